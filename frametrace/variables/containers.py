"""Tuples, lists, dicts and iterators of traced values."""
from __future__ import annotations

import collections
import operator
import weakref

import torch
import enum

from ..source import CallMethodSource, GetItemSource
from .base import (Unsupported, Var, a_type, binary_op, is_same, namedtuple_member, raise_builtin,
                   raise_folded, set_key, sorted_list, unsupported, var_iter, wrap)
from .classes import class_attr
from .constant import ConstVar, MethodVar, fold_call
from .. import config


class CollectionVar(Var):
    """A Var holding traced items (tuple, list, dict)."""
    __slots__ = ("items",)

    def getattr(self, tx, name):
        if callable(getattr(self.python_type(), name, None)):
            return MethodVar(self, name)
        unsupported(f"attribute {name!r} of {self.python_type().__name__}")

    def length(self, tx):
        return len(self.items)

    def noun(self):
        n = len(self.items)
        return f"{a_type(self.python_type())} of {n} item{'s' if n != 1 else ''}"

    def truth(self, tx):
        return bool(self.items)


class _SequenceVar(CollectionVar):
    __slots__ = ()
    kind: type = tuple

    def __init__(self, items, source=None):
        super().__init__(source)
        self.items = list(items)

    def python_type(self):
        return self.kind

    def is_const(self):
        return all(v.is_const() for v in self.items)

    def as_const(self):
        return self.kind(v.as_const() for v in self.items)

    def unpack(self, tx):
        return list(self.items)

    def getitem(self, tx, key):
        if not key.is_const():
            unsupported(f"indexing a {self.kind.__name__} with {key}")
        k = key.as_const()
        if isinstance(k, slice):
            return type(self)(self.items[k])
        try:
            return self.items[k]
        except (IndexError, TypeError) as e:
            raise_folded(type(e)(str(e).replace("list", self.kind.__name__, 1)),
                         f"indexing a {self.kind.__name__}")

    def call_method(self, tx, name, args, kwargs):
        if name in ("index", "count") and all(a.is_const() for a in args) and self.is_const() and \
                not any(has_nan(a.as_const()) for a in (*args, *self.items)):
            return fold_call(getattr(self.as_const(), name), args, kwargs, f"{self.kind.__name__}.{name}")
        if name == "index" and 1 <= len(args) <= 3 and not kwargs:
            # start and stop clip as a slice does; the index found is in the whole list.
            ends = [a.as_const() if a.is_const() else unsupported("index() bounds") for a in args[1:]]
            bounds = slice(*(ends + [None, None])[:2])
            start = bounds.indices(len(self.items))[0]
            return ConstVar(start + _find(tx, self.items[bounds], args[0],
                                          f"{self.kind.__name__}.index(x): x not in "
                                          f"{self.kind.__name__}"))
        if name == "count" and len(args) == 1 and not kwargs:
            return ConstVar(sum(_matches(tx, v, args[0]) for v in self.items))
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstVar(len(self.items))
        unsupported(f"{self.kind.__name__}.{name}")

    def reconstruct(self, cg):
        # A list or tuple from outside is the same object (a list's contents are written
        # back; `q is k` of a tuple argument and a key read back is CPython's answer
        # only on the very objects).
        if self.source is not None:
            return self.source.reconstruct(cg)
        if self.kind is list:
            # A new list is built once, however many places refer to it.
            if cg.load_rebuilt(self):
                return
        for v in self.items:
            v.reconstruct(cg)
        cg.build(self.kind, len(self.items))
        if self.kind is list:
            cg.keep_rebuilt(self)

    def __repr__(self):
        return f"{type(self).__name__}({self.items!r})"


def _matches(tx, v, item) -> bool:
    """``v is item or v == item`` (a list's comparison), when the trace can tell: the
    identity first, then the comparison and its truth, as CPython's
    PyObject_RichCompareBool (two tensors that are not one object compare by their
    data: a break where the answer needs it)."""
    if v is not item and v.is_const() and item.is_const():
        a, b = v.as_const(), item.as_const()
        if has_nan(a) or has_nan(b):
            # A NaN equals only itself, so the answer is which objects they are (also
            # inside tuples), which the guards of NaN values do not say.
            unsupported(f"comparing {item} with item {v} (a NaN: equal only to itself)")
        return a == b       # (without a NaN, `a is b` implies `a == b`)
    try:
        if is_same(v, item, tx):
            return True
    except Unsupported:
        pass
    if v.is_const() and item.is_const():
        return v.as_const() == item.as_const()
    return binary_op(tx, operator.eq, v, item).truth(tx)


