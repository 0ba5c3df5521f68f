"""Block sizes and warps: a few candidates per kernel shape, timed on first launch on the
GPU (the heuristic first one under Triton's interpreter), the choice cached per shape, in
the process and on disk (tune_cache.py: a later process takes it without timing)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch

from ... import progress
from . import config, tune_cache

# (kernel name, xnumel, rnumel) -> Config
TUNED: dict = {}
STATS = {"tuned": 0, "timed": 0, "built_in_threads": 0, "from_disk": 0}
# (kernel name, xnumel, rnumel) -> the Triton compiles its tuning takes on a
# GPU (its candidates where they are timed, else 1), for each choice made in this process,
# timed or not (on the CPU too: what a GPU would compile, benchmarks/triton_compile_time.py)
COMPILES: dict = {}


class Config:
    __slots__ = ("xblock", "rblock", "num_warps")

    def __init__(self, xblock, rblock, num_warps):
        self.xblock, self.rblock, self.num_warps = xblock, rblock, num_warps

    def kwargs(self, reduction) -> dict:
        kw = {"XBLOCK": self.xblock, "num_warps": self.num_warps}
        if reduction:
            kw["RBLOCK"] = self.rblock
        return kw

    def __repr__(self):
        return f"Config(XBLOCK={self.xblock}, RBLOCK={self.rblock}, num_warps={self.num_warps})"


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def is_persistent(rnumel: int, outer=False) -> bool:
    """Whether rows of `rnumel` stay in registers.  An outer reduction's block holds a
    wide tile of rows, so only short reduced extents fit."""
    return next_pow2(rnumel) <= (OUTER_PERSISTENT_MAX if outer else config.persistent_rblock_max)


def candidates(xnumel: int, rnumel: int, reduction: bool, looped=False) -> list[Config]:
    """Candidates, the heuristic default first.  `looped`: a looped reduction whose rows
    may be short (a symbolic length, `rnumel` its hint)."""
    xmax = next_pow2(xnumel)
    if looped and next_pow2(rnumel) < 2048:
        r = max(16, next_pow2(rnumel))
        x = min(xmax, max(1, 2048 // r))
        return _unique([Config(x, r, w) for w in (4, 8)] + [Config(max(1, x // 2), r, 4)])
    if not reduction:
        return _unique([Config(min(x, xmax), 1, w)
                        for x, w in ((1024, 4), (2048, 8), (4096, 8), (2048, 4), (512, 4))])
    if is_persistent(rnumel):
        r = next_pow2(rnumel)
        if r >= 2048:
            warps = min(16, max(4, r // 512))
            return _unique([Config(1, r, w) for w in (warps, warps // 2, min(32, warps * 2))])
        # short rows: several per program so that a block holds a few thousand elements
        x = min(xmax, max(1, 4096 // r))
        return _unique([Config(x, r, w) for w in (8, 4)] + [Config(max(1, min(xmax, x // 2)), r, 4)])
    return _unique([Config(1, r, w) for r, w in ((2048, 8), (1024, 4), (4096, 16))])


def gather_candidates(xnumel: int) -> list[Config]:
    """Block sizes of a pointwise kernel whose loads are all strided or gathered
    (contiguity.gathers_only), the default first: two elements a thread.  A 3x3 stride-2
    max pooling of 64x256x112x112 bf16 on the H200 took 538 us at 8 a thread (the contiguous
    default, 1024 with 4 warps), 304 at 4, 254 at 2 and 257 at 1."""
    xmax = next_pow2(xnumel)
    return _unique([Config(min(x, xmax), 1, w) for x, w in ((512, 8), (256, 4), (1024, 16))])


# Outer reductions (contiguous along the kept axis x, see contiguity.py) reduce at most
# this many elements per output in registers; longer ones loop over short RBLOCKs.
OUTER_PERSISTENT_MAX = 64
# Streaming multiprocessors of the GPUs tuned for (H100, H200): split reductions aim to
# give them all work.
SMS = 132


def outer_candidates(xnumel: int, rnumel: int, looped=False) -> list[Config]:
    """Block sizes of an outer reduction, the heuristic default first.  XBLOCK runs along
    the contiguous kept axis (16-256 elements: whole 64-1024 byte segments a warp reads),
    RBLOCK is short and looped over the reduced axis, as Inductor's outer configs; few
    enough columns for that to leave SMs idle are split beforehand (`split_count`)."""
    xmax = next_pow2(xnumel)
    if not looped and is_persistent(rnumel, outer=True):
        r = next_pow2(rnumel)
        x = min(xmax, max(32, 2048 // r))
        return _unique([Config(x, r, w) for w in (8, 4)] + [Config(max(1, min(xmax, x // 2)), r, 4),
                                                            Config(min(xmax, 2 * x), r, 8)])
    if xnumel < 4096:
        x, r = min(xmax, 32), 16
    elif xnumel <= 8 * 4096:
        # as many programs as columns allow: 16 wide leaves 256-2048 of them
        x, r = 16, 32
    else:
        x = max(64, min(256, next_pow2(xnumel // 4096)))
        r = 512 // x
    r = min(r, max(1, next_pow2(rnumel)))
    warps = min(8, max(2, x * r // 128))
    alts = [(64, 8, 4), (32, 16, 4), (128, 8, 4), (64, 32, 8)]
    return _unique([Config(x, r, warps)] + [Config(min(xmax, a), min(b, next_pow2(rnumel)), w)
                                           for a, b, w in alts])


def split_count(xnumel: int, rnumel: int, outer: bool) -> int:
    """How many chunks to cut each reduced row into when there are too few outputs to
    fill the GPU (a full sum, per-channel statistics): a first kernel reduces the chunks,
    a second one their partial results.  1: no split.

    An inner reduction runs a program per output: it splits under 2 programs per SM, into
    about 4 per SM in all.  An outer one runs a program per 64 columns, 4 warps: it splits
    when that leaves SMs short of 16 programs each.  Chunks are `SPLIT_MIN_CHUNK` long
    at least (rows under 4 of them are not split); a count dividing the row needs no mask."""
    chunk = SPLIT_MIN_CHUNK[outer]
    if rnumel < 4 * chunk or xnumel >= (64 if outer else 2) * SMS or xnumel * rnumel < SPLIT_MIN_WORK:
        return 1
    programs = -(-xnumel // 64) if outer else xnumel
    s = min(-(-(16 if outer else 4) * SMS // programs), rnumel // chunk)
    return near_divisor(rnumel, s, rnumel // chunk) if s >= 2 else 1


def near_divisor(n: int, s: int, most: int) -> int:
    """A divisor of `n` in [s/2, min(2s, most)] closest to `s` (the larger on ties), or `s`."""
    near = [d for d in range(max(2, s // 2), min(2 * s, most) + 1) if n % d == 0]
    return min(near, key=lambda d: (abs(d - s), -d)) if near else s


# The shortest chunk of a split reduction, inner (False) and outer (True): an inner chunk
# still fills a few loop steps of 2048, an outer one 8 steps of 32 rows.
SPLIT_MIN_CHUNK = {False: 4096, True: 256}
# Smaller reductions are not split: a second launch costs about what one program takes
# to stream this many elements, and the split one no longer fuses with sibling reductions.
SPLIT_MIN_WORK = 1 << 18


# config.autotune_candidates="few": kernels of at least this many elements (xnumel *
# rnumel) keep one more candidate (a percent of a long kernel is worth a compile)
FEW_LARGE = 1 << 22


def few(configs: list, elements: int, kind: str) -> list:
    """The candidates `config.autotune_candidates` keeps of `configs` (heuristic default
    first) for a kernel of `elements` elements (xnumel * rnumel; a size hint where
    symbolic), `kind` "pointwise", "tiled" or "reduction".  "all" (and max_autotune)
    keeps them all.  "few", as Inductor's default (one config per pointwise kernel, one or
    two per reduction): a pointwise or tiled kernel keeps its heuristic default alone,
    with the first alternative at FEW_LARGE elements or more; a reduction (inner, outer,
    looped, scan), whose warps and row blocking matter more, keeps the default and the
    first alternative, and a third at FEW_LARGE or more.  Deterministic: a function of
    the arguments and the two settings."""
    if config.max_autotune or config.autotune_candidates == "all":
        return configs
    if config.autotune_candidates != "few":
        raise ValueError(f"autotune_candidates={config.autotune_candidates!r}: 'few' or 'all'")
    large = elements >= FEW_LARGE
    keep = (2 + large) if kind == "reduction" else (1 + large)
    return configs[:keep]


def _unique(configs):
    if config.max_autotune:
        # Wider search: each candidate also with half and twice the warps.
        configs = list(configs) + [Config(c.xblock, c.rblock, w) for c in configs
                                   for w in (max(1, c.num_warps // 2), min(32, c.num_warps * 2))]
    seen, out = set(), []
    for c in configs:
        key = (c.xblock, c.rblock, c.num_warps)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def pick(name: str, xnumel: int, rnumel: int, configs, run, build=None) -> Config:
    """The cached choice for this kernel at this shape, or the fastest of `configs`
    (`run(config)` launches once; `build(config)`, if given, compiles without launching,
    which lets the candidates compile in threads before they are timed)."""
    key = (name, xnumel, rnumel)
    best = TUNED.get(key)
    if best is None:
        STATS["tuned"] += 1
        timed = tunes(configs, xnumel, rnumel)
        COMPILES[key] = len(configs) if timed else 1
        if not timed or not _timed():
            best = configs[0]
        elif (best := tune_cache.load(name, xnumel, rnumel, configs)) is not None:
            STATS["from_disk"] += 1     # (timed by an earlier process: tune_cache.py)
        else:
            span = progress.begin("autotune", name)
            try:
                if build is not None:
                    _build_all(configs, build)
                best = min(configs, key=lambda c: _time(lambda: run(c)))
            finally:
                progress.end(span)
            tune_cache.store(name, xnumel, rnumel, configs, best)
        TUNED[key] = best
    return best


def tunes(configs, xnumel: int, rnumel: int) -> bool:
    """Whether a GPU times (and so compiles) each of `configs` for this kernel."""
    return len(configs) > 1 and not _too_small(xnumel, rnumel)


def _timed() -> bool:
    """Whether candidates are timed at all: on a GPU, not in Triton's interpreter."""
    return not interpreted() and torch.cuda.is_available()


