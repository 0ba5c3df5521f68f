"""A graph's kernels compiled all at once, in threads, before its first call launches
them (config.precompile_kernels).

Each kernel compiles at its first launch, and the first call launches them one after
another: a ResNet-50 training step's ~380 kernels spent 39 of its 53 s there on the H200.
Triton's compiler spends most of a compile in MLIR/LLVM and ptxas, outside the GIL, so
compiles in threads overlap.  What a launch compiles depends on its arguments only
through their dtypes and alignment (and ints' values): the wrapper's `call` is run once
with nothing computed (each launch records its arguments, each aten call returns empty
tensors of the layouts it will return), then every launcher's block-size candidates that
its first launch would compile are built in a thread pool.  The first call's launches
find them in Triton's cache; a guess that differs from the real launch (an aten result
that is a view at an odd offset) only compiles again there, as before.

Only static graphs on CUDA whose sizes come from no data (no `nonzero`): the dry run
then runs no kernel and no aten op of the graph's (the wrapper's own helpers, layout
copies among them, run as in a call), nothing that draws from a generator or writes an
input.  It allocates about what a call does, more where an aten call would have written
into an input or returned a view of one (its stand-in is fresh memory); running out of
memory there costs the precompile only.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from . import autotune, config, tune_cache
from .ir import Buffer
from .wrapper import TiledLauncher

log = logging.getLogger("frametrace")

STATS = {"graphs": 0, "compiles": 0, "seconds": 0.0}


def precompile(mod, args) -> int:
    """Compile `mod`'s kernels ahead of its first call (with `args`), in threads; the
    number of compiles made (0 where the graph does not qualify, or where anything
    fails: each kernel then compiles at its launch, as without it)."""
    if not _qualifies(mod):
        return 0
    try:
        return _precompile(mod, args)
    except Exception as e:   # (out of memory for the stand-ins, say)
        log.debug("triton backend: no precompile (%s: %s)", type(e).__name__, e)
        return 0


def _precompile(mod, args) -> int:
    t0 = time.perf_counter()
    recorded = _dry_run(mod, args)
    if not recorded:
        return 0
    jobs = {}   # Triton function -> [(launcher, config, args)]: one thread per function
    for name, specs in recorded.items():
        launcher = mod.namespace[name]
        choices = _to_compile(launcher)
        if choices:
            args = _stand_ins(specs)
            jobs.setdefault(id(launcher.fn), []).extend((launcher, c, args) for c in choices)
    if not jobs:
        return 0
    groups = list(jobs.values())
    device = torch.cuda.current_device()

    def build(group):
        with torch.cuda.device(device):   # (a new thread's current device is the first)
            for launcher, choice, args in group:
                try:
                    launcher._build(choice, args)
                except Exception as e:   # (its launch compiles it and reports the error)
                    log.debug("triton backend: precompile of %s failed: %s", launcher.name, e)
    build(groups[0])     # alone: Triton's first compile in a process sets up shared state
    threads = max(1, min(config.compile_threads, len(groups) - 1))
    with ThreadPoolExecutor(threads, thread_name_prefix="frametrace-triton-precompile") as pool:
        list(pool.map(build, groups[1:]))
    n = sum(len(g) for g in groups)
    STATS["graphs"] += 1
    STATS["compiles"] += n
    STATS["seconds"] += time.perf_counter() - t0
    log.debug("triton backend: %d kernel compiles ahead of the first call (%d launchers) in %.1f s",
              n, len(recorded), time.perf_counter() - t0)
    return n


def _qualifies(mod) -> bool:
    L = mod.wrapper.lowered
    return (mod.settings.get("precompile_kernels", config.precompile_kernels)
            and mod.namespace["device"].type == "cuda" and autotune._timed()
            and not torch.cuda.is_current_stream_capturing()   # (a caller's capture)
            and not mod.symbolic and not L.late_symbols and not L.off_device
            and len(mod.kernels) > 1)


def _dry_run(mod, args):
    """{launcher name: the arguments its first launch passes, as a dry run with `args`
    makes them}, or None where the dry run fails (then each kernel compiles at its
    launch, as without it)."""
    w = mod.wrapper
    ns = dict(mod.namespace)
    recorded = {}
    for name in w.launchers:
        ns[name] = _Recorder(name, recorded)
    for name, e in w.extern_items.items():
        ns[name] = _Stub(e.outputs)
    try:
        exec(compile(mod.source, "<frametrace-triton dry run>", "exec"), ns)
        ns["call"](list(args))
    except Exception as e:   # (a wrapper the dry run cannot take)
        log.debug("triton backend: no precompile (%s: %s)", type(e).__name__, e)
        return None
    return recorded


class _Recorder:
    """Stands in for a launcher: keeps what Triton specializes its first launch's
    arguments on (a tensor's dtype, device and 16-byte alignment; a number's value), not
    the tensors, which the dry run frees as the call does."""
    __slots__ = ("name", "recorded")

    def __init__(self, name, recorded):
        self.name, self.recorded = name, recorded

    def __call__(self, *args):
        if self.name not in self.recorded:
            self.recorded[self.name] = tuple(
                _Spec(a.dtype, a.device, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a
                for a in args)


class _Spec:
    __slots__ = ("dtype", "device", "aligned")

    def __init__(self, dtype, device, aligned):
        self.dtype, self.device, self.aligned = dtype, device, aligned

    def tensor(self):
        """A small tensor Triton specializes as it would the recorded one."""
        t = torch.empty(32, dtype=self.dtype, device=self.device)
        return t if self.aligned else t[1:]


def _stand_ins(specs) -> tuple:
    return tuple(a.tensor() if isinstance(a, _Spec) else a for a in specs)


class _Stub:
    """Stands in for an aten call: empty tensors laid out as its results will be."""
    __slots__ = ("outputs",)

    def __init__(self, outputs):
        self.outputs = outputs

    def __call__(self, *args, **kwargs):
        return _empty(self.outputs)


def _empty(out):
    if isinstance(out, Buffer):
        return torch.empty_strided(tuple(int(n) for n in out.shape), tuple(int(s) for s in out.stride),
                                   dtype=out.dtype, device=out.device)
    if isinstance(out, (list, tuple)):
        return type(out)(_empty(o) for o in out)
    return out


def _to_compile(launcher) -> list:
    """The block-size candidates `launcher`'s first launch compiles (autotune.pick's
    choice of what to time): none once it has launched."""
    if launcher.kwargs is not None or launcher.numel is not None:
        return []
    x, r = (launcher.tile.xnumel, launcher.tile.ynumel) if isinstance(launcher, TiledLauncher) \
        else (launcher.xnumel, launcher.rnumel)
    configs = launcher.configs
    best = autotune.TUNED.get((launcher.name, x, r))
    if best is not None:
        return [best]
    if not autotune.tunes(configs, x, r):
        return configs[:1]
    stored = tune_cache.load(launcher.name, x, r, configs)
    return [stored] if stored is not None else list(configs)
