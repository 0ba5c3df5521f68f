"""Stances: what optimized calls do for a while, as torch.compiler.set_stance says it.

    with frametrace.set_stance("force_eager"):
        model(x)                       # plain CPython: nothing compiled, no entry used
    frametrace.set_stance("fail_on_recompile")   # after warm-up: a compile raises

- "default": compile on a miss, as usual.
- "force_eager": every optimized call runs as plain CPython (the C hook's Hooked
  wrapper decides, before any entry is looked at).
- "eager_on_recompile": entries that fit still run; a miss runs in CPython and
  compiles nothing.
- "fail_on_recompile": entries that fit still run; a miss raises `RecompileError`,
  naming, for each entry of the frame, the guard that failed.

`torch.compiler.set_stance(...)` is honoured too while frametrace's own stance is
"default": torch keeps its stance in the module global `_stance` of
torch._dynamo.eval_frame (a DynamoStance, replaced by each set_stance), read here only
once the program has imported that module: frametrace never imports torch._dynamo.
torch's "eager_then_compile" stances have no frametrace meaning and count as
"default".
"""
from __future__ import annotations

import functools
import sys

from . import _C

STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile")
_CODES = {"default": 0, "force_eager": 1}       # (the C hook's: 2 for the others)
_own = "default"


class RecompileError(RuntimeError):
    """A call would compile under the "fail_on_recompile" stance.  `reasons`: for each
    compiled entry of the frame (most recent first), the guard that failed, in words."""

    def __init__(self, message, reasons=()):
        super().__init__(message)
        self.reasons = list(reasons)


def _set(stance: str) -> str:
    global _own
    if stance not in STANCES:
        raise ValueError(f"unknown stance {stance!r}; frametrace knows {', '.join(STANCES)}")
    prior, _own = _own, stance
    _C.set_own_stance(_CODES.get(stance, 2))
    return prior


class set_stance:
    """``frametrace.set_stance(stance)``: as a plain call, the stance from now on; as a
    context manager, for the block (the stance before comes back at its end); as a
    decorator, for each call of the function.  See the module's docstring."""

    def __init__(self, stance: str = "default"):
        self.stance = stance
        self.prior = _set(stance)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _set(self.prior)
        return False

    def __call__(self, fn):
        _set(self.prior)            # (decorating sets nothing: each call does)
        stance = self.stance

        @functools.wraps(fn)
        def with_stance(*args, **kwargs):
            with set_stance(stance):
                return fn(*args, **kwargs)
        return with_stance

    def __repr__(self):
        return f"frametrace.set_stance({self.stance!r})"


def torch_stance() -> str:
    """torch.compiler.set_stance's current stance ("default" until torch._dynamo is
    imported: only its set_stance can change it)."""
    frames = sys.modules.get("torch._dynamo.eval_frame")
    stance = getattr(getattr(frames, "_stance", None), "stance", "default")
    return stance if stance in STANCES else "default"


def current() -> str:
    """The stance in effect: frametrace's own, or torch's where ours is "default"."""
    return _own if _own != "default" else torch_stance()