def _too_small(xnumel: int, rnumel: int) -> bool:
    """A kernel whose block sizes cannot matter: launch-bound (config.autotune_min_elements)."""
    if config.max_autotune:
        return False
    return xnumel * max(1, rnumel) <= config.autotune_min_elements


def _build_all(configs, build):
    """Compile every candidate at once in threads (a compile spends its time outside the
    GIL); one that fails to compile is timed as failing, at its launch."""
    threads = min(config.compile_threads, len(configs))
    if threads <= 1:
        return
    device = torch.cuda.current_device()   # (a new thread's current device is the first)

    def one(c):
        try:
            with torch.cuda.device(device):
                build(c)
        except Exception:   # e.g. out of shared memory: _time gives it inf
            pass
    one(configs[0])     # alone: it sets up the function's per-device state threads would race on
    STATS["built_in_threads"] += len(configs) - 1
    with ThreadPoolExecutor(threads, thread_name_prefix="frametrace-triton-compile") as pool:
        list(pool.map(one, configs[1:]))


def _time(fn) -> float:
    """Mean milliseconds of `fn` on the GPU (compiles on the first call)."""
    STATS["timed"] += 1
    try:
        fn()
        torch.cuda.synchronize()
    except Exception:  # e.g. out of shared memory for this block size
        return float("inf")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    reps = max(3, min(100, int(6.0 / max(start.elapsed_time(end) / 3, 1e-3))))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


# Scans along a strided dimension: rows up to this long stay in registers (then blocks
# hold 4096 // rnumel rows, still wide enough along the contiguous axis); longer rows loop.
OUTER_SCAN_RBLOCK = 64


def outer_scan_candidates(xnumel: int, rnumel: int) -> list[Config]:
    """Looped scans along a strided dimension: a block is XBLOCK neighbouring rows (each
    load a contiguous stretch across them) by an RBLOCK chunk of each.  Rows are the only
    parallelism, so narrower blocks make more programs; taller ones more bytes in flight."""
    xmax = next_pow2(xnumel)
    return _unique([Config(min(x, xmax), r, w) for x, r, w in
                    ((32, 32, 4), (64, 16, 4), (32, 64, 8), (16, 64, 4), (128, 8, 4))])
