"""Which iteration variable a reduction kernel's large memory accesses are contiguous
along.  A kernel reduces `xnumel` rows of `rnumel`; when its full-size loads step by one
element as `rindex` grows (a softmax row), the row is the contiguous axis: an *inner*
reduction.  When they step by one as `xindex` grows (`x.sum(0)`, a mean over a middle
dimension, channels-last statistics), the kept axis is: an *outer* reduction, which must
be tiled wide along x and short along r for a warp to read contiguous memory.

Strides are measured by evaluating each index at a few sample points rather than read off
the expression: after views an index is a nest of `//` and `%` whose stride is one only
almost everywhere."""
from __future__ import annotations

from . import config, indexing
from .indexing import RINDEX, XINDEX, pexpr

SAMPLES = 16


def _points(n) -> list:
    """A spread of positions p with p + 1 < n, by golden-ratio steps (evenly spaced ones
    can share their residue modulo a dimension and all land on its last index)."""
    return [int((i * 0.6180339887498949) % 1 * (n - 1)) for i in range(1, SAMPLES + 1)] if n >= 2 else []


def _addresses(index, hints, variables):
    """`index` as a function of `variables` ("xindex" or "xindex, rindex"), the shape
    symbols bound to their hints; None where it holds a loaded value (an indirect access)."""
    names = {s.name: v for s, v in hints.items()}
    if any(s.name not in names for s in getattr(index, "free_symbols", set()) - {XINDEX, RINDEX}):
        return None
    fn = eval(f"lambda {variables}, {', '.join(names)}: {pexpr(index)}" if names else
              f"lambda {variables}: {pexpr(index)}")
    return lambda *at: fn(*at, **names)


def axis(index, xnumel, rnumel, hints) -> str | None:
    """'x' or 'r': the variable along which most consecutive positions of this access are
    consecutive elements, or None (a per-row or per-column operand, an indirect or strided
    access)."""
    free = getattr(index, "free_symbols", set())
    if XINDEX not in free or RINDEX not in free:
        return None  # broadcast along one axis: small, and cached across the other
    at = _addresses(index, hints, "xindex, rindex")
    if at is None:
        return None  # a loaded (indirect) index
    xs, rs = _points(indexing.hint(xnumel, hints)), _points(indexing.hint(rnumel, hints))
    if not xs or not rs:
        return None
    pairs = list(zip(xs, rs[::-1]))
    steps = [(at(x + 1, r) - at(x, r), at(x, r + 1) - at(x, r)) for x, r in pairs]
    if config.broadcast_reads_abstain and any(2 * sum(s[i] == 0 for s in steps) > len(pairs) for i in (0, 1)):
        # the same element at most steps along one axis (a per-row mask broadcast over a
        # middle dimension's columns): read once and cached while the other axis's full-size
        # reads stream, as the per-row operands above; it must not outvote them
        return None
    dx = sum(sx == 1 for sx, _ in steps)
    dr = sum(sr == 1 for _, sr in steps)
    if 2 * dr > len(pairs) and dr >= dx:
        return "r"
    return "x" if 2 * dx > len(pairs) else None


def is_outer(cg) -> bool:
    """Whether the kernel `cg` generated reads and writes its full-size data mostly
    contiguously along x (ties: inner, the layout reductions had before)."""
    votes = {"x": 0, "r": 0, None: 0}
    hints, memo = cg.ctx.hints, cg.ctx.memo if config.memo_indexing else None
    for index in cg.load_indices:
        if memo is None:
            votes[axis(index, cg.xnumel, cg.rnumel, hints)] += 1
            continue
        # (kept for the compile: a kernel one member larger asks again for the same loads)
        key = (axis, index, type(index), cg.xnumel, cg.rnumel, tuple(hints.items()))
        found = memo.get(key, memo)
        if found is memo:
            found = memo[key] = axis(index, cg.xnumel, cg.rnumel, hints)
        votes[found] += 1
    # full-size stores walk rows (a softmax's output: inner), or columns (a gradient
    # stored by its bias gradient's kernel: outer)
    votes["x" if getattr(cg.group, "columns", False) else "r"] += sum(cg.own_flat(c) is not XINDEX for c in cg.stores)
    return votes["x"] > votes["r"]


def gathers_only(cg) -> bool:
    """Whether the pointwise kernel `cg` generated reads full-size data and none of it
    contiguously along x: every load steps by another stride (a pooling window's taps, a
    strided slice).  Its threads then gain nothing from holding several
    neighbouring elements (no vector loads), and fewer per thread measure faster
    (autotune.gather_candidates).  Loads on the same element at most steps (a bias, a
    per-row scale) have no vote."""
    hints = cg.ctx.hints
    points = _points(indexing.hint(cg.xnumel, hints))
    strided = 0
    for index in cg.load_indices:
        if XINDEX not in getattr(index, "free_symbols", set()):
            continue
        at = _addresses(index, hints, "xindex")
        if at is None:
            continue   # indirect (an embedding's rows): mostly contiguous in practice; unmeasured
        steps = [at(x + 1) - at(x) for x in points]
        if 2 * sum(d == 0 for d in steps) > len(steps):
            continue
        if 2 * sum(d == 1 for d in steps) > len(steps):
            return False
        strided += 1
    return strided > 0
