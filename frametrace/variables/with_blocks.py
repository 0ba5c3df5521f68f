"""What a `with` statement asks of the object it enters, beyond the contexts of
`contexts`: a user class's own __enter__/__exit__ (its instances are the attribute
protocol's, a kind above contexts), and whether a graph break may split the block."""
from __future__ import annotations

import _thread
import types

from .attributes import InstanceAttrs
from .base import unsupported
from .classes import class_attr
from .contexts import (GeneratorContextVar, LockContextVar, NullContextVar, RunTimeContextVar,
                       UserContextVar)

# The locks `with` takes for real while tracing (LockContextVar), an object from
# outside the frame (its source reloads it at a break).
LOCK_TYPES = (_thread.LockType, _thread.RLock)


def user_context(tx, obj):
    """The context Var for `with obj:` over an instance of a user class, else None."""
    if type(getattr(obj, "value", None)) in LOCK_TYPES and obj.source is not None:
        return LockContextVar(obj)
    if not isinstance(obj, InstanceAttrs):
        return None
    cls = obj.instance_class()
    enter, exit_ = class_attr(tx, cls, "__enter__"), class_attr(tx, cls, "__exit__")
    if enter is None or exit_ is None:
        unsupported(f"TypeError: {cls.__name__!r} object does not support the context manager protocol")
    if not isinstance(enter, types.FunctionType) or not isinstance(exit_, types.FunctionType):
        unsupported(f"'with' over {cls.__name__}, whose __enter__/__exit__ is not a Python function")
    return UserContextVar(obj, enter, exit_)


def check_break_at_with(ctx):
    """A graph break at a `with` (CPython enters the context, the block goes on in a
    resume function) is for contexts frametrace models, whose block it could not hand
    over: a `with` over anything else runs its whole frame in CPython, as torch.compile
    does."""
    if isinstance(ctx, NullContextVar) and ctx.remakable():
        return
    if not isinstance(ctx, (InstanceAttrs, GeneratorContextVar, RunTimeContextVar)):
        unsupported(f"a graph break at 'with' over {ctx}")
