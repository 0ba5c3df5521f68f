"""Triton functions from kernel source: compiled once per source, with the run-time
checks of a kernel that has them (debug mode; eager's exception from Triton's
interpreter).  A leaf: the kernel source generator, the wrapper and rng load kernels
through it."""
from __future__ import annotations

import dataclasses

import linecache
import re
import sys

import torch

from . import config
from .static_launch import static_kernel

_JITTED: dict = {}   # source -> Triton function


def load_kernel(name: str, source: str):
    fn = _JITTED.get(source)
    if fn is None:
        import triton  # (lazy: Triton loads with the first kernel, never at import)
        import triton.language as tl  # (lazy: as above)
        # Triton reads a kernel's source back through `inspect`, hence linecache.
        filename = f"<frametrace-triton {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        ns = {"triton": triton, "tl": tl, "__name__": "frametrace_triton_kernels"}
        exec(compile(source, filename, "exec"), ns)
        fn = ns[name]
        if "tl.device_assert(" in source:
            fn = Checked(fn)
        _JITTED[source] = fn
    return fn


def build_kernel(fn, grid, args, kwargs):
    """Compile `fn` (a Triton function or a Checked one) for these arguments and
    constexprs without launching it: the compile its first launch would make, with the
    same options, so that the launch finds it in Triton's cache."""
    if isinstance(fn, Checked):
        fn, kwargs = fn.fn, dict(kwargs, debug=True, sanitize_overflow=False)
    compiled = fn.warmup(*args, grid=grid, **kwargs)
    # The module load (and, for Triton's launcher, the C launcher of its signature: a C
    # compiler run, once per signature a process meets), otherwise made at its first
    # launch, one after another.
    if _static(fn, args) and static_kernel(compiled) is not None:
        return
    init = getattr(compiled, "_init_handles", None)
    if init is not None:
        init()


def launch(fn, grid, args, kwargs):
    """``fn[grid](*args, **kwargs)`` for `fn` (a Triton function or a Checked one),
    through torch's launcher where it runs the compiled kernel (static_launch.py), with
    Triton's otherwise; returns the compiled kernel."""
    return launch_static(fn, grid, args, kwargs)[0]


def launch_static(fn, grid, args, kwargs):
    """`launch`, returning (the compiled kernel, the StaticKernel that launched it or None
    where Triton's launcher did)."""
    base, options = (fn.fn, dict(kwargs, debug=True, sanitize_overflow=False)) \
        if isinstance(fn, Checked) else (fn, kwargs)
    if _static(base, args):
        compiled = base.warmup(*args, grid=grid, **options)
        kernel = static_kernel(compiled)
        # (every argument the kernel takes given by position, as the wrapper does)
        if kernel is not None and (not kernel.passed or kernel.passed[-1] < len(args)):
            kernel.launch(grid, args)
            return compiled, kernel
    return fn[grid](*args, **kwargs), None


def _static(fn, args) -> bool:
    """Whether torch's launcher may run `fn`'s kernels for these arguments (CUDA
    tensors, Triton's JIT, not its interpreter)."""
    if not config.static_launch:
        return False
    jit = sys.modules.get("triton.runtime.jit")     # (loaded with any Triton function)
    return jit is not None and isinstance(fn, jit.JITFunction) and \
        any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


# The exception eager raises for each check a kernel makes (kernel_source.check's messages
# start with its name): a failed check raises it from the launch.
_CHECK_ERRORS = {"IndexError": IndexError, "RuntimeError": RuntimeError}


class Checked:
    """A kernel with run-time checks (`tl.device_assert`).  Triton compiles them only in
    debug mode, so it launches in debug mode (without Triton's own integer-overflow checks,
    as Inductor's: Philox and wrapped index arithmetic overflow on purpose).  On CUDA a
    failed check is a device-side assert, as in eager and Inductor; in Triton's
    interpreter it raises eager's exception from the launch."""
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        from triton.runtime import interpreter  # (lazy: Triton, at the first launch)
        launch = self.fn[grid]
        if not isinstance(self.fn, interpreter.InterpretedFunction):
            return lambda *args, **kwargs: launch(*args, debug=True, sanitize_overflow=False, **kwargs)

        def run(*args, **kwargs):
            builder = interpreter.interpreter_builder
            saved = builder.options
            builder.options = dataclasses.replace(saved, debug=True, sanitize_overflow=False)
            try:
                return launch(*args, **kwargs)
            except Exception as e:
                error = _check_error(e)
                if error is None:
                    raise
                error.frametrace_check = True  # (not a kernel that failed to launch)
                raise error from e
            finally:
                builder.options = saved
        return run


def _check_error(e: Exception):
    """Eager's exception for a failed check in Triton's interpreter (which raises an
    AssertionError with the check's message, wrapped in its own errors), or None."""
    m = _FAILED_CHECK.search(str(e))
    return _CHECK_ERRORS[m.group(1)](m.group(2)) if m else None


_FAILED_CHECK = re.compile(r"""AssertionError\(['"](%s): ([^'"\n]*)""" % "|".join(_CHECK_ERRORS))
