"""When a code object has compiled enough entries that a miss runs in CPython.

One code object serves every instance of a class: each nn.Module's forward, each
optimizer's step and torch.optim's step wrappers, a training step called with one of
several models.  Instances differ in what the guards check (a module held across a
graph break is guarded by identity; each layer's optimizer has its parameters' shapes),
so such a code gets entries per instance, one or two each, and sixteen models or
per-layer optimizers would pass any small fixed limit although none recompiles more
than the first did.  As torch.compile does for modules (a recompile limit per
identity-matched object, and an accumulated limit), `config.cache_size_limit` counts
the entries made for the same instances among the frame's arguments as this call's, and
`config.accumulated_cache_size_limit` caps all entries of a code.  Every entry keeps its
whole set of guards: the count decides only when to stop compiling.
"""
from __future__ import annotations

import sys
import warnings
import weakref

import torch

from . import _C, config

# Classes whose instances typically share code: methods of nn.Modules and optimizers,
# torch.optim's step wrappers (which take the optimizer as `*args`' first item).
INSTANCE_TYPES = (torch.nn.Module, torch.optim.Optimizer)


def instances_of(code, args) -> tuple:
    """The instances among a frame's arguments, as (slot, index in a `*args` tuple or
    None, weak reference): what a new entry of `code` is attributed to."""
    found = []
    for slot, value in enumerate(args):
        if type(value) is tuple and value and code.co_flags & _VARARGS and \
                slot == code.co_argcount + code.co_kwonlyargcount:
            value, index = value[0], 0
        else:
            index = None
        if issubclass(type(value), INSTANCE_TYPES):   # (isinstance would ask the object)
            try:
                found.append((slot, index, weakref.ref(value)))
            except TypeError:
                pass
    return tuple(found)


def exceeded(code, args, n_entries: int) -> bool:
    """Whether this miss of `code` (its arguments `args`, `n_entries` cached) is past the
    limits: no more compiling for it."""
    if n_entries < config.cache_size_limit:
        return False
    if n_entries >= config.accumulated_cache_size_limit:
        return True
    return _count_same(code, args) >= config.cache_size_limit


def warn(code, n_entries: int, reasons):
    """Once per code: it reached the limit.  Names the function (where its `def` is),
    why it compiled the last time (`reasons`: each entry's failed guard, most recent
    first), and how to see every recompile; reported at the user's line that made the
    call (the first frame outside frametrace, torch and the standard library), not
    at whatever torch or frametrace frame happened to call it."""
    last = f" The last miss: {reasons[0]}." if reasons else ""
    warnings.warn(
        f"frametrace: {code.co_qualname} ({code.co_filename}:{code.co_firstlineno}) reached "
        f"the cache limit with {n_entries} compiled entries (config.cache_size_limit = "
        f"{config.cache_size_limit}, config.accumulated_cache_size_limit = "
        f"{config.accumulated_cache_size_limit}); calls that match none of them now run "
        f"in CPython.{last} FRAMETRACE_LOGS=recompiles logs the reason of every recompile.",
        stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel, from its caller, of the first frame in user code."""
    from .convert import is_skipped_file  # (lazy: import cycle, to break)
    level, frame = 1, sys._getframe(1)      # (level 1: our caller, which calls warn)
    while frame is not None and is_skipped_file(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 1


def _count_same(code, args) -> int:
    """Entries made for this call's instances (an entry made for none counts for every
    call, so a code that takes no instance keeps the plain limit)."""
    n = 0
    for entry in _C.entries(code):
        made_for = getattr(entry.check, "instances", ())
        if all(_argument(args, slot, index) is ref() for slot, index, ref in made_for):
            n += 1
    return n


def _argument(args, slot, index):
    value = args[slot] if slot < len(args) else None
    if index is not None:
        value = value[index] if type(value) is tuple and len(value) > index else None
    return value


_VARARGS = 0x04
