"""Side effects: changes the traced code makes to things that outlive the frame
(attributes of objects, globals, closure cells, lists and dicts from outside).

While tracing they are recorded, and reads see the new values; the transformed code
replays them after the graph runs, in program order, so the state after the call is
what CPython would leave.  In-place tensor ops need no replay: they are graph ops on
the real inputs.
"""
from __future__ import annotations

import collections
from collections import OrderedDict

from bytecode import FreeVar
import inspect

from .source import ClosureSource
from .variables.base import unsupported
from . import _C
from .exc import Unsupported
from .variables.iterators import advance_iterator
from .variables.containers import DictVar, ListVar, emit_key
from .variables.tensor import TensorVar
from .variables.base import DELETED


class SideEffects:
    def __init__(self, fresh_locals=()):
        # Sources of containers made anew for each call (the root frame's *args, **kwargs).
        self.fresh_locals = set(fresh_locals)
        # Ordered by first write; each key keeps its latest value.
        self._attrs: dict[tuple, tuple] = {}       # (id(obj), name) -> (owner Var, name, value)
        self._globals: dict[tuple, tuple] = {}     # (id(globals), name) -> (globals, name, value, is_root)
        self._cells: dict[int, tuple] = {}         # id(cell) -> (cell, value)
        self._containers: dict[int, object] = {}   # id(real list/dict) -> its ListVar/DictVar
        self._calls: dict[tuple, tuple] = {}       # ("call", n) -> (replay, TupleVar of its arguments)
        self._iters: dict[tuple, object] = {}     # ("iter", id(real iterator)) -> its Var
        self._order: list[tuple] = []
        # Where each effect first happened among the graph's ops: `clock()` counts the
        # ops created so far (set by convert; None: unknown).  A graph that raises
        # loses no effect of the program if every effect came after every op.
        self.clock = None
        self._first_at: dict[tuple, int | None] = {}
        # Writes recorded so far (a `with lock:` block asks whether it made any), and
        # the locks (their Vars) whose blocks did: the replay holds them.
        self.writes = 0
        self.locks: list = []
        self.locks_entered: list = []     # the real locks of the `with` blocks open now

    def _note(self, key):
        if key not in self._order:
            self._order.append(key)
            self._first_at[key] = self.clock() if self.clock is not None else None

    def all_after(self, ops: int) -> bool:
        """Whether every effect was first made once `ops` graph ops had been created
        (no op of the graph comes after any effect in program order)."""
        return all(self._first_at.get(key) == ops for key in self._order)

    # -- recording --
    def record_call(self, replay, args):
        """A call made for what code outside the program does with it (a log record, a
        warning: log_calls.py): `replay(args)` runs after the graph, at its place among
        the other effects, so the handlers see the state CPython showed them."""
        key = ("call", len(self._calls))
        self._calls[key] = (replay, args)
        self._note(key)

    def advance_iterator(self, var):
        """An iterator from outside the frame was consumed: its position is replayed."""
        key = ("iter", id(var))
        self._iters[key] = var
        self._note(key)

    def fence(self, what: str):
        """A write to state outside the frame after such a call: the handlers, which run
        after the graph, would see it (and a list they append to would be overwritten
        by its traced contents).  CPython makes it, at a break."""
        if self._calls:
            what = what() if callable(what) else what
            unsupported(f"{what} after a logging call or warning in the same graph "
                        "(its handlers run after the graph)")

    def store_attr(self, owner, real_obj, name: str, value, plain: bool = False):
        """`plain`: the store is object.__setattr__'s, replayed as such (the class's own
        __setattr__ already ran while tracing and must not run again)."""
        if owner.source is None and not _rebuilt_by_graph(owner):
            unsupported(f"setting attribute {name!r} on an object made while tracing")
        self.fence(f"setting attribute {name!r}")
        key = ("attr", id(real_obj), name)
        self._attrs[key] = (owner, name, value, plain)
        self._note(key)
        self.writes += 1

    def load_attr(self, real_obj, name: str):
        hit = self._attrs.get(("attr", id(real_obj), name))
        return None if hit is None else hit[2]

    def has_attr_writes(self, real_obj) -> bool:
        return any(key[1] == id(real_obj) for key in self._attrs)

    def attr_writes(self, real_obj) -> list:
        """(name, latest value) of each attribute of `real_obj` the trace wrote, in
        the order first written."""
        return [(self._attrs[key][1], self._attrs[key][2]) for key in self._order
                if key[0] == "attr" and key[1] == id(real_obj)]

    def store_global(self, f_globals: dict, name: str, value, is_root: bool):
        self.fence(f"setting global {name!r}")
        key = ("global", id(f_globals), name)
        self._globals[key] = (f_globals, name, value, is_root)
        self._note(key)
        self.writes += 1

    def load_global(self, f_globals: dict, name: str):
        hit = self._globals.get(("global", id(f_globals), name))
        return None if hit is None else hit[2]

    def store_cell(self, cell, value):
        if cell.source is not None:
            self.fence("setting a closure variable")
            key = ("cell", id(cell))
            self._cells[key] = (cell, value)
            self._note(key)
            self.writes += 1

    def written_cells(self) -> list:
        """The cells from outside the trace wrote (their Cells)."""
        return [self._cells[key][0] for key in self._order if key[0] == "cell"]

    def mutate_container(self, var, real_obj):
        """A list or dict from outside is about to change: its final contents are
        written back after the graph."""
        if var.source in self.fresh_locals:
            # The frame's own *args / **kwargs: made anew by every call, nothing to
            # write back; from now on it is a container of the trace, rebuilt if needed.
            var.source = None
            return
        self.fence(lambda: f"changing {var}")      # (its text reads a lazy dict whole)
        key = ("container", id(real_obj))
        self.writes += 1
        if key not in self._containers:
            self._containers[key] = var
            self._note(key)

    def hold_lock(self, lock_var):
        """A `with lock:` block of the trace wrote outside state: CPython made those
        writes holding the lock, and other threads may rely on that at run time (the
        trace ran alone, the compiled code does not), so the replay of the writes
        acquires it first and releases it after."""
        if all(v.value is not lock_var.value for v in self.locks):
            self.locks.append(lock_var)

    def container_mutated(self, var) -> bool:
        """The trace changed this list or dict from outside (its Var)."""
        return ("container", id(var)) in self._containers

    # -- replay --
    def values(self):
        """Every Var the replay will load (graph outputs must include their tensors)."""
        for key in self._order:
            kind = key[0]
            if kind == "attr":
                owner, _, value, _ = self._attrs[key]
                yield value
                if owner.source is None:
                    yield owner         # a tensor the graph computed: an output too
            elif kind == "global":
                yield self._globals[key][2]
            elif kind == "cell":
                yield self._cells[key][1]
            elif kind == "call":
                yield self._calls[key][1]
            elif kind == "iter":
                yield self._iters[key]
            else:
                yield self._containers[key]

    def __bool__(self):
        return bool(self._order)

    def __len__(self):
        return len(self._order)

    def _raising_store(self):
        """The first replayed store that can run code which raises, as text, or None."""
        for key in self._order:
            kind = key[0]
            # (a replayed log call: logging's handlers report their own errors; a
            # warning that a filter makes an error is a break, not a replay)
            if kind == "attr":
                owner, name, value, plain = self._attrs[key]
                if value is _deleted() or not plain and _store_runs_code(owner, name):
                    return f"the store of .{name}"
            if kind == "container":
                if type(self._containers[key]) not in (ListVar, DictVar):
                    return f"a write into {self._containers[key]}"
        return None

    def reconstruct(self, cg, root_cells: set[str]):
        """Replay in two phases: every new value first (they may be read from what the
        stores change, as in `a, b = b, a`), then every store, in program order."""
        temps, owners = [], {}

        def keep(emit):
            emit()
            name = f"___effect_{len(temps) + len(owners)}"
            cg.emit("STORE_FAST", name)
            return name

        for key in self._order:
            kind = key[0]
            if kind == "attr":
                owner = self._attrs[key][0]
                temps.append(keep(lambda: self._attrs[key][2].reconstruct(cg)))
                # The object written to is found now too: a store before it may
                # rebind the path to it (old = o.a; o.a = o.b; old.v = 5).
                owners[key] = keep(lambda: (owner if owner.source is None else owner.source).reconstruct(cg))
            elif kind == "global":
                temps.append(keep(lambda: self._globals[key][2].reconstruct(cg)))
            elif kind == "cell":
                temps.append(keep(lambda: self._cells[key][1].reconstruct(cg)))
            elif kind == "call":
                temps.append(keep(lambda: self._calls[key][1].reconstruct(cg)))
            elif kind == "iter":
                temps.append(keep(lambda: self._iters[key].reconstruct(cg)))
            else:
                temps.append(keep(lambda: _new_contents(cg, self._containers[key])))
                owners[key] = keep(lambda: self._containers[key].source.reconstruct(cg))
        if self.locks:
            # The stores below run holding the locks, with no handler around them: a
            # store that can raise (a __setattr__ or property of the class, a replayed
            # log call's handler, a list subclass's method) would leave a lock held.
            risky = self._raising_store()
            if risky is not None:
                raise Unsupported(f"a write after 'with lock:' that can raise ({risky}) would be "
                                  f"replayed holding the lock")
            cg.call_const(_acquire_all, [lock.reconstruct for lock in self.locks])
            cg.emit("POP_TOP")
        for key, temp in zip(self._order, temps):
            kind = key[0]
            if kind == "attr":
                _, name, value, plain = self._attrs[key]
                if value is _deleted():
                    cg.call_const(_ensure_deleted, [
                        lambda cg: cg.emit("LOAD_FAST", owners[key]), lambda cg: cg.load_const(name)])
                    cg.emit("POP_TOP")
                    continue
                if plain:
                    cg.call_const(object.__setattr__, [
                        lambda cg: cg.emit("LOAD_FAST", owners[key]),
                        lambda cg: cg.load_const(name), lambda cg: cg.emit("LOAD_FAST", temp)])
                    cg.emit("POP_TOP")
                    continue
                cg.emit("LOAD_FAST", temp)
                cg.emit("LOAD_FAST", owners[key])
                cg.store_attr(name)
            elif kind == "global":
                f_globals, name, _, is_root = self._globals[key]
                cg.emit("LOAD_FAST", temp)
                if is_root:
                    cg.emit("STORE_GLOBAL", name)
                else:
                    cg.load_const(f_globals)
                    cg.load_const(name)
                    cg.emit("STORE_SUBSCR")
            elif kind == "call":
                # (unhooked: the handlers are CPython's to run, not frames to compile)
                cg.call_const(_C.Unhooked(self._calls[key][0]), [lambda cg: cg.emit("LOAD_FAST", temp)])
                cg.emit("POP_TOP")
            elif kind == "cell":
                cell, _ = self._cells[key]
                cg.emit("LOAD_FAST", temp)
                if isinstance(cell.source, ClosureSource):
                    cg.emit("STORE_DEREF", FreeVar(cell.source.var))
                else:
                    cell.source.base.reconstruct(cg)   # the cell object itself
                    cg.store_attr("cell_contents")
            elif kind == "iter":
                continue
            else:
                _store_contents(cg, owners[key], temp)
        # Iterators last: __setstate__ clamps the position to the length of the list,
        # which the stores above may have grown.
        for key, temp in zip(self._order, temps):
            if key[0] == "iter":
                var = self._iters[key]
                cg.call_const(advance_iterator, [lambda cg: cg.emit("LOAD_FAST", temp),
                                                 lambda cg: cg.load_const(var.pos),
                                                 lambda cg: cg.load_const(var.exhausted)])
                cg.emit("POP_TOP")
        if self.locks:
            cg.call_const(_release_all, [lock.reconstruct for lock in reversed(self.locks)])
            cg.emit("POP_TOP")


