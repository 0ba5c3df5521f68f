"""Python builtins while tracing: evaluated at trace time on constants, or given
meaning on traced values (len of a list, isinstance of a tensor, zip of lists ...).

Iterators made by builtins (zip, map, filter, enumerate, reversed, iter) and by
itertools are lazy, like CPython's (`iterators.LazyIteratorVar`).  Sets hold constants
only (`SetVar`, `FrozenSetVar`)."""
from __future__ import annotations

import abc
import collections.abc
import functools
import operator
import types

import torch
from torch._subclasses.fake_tensor import FakeTensor
import sys

from .base import (DELETED, NULL, Unsupported, Var, binary_op, nouns, raise_builtin, raise_folded,
                   register, safe_repr, unsupported, wrap)
from .constant import ConstVar, MethodVar, fold_call
from .containers import (DictVar, DictViewVar, IteratorVar, ListVar, NamedTupleVar, TupleVar, _dict_key,
                         has_nan, live_items, live_keys, live_members, note_live_read)
from .iterators import (MAX_UNPACK, DictIteratorVar, LazyIteratorVar, ListIteratorVar, const_key, drain,
                        private_list)
from .lazy import Lazy
from .functions import BoundMethodVar, NestedFunctionVar, PartialVar, UserFunctionVar
from .classes import class_attr, class_defines, class_lookup
from .modules import NNModuleVar, table_changed
from .objects import ObjectVar, SuperVar, TorchFnVar, _all_const, _refuse_metaclass_hook, namespace_var
from .symbolic import SliceVar, SymNodeVar
from .tensor import TensorVar
from ..resume_codes import original_code
from .attributes import InstanceAttrs, class_read_runs_code, guard_hasattr
from .exceptions import TracedRaise, caught, construct_exception, user_iterator, user_next
from .user_objects import (DataclassVar, NewObjectVar, UserObjectVar, is_user_object, new_object_hasattr,
                           user_object_text)
from .numpy import NdarrayVar, numpy_binary_op, numpy_unary_op
from .tensor_attrs import has_python_attr
from .tensor_facts import hashed