def _find(tx, items, item, error):
    for i, v in enumerate(items):
        if _matches(tx, v, item):
            return i
    raise_builtin(ValueError, error)


class TupleVar(_SequenceVar):
    # `real`: the tuple itself, for one read from the frame (builder.wrap): which object
    # it is, for `is` with another object of the frame's (guarded between their sources).
    __slots__ = ("real",)
    kind = tuple


class SizeVar(TupleVar):
    """A torch.Size whose items may be symbolic sizes."""
    __slots__ = ()

    def python_type(self):
        return torch.Size

    def as_const(self):
        return torch.Size(v.as_const() for v in self.items)

    def call_method(self, tx, name, args, kwargs):
        if name == "numel" and not args and not kwargs:
            if all(isinstance(v, ConstVar) for v in self.items):
                return ConstVar(self.as_const().numel())
            total = ConstVar(1)
            for item in self.items:    # a product of symbolic sizes stays symbolic
                total = tx.output.call("call_function", operator.mul, (total, item), {})
            return total
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        cg.call_const(torch.Size, [lambda cg: TupleVar(self.items).reconstruct(cg)])


class NamedTupleVar(TupleVar):
    """A namedtuple or torch.return_types result (values, indices, ...).  An instance of
    a namedtuple subclass with a __dict__ may get attributes (`attrs`): it is then one
    object, rebuilt once."""
    __slots__ = ("fields", "cls", "attrs")

    def __init__(self, items, fields, source=None, cls=None):
        super().__init__(items, source)
        self.fields = tuple(fields)
        self.cls = cls
        self.attrs = {}

    def python_type(self):
        return self.cls or tuple

    def is_const(self):
        return not self.attrs and super().is_const()

    def as_const(self):
        # The instance of its class, not a plain tuple (its repr names the fields).
        items = tuple(v.as_const() for v in self.items)
        if self.cls is None:
            return items
        if hasattr(self.cls, "n_fields"):       # a structseq (torch.return_types)
            return self.cls(items)
        return tuple.__new__(self.cls, items)   # what namedtuple's _make does

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name in self.fields:
            return self.items[self.fields.index(name)]
        if name == "_fields":
            return ConstVar(self.fields)
        if name in ("_replace", "_asdict") and hasattr(self.cls, name):
            return MethodVar(self, name)
        if self.cls is not None and not hasattr(self.cls, "n_fields"):
            member = namedtuple_member(tx, self, name)
            if member is not None:
                return member
        unsupported(f"attribute {name!r} of a result with fields {self.fields}")

    def setattr(self, tx, name, value):
        cls = self.cls
        if self.source is not None or cls is None or not cls.__dictoffset__ or \
                class_attr(tx, cls, name) is not None or \
                class_attr(tx, cls, "__setattr__") is not object.__setattr__:
            unsupported(f"setting attribute {name!r} on {self.python_type().__name__}")
        self.attrs[name] = value

    def call_method(self, tx, name, args, kwargs):
        if name in ("_replace", "_asdict") and not hasattr(self.cls, name):
            unsupported(f"{name}() of a {self.python_type().__name__}")     # AttributeError
        if name == "_replace" and not args:
            items = list(self.items)
            for k, v in kwargs.items():
                if k not in self.fields:
                    unsupported(f"_replace() got an unexpected field {k!r}")
                items[self.fields.index(k)] = v
            return NamedTupleVar(items, self.fields, cls=self.cls)
        if name == "_asdict" and not args:
            return DictVar(dict(zip(self.fields, self.items)))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        if self.cls is None or self.source is not None:
            return super().reconstruct(cg)     # (one from outside: that very object)
        if not self.cls.__dictoffset__:
            return self._construct(cg)
        if cg.load_rebuilt(self):
            return
        cg.call_const(_with_attrs, [self._construct, attrs_dict(self.attrs)])
        cg.keep_rebuilt(self)

    def _construct(self, cg):
        cg.load_constructor(self.cls)
        for v in self.items:
            v.reconstruct(cg)
        if hasattr(self.cls, "n_fields"):
            # A structseq (torch.return_types) is made from one sequence.
            cg.emit("BUILD_TUPLE", len(self.items))
            cg.call(1)
        else:
            cg.call(len(self.items))


