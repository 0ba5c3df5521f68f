"""Iterators while tracing: `LazyIteratorVar` pulls items from a Python generator over
Vars (what builtins and itertools make: map, zip, enumerate, islice ...), so that
functions passed to map/filter run when the item is consumed and infinite iterators
work under islice/zip; `ListIteratorVar` and `DictIteratorVar` read their container
live, as CPython's do; an iterator the frame returns or hands over at a graph break is
made again at run time (`rebuild_live_iterator`)."""
from __future__ import annotations

import itertools

from .base import Var, raise_builtin, unsupported, wrap
from .constant import ConstVar, MethodVar
from .containers import (DictVar, DictViewVar, IteratorVar, ListVar, TupleVar, live_keys,
                         note_live_read)
from ..resume_codes import private_lists
from ..source import CallMethodSource, GetItemSource, LocalSource

# An iterator unpacked whole (list(it), sorted(it) ...) may yield at most this many
# items: past it, it is taken for an infinite one.
MAX_UNPACK = 100_000


class LazyIteratorVar(IteratorVar):
    """An iterator whose items come from `gen`, a Python iterator of Vars (a generator
    that may call traced functions, add graph nodes, or never end)."""
    __slots__ = ("gen", "kind", "frozen")

    def __init__(self, gen, kind=None):
        Var.__init__(self, None)
        self.items = []
        self.index = 0
        self.gen = gen
        self.kind = kind
        self.frozen = False

    def python_type(self):
        if self.kind is None:
            unsupported("type of an iterator")
        return self.kind

    def next(self):
        if self.index < len(self.items):      # pulled ahead by remaining()
            self.index += 1
            return self.items[self.index - 1]
        try:
            return next(self.gen)
        except StopIteration:
            return None

    def remaining(self, tx) -> list:
        # Pulling the rest now moves it before the breaking instruction: right only
        # when no code of the program runs for it (map's function, a generator's body
        # with effects), which would then run early, or for items never consumed.
        # And what is left of a list or dict it reads live is a snapshot then: right
        # only when nothing can change that container later.
        root = tx.root
        before = root.code_runs
        outer, root.live_reads = root.live_reads, []
        try:
            self.items = self.items[self.index:] + self._pull_all()
        finally:
            reads, root.live_reads = root.live_reads, outer
        if outer is not None:
            outer.extend(reads)
        self.index = 0
        if root.code_runs != before:
            unsupported("a graph break in a loop over an iterator that runs code of the "
                        "program for its items (map, filter, a generator)")
        if any(_reachable(tx, c) for c in reads):
            unsupported("a graph break in a loop over an iterator that reads a list or dict "
                        "the frame can still change")
        return self.items

    def unpack(self, tx):
        rest = self.items[self.index:] + self._pull_all()
        self.items, self.index = [], 0
        return rest

    def _pull_all(self):
        out = []
        for v in self.gen:
            out.append(v)
            if len(out) > MAX_UNPACK:
                unsupported(f"iterator gave more than {MAX_UNPACK} items (infinite?)")
        return out

    def length(self, tx):
        unsupported("len() of an iterator")

    def truth(self, tx):
        return True

    def getattr(self, tx, name):
        if name in ("__next__", "__iter__"):
            return MethodVar(self, name)
        unsupported(f"attribute {name!r} of an iterator")

    def call_method(self, tx, name, args, kwargs):
        if name == "__iter__" and not args and not kwargs:
            return self
        if name == "__next__" and not args and not kwargs:
            return _next_or_fail(self)
        unsupported(f"iterator.{name}")

    def freeze(self, tx):
        """The frame returns this iterator: what it has left is pulled now, when that
        computes nothing (no graph op, no code of the program), so that the iterator the
        caller gets yields the same objects, of the same type.  A live iterator (over a
        list or dict) is rebuilt over its containers instead."""
        if self.handover() is not None:
            self.remaining(tx)              # (its checks: a dict changed size ...)
            return
        if self.kind not in _REBUILD:
            unsupported(f"returning a {getattr(self.kind, '__name__', 'lazy')} iterator from a compiled frame")
        ops = tx.output.op_count()
        self.remaining(tx)
        if tx.output.op_count() != ops:
            unsupported("returning an iterator whose items are computed as it is consumed")
        self.frozen = True

    def reconstruct(self, cg):
        if cg.load_rebuilt(self):
            return
        live = self.handover()
        if live is not None:
            cg.call_const(rebuild_live_iterator, [lambda cg: cg.load_const(live[0]), live[1].reconstruct])
        elif self.frozen:
            rest = self.items[self.index:]

            def push_rest(cg):
                for v in rest:
                    v.reconstruct(cg)
                cg.build(list, len(rest))
            cg.call_const(_REBUILD[self.kind], [push_rest])
        else:
            unsupported("returning an iterator from a compiled frame")
        cg.keep_rebuilt(self)

    def noun(self):
        return f"a {getattr(self.kind, '__name__', None) or 'iterator'} iterator"

    def __repr__(self):
        return f"LazyIteratorVar({getattr(self.kind, '__name__', '?')})"


