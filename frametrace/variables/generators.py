"""The generators of inlined generator functions.

A generator made by a traced call runs its body lazily, as CPython's: up to the next
yield on each next() or send(), in the child interpreter the call made (`tx` hands
it over; this module does not know the interpreter), which unwinds at a yield with
`exc.Yield`.
"""
from __future__ import annotations

import sys

from ..exc import Yield
from .base import unsupported
from .iterators import LazyIteratorVar
from .constant import ConstVar, MethodVar
from .containers import DictVar, ListVar, TupleVar
from .exceptions import ExceptionVar, TracedRaise, exception_type
from .operators import is_none

# 3.11 turns a StopIteration leaving a generator into RuntimeError in gen_send_ex; 3.12
# compiles a handler into the generator (CALL_INTRINSIC_1 INTRINSIC_STOPITERATION_ERROR).
_STOPITERATION_IN_GEN_SEND = sys.version_info < (3, 12)

_GENERATOR = type((lambda: (yield))())


def stop_iteration_error(tx, exc):
    """PEP 479: a StopIteration leaving a generator's frame becomes a RuntimeError."""
    error = ExceptionVar(RuntimeError, [ConstVar("generator raised StopIteration")])
    error.cause = error.context = exc
    error.suppress = True
    raise TracedRaise(error, fresh=False)


class InlinedGeneratorVar(LazyIteratorVar):
    """A generator of an inlined generator function.  Its body runs lazily, as
    CPython's, up to the next yield on each next() or send(), so no item is computed
    that the caller does not consume."""
    __slots__ = ("child", "pure", "started", "finished", "returned", "maker", "remade")

    def __init__(self, child, pure: bool):
        self.child = child
        self.pure = pure
        self.started = self.finished = False
        self.returned = ConstVar(None)
        # (function, args, kwargs) of the call that made it, where the caller knows:
        # a generator that never ran is made again by that call in the transformed code.
        self.maker = None
        self.remade = False
        super().__init__(self._items(), _GENERATOR)

    def _items(self):
        while True:
            v = self.resume(self.child, ConstVar(None))
            if v is None:
                return
            yield v

    def resume(self, tx, sent):
        """Run to the next yield (its value) or the return (None) with `sent` as the
        value of the yield it was suspended at."""
        if self.index < len(self.items):
            unsupported("send() to a generator a graph break pulled ahead")
        if self.finished:
            return None
        if self.started:
            self.child.stack[-1] = sent
        elif not is_none(sent):
            unsupported("can't send non-None value to a just-started generator (TypeError)")
        self.started = True
        if not self.pure:
            self.child.root.code_runs += 1
        try:
            returned = self.child.run()
        except Yield as y:
            return y.value
        except TracedRaise as r:
            self.finished = True
            if _STOPITERATION_IN_GEN_SEND and issubclass(exception_type(r.exc), StopIteration):
                stop_iteration_error(self.child, r.exc)
            raise
        self.finished = True
        self.returned = returned
        return None

    def freeze(self, tx):
        if not self.started and self.maker is not None:
            # Nothing of its body ran: the caller gets a generator made by the same call,
            # whose body runs when (and as far as) the caller consumes it, as in CPython.
            # Its arguments are what the call was given (an iterator among them outlives
            # the trace too).
            for v in (*self.maker[1], *self.maker[2].values()):
                freeze_returned_iterators(tx, v)
            self.remade = True
            return
        super().freeze(tx)
        if not is_none(self.returned):
            # (the rebuilt generator would end with StopIteration(None))
            unsupported("returning a generator that ends with a return value")

    def reconstruct(self, cg):
        if not self.remade:
            return super().reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        fn, args, kwargs = self.maker
        cg.call_const_packed(call_with, [fn.reconstruct], args, kwargs)
        cg.keep_rebuilt(self)

    def next(self):
        if self.remade:
            unsupported("a generator the frame returns, consumed after the return was traced")
        return super().next()

    def getattr(self, tx, name):
        if name == "send":
            return MethodVar(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "send" and len(args) == 1 and not kwargs:
            v = self.resume(tx, args[0])
            if v is None:
                unsupported("send() to a generator that returned (StopIteration)")
            return v
        return super().call_method(tx, name, args, kwargs)


def call_with(fn, args, kwargs):
    return fn(*args, **kwargs)


def freeze_returned_iterators(tx, v, depth=0):
    """Iterators the frame returns (in tuples, lists and dicts too) outlive the trace."""
    if isinstance(v, LazyIteratorVar):
        v.freeze(tx)
    elif depth < 8 and isinstance(v, (TupleVar, ListVar)):
        for item in v.items:
            freeze_returned_iterators(tx, item, depth + 1)
    elif depth < 8 and type(v) is DictVar:
        for item in v.items.values():
            freeze_returned_iterators(tx, item, depth + 1)
