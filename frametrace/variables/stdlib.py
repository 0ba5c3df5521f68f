"""Standard-library callables with meaning while tracing (functools, itertools,
collections, ...).  Each handler takes (tx, args, kwargs) and returns a Var, or None
to say it does not apply (the call is then unsupported)."""
from __future__ import annotations

import functools
import itertools

from .base import unsupported
from .containers import ListVar, TupleVar
from .objects import ObjectVar


class LibraryFnVar(ObjectVar):
    """A standard-library function whose call is handled in LIBRARY_HANDLERS."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        result = LIBRARY_HANDLERS[self.value](tx, args, kwargs)
        if result is None:
            unsupported(f"{getattr(self.value, '__qualname__', self.value)}() with these arguments")
        return result


def _reduce(tx, args, kwargs):
    if kwargs or len(args) not in (2, 3):
        return None
    fn, items = args[0], args[1].unpack(tx)
    if len(args) == 3:
        acc = args[2]
    elif items:
        acc, items = items[0], items[1:]
    else:
        return None
    for item in items:
        acc = fn.call(tx, [acc, item], {})
    return acc


def _chain(tx, args, kwargs):
    if kwargs:
        return None
    out = []
    for a in args:
        out.extend(a.unpack(tx))
    return ListVar(out)


LIBRARY_HANDLERS = {
    functools.reduce: _reduce,
    itertools.chain: _chain,
}


def library_var(value, source):
    """The Var for `value` if it is a handled library callable, else None."""
    try:
        if value in LIBRARY_HANDLERS:
            return LibraryFnVar(value, source)
    except TypeError:      # unhashable
        pass
    return None


__all__ = ["LIBRARY_HANDLERS", "LibraryFnVar", "library_var", "TupleVar"]
