"""Split reductions: a reduction with few outputs and long rows (a full sum, per-channel
statistics of an NCHW activation, a column sum of a tall matrix) runs one program per
output, or per tile of outputs, leaving most SMs idle.  It becomes two reductions: the
first reduces `S` chunks of each row into a (S, *outputs) buffer of partial results,
enough programs to fill the GPU; the second reduces those over S.  The partials keep the
accumulator's dtype (float32 for half inputs, int64 for integer sums).

The chunk count comes from `autotune.split_count`, which asks whether the reduction is
an outer one: that is found by generating its kernel once (contiguity.py)."""
from __future__ import annotations

import math

import torch

from . import autotune, config, indexing
from .kernel_source import KernelCodegen, KernelGroup
from .indexing import unflatten
from .ir import Computed, Reduction
from .lowering_base import compute_dtype

# what the second step does with the first's results: the same reduction
SPLITTABLE = ("sum", "max", "min", "any")


def count(L, r: Reduction, in_registers=False) -> int:
    """Chunks to cut `r`'s rows into (1: do not split).  `in_registers`: an inner chunk
    is read twice (a variance), so one that fits in registers reads memory once."""
    if r.rtype not in SPLITTABLE or L.ctx.hints:
        return 1
    x, n = math.prod(r.shape), r.rnumel
    if not (indexing.is_static(x) and indexing.is_static(n)):
        return 1
    if autotune.split_count(x, n, outer=False) == 1 and autotune.split_count(x, n, outer=True) == 1:
        return 1  # (no need to generate the kernel to know)
    outer = _is_outer(L, r)
    s = autotune.split_count(x, n, outer)
    if s == 1:
        return 1
    lo, hi = max(2, s // 2), min(2 * s, n // autotune.SPLIT_MIN_CHUNK[outer])
    if in_registers and not outer and not autotune.is_persistent(-(-n // s)):
        s = lo = -(-n // config.persistent_rblock_max)
        hi = 2 * s
    return _aligned(r.rshape, s, lo, hi) or s


def _aligned(rshape, s, lo, hi):
    """A chunk count in [lo, hi] near `s` that divides the leading reduced dimensions,
    so that a chunk is whole runs of the trailing ones (per-channel statistics of NCHW:
    whole H*W planes): its index needs no division across a run, and stays provably
    contiguous along it.  None if there is none."""
    for i in range(1, len(rshape) + 1):
        lead = math.prod(rshape[:i])
        near = [d for d in range(lo, hi + 1) if lead % d == 0]
        if near:
            return min(near, key=lambda d: (abs(d - s), -d))
    return None


def _is_outer(L, r) -> bool:
    probe = Computed("split_probe", r, L.device, len(L.items))  # not one of L.items
    group = KernelGroup([probe], math.prod(r.shape), r.rnumel, True, ctx=L.ctx)
    KernelCodegen(group, [probe]).generate()
    return bool(group.outer)


def _identity(rtype, dtype):
    if rtype in ("sum", "any"):
        return 0
    cd = compute_dtype(dtype)
    big = rtype == "min"
    if cd.is_floating_point:
        return math.inf if big else -math.inf
    if cd == torch.bool:
        return big
    info = torch.iinfo(cd)
    return info.max if big else info.min


def _partial_dtype(r):
    if r.rtype == "sum":
        return compute_dtype(r.dtype)  # an integer sum's dtype is int64 already
    return r.dtype


class Chunks:
    """Row positions of chunk `s`, element `j`: `s * size + j`, masked past the row."""
    __slots__ = ("n", "count", "size")

    def __init__(self, n, count):
        self.n, self.count, self.size = n, count, -(-n // count)

    @property
    def ragged(self) -> bool:
        return self.count * self.size != self.n

    def value(self, k, r, s, j, oidx, ident=None):
        """`r`'s reduced value at chunk `s`, element `j` (of output `oidx`); `ident` past
        the row's end."""
        flat = s * self.size + j
        if not self.ragged:
            return r.fn(k, oidx, unflatten(flat, r.rshape))
        cond = k.op(f"{k.index(flat)} < {self.n}")
        with k.masked(cond):
            v = r.fn(k, oidx, unflatten(flat, r.rshape))
        return k.op(f"tl.where({cond}, {v}, {k.literal(ident, r.src_dtype)})")

    def length(self, k, s) -> str:
        """How many elements chunk `s` has, as float32 code."""
        if not self.ragged:
            return k.literal(self.size, torch.float32)
        last = self.n - (self.count - 1) * self.size
        return k.op(f"tl.where({k.index(s)} == {self.count - 1}, {float(last)!r}, {float(self.size)!r})")


def split(L, r: Reduction, s: int) -> Computed:
    """`r` as two reductions: chunk partials, then their reduction."""
    ch = Chunks(r.rnumel, s)
    pdt = _partial_dtype(r)
    ident = _identity(r.rtype, r.src_dtype)
    part = L.computed(Reduction(
        (s,) + r.shape, pdt, (ch.size,), r.rtype,
        lambda k, pidx, ridx: ch.value(k, r, pidx[0], ridx[0], list(pidx[1:]), ident), r.src_dtype))
    return L.computed(Reduction(
        r.shape, r.dtype, (s,), r.rtype,
        lambda k, oidx, ridx: part.load(k, [ridx[0]] + list(oidx)), pdt))


def split_var(L, r: Reduction, s: int, out_shape, out_index):
    """Variance by chunks, reading x once: the first kernel takes each chunk's sum and its
    centred sum of squares M2 about the chunk's own mean (two passes over a chunk, the
    second from cache); the second combines them (Chan et al.):
        M2 = sum_s M2_s + n_s * (mean_s - mean)^2.
    `r` sums x (over rows of the keepdim shape).  Returns (M2 over `out_shape`, whose
    index maps to r's by `out_index`; the sum, keepdim)."""
    ch = Chunks(r.rnumel, s)
    acc = compute_dtype(r.dtype)
    n = r.rnumel
    psum = L.computed(Reduction(
        (s,) + r.shape, acc, (ch.size,), "sum",
        lambda k, pidx, ridx: ch.value(k, r, pidx[0], ridx[0], list(pidx[1:]), 0), r.src_dtype))

    def centred(k, pidx, ridx):
        m = k.op(f"{psum.load(k, pidx)} / {ch.length(k, pidx[0])}")
        v = k.cast(ch.value(k, r, pidx[0], ridx[0], list(pidx[1:]), 0), r.src_dtype, acc)
        c = k.op(f"{v} - {m}")
        sq = k.op(f"{c} * {c}")
        if ch.ragged:  # past the row x reads as 0, not as the mean
            sq = k.op(f"tl.where({k.index(pidx[0] * ch.size + ridx[0])} < {n}, {sq}, 0.0)")
        return sq
    pm2 = L.computed(Reduction((s,) + r.shape, acc, (ch.size,), "sum", centred, acc))
    total = L.computed(Reduction(r.shape, r.dtype, (s,), "sum",
                                 lambda k, oidx, ridx: psum.load(k, [ridx[0]] + list(oidx)), acc))

    def combined(k, oidx, ridx):
        pidx = [ridx[0]] + list(out_index(oidx))
        mean = k.op(f"{k.cast(total.load(k, pidx[1:]), r.dtype, acc)} * {1.0 / n!r}")
        d = k.op(f"{psum.load(k, pidx)} / {ch.length(k, ridx[0])} - {mean}")
        return k.op(f"{pm2.load(k, pidx)} + {ch.length(k, ridx[0])} * {d} * {d}")
    m2 = L.computed(Reduction(out_shape, r.dtype, (s,), "sum", combined, acc))
    return m2, total
