"""Tiled pointwise kernels: a 2-D [YBLOCK, XBLOCK] block over the output split into outer
dims (y) and inner dims (x), element `yindex * xnumel + xindex`, when a flat index would read
some large operand with a stride.

A transposed operand (`x.t() + y`, a permute, NCHW <-> NHWC) is contiguous along an outer
dim of the output: the split puts that dim innermost in y, so its loads are contiguous along
the block's y axis while the stores are along x (Triton converts between the two layouts
through shared memory).  A broadcast operand that is constant along the inner dims (a
per-channel weight over NCHW activations) splits there, so that it is loaded, and what is
computed from it only, once per row of the block.

Which operand does what is found by generating the kernel flat once and evaluating each
access's address one step along each output dim.  Only accesses that disagree call for a
tile: where all of them run along one order, a flat walk in that order is best.  Symbolic
sizes stay flat.
"""
from __future__ import annotations

import hashlib
import math
import re

import sympy

from . import indexing
from .autotune import few, next_pow2
from .kernel_source import COMBINE, KernelCodegen, NotFusable
from .indexing import XINDEX, YINDEX, flatten, pexpr, unflatten
from .ir import contiguous_strides

MAX_GRID_Y = 65535  # CUDA's limit on the second and third grid axes
_NAMES = re.compile(r"\b(tmp\d+|xindex|yindex|xmask|ymask)\b")
_BITS = {"xindex": 1, "xmask": 1, "yindex": 4, "ymask": 4}


class TileConfig:
    __slots__ = ("yblock", "xblock", "num_warps")

    def __init__(self, yblock, xblock, num_warps):
        self.yblock, self.xblock, self.num_warps = yblock, xblock, num_warps

    def kwargs(self, reduction=False) -> dict:
        return {"YBLOCK": self.yblock, "XBLOCK": self.xblock, "num_warps": self.num_warps}

    def __repr__(self):
        return f"TileConfig(YBLOCK={self.yblock}, XBLOCK={self.xblock}, num_warps={self.num_warps})"


class Tile:
    """The split of a kernel's `ynumel * xnumel` elements; `swap`: y blocks on grid axis 0
    (there are more than axis 1 takes), x blocks on axis 1."""
    __slots__ = ("ynumel", "xnumel", "kind", "configs", "swap")

    def __init__(self, ynumel, xnumel, kind):
        self.ynumel, self.xnumel, self.kind = ynumel, xnumel, kind
        self.configs = candidates(ynumel, xnumel, kind)
        self.swap = math.ceil(ynumel / min(c.yblock for c in self.configs)) > MAX_GRID_Y

    def grid(self, config) -> tuple:
        gx, gy = math.ceil(self.xnumel / config.xblock), math.ceil(self.ynumel / config.yblock)
        return (gy, gx) if self.swap else (gx, gy)

    def __repr__(self):
        return f"Tile({self.ynumel}x{self.xnumel}, {self.kind})"


def candidates(ynumel, xnumel, kind) -> list[TileConfig]:
    """Block shapes, the heuristic default first: square tiles for a transpose (both axes
    carry contiguous accesses), wide ones for a broadcast (only x does); as many as
    config.autotune_candidates keeps (autotune.few)."""
    return few(_all_candidates(ynumel, xnumel, kind), ynumel * xnumel, "tiled")