def structseq_fields(cls):
    """The field names of a structseq class (torch.return_types.max: values,
    indices), in order, read off an instance made of numbered items; None for
    another class."""
    n = getattr(cls, "n_sequence_fields", None)
    if n is None or not isinstance(cls, type) or not issubclass(cls, tuple):
        return None
    probe = cls(tuple(range(n)))
    by_index = {}
    for d in dir(cls):
        if d.startswith("_") or d in ("count", "index", "n_fields", "n_sequence_fields",
                                       "n_unnamed_fields"):
            continue
        v = getattr(probe, d, None)
        if type(v) is int and 0 <= v < n:
            by_index[v] = d
    return tuple(by_index.get(i, f"_{i}") for i in range(n))


def _with_attrs(obj, attrs):
    obj.__dict__.update(attrs)
    return obj


class ListVar(_SequenceVar):
    """A list.  Lists made while tracing can be mutated freely; a list that came from
    outside the frame (has a source) cannot yet: that is a side effect to replay.
    A plain list from outside starts `lazy`: appends to it are recorded without reading
    what it holds (its length is not guarded: a history appended to every step
    recompiled every step) and replayed as appends; the first other use reads it whole
    and guards its length."""
    __slots__ = ("_lazy",)
    kind = list

    def __init__(self, items, source=None):
        self._lazy = None
        super().__init__(items, source)

    @classmethod
    def lazy(cls, tx, value: list, source):
        """The list `value` from outside, read from `source` (guarded by type), as it is
        now.  Its slot holds the appended Vars until it is read whole."""
        var = cls.__new__(cls)
        var._lazy = None
        CollectionVar.__init__(var, source)
        _ITEMS.__set__(var, [])
        var._lazy = (list(value), weakref.ref(tx.root))
        return var

    @property
    def items(self):
        lazy = self._lazy
        if lazy is not None:
            self._lazy = None
            tx = lazy[1]()
            if tx is None:
                raise AssertionError("a lazy list read after its trace ended")
            tx.guards.length(self.source, lazy[0])
            appended = _ITEMS.__get__(self)
            _ITEMS.__set__(self, [_wrap_read(tx, v, GetItemSource(self.source, i))
                                  for i, v in enumerate(lazy[0])] + appended)
        return _ITEMS.__get__(self)

    @items.setter
    def items(self, items):
        self._lazy = None
        _ITEMS.__set__(self, items)

    def appended_items(self):
        """The Vars appended while the list stayed lazy, or None when it was read whole
        (its whole contents are written back then)."""
        return _ITEMS.__get__(self) if self._lazy is not None else None

    def _check_mutable(self, tx):
        if self.source is not None:
            tx.side_effects.mutate_container(self, self)

    def call_method(self, tx, name, args, kwargs):
        if name == "append" and len(args) == 1:
            self._check_mutable(tx)
            # (while lazy the slot holds what was appended; after, everything)
            _ITEMS.__get__(self).append(args[0])
            return ConstVar(None)
        if name == "extend" and len(args) == 1:
            self._check_mutable(tx)
            src = args[0]
            if src is self:
                self.items.extend(src.unpack(tx))
            elif type(src) in (ListVar, TupleVar):
                _ITEMS.__get__(self).extend(src.unpack(tx))      # (as append, lazily)
            else:
                # As CPython: other iterables append each item as it comes, so a
                # generator reading the list sees the items already appended.
                for v in var_iter(tx, src):
                    self.items.append(v)
            return ConstVar(None)
        if name == "insert" and len(args) == 2 and args[0].is_const():
            self._check_mutable(tx)
            self.items.insert(args[0].as_const(), args[1])
            return ConstVar(None)
        if name == "pop" and len(args) <= 1:
            if not self.items or args and not -len(self.items) <= args[0].as_const() < len(self.items):
                raise_builtin(IndexError, "pop index out of range" if self.items else "pop from empty list")
            self._check_mutable(tx)
            return self.items.pop(*(a.as_const() for a in args))
        if name == "reverse" and not args:
            self._check_mutable(tx)
            self.items.reverse()
            return ConstVar(None)
        if name == "copy" and not args:
            return ListVar(self.items)
        if name == "clear" and not args:
            self._check_mutable(tx)
            self.items.clear()
            return ConstVar(None)
        if name == "remove" and len(args) == 1:
            i = _find(tx, self.items, args[0], "list.remove(x): x not in list")
            self._check_mutable(tx)
            del self.items[i]
            return ConstVar(None)
        if name == "sort" and not args and set(kwargs) <= {"key", "reverse"}:
            ordered = sorted_list(tx, [ListVar(self.items)], kwargs)
            self._check_mutable(tx)
            self.items[:] = ordered.items
            return ConstVar(None)
        return super().call_method(tx, name, args, kwargs)

    def setitem(self, tx, key, value):
        self._check_mutable(tx)
        if not key.is_const():
            unsupported("list index that is not a constant")
        k = key.as_const()
        if isinstance(k, slice):
            self.items[k] = value.unpack(tx)
        else:
            self.items[k] = value