def _store_runs_code(owner, name) -> bool:
    """Whether STORE_ATTR of `name` on `owner`'s object may run Python code (which may
    raise): its class's own __setattr__, or a data descriptor of the class."""
    try:
        cls = owner.python_type()
    except Exception:
        return True
    if cls.__setattr__ is not object.__setattr__:
        return True
    try:
        attr = inspect.getattr_static(cls, name)
    except AttributeError:
        return False
    return hasattr(type(attr), "__set__")


def _acquire_all(*locks):
    for lock in locks:
        lock.acquire()


def _release_all(*locks):
    for lock in locks:
        lock.release()


def _rebuilt_by_graph(owner) -> bool:
    """A tensor computed in the graph: the replay finds it among the graph's outputs
    (its attributes leave the frame with it)."""
    return isinstance(owner, TensorVar)


def _ensure_deleted(obj, name):
    """The attribute's last change was a del (which the trace checked was legal then):
    it may have been set only by the trace (`o.c = 1; del o.c`), so absent now too."""
    try:
        object.__delattr__(obj, name)
    except AttributeError:
        pass


def _deleted():
    return DELETED


class _Stores(dict):
    """Stores to replay key by key into a dict from outside (see DictVar.stored_items)."""
    __slots__ = ()


class _Appends(list):
    """Items to append to a list from outside (see ListVar.appended_items)."""
    __slots__ = ()