def _all_candidates(ynumel, xnumel, kind) -> list[TileConfig]:
    if kind == "transpose":
        shapes = [(32, 32), (64, 64), (16, 128), (128, 16), (16, 256)]
    else:
        x = broadcast_xblock(xnumel) or 32
        shapes = [(1024 // x, x), (8, 128), (4, 256), (2, 512), (16, 64), (1, 1024)]
    out, seen = [], set()
    for y, x in shapes:
        c = _fit(y, x, ynumel, xnumel)
        key = (c.yblock, c.xblock, c.num_warps)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def broadcast_xblock(xnumel) -> int | None:
    """The widest x block that rows of `xnumel` fill to 7/8 or more, or None: a row's masked
    tail costs more lanes than loading the broadcast per element does."""
    for x in (256, 128, 64, 32):
        if -(-xnumel // x) * x * 7 <= xnumel * 8:
            return x
    return None


def _fit(y, x, ynumel, xnumel) -> TileConfig:
    """(y, x) shrunk to the extents, then grown along the other axis back to its size."""
    ymax, xmax = next_pow2(ynumel), next_pow2(xnumel)
    target = min(y * x, ymax * xmax)
    y, x = min(y, ymax), min(x, xmax)
    while y * x < target and x < xmax:
        x *= 2
    while y * x < target and y < ymax:
        y *= 2
    return TileConfig(y, x, max(1, min(8, y * x // 256)))


# -- choosing the split -----------------------------------------------------------------------
class _RowMajorWalk(KernelCodegen):
    """Members' elements visited in row-major order of their shape, whatever their stored
    layout (each store then goes to its buffer's address of that element): the order in
    which accesses are classified, and the one a tiled kernel splits."""

    def own_index(self, c) -> list:
        return unflatten(self.own_flat(c), c.shape)

    def computed(self, c, idx) -> str:
        if c.name in self.members and not c.is_reduction:
            if sympy.expand(flatten(idx, c.shape) - self.own_flat(c)) != 0:
                raise NotFusable(f"{c.name} is read at another position")
            return self.value(c)
        return super().computed(c, idx)


class _Probe(_RowMajorWalk):
    """The flat kernel, recording the index of every load and store (`accesses`, as
    every KernelCodegen does)."""


def _probe_of(group, stores):
    """The scheduler's generation of `group` (KernelGroup.generated) where it is what
    `_Probe(group, stores)` generates, else None: every member stored, none in another
    layout than row-major (so that both walk the same order), and more than one element
    (a single one is read at any position, which only KernelCodegen allows)."""
    made = group.generated
    if made is None or type(made[0]) is not KernelCodegen or len(stores) != len(group.members) \
            or not all(a is b for a, b in zip(stores, group.members)):
        return None
    if group.xnumel == 1 or any(c.fill is not None for c in group.members):
        return None
    return made


def _address(code, flat):
    """`code` (an index, compiled by `_compiled`) at output element `flat`, or None where
    it depends on loaded values."""
    try:
        return eval(code, {"xindex": flat})
    except Exception:  # (NameError: a loaded value's symbol) a heuristic's input: no vote
        return None


def _compiled(index):
    """`index` printed and compiled once, for `_address` at each of its elements (an eval
    of the source compiled it again at each)."""
    try:
        return compile(pexpr(index), "<index>", "eval")
    except Exception:
        return None


def _split_of(index, shape, steps) -> tuple | None:
    """(kind, split) for one access: ("row", None) when it is contiguous along the last
    dim of `shape`; ("broadcast", k) when it is constant along dims k and after;
    ("transpose", k) when it is contiguous along dim k-1; None for anything else."""
    code = _compiled(index)
    base = None if code is None else _address(code, 0)
    if base is None:
        return None
    deltas = []
    for n, step in zip(shape, steps):
        a = _address(code, step) if n > 1 else base
        if a is None:
            return None
        deltas.append(a - base)
    last = max(i for i, n in enumerate(shape) if n > 1)
    if deltas[last] == 1:
        return "row", None
    varying = [i for i, d in enumerate(deltas) if d != 0]
    if varying and deltas[last] == 0:
        return "broadcast", varying[-1] + 1
    ones = [i for i, d in enumerate(deltas) if d == 1 and shape[i] > 1]
    return ("transpose", ones[-1] + 1) if ones else None


def choose(stores, accesses) -> Tile | None:
    """The split of one of the stored shapes (views of one flat space), the first that
    has one."""
    shapes = sorted(dict.fromkeys(tuple(c.shape) for c in stores), key=len, reverse=True)
    for shape in shapes:
        if all(indexing.is_static(n) for n in shape) and sum(int(n) > 1 for n in shape) >= 2:
            tile = _choose([int(n) for n in shape], accesses)
            if tile is not None:
                return tile
    return None


def _choose(shape, accesses) -> Tile | None:
    """The split of `shape` where the accesses disagree: some contiguous along the last
    dim and others along another one (the split of the most of those), or else constant
    along the inner dims (the split of the most of those, when rows are wide enough).
    None: stay flat (a flat walk suits accesses that all agree)."""
    steps = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    votes = {"row": {}, "transpose": {}, "broadcast": {}}
    for _, index in accesses:
        found = _split_of(index, shape, steps)
        if found is not None:
            kind, k = found
            votes[kind][k] = votes[kind].get(k, 0) + 1
    if not votes["row"]:
        return None
    for kind in ("transpose", "broadcast"):
        if not votes[kind]:
            continue
        k = max(votes[kind], key=votes[kind].get)
        ynumel, xnumel = math.prod(shape[:k]), math.prod(shape[k:])
        if kind == "broadcast" and broadcast_xblock(xnumel) is None:
            continue
        tile = Tile(ynumel, xnumel, kind)
        if tile.swap and math.ceil(xnumel / min(c.xblock for c in tile.configs)) > MAX_GRID_Y:
            return None
        return tile
    return None


def generate(group, stores) -> tuple:
    """(code generator, kernel name, source) of a group's kernel: tiled where that pays
    (pointwise, static sizes), else flat."""
    if group.reduction or group.ctx.hints:
        if group.generated is not None and len(stores) == len(group.members) and \
                all(a is b for a, b in zip(stores, group.members)):
            return group.generated  # (the scheduler's generation, every member stored)
        cg = KernelCodegen(group, stores)
        return (cg, *cg.generate())
    made = _probe_of(group, stores)
    if made is not None:
        probe, name, source = made
    else:
        probe = _Probe(group, stores)
        try:
            name, source = probe.generate()
        except NotFusable:  # members that share a kernel only in their layouts' own walk
            cg = KernelCodegen(group, stores)
            return (cg, *cg.generate())
    tile = choose(stores, probe.accesses)
    if tile is not None:
        tiled = TiledCodegen(group, stores, tile)
        try:
            return (tiled, *tiled.generate())
        except NotFusable:  # a member's own index that does not simplify under this split
            pass
    if all(c.buffer.stride == contiguous_strides(c.shape) for c in stores):
        return probe, name, source
    if made is not None:
        return made  # (the same generation: no member has a layout's own walk)
    cg = KernelCodegen(group, stores)  # (a layout's own walk, where it has one)
    return (cg, *cg.generate())


# -- the tiled kernel ---------------------------------------------------------------------------
class TiledCodegen(_RowMajorWalk):
    """A pointwise kernel over [YBLOCK, XBLOCK] blocks.  A value's level is a bit set of the
    axes it varies along (1: x, 4: y), so that a load takes only the masks of its axes."""
    BLOCK = "[YBLOCK, XBLOCK]"

    def __init__(self, group, stores, tile: Tile):
        super().__init__(group, stores)
        self.tile = tile
        self.xnumel, self.ynumel = tile.xnumel, tile.ynumel
        self.configs = tile.configs
        self.has_xmask = any(self.xnumel % c.xblock for c in self.configs)
        self.has_ymask = any(self.ynumel % c.yblock for c in self.configs)

    def level(self, expr: str) -> int:
        bits = 0
        for n in _NAMES.findall(expr):
            bits |= _BITS.get(n, self.levels.get(n, 0))
        return bits

    def _mask(self, level) -> str:
        parts = (["ymask"] if level & 4 and self.has_ymask else []) + \
                (["xmask"] if level & 1 and self.has_xmask else []) + self.masks
        return ", " + " & ".join(parts) if parts else ""

    def lanes(self, text):
        """The address broadcast along the axes its mask has and it lacks (a row's operand
        under a condition on the column, in a `cat`): Triton broadcasts a mask to the
        pointer's shape, not the pointer to the mask's."""
        level = self.level(text)
        mask = self._mask(level)
        missing = self.level(mask) & ~level
        if not missing:
            return text, mask
        zero = " + ".join(v for bit, v in ((4, "yindex"), (1, "xindex")) if missing & bit)
        return f"{text} + ({zero}) * 0", self._mask(level | missing)

    def own_flat(self, c):
        return YINDEX * self.xnumel + XINDEX

    def generate(self) -> tuple[str, str]:
        with self.ctx.active():
            self.ctx.ranges = indexing.ranges(self.xnumel, 1, self.ynumel)
            for c in self.stores:
                self.store(c)
            return self._source()

    def _source(self):
        params = list(self.args.values()) + ["YBLOCK: tl.constexpr", "XBLOCK: tl.constexpr"]
        ypid, xpid = ("tl.program_id(0)", "tl.program_id(1)") if self.tile.swap else \
            ("tl.program_id(1)", "tl.program_id(0)")
        if self.wide:
            ypid, xpid = f"{ypid}.to(tl.int64)", f"{xpid}.to(tl.int64)"
        head = [f"ynumel: tl.constexpr = {self.ynumel}", f"xnumel: tl.constexpr = {self.xnumel}",
                f"yoffset = {ypid} * YBLOCK",
                "yindex = yoffset + tl.arange(0, YBLOCK)[:, None]"]
        if self.has_ymask:
            head.append("ymask = yindex < ynumel")
        head += [f"xoffset = {xpid} * XBLOCK", "xindex = xoffset + tl.arange(0, XBLOCK)[None, :]"]
        if self.has_xmask:
            head.append("xmask = xindex < xnumel")
        body = "\n".join("    " + line for line in head + self.outer)
        helpers = "".join(COMBINE[h] for h in sorted(self.helpers))  # (random numbers' Philox)
        src = f"{helpers}@triton.jit\ndef KERNEL({', '.join(params)}):\n{body}\n"
        name = f"triton_tile_{hashlib.sha256(src.encode()).hexdigest()[:12]}"
        return name, src.replace("def KERNEL(", f"def {name}(", 1)