_ITEMS = CollectionVar.items     # the slot under DictVar.items and ListVar.items
_SOURCE = Var.source             # the slot under DictVar.source


def _wrap_read(tx, value, source):
    """An item of a lazy container from outside, read now."""
    return wrap(tx, value, source)


class DictVar(CollectionVar):
    """A dict with constant keys.  A dict from outside starts `lazy`: a key looked up
    (d[k], d.get(k), k in d) is wrapped and guarded alone (present with its value, or
    absent); the first use of the whole dict (`items`: len, iteration, a write, ...)
    wraps the rest and guards its keys."""
    __slots__ = ("_lazy", "_key_vars")
    # A set is a DictVar of its members (builtins.SetVar), which dict operators refuse.
    is_set = False

    def __init__(self, items: dict, source=None):
        self._lazy = None
        super().__init__(source)
        self.items = dict(items)
        if source is not None:
            self._identities()["entry"] = list(self.items)  # (the outside dict's, in order)

    # Which object each key is.  The items are keyed by plain values, so a key read back
    # (iteration, keys(), popitem) would be a constant, rebuilt as the traced object
    # (LOAD_CONST): `k is q` at a break, or a key handed back, would be another object
    # than CPython's.  A key the dict had when read from outside is reloaded from it
    # (its position: the guards keep the keys and their order); a key the trace put in
    # is the Var it came from.  {id(key object): (key object, Var)}, and "entry": the
    # keys of the dict from outside, in its order.
    def _identities(self) -> dict:
        try:
            return self._key_vars
        except AttributeError:
            self._key_vars = {}
            return self._key_vars

    def key_var(self, k):
        """The Var of key `k`, an object among `self.items`' keys."""
        known = self._identities()
        got = known.get(id(k))
        if got is not None and got[0] is k:
            return got[1]
        entry = known.get("entry")
        # (A VarKey, a tensor or an object hashed by identity, is its own Var already.)
        if entry is not None and self.source is not None and not isinstance(k, VarKey) \
                and not _one_object_per_value(k):
            if "index" not in known:
                known["index"] = {id(e): (i, e) for i, e in enumerate(entry)}
                known["keys"] = CallMethodSource(self.source, "keys", as_list=True, through=_dict_keys)
            at = known["index"].get(id(k))
            if at is not None and at[1] is k:
                var = KeyConstVar(k, GetItemSource(known["keys"], at[0]))
                known[id(k)] = (k, var)
                return var
        return key_var(k)

    def store_key(self, key: Var, value: Var):
        """``d[key] = value``: a new key is the object `key` stands for (an existing
        one keeps its object, as CPython's dicts do).  A plain dict from outside stays
        lazy under stores of constant keys: what it held is not read (nor guarded), and
        the stores are replayed one by one (`stored_items`)."""
        k = _dict_key(key)
        lazy = self._lazy
        if lazy is not None and type(self) is DictVar and not isinstance(k, VarKey) and \
                constant_key(k) and config.lazy_dict_guards:
            got = _ITEMS.__get__(self)
            if k not in got and k not in lazy[0]:
                self._note_key(k, key)
            got[k] = value
            self._identities().setdefault("stored", {})[k] = None
            return
        if k not in self.items:
            self._note_key(k, key)
        self.items[k] = value

    def _note_key(self, k, var):
        if not isinstance(k, VarKey) and not _one_object_per_value(k):
            self._identities()[id(k)] = (k, var)

    def _copy_identities(self, other):
        """Keys that `other` (a DictVar) shares with this dict are its objects."""
        mine = self._identities()
        own = {id(k): k for k in self.items}
        for k in other.items:
            if own.get(id(k)) is k and id(k) not in mine:
                var = other.key_var(k)
                if not (type(var) is ConstVar and var.source is None):
                    mine[id(k)] = (k, var)

    @classmethod
    def lazy(cls, tx, value: dict, source):
        """The dict `value` from outside, read from `source` (guarded by type), as it
        is now.  (It holds the root tracer weakly: a Var must not keep the trace alive.)"""
        var = cls.__new__(cls)
        var._lazy = None
        CollectionVar.__init__(var, source)
        _ITEMS.__set__(var, {})     # the items wrapped so far
        var._lazy = (dict(value), weakref.ref(tx.root))
        if not config.lazy_dict_guards:
            var.items       # wrapped whole now: every key guarded by the keys guard
        return var

    def _tracer(self):
        tx = self._lazy[1]()
        if tx is None:
            raise AssertionError("a lazy dict read after its trace ended")
        return tx

    def _wrap_item(self, tx, k, v):
        return _wrap_read(tx, v, GetItemSource(self.source, k))

    @property
    def items(self):
        lazy = self._lazy
        if lazy is not None:
            tx = self._tracer()
            self._lazy = None
            value = lazy[0]
            got = _ITEMS.__get__(self)
            tx.guards.dict_keys(self.source, value)
            items = {k: got[k] if k in got else self._wrap_item(tx, k, v) for k, v in value.items()}
            # keys stored while lazy that it did not hold: after its own, in store order
            items.update((k, v) for k, v in got.items() if k not in items)
            _ITEMS.__set__(self, items)
            self._identities()["entry"] = list(value)
            self._identities().pop("stored", None)
        return _ITEMS.__get__(self)

    @items.setter
    def items(self, items):
        self._lazy = None
        _ITEMS.__set__(self, items)

    @property
    def source(self):
        return _SOURCE.__get__(self)

    @source.setter
    def source(self, source):
        # The keys are guarded through the source the dict came from: a lazy dict
        # whose source changes (a **kwargs dict becoming the trace's own) is wrapped
        # whole first.
        if getattr(self, "_lazy", None) is not None and source is not _SOURCE.__get__(self):
            self.items
        _SOURCE.__set__(self, source)

    def lookup(self, k, default=None):
        """The Var of key `k` (a key as `_dict_key` gives it), or `default`."""
        lazy = self._lazy
        if lazy is None or isinstance(k, VarKey) or not constant_key(k):
            # (a key of another kind, an IntEnum member say, is looked up in the dict
            # wrapped whole: a guard on `d[k]` alone would need k written in the check)
            return self.items.get(k, default)
        got = _ITEMS.__get__(self)
        if k in got:
            return got[k]
        value = lazy[0]
        try:
            present = k in value
        except TypeError:
            return self.items.get(k, default)
        if not present:
            self._tracer().guards.dict_lacks(self.source, k)
            return default
        var = got[k] = self._wrap_item(self._tracer(), k, value[k])
        return var

    def stored_items(self):
        """{key: Var} of the stores made while the dict stayed lazy, or None when the
        dict was read whole (its whole contents are written back then)."""
        if self._lazy is None:
            return None
        stored = self._identities().get("stored")
        got = _ITEMS.__get__(self)
        return {k: got[k] for k in stored} if stored else None

    def has_key(self, k) -> bool:
        return self.lookup(k, _ABSENT) is not _ABSENT

    def python_type(self):
        return dict

    def is_const(self):
        return all(v.is_const() for v in self.items.values()) and not has_var_keys(self.items)

    def as_const(self):
        if has_var_keys(self.items):
            unsupported("a dict with keys hashed by identity as a constant")
        return {k: v.as_const() for k, v in self.items.items()}

    def unpack(self, tx):
        return [self.key_var(k) for k in self.items]

    def getitem(self, tx, key):
        got = self.lookup(_dict_key(key), _ABSENT)
        if got is not _ABSENT:
            return got
        raise_builtin(KeyError, key.as_const())

    def setitem(self, tx, key, value):
        if self.source is not None:
            tx.side_effects.mutate_container(self, self)
        self.store_key(key, value)

    def _mutating(self, tx):
        if self.source is not None:
            tx.side_effects.mutate_container(self, self)

    def copy_with(self, items: dict):
        """A new dict of this kind (OrderedDict, defaultdict ...) holding `items`: what
        `self | other` makes."""
        return DictVar(items)

    def delitem(self, tx, key):
        self._mutating(tx)
        self.items.pop(_dict_key(key), None)

    def call_method(self, tx, name, args, kwargs):
        if name == "pop" and 1 <= len(args) <= 2:
            key = _dict_key(args[0])
            if key not in self.items and len(args) == 1:
                raise_builtin(KeyError, key)
            self._mutating(tx)
            return self.items.pop(key) if key in self.items else args[1]
        if name == "setdefault" and 1 <= len(args) <= 2:
            key = _dict_key(args[0])
            if key not in self.items:
                self._mutating(tx)
                self.store_key(args[0], args[1] if len(args) == 2 else ConstVar(None))
            return self.items[key]
        if name == "update" and len(args) <= 1:
            self._mutating(tx)
            if args:
                other = args[0]
                mapped = other.mapping_items(tx)
                if isinstance(other, DictVar):
                    self.items.update(other.items)
                    self._copy_identities(other)
                elif mapped is not None:
                    self.items.update(mapped)
                else:
                    for i, pair in enumerate(other.unpack(tx)):
                        kv = pair.unpack(tx)
                        if len(kv) != 2:
                            unsupported(f"ValueError: dictionary update sequence element #{i} has "
                                        f"length {len(kv)}; 2 is required")
                        self.store_key(*kv)
            self.items.update(kwargs)
            return ConstVar(None)
        if name == "copy" and not args:
            new = DictVar(self.items)
            new._copy_identities(self)
            return new
        if name in ("__or__", "__ror__") and len(args) == 1:
            other = args[0]
            if not isinstance(other, DictVar) or other.is_set:
                unsupported(f"dict | {other} (NotImplemented)")
            first, second = (self, other) if name == "__or__" else (other, self)
            new = self.copy_with({**first.items, **second.items})
            new._copy_identities(first)
            new._copy_identities(second)
            return new
        if name == "__ior__" and len(args) == 1:
            type(self).call_method(self, tx, "update", args, {})
            return self
        if name == "clear" and not args:
            self._mutating(tx)
            self.items.clear()
            return ConstVar(None)
        if name == "__setitem__" and len(args) == 2:
            self.setitem(tx, args[0], args[1])
            return ConstVar(None)
        if name in ("keys", "values", "items") and not args and not kwargs:
            return DictViewVar(self, name)
        if name == "get" and 1 <= len(args) <= 2:
            default = args[1] if len(args) == 2 else ConstVar(None)
            return self.lookup(_dict_key(args[0]), default)
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__contains__" and len(args) == 1:
            return ConstVar(self.has_key(_dict_key(args[0])))
        unsupported(f"dict.{name}")

    def reconstruct(self, cg):
        if self.source is not None:
            return self.source.reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        self.emit_items(cg)
        cg.keep_rebuilt(self)

    def emit_items(self, cg):
        """Push a new plain dict of the items."""
        for k, v in self.items.items():
            emit_key(cg, k, self)
            v.reconstruct(cg)
        cg.build(dict, len(self.items))

    def __repr__(self):
        # (never the lazy items: a repr must not guard)
        return f"DictVar({_ITEMS.__get__(self)!r}{', lazy' if self._lazy is not None else ''})"