def _new_contents(cg, var):
    """Push the final contents of a list or dict from outside (a new list / dict), or
    what the trace appended to a list (an _Appends) or stored into a dict (a _Stores)
    that it never read whole."""
    appended = var.appended_items() if isinstance(var, ListVar) else None
    if appended is not None:
        def build_list(cg):
            for item in appended:
                item.reconstruct(cg)
            cg.build(list, len(appended))
        cg.call_const(_Appends, [build_list])
        return
    stored = var.stored_items() if isinstance(var, DictVar) else None
    if stored is not None:
        def build(cg):
            for k, v in stored.items():
                emit_key(cg, k, var)
                v.reconstruct(cg)
            cg.build(dict, len(stored))
        cg.call_const(_Stores, [build])
        return
    if isinstance(var, ListVar):
        for item in var.items:
            item.reconstruct(cg)
        cg.build(list, len(var.items))
    elif isinstance(var, DictVar):
        for k, v in var.items.items():
            emit_key(cg, k, var)      # (the very key objects: see _replace_contents)
            v.reconstruct(cg)
        cg.build(dict, len(var.items))
    else:
        unsupported(f"writing back {var}")


def _store_contents(cg, container: str, temp: str):
    """Make the outside list or dict (in local `container`) hold the contents kept in
    `temp`, in place."""
    cg.call_const(_replace_contents, [lambda cg: cg.emit("LOAD_FAST", container),
                                      lambda cg: cg.emit("LOAD_FAST", temp)])
    cg.emit("POP_TOP")