class BuiltinVar(ObjectVar):
    """A Python builtin: evaluated at trace time on constants, or given meaning on
    traced values (len of a list, isinstance of a tensor, ...)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        fn = self.value
        if isinstance(fn, type) and issubclass(fn, BaseException):
            return construct_exception(tx, fn, args, kwargs)
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is not None:
            result = handler(tx, args, kwargs)
            if result is not None:
                return result
        if fn in _FOLDABLE_BUILTINS and _all_const(args, kwargs):
            return fold_call(fn, args, kwargs, fn.__name__)
        data = [a for a in args if isinstance(a, SymNodeVar) and not a.is_const()]
        if data:
            # (what stops the trace is that one value, not the call's other arguments)
            unsupported(f"{fn.__name__}() needs the value of {data[0]}",
                        hint=_BUILTIN_HINTS.get(fn.__name__))
        on = f" of {', '.join(map(str, args))}" if args else ""
        unsupported(f"{fn.__name__}(){on}", hint=_BUILTIN_HINTS.get(fn.__name__))


_OUT_OF_GRAPH = "move it out of the compiled function (or into a function marked torch.compiler.disable)"
# What the user can do about a builtin the graph cannot hold.
_BUILTIN_HINTS = {
    "print": "move the print() out of the compiled function, or print tensors after it "
             "returns; here it runs in CPython at a graph break",
    "id": "id() names the object, not its value: key on something the graph computes",
    "hash": "hash() names the object, not its value: key on something the graph computes",
    "open": _OUT_OF_GRAPH, "input": _OUT_OF_GRAPH, "exec": _OUT_OF_GRAPH, "eval": _OUT_OF_GRAPH,
    "breakpoint": "debug the function uncompiled (frametrace.disable, or without optimize())",
}



@register
def var_iter(tx, v: Var):
    """A Python iterator over the Vars that iterating over `v` gives, taken now (as
    CPython's iter() would be); iterators are consumed lazily."""
    if isinstance(v, IteratorVar):
        return drain(v)
    from .subclasses import is_user_container  # (lazy: import cycle, to break)
    if is_user_container(v) and v._user_method(tx, "__iter__") is None:
        # The builtin base's iterator: live, as for a plain container.
        if isinstance(v, SetVar):
            v.check_order_known()
            return live_members(v, "real", tx, lambda s, k: s.members[k], "set")
        if isinstance(v, DictVar):
            return live_keys(v, tx)
        return live_items(v, tx)
    if type(v) is ListVar:
        return live_items(v, tx)
    if type(v) is SetVar:
        v.check_order_known()
        return live_members(v, "real", tx, lambda s, k: s.members[k], "set")
    if isinstance(v, DictVar) and type(v).unpack is DictVar.unpack:
        return live_keys(v, tx)
    if isinstance(v, DictViewVar):
        return v.iter_items(tx)
    if isinstance(v, ConstVar) and not isinstance(v.value, (str, bytes)) and hasattr(v.value, "__iter__"):
        return (ConstVar(x) for x in v.value)        # ranges need not be listed
    items = user_iterator(tx, v)
    if items is not None:
        return items
    return iter(v.unpack(tx))


def call_item_fn(tx, fn, args):
    """Call a function an iterator applies to its items (map, filter, ...): code of the
    program, counted, since a graph break in a loop must not run it ahead of time."""
    if not (isinstance(fn, BuiltinVar) and fn.value in _FOLDABLE_BUILTINS):
        tx.root.code_runs += 1
    return fn.call(tx, args, {})


@register
def var_list(tx, v: Var) -> list:
    """All items of an iterable Var (bounded)."""
    if isinstance(v, IteratorVar):
        return v.unpack(tx)
    out = []
    for item in var_iter(tx, v):
        out.append(item)
        if len(out) > MAX_UNPACK:
            unsupported(f"iterable gave more than {MAX_UNPACK} items")
    return out


def _truth(tx, v: Var) -> bool:
    return v.truth(tx)


_ITER_TYPES = {"list": type(iter([])), "tuple": type(iter(())), "dict": type(iter({})),
               "range": type(iter(range(0))), "str": type(iter("")), "set": type(iter(set()))}


# --------------------------------------------------------------------------- sets
class SetVar(DictVar):
    """A set of constants, and of objects hashed by identity (modules, user objects,
    classes, functions: the memo sets of torch.nn code).  `real` is a Python set of the
    same keys (the constants, the real objects) with the same history of adds and
    removes, so iteration order (and pop) is CPython's; `members` maps each key to its
    Var, and `items` mirrors the constant keys so that `in` works as on a dict."""
    __slots__ = ("real", "members")
    kind = set
    is_set = True

    def __init__(self, values=(), source=None):
        DictVar.__init__(self, {}, source)
        self.real = self.kind(values)
        self.members = {k: ConstVar(k) for k in self.real}
        self._sync()

    @classmethod
    def of_vars(cls, tx, vars_):
        out = cls()
        keys = []
        for v in vars_:
            k = set_key(v)
            if k not in out.members:
                out.members[k] = v
            keys.append(k)
        out.real = cls.kind(keys)
        out._sync()
        return out

    def _sync(self):
        self.members = {k: self.members.get(k) or ConstVar(k) for k in self.real}
        self.items = {k: v for k, v in self.members.items() if v.is_const()}

    def python_type(self):
        return self.kind

    def is_const(self):
        return False     # mutable: never folded into a shared constant

    def as_const(self):
        if not all(v.is_const() for v in self.members.values()):
            unsupported(f"{self.kind.__name__} of non-constant members")
        return self.kind(self.real)

    def unpack(self, tx):
        self.check_order_known()
        return [self.members[k] for k in self.real]

    def check_order_known(self):
        """Iteration order is the order of the keys' hashes: known for constants and
        objects guarded by identity, not for members hashed by an identity that the
        next call changes (tensors, objects made in the frame, objects guarded by
        type only)."""
        if any(_order_unknown(m) for m in self.members.values()):
            unsupported(f"iterating over a {self.kind.__name__} of tensors or objects hashed by "
                        "identity (its order changes from call to call)")

    def length(self, tx):
        return len(self.real)

    def truth(self, tx):
        return bool(self.real)

    def contains(self, tx, item) -> bool:
        """`item in self` (for the interpreter's CONTAINS_OP)."""
        return set_key(item) in self.real

    def getitem(self, tx, key):
        unsupported(f"'{self.kind.__name__}' object is not subscriptable")

    def setitem(self, tx, key, value):
        unsupported(f"'{self.kind.__name__}' object does not support item assignment")

    def delitem(self, tx, key):
        unsupported(f"'{self.kind.__name__}' object does not support item deletion")

    _MUTATING = {"add", "discard", "remove", "pop", "clear", "update", "difference_update",
                 "intersection_update", "symmetric_difference_update"}
    _NEW = {"union", "intersection", "difference", "symmetric_difference", "copy",
            "__or__", "__and__", "__sub__", "__xor__"}
    _QUERY = {"issubset", "issuperset", "isdisjoint", "__len__", "__eq__",
              "__ne__", "__le__", "__lt__", "__ge__", "__gt__"}

    # Operators take sets only (else NotImplemented: a TypeError, or == is False).
    _OPERATORS = {"__or__", "__and__", "__sub__", "__xor__", "__eq__", "__ne__", "__lt__",
                  "__le__", "__gt__", "__ge__", "__ior__", "__iand__", "__isub__", "__ixor__"}
    _INPLACE = {"__ior__": "update", "__iand__": "intersection_update",
                "__isub__": "difference_update", "__ixor__": "symmetric_difference_update"}

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            unsupported(f"{self.kind.__name__}.{name} with keyword arguments")
        try:
            return self._call_method(tx, name, args)
        except TypeError as e:      # the real set's own check (a missing argument ...)
            raise_folded(e, f"{self.kind.__name__}.{name}")

    def _call_method(self, tx, name, args):
        if name in self._OPERATORS:
            other = as_set_var(args[0]) if len(args) == 1 else None
            if other is None:
                if name in ("__eq__", "__ne__") and len(args) == 1 and never_equal_to_set(args[0]):
                    return ConstVar(name == "__ne__")
                unsupported(f"{self.kind.__name__}.{name} with {nouns(args)} (NotImplemented)")
            args = [other]
            if name in self._INPLACE:
                if self.kind is not set:
                    unsupported(f"frozenset.{name}")
                SetVar.call_method(self, tx, self._INPLACE[name], args, {})
                return self
        if name == "__contains__" and len(args) == 1:
            return ConstVar(self.contains(tx, args[0]))
        if name in ("isdisjoint", "issuperset") and len(args) == 1 and \
                not isinstance(args[0], SetVar):
            return ConstVar(self._scan(tx, args[0], stop_if_in=name == "isdisjoint"))
        new_members = {}
        if name in ("add", "discard", "remove"):
            real_args = [set_key(a) for a in args]
            new_members.update(zip(real_args, args))
        else:
            real_args = [self._as_real(tx, a, new_members) for a in args]
        if name in self._MUTATING and self.kind is set:
            if name == "remove" and real_args and real_args[0] not in self.real:
                if not args[0].is_const():
                    unsupported("set.remove of a missing member (KeyError)")
                raise_builtin(KeyError, real_args[0])
            if name == "pop" and not self.real:
                raise_builtin(KeyError, "pop from an empty set")
            if name == "pop":
                self.check_order_known()
                k = self.real.pop()
                v = self.members[k]
                self._sync()
                return v
            for k, v in new_members.items():
                self.members.setdefault(k, v)
            getattr(self.real, name)(*real_args)
            self._sync()
            return ConstVar(None)
        if name in self._NEW:
            # A plain set or frozenset, also for a subclass (as CPython's).
            out = (FrozenSetVar if self.kind is frozenset else SetVar)()
            out.real = getattr(self.real, name)(*real_args)
            out.members = {**new_members, **self.members}
            out._sync()
            return out
        if name in self._QUERY:
            return ConstVar(getattr(self.real, name)(*real_args))
        unsupported(f"{self.kind.__name__}.{name}")

    def _scan(self, tx, iterable, stop_if_in: bool) -> bool:
        """isdisjoint / issuperset of an iterable that is not a set: CPython stops at
        the first item that decides (a generator is left part-way)."""
        for x in var_iter(tx, iterable):
            if (set_key(x) in self.real) == stop_if_in:
                return False
        return True

    def _as_real(self, tx, v, members):
        if isinstance(v, SetVar):
            members.update(v.members)
            return v.real
        keys = []
        for x in var_list(tx, v):
            k = set_key(x)
            members.setdefault(k, x)
            keys.append(k)
        return keys

    def reconstruct(self, cg):
        cg.load_constructor(self.kind)
        for k in self.real:
            self.members[k].reconstruct(cg)
        cg.build(tuple, len(self.real))
        cg.call(1)

    def __repr__(self):
        return f"{type(self).__name__}({safe_repr(self.real)})"


class FrozenSetVar(SetVar):
    __slots__ = ()
    kind = frozenset

    def is_const(self):
        return all(v.is_const() for v in self.members.values())

    def reconstruct(self, cg):
        if self.is_const():
            cg.load_const(self.real)
        else:
            super().reconstruct(cg)


def as_set_var(v: Var):
    """`v` as a SetVar when it is a set or frozenset (a constant frozenset too), else None."""
    if isinstance(v, SetVar):
        return v
    if isinstance(v, ConstVar) and isinstance(v.value, (set, frozenset)):
        return FrozenSetVar(v.value)
    return None


def never_equal_to_set(v: Var) -> bool:
    """Values whose == with a set is False with no code of the program run (neither side
    knows the other: both __eq__ return NotImplemented, then identity decides)."""
    from .subclasses import is_user_container  # (lazy: import cycle, to break)
    if is_user_container(v):
        return False
    return isinstance(v, (ConstVar, TupleVar, ListVar, DictViewVar)) or \
        isinstance(v, DictVar) and not isinstance(v, SetVar)


def _identity_hashed(cls) -> bool:
    return class_lookup(cls, "__hash__") is object.__hash__ and \
        class_lookup(cls, "__eq__") is object.__eq__


def _order_unknown(member: Var) -> bool:
    return isinstance(member, (TensorVar, NewObjectVar, UserObjectVar))


@register
def set_key(v: Var):
    """What stands for `v` in a set: the constant, or the real object for values hashed
    by identity."""
    if v.is_const():
        k = v.as_const()
        try:
            hash(k)
        except TypeError as e:
            raise_folded(e, f"unhashable set member {k!r}")
        if has_nan(k):
            # A set or dict finds a NaN only by identity: the trace's answer would be
            # the traced objects', and which NaN object the program holds is not guarded.
            unsupported("a set member or dict key holding a NaN (found only by identity)")
        return k
    if isinstance(v, IdVar):
        return v.key
    by_value = v.value_key()
    if by_value is not None:
        return by_value
    if isinstance(v, TensorVar):
        if getattr(v.example, PICKED, False):
            refuse_picked("hashing")
        return hashed(v.example)    # one FakeTensor per tensor; a tensor hashes by identity
    if isinstance(v, NewObjectVar) and _identity_hashed(v.cls):
        return v                # one Var per object made in the frame
    real = None
    if isinstance(v, NNModuleVar):
        real = v.module
    elif isinstance(v, (UserObjectVar, ObjectVar)):
        real = v.value
    elif isinstance(v, UserFunctionVar) and not (v.fn.__closure__ and v.source is not None):
        real = v.fn         # (a closure from outside is guarded by its code, not identity)
    if real is not None and (isinstance(real, (type, types.FunctionType, types.BuiltinFunctionType))
                             or type(real).__hash__ is object.__hash__):
        return real
    unsupported(f"set member {v} (only constants and objects hashed by identity)")


# --------------------------------------------------------------------------- handlers
def _python_type_of(tx, v: Var) -> type:
    return v.python_type()


def _len(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        if isinstance(args[0], TensorVar) and args[0].example.dim():
            return tx.output.size_of(args[0]).items[0]     # may stay symbolic
        if isinstance(args[0], NdarrayVar) and not args[0].scalar and args[0].base.example.dim():
            return tx.output.size_of(args[0].base).items[0]
        return ConstVar(args[0].length(tx))


def _class_value(v):
    if isinstance(v, ObjectVar):
        return v.value
    if isinstance(v, TupleVar):
        return tuple(_class_value(c) for c in v.items)
    if v.is_const():
        return v.as_const()
    unsupported(f"class argument {v}")


def _isinstance(tx, args, kwargs):
    if len(args) != 2 or kwargs:
        return None
    return ConstVar(_instance_check(tx, args[0], args[1]))


def _instance_check(tx, obj: Var, cls_var: Var) -> bool:
    """CPython's isinstance: the exact type first, tuples member by member, then the
    metaclass's __instancecheck__ (traced when the user wrote it)."""
    if isinstance(cls_var, TupleVar):
        return any(_instance_check(tx, obj, c) for c in cls_var.items)
    cls = _class_value(cls_var)
    if isinstance(cls, tuple):
        return any(_instance_check(tx, obj, ObjectVar(c)) for c in cls)
    t = _python_type_of(tx, obj)
    if isinstance(obj, TensorVar):
        if type(cls) is type(torch.FloatTensor):
            # Legacy tensor types (torch.FloatTensor ...) check dtype, device and
            # layout, which the FakeTensor has (and the input's tensor guard checks).
            return isinstance(obj.example, cls)
        # A FakeTensor stands for a plain tensor or a Parameter; a wrapper subclass's
        # fake is an instance of the subclass.
        t = torch.Tensor if issubclass(t, FakeTensor) else t
    if t is cls:
        return True
    check = _user_meta_method(tx, cls, "__instancecheck__")
    if check is not None:
        return _call_meta_method(tx, check, cls_var, cls, obj)
    if not isinstance(obj, TensorVar) and _instance_dependent(cls):
        unsupported(f"isinstance with {getattr(cls, '__qualname__', cls)!r}, whose metaclass "
                    "looks at the instance")
    asks_class = isinstance(obj, InstanceAttrs) and (isinstance(cls, abc.ABCMeta) or not _class_covers(t, cls))
    if asks_class and class_read_runs_code(obj):
        # CPython asks the object for its __class__ here (ABCMeta always), through the
        # class's own __getattribute__ or __class__ property: traced, it runs as often.
        claimed = _class_value(obj.getattr(tx, "__class__"))
        if claimed is not t and isinstance(claimed, type) and _class_covers(claimed, cls, tx):
            return True
    elif asks_class:
        # (a __getattribute__ given to the class later would run here: it fails this)
        k = obj.instance_class()
        tx.guards.class_attr(k, "__getattribute__", class_lookup(k, "__getattribute__"))
    return _class_covers(t, cls, tx)


_CLASS_BASED_CHECKS = (type.__dict__["__instancecheck__"], abc.ABCMeta.__dict__["__instancecheck__"])


def _instance_dependent(cls) -> bool:
    """Whether isinstance(obj, cls) may depend on more than type(obj): a library
    metaclass's own __instancecheck__ (typing's runtime protocols look at the instance's
    attributes)."""
    for k in type(cls).__mro__:
        check = k.__dict__.get("__instancecheck__")
        if check is not None:
            return check not in _CLASS_BASED_CHECKS
    return False


def _issubclass(tx, args, kwargs):
    if len(args) != 2 or kwargs:
        return None
    return ConstVar(_subclass_check(tx, args[0], args[1]))


def _subclass_check(tx, sub: Var, cls_var: Var) -> bool:
    if isinstance(cls_var, TupleVar):
        return any(_subclass_check(tx, sub, c) for c in cls_var.items)
    cls = _class_value(cls_var)
    if isinstance(cls, tuple):
        return any(_subclass_check(tx, sub, ObjectVar(c)) for c in cls)
    check = _user_meta_method(tx, cls, "__subclasscheck__")
    if check is not None:
        return _call_meta_method(tx, check, cls_var, cls, sub)
    return _class_covers(_class_value(sub), cls, tx)


def _user_meta_method(tx, cls, name):
    """`name` of cls's metaclass when it is a Python function from user code (library
    metaclasses, ABCMeta and torch's, are answered on the real classes).  Guarded: a
    metaclass is a class like any other."""
    meta = type(cls)
    if meta is type:
        return None
    fn = class_attr(tx, meta, name)
    if not isinstance(fn, types.FunctionType):
        return None
    module = (getattr(fn, "__module__", None) or "").split(".")[0]
    if module in sys.stdlib_module_names or module in ("torch", "frametrace", "typing_extensions"):
        return None
    return fn


def _call_meta_method(tx, fn, cls_var, cls, arg) -> bool:
    if not isinstance(cls_var, ObjectVar) or cls_var.value is not cls:
        cls_var = ObjectVar(cls)
    return wrap(tx, fn, None, guard=False).call(tx, [cls_var, arg], {}).truth(tx)


def _class_covers(t, classes, tx=None):
    try:
        answer = issubclass(t, classes)
    except TypeError:
        unsupported(f"isinstance with {classes!r}")
    if tx is not None:
        tx.guards.class_mro(t)      # (`__bases__` can be assigned)
    # A register() can turn an ABC's False into True; a True stays (registries and the
    # ABCs' positive caches only grow).
    if tx is not None and not answer and any(
            isinstance(c, abc.ABCMeta) for c in (classes if isinstance(classes, tuple) else (classes,))):
        tx.guards.abc_registry(t, classes)
    return answer


def _range(tx, args, kwargs):
    if _all_const(args, kwargs):
        return fold_call(range, args, kwargs, "range")
    unsupported(f"range() of values not known at trace time: {nouns(args)}")


def _tuple_list(kind):
    def handler(tx, args, kwargs):
        if kwargs or len(args) > 1:
            return None
        items = var_list(tx, args[0]) if args else []
        return TupleVar(items) if kind is tuple else ListVar(items)
    return handler


def _set(kind):
    cls = SetVar if kind is set else FrozenSetVar

    def handler(tx, args, kwargs):
        if kwargs or len(args) > 1:
            return None
        if args and type(args[0]) is cls:
            return args[0] if cls is FrozenSetVar else SetVar.call_method(args[0], tx, "copy", [], {})
        return cls.of_vars(tx, var_list(tx, args[0]) if args else [])
    return handler


def mapping_items(tx, src):
    """What ``dict.update(d, src)`` (and ``**src``) takes from `src` when it is a
    mapping: a dict's items, or a user mapping's (`mapping_items` of its Var).  None
    for anything else (an iterable of pairs)."""
    if isinstance(src, DictVar) and not isinstance(src, SetVar):
        return dict(src.items)
    return src.mapping_items(tx)


def _dict(tx, args, kwargs):
    if len(args) > 1:
        return None
    items = {}
    if args:
        src = args[0]
        mapped = mapping_items(tx, src)
        if mapped is not None:
            items.update(mapped)
        else:
            for pair in var_iter(tx, src):
                kv = var_list(tx, pair)
                if len(kv) != 2:
                    unsupported("dict() from a sequence element that is not a pair")
                items[_dict_key(kv[0])] = kv[1]
    items.update(kwargs)
    return DictVar(items)


def _enumerate(tx, args, kwargs):
    if len(args) not in (1, 2) or set(kwargs) - {"start"}:
        return None
    start = args[1] if len(args) == 2 else kwargs.get("start", ConstVar(0))
    return EnumerateVar(iter_of(tx, args[0]), const_key(start, "enumerate start"))


class EnumerateVar(LazyIteratorVar):
    """enumerate(it): at a graph break, over a live list or dict iterator, it is handed
    over as enumerate(that iterator, count) (else as what it has left)."""
    __slots__ = ("inner", "count")

    def __init__(self, inner: IteratorVar, start: int):
        self.inner, self.count = inner, start
        super().__init__(self._pull(), enumerate)

    def _pull(self):
        for v in drain(self.inner):
            self.count += 1
            yield TupleVar([ConstVar(self.count - 1), v])

    def handover(self):
        inner = self.inner.handover()
        return None if inner is None else (f"e:{inner[0]}", TupleVar([inner[1], ConstVar(self.count)]))

    def remaining(self, tx) -> list:
        if self.handover() is not None:
            return self.inner.remaining(tx)
        if self.index >= len(self.items):
            rest = self.inner.remaining(tx)
            self.items = [TupleVar([ConstVar(self.count + i), v]) for i, v in enumerate(rest)]
            self.index = 0
            self.gen = iter(())
        return self.items[self.index:]


def _zip_rows(iters, strict=False):
    if not iters:
        return
    while True:
        row = []
        for i, it in enumerate(iters):
            try:
                row.append(next(it))
            except StopIteration:
                if strict:
                    if i > 0:
                        unsupported("zip(strict=True) over iterables of different lengths")
                    for other in iters[1:]:
                        if next(other, None) is not None:
                            unsupported("zip(strict=True) over iterables of different lengths")
                return
        yield row


def _zip(tx, args, kwargs):
    if set(kwargs) - {"strict"}:
        return None
    strict = bool(const_key(kwargs["strict"])) if "strict" in kwargs else False
    return ZipVar([iter_of(tx, a) for a in args], strict)


class ZipVar(LazyIteratorVar):
    """zip(...): at a graph break, over live list or dict iterators (enumerated or
    not), it is handed over as zip of those iterators (else as what it has left)."""
    __slots__ = ("inners", "strict")

    def __init__(self, inners: list, strict: bool):
        self.inners, self.strict = inners, strict
        rows = _zip_rows([drain(i) for i in inners], strict)
        super().__init__((TupleVar(row) for row in rows), zip)

    def handover(self):
        if self.strict or not self.inners:
            return None
        live = [i.handover() for i in self.inners]
        if any(h is None or ";" in h[0] for h in live):     # no zip in a zip
            return None
        return "z:" + ";".join(h[0] for h in live), TupleVar([h[1] for h in live])

    def remaining(self, tx) -> list:
        if self.handover() is None:
            return super().remaining(tx)
        for inner in self.inners:
            inner.remaining(tx)
        return []


def _map(tx, args, kwargs):
    if kwargs or len(args) < 2:
        return None
    fn = args[0]
    iters = [var_iter(tx, a) for a in args[1:]]
    return LazyIteratorVar((call_item_fn(tx, fn, row) for row in _zip_rows(iters)), map)


def _is_none_var(v):
    return isinstance(v, ConstVar) and v.value is None


def _filter(tx, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    fn = args[0]
    source = var_iter(tx, args[1])

    def gen():
        for v in source:
            keep = v if _is_none_var(fn) else call_item_fn(tx, fn, [v])
            if _truth(tx, keep):
                yield v
    return LazyIteratorVar(gen(), filter)


def _reversed(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    v = args[0]
    if isinstance(v, IteratorVar):
        unsupported("reversed() of an iterator (TypeError)")
    if isinstance(v, SetVar):
        unsupported("reversed() of a set (TypeError)")
    if isinstance(v, ConstVar):
        try:
            real = reversed(v.value)
        except TypeError as e:
            unsupported(f"reversed(): {e}")
        return LazyIteratorVar((ConstVar(x) for x in real), type(real))
    if type(v) is ListVar:
        return LazyIteratorVar(_live_reversed(v, tx), type(reversed([])))
    items = var_list(tx, v)
    return LazyIteratorVar(iter(items[::-1]), type(reversed([])))


def _live_reversed(seq, tx):
    """CPython's reversed list iterator: by index into the live list, from the end it
    had; it stops for good at an index past the end (the list shrank)."""
    i = len(seq.items) - 1
    while True:
        note_live_read(tx, seq)
        if not 0 <= i < len(seq.items):
            return
        yield seq.items[i]
        i -= 1


def _iter(tx, args, kwargs):
    if len(args) == 2 and not kwargs:
        return _call_until(tx, args[0], args[1])
    if len(args) != 1 or kwargs:
        return None
    return iter_of(tx, args[0])


_CALLABLE_ITERATOR = type(iter(int, 0))


def _call_until(tx, fn, sentinel):
    """iter(fn, sentinel): calls fn lazily, one call per item, until it returns
    something equal to the sentinel (CPython compares with ==, sentinel on the left)."""

    def gen():
        while True:
            v = call_item_fn(tx, fn, [])
            if binary_op(tx, operator.eq, sentinel, v).truth(tx):
                return
            yield v
    return LazyIteratorVar(gen(), _CALLABLE_ITERATOR)


@register
def iter_of(tx, v: Var) -> IteratorVar:
    """iter(v) (and GET_ITER)."""
    if isinstance(v, IteratorVar):
        return v
    if isinstance(v, TensorVar):
        return LazyIteratorVar(iter(v.unpack(tx)), None)
    if type(v) is ListVar:
        if private_list(tx, v):
            # The rest of a loop handed to this resume function: handed on the same
            # way at a break, so that one resume code serves every iteration.
            return LazyIteratorVar(live_items(v, tx), type(iter([])))
        return ListIteratorVar(v, tx)
    if isinstance(v, DictVar) and type(v).unpack is DictVar.unpack:
        return DictIteratorVar(v, "keys", tx)
    if isinstance(v, DictViewVar) and type(v.dict).unpack is DictVar.unpack:
        return DictIteratorVar(v.dict, v.kind, tx)
    kind = None
    try:
        kind = _ITER_TYPES.get(v.python_type().__name__)
    except Exception:
        pass
    return LazyIteratorVar(var_iter(tx, v), kind)


def _next(tx, args, kwargs):
    if len(args) not in (1, 2) or kwargs:
        return None
    it = args[0]
    if not isinstance(it, IteratorVar):
        return user_next(tx, it, args[1] if len(args) == 2 else None)
    v = it.next()
    if v is None:
        if len(args) == 2:
            return args[1]
        raise_builtin(StopIteration)
    return v


def _keys_of(tx, items, key):
    """Constant sort keys for `items` (Vars), through the traced `key` function."""
    keys = []
    for v in items:
        k = v if key is None or _is_none_var(key) else key.call(tx, [v], {})
        if isinstance(k, TensorVar) or isinstance(v, TensorVar) and k is v:
            unsupported("comparing tensors (data-dependent)")
        keys.append(const_key(k, "comparison key"))
    return keys


@register
def sorted_list(tx, args, kwargs):
    if len(args) != 1 or set(kwargs) - {"key", "reverse"}:
        return None
    items = var_list(tx, args[0])
    keys = _keys_of(tx, items, kwargs.get("key"))
    reverse = bool(const_key(kwargs.get("reverse", ConstVar(False))))
    try:
        order = sorted(range(len(items)), key=keys.__getitem__, reverse=reverse)
    except TypeError as e:
        unsupported(f"sorted(): {e}")
    return ListVar([items[i] for i in order])


def _min_max(pick):
    def handler(tx, args, kwargs):
        if not args or set(kwargs) - {"key", "default"}:
            return None
        if len(args) == 1:
            items = var_list(tx, args[0])
        else:
            if "default" in kwargs:
                return None
            items = list(args)
        if not items:
            if "default" in kwargs:
                return kwargs["default"]
            unsupported(f"{pick.__name__}() of an empty sequence (ValueError)")
        if "key" not in kwargs and any(isinstance(i, SymNodeVar) for i in items) and \
                all(isinstance(i, (SymNodeVar, ConstVar)) for i in items):
            best = items[0]
            if all(i.python_type() is int for i in items):
                # Sizes: torch.sym_max / sym_min keep the result symbolic, without a guard.
                sym_pick = torch.sym_max if pick is max else torch.sym_min
                for item in items[1:]:
                    best = tx.output.call("call_function", sym_pick, (best, item), {})
                return best
            # Mixed with floats: CPython returns one of the items, so pick it by
            # comparisons (each a guard on the relation, not on the value), made as
            # the `>` operator is (sympy would answer `m > inf` for a float m).
            for item in items[1:]:
                if binary_op(tx, operator.gt if pick is max else operator.lt, item, best).truth(tx):
                    best = item
            return best
        if "key" not in kwargs and len(items) > 1:
            made = _pick_tensor(tx, pick, items)
            if made is not None:
                return made
        keys = _keys_of(tx, items, kwargs.get("key"))
        try:
            best = pick(range(len(items)), key=keys.__getitem__)
        except TypeError as e:
            unsupported(f"{pick.__name__}(): {e}")
        return items[best]
    return handler


PICKED = "_frametrace_min_max_result"     # set on the FakeTensor of such a result


def refuse_picked(what):
    """The frame runs in CPython: a break here would run `what` on the new tensor."""
    e = Unsupported(f"{what} of the result of min()/max() of tensors (in CPython, one of its items)")
    e.whole_frame = True
    raise e


def _pick_tensor(tx, pick, items):
    """min/max of one-element tensors, chosen in the graph: CPython keeps the first item
    and replaces it by each later one that compares less (greater), so `where(item < best,
    item, best)` in turn has its values, NaNs included.  The result is a new tensor, not
    the chosen object: only where nothing tells them apart (one shape, dtype and device;
    nothing that requires grad: where() would give the item not chosen a zero gradient,
    where CPython gives it none), and a write into it later (`m += 1`, which would write
    the chosen item in CPython) refuses the compile."""
    if not all(isinstance(i, TensorVar) for i in items):
        return None
    fakes = [i.node.meta.get("example_value") for i in items]
    if not all(isinstance(f, torch.Tensor) for f in fakes):
        return None
    first = fakes[0]
    if any(f.numel() != 1 or f.shape != first.shape or f.dtype != first.dtype or
           f.device != first.device or f.layout != torch.strided or f.is_complex() or
           f.requires_grad for f in fakes):
        return None
    op = torch.gt if pick is max else torch.lt
    best = items[0]
    for item in items[1:]:
        cond = tx.output.call("call_function", op, (item, best), {})
        best = tx.output.call("call_function", torch.where, (cond, item, best), {})
    made = best.node.meta.get("example_value")
    setattr(made, PICKED, True)
    tx.output.picked_storages[made.untyped_storage()._cdata] = \
        [f.untyped_storage()._cdata for f in fakes]
    return best


def _sum(tx, args, kwargs):
    if len(args) not in (1, 2) or set(kwargs) - {"start"}:
        return None
    acc = args[1] if len(args) == 2 else kwargs.get("start", ConstVar(0))
    if isinstance(acc, ConstVar) and isinstance(acc.value, (str, bytes, bytearray)):
        unsupported("sum() can't sum strings (TypeError)")
    for item in var_iter(tx, args[0]):
        acc = binary_op(tx, operator.add, acc, item)
    return acc


def _any_all(want):
    def handler(tx, args, kwargs):
        if len(args) != 1 or kwargs:
            return None
        for v in var_iter(tx, args[0]):
            if _truth(tx, v) == want:
                return ConstVar(want)
        return ConstVar(not want)
    return handler


def _abs(tx, args, kwargs):
    if len(args) == 1 and not kwargs and isinstance(args[0], TensorVar):
        return tx.output.call("call_function", operator.abs, (args[0],), {})
    if len(args) == 1 and not kwargs and isinstance(args[0], NdarrayVar):
        return numpy_unary_op(tx, operator.abs, args[0])


def _round(tx, args, kwargs):
    if args and isinstance(args[0], TensorVar):
        unsupported("round() of a tensor (TypeError: Tensor has no __round__)")


def _pow(tx, args, kwargs):
    if len(args) == 2 and not kwargs and any(isinstance(a, NdarrayVar) for a in args):
        return numpy_binary_op(tx, operator.pow, *args)
    if len(args) == 2 and not kwargs and any(isinstance(a, TensorVar) for a in args):
        return tx.output.call("call_function", operator.pow, tuple(args), {})


_SYM_CONVERSIONS = {int: torch.sym_int, float: torch.sym_float}


def _data_conversion(kind):
    def handler(tx, args, kwargs):
        if len(args) == 1 and isinstance(args[0], TensorVar) and not kwargs and kind in (int, float, bool):
            return args[0].call_method(tx, f"__{kind.__name__}__", [], {})
        if len(args) == 1 and isinstance(args[0], TensorVar):
            unsupported(f"{kind.__name__}() of a tensor needs the tensor's data")
        if len(args) == 1 and not kwargs and isinstance(args[0], NdarrayVar):
            return args[0].convert(tx, kind)
        if len(args) == 1 and not kwargs and isinstance(args[0], SymNodeVar) and kind in _SYM_CONVERSIONS:
            if args[0].python_type() is kind:
                return args[0]
            return tx.output.call("call_function", _SYM_CONVERSIONS[kind], (args[0],), {})
        if kind is bool and len(args) == 1 and not kwargs and not args[0].is_const():
            return ConstVar(_truth(tx, args[0]))
        if kind is str and len(args) == 1 and args[0].str_of is not None:
            return args[0].str_of(tx, str)
        if kind is str and len(args) == 1 and not kwargs:
            return _text(tx, args[0], str)
    return handler


def _text(tx, v, kind):
    from .subclasses import container_format  # (lazy: import cycle, to break)
    text = container_format(tx, v, kind.__name__)
    if text is not None:
        return ConstVar(text)
    if is_user_object(v):
        return user_object_text(tx, v, kind)


def _repr(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return _text(tx, args[0], repr)


def _slice(tx, args, kwargs):
    if not kwargs and 1 <= len(args) <= 3 and any(isinstance(a, SymNodeVar) for a in args):
        return SliceVar(args if len(args) > 1 else [ConstVar(None), args[0]])


def _getattr(tx, args, kwargs):
    if len(args) not in (2, 3) or kwargs or not args[1].is_const():
        return None
    obj, name = args[0], args[1].as_const()
    if len(args) == 2:
        return obj.getattr(tx, name)
    if name == "__class__":
        return _type(tx, [obj], {})
    present = _has_attr(tx, obj, name)
    if present is True:
        return obj.getattr(tx, name)
    if present is False:
        return args[2]
    try:
        return obj.getattr(tx, name)
    except Unsupported as e:
        if caught(e, AttributeError):
            return args[2]
        if isinstance(e, TracedRaise):
            raise
        unsupported(f"getattr({obj}, {name!r}, default): cannot tell whether it exists")


_ABSENT = object()


def _has_attr(tx, obj, name):
    """Whether `obj` has attribute `name`: True, False, or None (cannot tell).  A
    guard keeps the answer for objects from the frame."""
    if isinstance(obj, (UserObjectVar, NNModuleVar)):
        value = obj.value if isinstance(obj, UserObjectVar) else obj.module
        if isinstance(class_lookup(type(value), "__getattribute__"), types.FunctionType):
            # The class's own hook answers (a config's attribute_map aliases), not
            # its __dict__: a user object's hook is inlined (getattr, as CPython's
            # hasattr does); a module's is asked of the real object while the trace
            # left it alone.
            if obj.source is None or tx.side_effects.has_attr_writes(value) or \
                    type(value) is not obj.python_type() or isinstance(obj, UserObjectVar):
                return None
            found = hasattr(value, name)
            guard_hasattr(tx, obj.source, name, found)
            return found
        written = tx.side_effects.load_attr(value, name)
        if written is not None:
            return written is not DELETED
        d = getattr(value, "__dict__", {})
        cls = obj.instance_class() if isinstance(obj, UserObjectVar) else type(value)
        if cls is not type(value):
            return _has_attr_of_new_class(tx, obj, d, cls, name)
        held = obj._dict_var(tx) if isinstance(obj, UserObjectVar) else None
        if held is not None:
            # The trace holds obj.__dict__ and may have changed it (obj.__dict__[k] = v,
            # .pop(k)): its items are the truth, as in own_attr; they carry their own
            # guards, and the class's part is guarded as a class lookup.
            if held.lookup(name, _ABSENT) is not _ABSENT:
                return True
            for hook in ("__getattribute__", "__getattr__", name):
                tx.guards.class_attr(cls, hook, class_lookup(cls, hook))
            return class_lookup(cls, name) is not None or \
                (None if class_lookup(cls, "__getattr__") is not None else False)
        if isinstance(value, torch.nn.Module) and any(
                table_changed(tx, value, t) for t in ("_parameters", "_buffers", "_modules")):
            return None     # (the tables the replay will write: the attribute read decides)
        found = name in d or class_lookup(cls, name) is not None
        if not found and isinstance(value, torch.nn.Module):
            found = any(name in (d.get(t) or {}) for t in ("_parameters", "_buffers", "_modules"))
        if not found:
            custom = class_lookup(cls, "__getattr__")
            if custom is not None and custom is not torch.nn.Module.__getattr__:
                return None
        if obj.source is not None:
            # (first: a hook added to the class later fails these, not the hasattr
            # check, which would run it)
            for hook in ("__getattribute__", "__getattr__"):
                tx.guards.class_attr(cls, hook, class_lookup(cls, hook))
            guard_hasattr(tx, obj.source, name, found)
        return found
    from .subclasses import is_user_container  # (lazy: import cycle, to break)
    if is_user_container(obj):
        # Its own attributes are all known (the names in an outside one's __dict__ are
        # guarded); the class's, guarded as classes are.
        if name in obj.attrs or class_attr(tx, obj.cls, name) is not None:
            return True
        return None if class_lookup(obj.cls, "__getattr__") is not None else False
    if isinstance(obj, PartialVar):
        return _partial_has_attr(tx, obj, name)
    if isinstance(obj, NewObjectVar):
        return new_object_hasattr(tx, obj, name)
    if isinstance(obj, NestedFunctionVar):
        return obj.has_attr(name)
    if isinstance(obj, DataclassVar):
        if name in obj.fields:
            return True
        return class_attr(tx, obj.cls, name) is not None
    if isinstance(obj, (ConstVar, ObjectVar)):
        if isinstance(obj.value, type):
            _refuse_metaclass_hook(obj.value, name)     # (hasattr would run it, here and in the guard)
        found = hasattr(obj.value, name)
        if obj.source is not None and not isinstance(obj, ConstVar):
            guard_hasattr(tx, obj.source, name, found)
        return found
    if isinstance(obj, TensorVar):
        return has_python_attr(tx, obj, name)
    if isinstance(obj, (TupleVar, ListVar, DictVar)):
        try:
            t = obj.python_type()
        except Exception:
            return None
        if hasattr(t, name):
            return True
        if isinstance(obj, NamedTupleVar):
            return name in obj.fields
        return False
    return None


_BLANK_PARTIAL = functools.partial(len)      # what every partial has


def _partial_has_attr(tx, p, name):
    """A functools.partial has func, args and keywords, what its class has, and what
    was set on it: one made while tracing nothing (setting on it is not traced)."""
    if hasattr(_BLANK_PARTIAL, name):
        return True
    if p.real is None:
        return False
    found = hasattr(p.real, name)
    guard_hasattr(tx, p.source, name, found)
    return found


def _has_attr_of_new_class(tx, obj, d, cls, name):
    """_has_attr for an object whose __class__ the frame assigned: the class the trace
    has answers (its lookups guarded), and the instance dict, guarded on its own (a
    hasattr guard would ask the class the object has when the frame starts)."""
    if class_attr(tx, cls, name) is not None:
        return True
    if name in d or obj.source is None:
        return True if name in d and obj.source is None else None
    if class_attr(tx, cls, "__getattr__") is not None:
        return None
    tx.guards.not_in_dict(obj.source, name)
    return False


def _hasattr(tx, args, kwargs):
    if len(args) != 2 or kwargs or not args[1].is_const():
        return None
    obj, name = args[0], args[1].as_const()
    present = _has_attr(tx, obj, name)
    if present is None:
        try:
            obj.getattr(tx, name)
            return ConstVar(True)
        except Unsupported as e:
            if caught(e, AttributeError):
                return ConstVar(False)
            if isinstance(e, TracedRaise):
                raise
            unsupported(f"hasattr({obj}, {name!r}): cannot tell")
    return ConstVar(present)


def _globals(tx, args, kwargs):
    if not args and not kwargs:
        return namespace_var(tx, tx.f_globals)


def _vars(tx, args, kwargs):
    if not args and not kwargs:
        return frame_locals(tx)              # vars() is locals()
    if len(args) == 1 and not kwargs and (isinstance(args[0], InstanceAttrs) or isinstance(
            args[0], ObjectVar) and (type(args[0].value) is types.ModuleType or
                                     isinstance(args[0].value, type) and args[0].source is not None)):
        return args[0].getattr(tx, "__dict__")      # (a class's: read through its source)


def _setattr(tx, args, kwargs):
    if len(args) == 3 and not kwargs and args[1].is_const():
        args[0].setattr(tx, args[1].as_const(), args[2])
        return ConstVar(None)


def _delattr(tx, args, kwargs):
    if len(args) == 2 and not kwargs and args[1].is_const() and isinstance(args[0], InstanceAttrs):
        args[0].delattr(tx, args[1].as_const())
        return ConstVar(None)


def _type(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return wrap(tx, _python_type_of(tx, args[0]), None, guard=False)


def _super(tx, args, kwargs):
    if not args and not kwargs:
        return tx.zero_arg_super()
    if len(args) == 2:
        return SuperVar(args[0], args[1])


def _callable(tx, args, kwargs):
    if len(args) == 1:
        v = args[0]
        if isinstance(v, (UserFunctionVar, NestedFunctionVar, BoundMethodVar, PartialVar,
                          TorchFnVar, BuiltinVar, MethodVar)):
            return ConstVar(True)
        if isinstance(v, (ConstVar, TensorVar, TupleVar, ListVar, DictVar, IteratorVar)):
            return ConstVar(callable(v.as_const()) if v.is_const() else False)
        if isinstance(v, ObjectVar):
            return ConstVar(callable(v.value))
        if is_user_object(v):
            # callable() asks the type for __call__ (guarded: a class can gain one)
            class_attr(tx, v.python_type(), "__call__")
            return ConstVar(class_defines(v.python_type(), "__call__"))


class IdVar(Var):
    """``id(obj)`` of a value whose identity the trace knows but not its address (a
    tensor, an object of a user class): equal to another IdVar of the same object, a
    dict key or set member standing for that object's id, and, where the program
    keeps it, ``id(obj)`` computed again at run time.  `key`: one object per traced
    object, what stands for it among keys."""
    __slots__ = ("target", "key")

    def __init__(self, target, key):
        super().__init__(None)
        self.target = target
        self.key = key

    def python_type(self):
        return int

    def reconstruct(self, cg):
        cg.call_const(id, [self.target.reconstruct])

    def noun(self):
        return f"id() of {self.target.noun()}"

    def __repr__(self):
        return f"IdVar({self.target!r})"


def _id(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    v = args[0]
    real = v.module if isinstance(v, NNModuleVar) else \
        v.value if isinstance(v, ObjectVar) and isinstance(
            v.value, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)) else \
        v.fn if isinstance(v, UserFunctionVar) and not v.fn.__closure__ else None
    if real is not None:
        # An object the trace holds as itself (guarded by identity, or fixed in the
        # code): its id is a constant while the entry's guards hold.
        return ConstVar(id(real))
    if isinstance(v, TensorVar):
        if is_picked(tx, v):
            refuse_picked("id()")
        identity = v.example            # one FakeTensor per tensor
    elif isinstance(v, (NewObjectVar, DataclassVar)):
        identity = v                    # one Var per object made in the frame
    elif isinstance(v, UserObjectVar):
        identity = v.value
    else:
        return None
    key = tx.output.id_keys.setdefault(id(identity), (identity, _IdKey(v)))[1]
    return IdVar(v, key)


class _IdKey:
    """What stands for one object's id among a dict's keys (hashed by identity)."""
    __slots__ = ("var",)

    def __init__(self, var):
        self.var = var

    def __repr__(self):
        return f"<id of {self.var!r}>"


def _divmod(tx, args, kwargs):
    if len(args) == 2 and any(isinstance(a, TensorVar) for a in args):
        unsupported("divmod() of a tensor (TypeError in CPython)")


_BUILTIN_HANDLERS = {
    len: _len, isinstance: _isinstance, issubclass: _issubclass, range: _range,
    tuple: _tuple_list(tuple), list: _tuple_list(list), dict: _dict, set: _set(set),
    frozenset: _set(frozenset), enumerate: _enumerate, zip: _zip, map: _map, filter: _filter,
    reversed: _reversed, iter: _iter, next: _next, sorted: sorted_list,
    min: _min_max(min), max: _min_max(max), sum: _sum, any: _any_all(True), all: _any_all(False),
    abs: _abs, round: _round, pow: _pow, divmod: _divmod,
    int: _data_conversion(int), float: _data_conversion(float), bool: _data_conversion(bool),
    complex: _data_conversion(complex), str: _data_conversion(str),
    repr: _repr, getattr: _getattr, hasattr: _hasattr, setattr: _setattr, delattr: _delattr,
    type: _type,
    globals: _globals, vars: _vars,
    super: _super, callable: _callable, slice: _slice, id: _id,
    locals: lambda tx, args, kwargs: None if args or kwargs else frame_locals(tx),
}

_FOLDABLE_BUILTINS = {abs, min, max, int, float, bool, str, round, divmod, pow, len, sum,
                      all, any, hash, repr, chr, ord, hex, oct, bin, sorted, complex, slice,
                      format, ascii, bytes}


def frame_locals(tx) -> Var:
    """What locals() returns here: a new dict of the bound locals, cells and free
    variables in CPython's order (the slots of the frame).  A resume frame answers
    with its original's names: its ___stackN/___resultN parameters are ours.
    3.13 (PEP 667) answers a FrameLocalsProxy instead, a view that writes through
    to the frame and is no dict: not traced.  In an inlined call, the call breaks
    (CPython runs the function); in the frame being compiled, the frame runs in
    CPython: a break there would call locals() in the transformed code, whose
    temporaries are locals too."""
    if sys.version_info >= (3, 13):
        e = Unsupported("locals() is a FrameLocalsProxy (PEP 667)")
        e.whole_frame = tx.parent is None
        raise e
    code = original_code(tx.code)
    names = list(code.co_varnames)
    names += [n for n in code.co_cellvars if n not in names]
    names += list(code.co_freevars)
    items = {}
    for name in names:
        if name in tx.cells:
            v = tx.cells[name].value
            if type(v) is Lazy:
                v = tx.cells[name].value = v.wrap(tx)
        else:
            v = tx._local(name) if name in tx.locals else None
        if v is not None and v is not NULL:
            items[name] = v
    return DictVar(items)


def is_picked(tx, v) -> bool:
    """Whether tensor `v` is a min()/max() result that stands for one of its items
    (min() and max() below)."""
    picked = tx.output.picked_storages
    if not picked:
        return False
    try:
        return v.example.untyped_storage()._cdata in picked
    except Exception:       # (no storage: sparse, nested ... never a min()/max() result)
        return False