class DictViewVar(Var):
    """d.keys(), d.values() or d.items(): a live view, which sees later changes of the
    dict, as CPython's."""
    __slots__ = ("dict", "kind")
    _TYPES = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}

    def __init__(self, d: DictVar, kind: str):
        super().__init__(None)
        self.dict = d
        self.kind = kind

    def python_type(self):
        return self._TYPES[self.kind]

    def item(self, d, k):
        if self.kind == "keys":
            return d.key_var(k)
        if self.kind == "values":
            return d.items[k]
        return TupleVar([d.key_var(k), d.items[k]])

    def iter_items(self, tx):
        return live_keys(self.dict, tx, self.item)

    def unpack(self, tx):
        return [self.item(self.dict, k) for k in self.dict.items]

    def length(self, tx):
        return len(self.dict.items)

    def truth(self, tx):
        return bool(self.dict.items)

    def contains(self, tx, item):
        if self.kind == "keys":
            return _dict_key(item) in self.dict.items
        members = self.unpack(tx)
        if item.is_const() and all(m.is_const() for m in members):
            return item.as_const() in [m.as_const() for m in members]
        unsupported(f"'in' on dict.{self.kind}() with {item}")

    def is_const(self):
        return self.kind == "keys" or self.dict.is_const()

    def as_const(self):
        return getattr(self.dict.as_const(), self.kind)()

    def getattr(self, tx, name):
        if name in ("__len__", "__iter__", "__contains__", "isdisjoint", "mapping"):
            return MethodVar(self, name)
        unsupported(f"attribute {name!r} of dict.{self.kind}()")

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__" and not args:
            return ConstVar(len(self.dict.items))
        if name == "__contains__" and len(args) == 1:
            return ConstVar(self.contains(tx, args[0]))
        unsupported(f"dict.{self.kind}().{name}")

    def reconstruct(self, cg):
        cg.push_callable(self._bound_method)
        cg.call(0)

    def _bound_method(self, cg):
        self.dict.reconstruct(cg)
        cg.load_attr(self.kind)

    def __repr__(self):
        return f"DictViewVar({self.kind})"


