"""Fusion: consecutive realized nodes share a kernel while their iteration spaces match
(the same element count, or rows × row length around a reduction) and each reads the
others only at its own position.  Whether it does is found by generating the kernel:
`NotFusable` ends the group.  Extern calls end groups too: they run between kernels.
"""
from __future__ import annotations

from . import tiling
from .codegen import KernelCodegen, KernelGroup, NotFusable
from .ir import Computed, Extern


def _space(c: Computed):
    if c.is_reduction:
        return c.numel, c.node.rnumel, True
    return c.numel, 1, False


def _join(group: KernelGroup, c: Computed):
    x, r, red = group.xnumel, group.rnumel, group.reduction
    cx, cr, cred = _space(c)
    if red and cred:
        ok = (cx, cr) == (x, r)
    elif red:
        ok = c.numel in (x * r, x)
    elif cred:
        ok = x in (cx * cr, cx)
        x, r, red = cx, cr, True
    else:
        ok = c.numel == x
    if not ok:
        return None
    joined = KernelGroup(group.members + [c], x, r, red)
    try:
        KernelCodegen(joined, joined.members).generate()
    except NotFusable:
        return None
    return joined


def group(items) -> list:
    """KernelGroups and Externs, in program order."""
    out, current = [], None
    for item in items:
        if isinstance(item, Extern):
            if current is not None:
                out.append(current)
                current = None
            out.append(item)
            continue
        joined = _join(current, item) if current is not None else None
        if joined is None:
            if current is not None:
                out.append(current)
            x, r, red = _space(item)
            current = KernelGroup([item], x, r, red)
        else:
            current = joined
    if current is not None:
        out.append(current)
    return out


class Kernel:
    """One launch: the group, which members it stores, and its source."""
    __slots__ = ("group", "stores", "name", "source", "args", "symbols", "tile")

    def __init__(self, group, stores, name, source, args, symbols=(), tile=None):
        self.group, self.stores, self.name, self.source, self.args = group, stores, name, source, args
        self.symbols = list(symbols)  # shape symbols passed after the pointers
        self.tile = tile  # a tiling.Tile: a 2-D grid of [YBLOCK, XBLOCK] blocks

    def __repr__(self):
        return f"Kernel({self.name}, stores={[c.name for c in self.stores]})"


def schedule(lowered) -> list:
    """Kernels and Externs in launch order.  A computed value is written to memory only
    when another kernel, an extern or the graph's outputs read it."""
    groups = group(lowered.items)
    needed = set(lowered.wrapper_reads)
    for g in groups:
        if not isinstance(g, Extern):
            cg = KernelCodegen(g, g.members)
            cg.generate()
            needed |= cg.reads
    out = []
    for g in groups:
        if isinstance(g, Extern):
            out.append(g)
            continue
        stores = [c for c in g.members if c.name in needed]
        if stores:
            cg, name, source = tiling.generate(g, stores)
            out.append(Kernel(g, stores, name, source, dict(cg.args), cg.symbols,
                              getattr(cg, "tile", None)))
    return out
