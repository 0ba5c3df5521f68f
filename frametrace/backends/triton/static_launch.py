"""Launching compiled Triton kernels on CUDA without Triton's per-signature C launcher.

Triton (3.6 and before) makes a small C extension for each kernel signature it launches,
with the system's C compiler: a first call of a training step met 19 signatures and spent
6 s in gcc (H200, torch 2.11).  torch's CUDA builds carry a launcher compiled ahead of
time, `torch._C._StaticCudaLauncher` (what Inductor launches its kernels with): it loads
the kernel's cubin and launches it given the grid, the arguments and their types as one
character each.  It is also cheaper per launch (5.2 against 7.9 us measured on the H200).

`static_kernel(compiled)` gives a `StaticKernel` for a Triton `CompiledKernel`, or None
where this launcher cannot run it as Triton would (then Triton's own launcher runs it):
several CTAs, scratch memory, tensor descriptors, cooperative or PDL launches, 16-bit
scalar arguments, launch hooks (a profiler's), or `config.static_launch` off.

    >>> k = fn.warmup(x, y, n, BLOCK=256, grid=(4,))     # compiles, launches nothing
    >>> s = static_kernel(k)                               # loads the cubin (no C compiler)
    >>> s.launch((4, 1, 1), (x, y, n, 256))                # all of fn's arguments, in order
"""
from __future__ import annotations

import logging
import operator
import os
import sys
import tempfile

import torch

from ... import cxx_modules
from . import config

_LAUNCHER = getattr(torch._C, "_StaticCudaLauncher", None)

# A scalar parameter's Triton type -> the launcher's type character.
_SCALARS = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l",
            "u1": "I", "u8": "B", "u16": "H", "u32": "I", "u64": "K",
            "fp32": "f", "f32": "f", "fp64": "d"}

# Kernels loaded for torch's launcher, and kernels it declined (tests read it).
STATS = {"loaded": 0, "declined": 0}
_ATTR = "_frametrace_static"        # on a CompiledKernel: {device: StaticKernel or None}


class StaticKernel:
    """One compiled kernel loaded on one device, launched through torch's launcher."""
    __slots__ = ("function", "num_warps", "shared", "types", "passed", "extra", "pick")

    def __init__(self, function, num_warps, shared, types, passed, extra):
        self.function, self.num_warps, self.shared = function, num_warps, shared
        self.types = types          # one character per argument passed, scratch pointers too
        self.passed = passed        # positions of the Python arguments the kernel takes
        self.extra = extra          # None for each scratch pointer the kernel takes (last)
        assert len(types) == len(passed) + len(extra)
        # (one C call per launch; itemgetter of one position gives the item, not a tuple)
        self.pick = operator.itemgetter(*passed) if len(passed) > 1 else None

    def args_of(self, args) -> tuple:
        """The arguments the kernel takes, from all of its Python function's."""
        if self.pick is not None:
            return self.pick(args) + self.extra
        return tuple(args[i] for i in self.passed) + self.extra

    @staticmethod
    def launcher():
        """torch's launch function: (function, grid x, y, z, warps, shared memory, types,
        arguments, stream)."""
        return _LAUNCHER._launch_kernel

    def launch(self, grid, args, stream=None):
        g = tuple(grid) + (1, 1)
        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream
        _LAUNCHER._launch_kernel(self.function, g[0], g[1], g[2], self.num_warps, self.shared,
                                 self.types, self.args_of(args), stream)


def static_kernel(compiled, device: int | None = None) -> StaticKernel | None:
    """`compiled` loaded for torch's launcher on `device` (default: the current one), or
    None where Triton's own launcher must run it (see the module's docstring)."""
    if not config.static_launch or _LAUNCHER is None or _hooked() or \
            not isinstance(getattr(compiled, "asm", None), dict):
        return None             # (not a CompiledKernel of Triton's: a test's stand-in)
    if device is None:
        device = torch.cuda.current_device()
    per_device = getattr(compiled, _ATTR, None)
    if per_device is None:
        per_device = {}
        try:
            setattr(compiled, _ATTR, per_device)
        except AttributeError:
            return None
    if device not in per_device:
        per_device[device] = _load(compiled, device)
        STATS["loaded" if per_device[device] is not None else "declined"] += 1
    return per_device[device]