class VarKey:
    """A dict key that is a traced value hashed by identity (a tensor, an object made
    in the frame, an object from outside): equal to another for the same object (`obj`:
    the FakeTensor, the Var, the real object); `var` is the Var it stands for.  A dict
    keeps insertion order, so, unlike a set's, its order is known."""
    __slots__ = ("obj", "var")

    def __init__(self, obj, var):
        self.obj = obj
        self.var = var

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, VarKey) and other.obj is self.obj

    def __repr__(self):
        return f"<key {self.var!r}>"


class ValueKey(VarKey):
    """A dict key that is a traced value hashed and compared by value (a frozen
    dataclass made in the frame, of constant fields): `obj` is that value, made."""
    __slots__ = ()

    def __hash__(self):
        return hash(self.obj)

    def __eq__(self, other):
        return isinstance(other, ValueKey) and type(other.obj) is type(self.obj) and other.obj == self.obj


_ABSENT = object()

# Dict keys a dict from outside may have to be read lazily and guarded by its keys
# (guards.c's same_key: by exact type and value, so True is not the key 1 nor 1.0):
# names, numbers, and the (device, dtype) tuples that torch's foreach helpers key
# their groups by.  Not str or int subclasses (an IntEnum, a str subclass), whose
# __eq__ and __hash__ are the class's, nor NaN or infinite floats (a NaN key is found
# only by identity; neither has a repr a Python guard can read back).
_KEY_TYPES = (str, int, bool, type(None), torch.dtype, torch.device)