# Iterators of each kind over given items (what a returned iterator had left): the
# same type as the original, yielding the same objects.
def _replay(items):
    yield from items


def _enumerate_rows(rows):
    return enumerate([v for _, v in rows], rows[0][0]) if rows else enumerate(())


def _range_iterator(items):
    """What is left of a range iterator, as one: its items are in steps of one size."""
    if not items:
        return iter(range(0))
    step = items[1] - items[0] if len(items) > 1 else 1
    return iter(range(items[0], items[-1] + step, step))


_REBUILD = {
    type(iter([])): iter, type(iter(())): lambda items: iter(tuple(items)),
    type(iter(range(0))): _range_iterator,
    type(reversed([])): lambda items: reversed(items[::-1]),
    zip: lambda rows: zip(*zip(*rows)) if rows else zip(),
    map: lambda items: map(_identity, items), filter: lambda items: filter(_always, items),
    enumerate: _enumerate_rows,
    type(_replay(())): _replay,
    itertools.islice: lambda items: itertools.islice(items, None),
    itertools.chain: itertools.chain,
}


def _identity(v):
    return v


def _always(v):
    return True


def rebuild_live_iterator(kind: str, state):
    """At run time: the live iterator a frame returns, made anew over its containers at
    the position the trace left it (the kinds of IteratorVar.handover)."""
    what, _, rest = kind.partition(":")
    if what == "l":
        seq, pos = state
        it = iter(seq)
        it.__setstate__(pos)
        return it
    if what == "d":
        d, pos = state
        it = iter(d if rest == "keys" else getattr(d, rest)())
        for _ in range(pos):
            next(it)
        return it
    if what == "e":
        inner, count = state
        return enumerate(rebuild_live_iterator(rest, inner), count)
    if what == "z":
        return zip(*(rebuild_live_iterator(k, s) for k, s in zip(rest.split(";"), state)))
    raise AssertionError(kind)