def _replace_contents(container, new):
    # Through the builtin base's methods: a subclass's own clear / update /
    # __setitem__ ran while tracing and must not run again.
    if isinstance(new, _Appends):
        list.extend(container, new)      # onto the list as it is now, as the appends were
        return
    if isinstance(new, _Stores):
        # in store order: a key already there keeps its place and object, a new one
        # goes last, as the frame's own stores did
        store = OrderedDict.__setitem__ if isinstance(container, OrderedDict) else dict.__setitem__
        for k, v in new.items():
            store(container, k, v)
        return
    if isinstance(container, list):
        list.__setitem__(container, slice(None), new)
    elif isinstance(container, dict):
        _replace_items(container, new, OrderedDict if isinstance(container, OrderedDict) else dict)
    elif isinstance(container, collections.deque):
        container.clear()
        container.extend(new)
    else:
        dict.clear(container)
        dict.update(container, new)


def _replace_items(container, new, cls):
    """The dict `container` made to hold `new`'s items, whose keys are the very objects
    CPython's dict would hold.  In place where the keys it keeps are those objects, in
    its order, and the new ones come after them: the key objects stay, and an iterator
    over the dict (a loop the frame broke out of at a graph break) still runs, as it
    would after CPython's writes; else cleared and filled."""
    old = list(cls.__iter__(container))
    kept = [k for k in old if k in new]
    order = list(new)
    if all(a is b for a, b in zip(kept, order)) and \
            not any(k in container for k in order[len(kept):]):
        for k in old:
            if k not in new:
                cls.__delitem__(container, k)
    else:
        cls.clear(container)
    for k, v in new.items():
        cls.__setitem__(container, k, v)