def launch_key(blocks, args) -> tuple | None:
    """What Triton specializes a launch of these arguments on, with the current device
    and the kernel's block sizes and warps (`blocks`, hashable): a launch whose key equals
    an earlier one's runs the kernel Triton compiled then (wrapper.Launcher's memo).  None
    where torch's launcher would not run it (no CUDA tensor, an argument of another kind,
    launch hooks, config.static_launch off).  Tensors: dtype and 16-byte alignment of the
    data pointer; ints: being 1 (a constexpr for Triton), a multiple of 16, and their
    width (int32, int64, uint64); floats, bools and None: their type."""
    if _LAUNCHER is None or not config.static_launch:
        return None
    if config.launch_keys_in_cxx and _KEYS is not None:
        codes = _KEYS.codes(args)
        if codes is None or _hooked():
            return None
        if codes is not NotImplemented:     # (else a tensor's reads may run Python code)
            return (_current_device(), blocks, codes)
    spec = [None, blocks]
    cuda = False
    for a in args:
        kind = type(a)
        if kind is _Tensor or isinstance(a, _Tensor):
            if not a.is_cuda:
                return None
            cuda = True
            spec.append((a.dtype, a.data_ptr() & 15 == 0))
        elif kind is int:
            spec.append((a == 1, a & 15 == 0, 0 if -0x80000000 <= a <= 0x7fffffff else
                         1 if -0x8000000000000000 <= a <= 0x7fffffffffffffff else 2))
        elif kind is float or kind is bool or a is None:
            spec.append(kind)
        else:
            return None
    # (the device asked only now: torch's CUDA builds on a machine without a driver have
    # the launcher, and asking raises there; CPU tensors never get this far)
    if not cuda or _hooked():
        return None
    spec[0] = _current_device()
    return tuple(spec)


_Tensor = torch.Tensor
# The same key's argument entries read in C++ (launch_keys.cpp): one `bytes` object, equal
# exactly when the entries above are; it never equals a key made here (a tuple of
# argument entries), so a launcher's memo may hold both kinds.
_KEYS = cxx_modules.load("_launch_keys", logging.getLogger("frametrace"), "launch keys in Python")


def _current_device() -> int:
    get = getattr(torch._C, "_cuda_getDevice", None)
    return get() if get is not None else torch.cuda.current_device()


def current_raw_stream(device: int):
    """The current CUDA stream of `device`, as the launcher takes it."""
    return torch._C._cuda_getCurrentRawStream(device)


def _hooked() -> bool:
    """A launch hook is set (a profiler's): only Triton's launcher calls it.  (Once per
    launch where a launcher's memo runs it: kept to a few attribute reads.)"""
    knobs = getattr(sys.modules.get("triton"), "knobs", None)   # (no triton loaded: no hooks)
    if knobs is None:
        return False
    runtime = knobs.runtime
    return _set(runtime.launch_enter_hook) or _set(runtime.launch_exit_hook)


def _set(hook) -> bool:
    # (Triton 3.5+: a chain of hooks, set when it holds any; before: a function or None)
    return hook is not None and (getattr(hook, "calls", None) is None or bool(hook.calls))


def _load(compiled, device):
    md, src = compiled.metadata, compiled.src
    cubin = getattr(compiled, "asm", {}).get("cubin")
    if cubin is None or getattr(md, "num_ctas", 1) != 1 or getattr(md, "tensordesc_meta", None) or \
            getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False) or \
            any(d not in (None, 1) for d in (getattr(md, "cluster_dims", None) or ())):
        return None
    extra = ()
    for size in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(md, size):
            if getattr(md, size):
                return None         # (Triton's launcher allocates it)
            extra += (None,)        # the kernel takes the pointer, unused: null
    names = list(src.fn.arg_names)
    constants = {k[0] if isinstance(k, tuple) else (names.index(k) if isinstance(k, str) else k)
                 for k in (getattr(src, "constants", None) or {})}
    types, passed = "", []
    for i, (name, ty) in enumerate(src.signature.items()):
        if names.index(name) != i:
            return None
        if ty == "constexpr" or i in constants:
            continue
        if ty.startswith("*"):
            types += "O"
        elif ty in _SCALARS:
            types += _SCALARS[ty]
        else:
            return None             # 16-bit scalars, tensor descriptors
        passed.append(i)
    # The launcher reads the cubin from a file once, when it loads it.
    fd, path = tempfile.mkstemp(prefix="frametrace-", suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        loaded = _LAUNCHER._load_kernel(path, src.fn.__name__, md.shared, device)
    finally:
        os.unlink(path)
    # (module, function, registers, spills) from torch 2.13 on, (function, ...) before
    function = loaded[1] if len(loaded) == 4 else loaded[0]
    return StaticKernel(function, md.num_warps, md.shared, types + "O" * len(extra), tuple(passed), extra)