def constant_key(k) -> bool:
    t = type(k)
    if t in _KEY_TYPES:
        return True
    if t is float:
        return k - k == 0.0        # (finite)
    return t is tuple and all(map(constant_key, k))


def has_nan(k) -> bool:
    """A NaN anywhere in the key `k` (in a tuple, a frozenset): a dict finds it only
    by identity, which the trace's own lookup, made with the traced object, does not
    say of the program's."""
    t = type(k)
    if t is float or t is complex:
        return k != k
    if t is tuple or t is frozenset:
        return any(map(has_nan, k))
    return False


def key_var(k):
    """The Var of a dict key."""
    return k.var if isinstance(k, VarKey) else ConstVar(k)


def emit_key(cg, k, d=None):
    """Push key `k` of DictVar `d`: the object it is (see DictVar.key_var)."""
    if isinstance(k, VarKey):
        k.var.reconstruct(cg)
    elif d is not None:
        d.key_var(k).reconstruct(cg)
    else:
        cg.load_const(k)


class KeyConstVar(ConstVar):
    """A key of a dict from outside, read back: reloaded from the dict (its source),
    so that it is the object the dict holds, not the one traced."""
    __slots__ = ()

    def reconstruct(self, cg):
        # The dict's keys listed once for all the keys this code reloads (a dict
        # written back reloads every key).
        keys = self.source.base
        if not cg.load_rebuilt(keys):
            keys.reconstruct(cg)
            cg.keep_rebuilt(keys)
        cg.load_const(self.source.index)
        cg.subscr()