class ListIteratorVar(LazyIteratorVar):
    """iter(a list): reads the live list by index, so items appended while a loop runs
    are seen (CPython's list iterator).  A graph break hands over the list itself and the
    position, which the resume function restores with __setstate__."""
    __slots__ = ("seq", "pos")

    def __init__(self, seq: ListVar, tx):
        self.seq = seq
        self.pos = 0
        super().__init__(self._pull(tx), type(iter([])))

    def _pull(self, tx):
        while True:
            note_live_read(tx, self.seq)
            if self.pos >= len(self.seq.items):
                return
            self.pos += 1
            yield self.seq.items[self.pos - 1]

    def remaining(self, tx) -> list:
        return []               # nothing pulled: handed over live

    def handover(self):
        return "l", TupleVar([self.seq, ConstVar(self.pos)])

    def getattr(self, tx, name):
        if name == "__setstate__":
            return MethodVar(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__setstate__" and len(args) == 1 and not kwargs:
            self.pos = max(0, min(const_key(args[0], "list iterator position"), len(self.seq.items)))
            return ConstVar(None)
        return super().call_method(tx, name, args, kwargs)


class OuterListIteratorVar(ListIteratorVar):
    """A list iterator from outside the frame (an argument): it reads its list (guarded
    as any list of the frame's) from its position (guarded).  What the trace consumes
    is a side effect, replayed on the real iterator, which stays the one object the
    caller holds: it is never rebuilt, pulled ahead or handed over anew."""
    __slots__ = ("exhausted",)

    def __init__(self, seq: ListVar, pos: int, source, tx):
        super().__init__(seq, tx)
        self.pos = pos                  # (the generator above has not started yet)
        self.source = source
        self.exhausted = False

    def _pull(self, tx):
        for item in super()._pull(tx):
            tx.side_effects.advance_iterator(self)
            yield item
        # CPython drops the list of an exhausted iterator: it stays exhausted.
        self.exhausted = True
        tx.side_effects.advance_iterator(self)

    def handover(self):
        return None

    def remaining(self, tx) -> list:
        unsupported("pulling ahead what is left of an iterator from outside the frame")

    def freeze(self, tx):
        pass                            # returned as itself, its position replayed

    def reconstruct(self, cg):
        self.source.reconstruct(cg)

    def call_method(self, tx, name, args, kwargs):
        if name == "__setstate__":
            unsupported("__setstate__ of an iterator from outside the frame")
        return super().call_method(tx, name, args, kwargs)


def advance_iterator(it, pos, exhausted):
    """At run time: the caller's list iterator where the trace left it."""
    it.__setstate__(pos)
    if exhausted:
        for _ in it:
            pass


def wrap_outer_list_iterator(tx, it, source):
    """A list iterator read from the frame, or None where it cannot be followed (one
    already exhausted has no list left to read)."""
    state = it.__reduce__()
    if len(state) != 3 or type(state[1][0]) is not list:
        return None
    tx.guards.type_match(source, it)
    reduced = CallMethodSource(source, "__reduce__")
    tx.guards.equals(GetItemSource(reduced, 2), state[2])
    seq = wrap(tx, state[1][0], GetItemSource(GetItemSource(reduced, 1), 0))
    if not isinstance(seq, ListVar):
        return None
    var = OuterListIteratorVar(seq, state[2], source, tx)
    tx.output.object_vars[id(it)] = (it, var)
    return var


class DictIteratorVar(LazyIteratorVar):
    """iter(a dict) or iter(d.keys() / .values() / .items()): live, as CPython's.  A
    graph break hands over the dict and the number of items taken; the resume function
    makes the iterator anew and advances it."""
    __slots__ = ("dict", "view", "pos", "size", "after_writes")

    def __init__(self, d: DictVar, view: str, tx):
        self.dict, self.view, self.pos, self.size = d, view, 0, len(d.items)
        # Made after the trace changed the dict: at run time, after its writes too.
        self.after_writes = d.source is not None and tx.side_effects.container_mutated(d)
        item = DictViewVar(d, view).item
        super().__init__(self._pull(live_keys(d, tx, item)), _DICT_ITER_TYPES[view])

    def _pull(self, items):
        for v in items:
            self.pos += 1
            yield v

    def remaining(self, tx) -> list:
        if len(self.dict.items) != self.size:
            unsupported("dictionary changed size during iteration (RuntimeError)")
        return []               # nothing pulled: handed over live

    def handover(self):
        return f"d:{self.view}", TupleVar([self.dict, ConstVar(self.pos)])

    def reconstruct(self, cg):
        if not self.after_writes:
            return super().reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        # (a local or the value returned, made before the dict's writes are replayed;
        # a stack value is made by the resume function, after them)
        cg.call_const(_dict_iterator_after_writes, [
            lambda cg: cg.load_const(self.view), self.dict.reconstruct,
            lambda cg: cg.load_const(self.pos), lambda cg: cg.load_const(self.size)])
        cg.keep_rebuilt(self)


def _dict_iterator_after_writes(view, d, pos, size):
    """A dict's iterator that the frame holds at a break or returns, made by its first
    next(): the writes the trace made to the dict before iter() are replayed after the
    values handed over are made (an iterator made then would see the dict change size).
    As CPython's, it raises if the dict's size is not what it was at iter()."""
    if len(d) != size:
        raise RuntimeError("dictionary changed size during iteration")
    it = iter(d if view == "keys" else getattr(d, view)())
    for _ in range(pos):
        next(it)
    yield from it


_DICT_ITER_TYPES = {"keys": type(iter({})), "values": type(iter({}.values())),
                    "items": type(iter({}.items()))}


def private_list(tx, container) -> bool:
    """A list that a graph break made for its resume function, to iterate (a
    parameter of it that only the loop's iterator reads)."""
    source = container.source
    return isinstance(source, LocalSource) and source.local in private_lists(tx.root.code)


def _reachable(tx, container) -> bool:
    """Whether the frame can reach `container` other than through an iterator: it came
    from outside, was stored outside (an attribute, a global, a cell), or a local, cell
    or stack slot holds it (inside tuples, lists, dicts and objects too)."""
    if container.source is not None and not private_list(tx, container):
        return True
    seen = set()
    # (A resume function's ___stackN parameters are dead once its prologue ran.)
    todo = [*tx.stack, *(v for n, v in tx.locals.items() if not n.startswith("___stack")),
            *(c.value for c in tx.cells.values()),
            *tx.side_effects.values()]
    while todo:
        v = todo.pop()
        if v is container:
            return True
        if id(v) in seen or isinstance(v, IteratorVar):
            continue
        seen.add(id(v))
        items = getattr(v, "items", None)
        if isinstance(items, dict):
            todo.extend(items.values())
        elif isinstance(items, list):
            todo.extend(items)
        attrs = getattr(v, "attrs", None)
        if isinstance(attrs, dict):
            todo.extend(attrs.values())
    return False


def _next_or_fail(it):
    v = it.next()
    if v is None:
        raise_builtin(StopIteration)
    return v


def const_key(v: Var, what="value"):
    if not v.is_const():
        unsupported(f"{what} {v} is not a constant")
    return v.as_const()


def drain(it: IteratorVar):
    """The items of the iterator Var `it`, pulled one by one as they are consumed."""
    while True:
        v = it.next()
        if v is None:
            return
        yield v
