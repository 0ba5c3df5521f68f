"""The state of one graph's compile that is not IR: the size hints of its shape symbols,
the ranges of the iteration variables of the kernel being generated, and the record of
FX nodes a kernel's generation runs.  `backend.build` makes one per compile and hands it
to the lowering (`GraphLowering.ctx`), which the scheduler, the kernel source generator
(`KernelCodegen.ctx`) and the wrapper read it from.

The index helpers (indexing.py) are plain functions called from inside every lowering's
code generator, which has no context to pass: they read the one `active()` in this
thread.  A `ContextVar` (not a module global) keeps two compiles, in two threads or one
nested in the other, from seeing each other's symbols and ranges."""
from __future__ import annotations

import contextlib
import contextvars

from .derived import Derived


class CompileContext:
    """`hints`: {shape symbol: the ShapeEnv's value}, block sizes and persistent reductions
    are chosen for these (the code is correct for any value); empty for static shapes.
    `ranges`: {iteration variable: its exclusive upper bound} in the kernel being
    generated, which index simplification relies on.  `record`: while a set, the FX nodes
    whose code a kernel's generation runs are added to it (fallback.kernel_nodes).
    `memo`: the index helpers' results in this compile (indexing.memoized), keyed on their
    arguments and the ranges they were computed under.  `derived`: the opaque symbols
    that stand for this compile's non-polynomial sizes (derived.py), with their sources."""
    __slots__ = ("hints", "ranges", "record", "memo", "derived")

    def __init__(self):
        self.hints: dict = {}
        self.ranges: dict = {}
        self.record: set | None = None
        self.memo: dict = {}
        self.derived = Derived()

    @contextlib.contextmanager
    def active(self):
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("frametrace_triton_compile", default=None)


def current() -> CompileContext:
    """The compile running in this thread.  Outside one there are no symbols to hint and
    no kernel whose ranges to use: asking is a bug, not an empty answer."""
    ctx = _ACTIVE.get()
    if ctx is None:
        raise RuntimeError("triton backend: index helpers used outside a compile (no CompileContext active)")
    return ctx