def _dict_keys(d):
    # (the builtin's keys, in the order the guards checked: no keys() of a subclass runs)
    return collections.OrderedDict.keys(d) if isinstance(d, collections.OrderedDict) else dict.keys(d)


def _one_object_per_value(k) -> bool:
    """Keys whose identity follows from their type and value (guarded by both)."""
    return k is None or type(k) in (bool, type(Ellipsis), type(NotImplemented), torch.dtype) or \
        isinstance(k, enum.Enum)


def has_var_keys(items: dict) -> bool:
    return any(isinstance(k, VarKey) for k in items)


def _dict_key(v):
    """What stands for `v` among a dict's keys: the constant, or a VarKey for a value
    hashed by identity."""
    k = set_key(v)      # (a NaN is a break there)
    if v.is_const():
        return k
    return ValueKey(k, v) if v.value_key() is not None else VarKey(k, v)


class IteratorVar(Var):
    """The iterator of a for loop over items known at trace time; the loop is
    unrolled."""
    __slots__ = ("items", "index")

    def __init__(self, items):
        super().__init__(None)
        self.items = items
        self.index = 0

    def next(self):
        if self.index >= len(self.items):
            return None
        v = self.items[self.index]
        self.index += 1
        return v

    def unpack(self, tx):
        rest = self.items[self.index:]
        self.index = len(self.items)
        return rest

    def remaining(self, tx) -> list:
        """What the iterator has left, as a list, for a graph break that hands the rest
        of the loop to a resume function (its tensors become graph outputs); the
        iterator then iterates that list.  [] for one handed over live."""
        return self.items[self.index:]

    def handover(self):
        """(layout kind, Var) when a graph break hands this iterator over live: the Var
        is a tuple of the containers it reads and its positions, from which the resume
        function's prologue makes it anew (see resume._live_iterator); None when it is
        handed over as the list of what it has left."""
        return None


def note_live_read(tx, container):
    """A live iterator read `container`: while a graph break pulls what an iterator has
    left (LazyIteratorVar.remaining), the containers it reads are collected."""
    reads = tx.root.live_reads
    if reads is not None:
        reads.append(container)


def live_items(seq: _SequenceVar, tx):
    """The items of a list as its iterator sees them: by index into the live list, so
    items appended while the loop runs are seen (CPython's list iterator)."""
    i = 0
    while True:
        note_live_read(tx, seq)
        if i >= len(seq.items):
            return
        yield seq.items[i]
        i += 1


def live_keys(d: DictVar, tx, view=lambda d, k: d.key_var(k)):
    """The keys (or `view` of each key) of a dict as its iterator sees them: a change of
    its size while the loop runs is CPython's RuntimeError, which the trace cannot give
    (the frame runs in CPython, which raises it).  The size is taken now, as iter()
    does."""
    return live_members(d, "items", tx, view, "dictionary")


def live_members(var, table: str, tx, view, kind: str):
    """What iterating over a hash table gives (a dict's `items`, a set's `real`, read
    through the attribute `table` of `var` on every step), with CPython's check that
    its size did not change; the size is taken now, as iter() does."""
    return _live_members(var, table, tx, view, kind, len(getattr(var, table)))


def _live_members(var, table, tx, view, kind, size):
    for k in list(getattr(var, table)):
        note_live_read(tx, var)
        if len(getattr(var, table)) != size:
            break
        if k not in getattr(var, table):
            unsupported(f"a {kind} member removed while iterating over it")
        yield view(var, k)
    note_live_read(tx, var)
    if len(getattr(var, table)) != size:
        unsupported(f"{kind} changed size during iteration (RuntimeError)")


def attrs_dict(attrs: dict):
    """An emitter of the dict ``{name: value}`` of an object's traced attributes (to
    rebuild the object with them)."""
    names = list(attrs)

    def emit(cg):
        for n in names:
            cg.load_const(n)
            attrs[n].reconstruct(cg)
        cg.build(dict, len(names))
    return emit
