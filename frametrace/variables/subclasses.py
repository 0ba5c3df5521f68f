"""Instances of user subclasses of builtin containers (set, frozenset, dict, list, tuple,
OrderedDict) made while tracing.

Such an instance is its builtin part plus a class: its Var is the builtin container's
Var (SetVar, DictVar ...) with `UserContainerMixin` in front, which adds the class and
the instance's own attributes.  Every operation follows CPython's lookup on the class:
a method the user wrote (in the subclass or a Python base) is inlined, with this Var as
`self`; what the class inherits from the builtin base runs the builtin Var's own code
on the builtin part (`base_call`), and so do ``super().m(...)`` and unbound calls such
as ``set.__and__(a, b)``.  Results of the builtin operations are plain containers, as
in CPython (``CustomSet() | s`` is a set).  Leaving the frame, the object is rebuilt as
its class (`rebuild_container`), without running the user's __init__ again.

Objects of such classes from outside the frame (dict, OrderedDict, list and tuple
subclasses that keep the base's readers) get the same Vars with a source, guarded as
the builtin containers are; so do plain OrderedDicts and defaultdicts."""
from __future__ import annotations

import collections
import operator
import types
import typing

import torch

from ..guards import one_check
from .attributes import InstanceAttrs, MISSING, is_data_descriptor
from .base import Var, binary_op, contains, register, unsupported, wrap
from .constant import ConstVar, MethodVar
from .containers import (DictVar, ListVar, TupleVar, _dict_key, attrs_dict, constant_key, emit_key,
                         has_var_keys)
from .classes import class_attr, class_lookup
from .objects import ObjectVar
from .builtins import BuiltinVar, FrozenSetVar, SetVar, iter_of, var_list
from .functions import UserFunctionVar
from .tensor import TensorVar
from .user_objects import _AttrsDictVar, checked_bool, checked_len
from ..source import AttrSource, CallMethodSource, GetItemSource
from .stdlib import DefaultDictVar, OrderedDictVar

_BUILTIN_METHODS = (types.WrapperDescriptorType, types.MethodDescriptorType,
                    types.ClassMethodDescriptorType, types.BuiltinFunctionType)


def _var_types():
    return {set: SetVar, frozenset: FrozenSetVar, dict: DictVar, list: ListVar,
            tuple: TupleVar, collections.OrderedDict: OrderedDictVar}


_BASES = CONTAINER_BASES = (collections.OrderedDict, set, frozenset, dict, list, tuple)


def container_base(cls):
    """The builtin container class `cls` derives from (its nearest one), or None."""
    if not isinstance(cls, type) or cls in _BASES:
        return None
    for klass in cls.__mro__[1:]:
        if klass in _BASES:
            return klass
        if klass.__module__ == "builtins" and klass is not object:
            return None                 # another builtin first (an int subclass ...)
    return None


def is_user_container(v) -> bool:
    return isinstance(v, UserContainerMixin)


class UserContainerMixin(InstanceAttrs):
    """In front of a builtin container Var: `cls` is the user's class, `attrs` the
    instance's own attributes.  The concrete classes are made by `_sub_var_type`."""
    __slots__ = ()

    # -- what it is --
    def python_type(self):
        return self.cls

    def instance_class(self):
        return self.cls

    def base_class(self):
        return container_base(self.cls)

    def is_const(self):
        return False          # a user object: never folded into a constant

    def as_const(self):
        unsupported(f"a {self.cls.__name__} object as a constant")

    def plain(self) -> Var:
        """A plain container Var with the same contents (a snapshot of the builtin part)."""
        base_var = _var_types()[self.base_class()]
        return _copy_slots(base_var, self, base_var)

    # -- attributes --
    def own_attr(self, tx, name):
        return self.attrs.get(name, MISSING)

    def set_own_attr(self, tx, name, value):
        if self.source is not None:         # an object from outside: written back
            tx.side_effects.store_attr(self, self.value, name, value, plain=True)
        self.attrs[name] = value

    def set_class(self, tx, cls):
        unsupported(f"assigning __class__ of a {self.cls.__name__} object")

    def class_value_attr(self, tx, name, attr):
        if isinstance(attr, _BUILTIN_METHODS) and getattr(attr, "__objclass__", None) in (
                *_BASES, object):
            return BaseMethodVar(self, name)
        return super().class_value_attr(tx, name, attr)

    def opaque_attr(self, tx, name, hooked=False):
        if name == "__class__" and not hooked:
            return ObjectVar(self.cls)
        if name == "__dict__" and self.source is None:
            # made in the frame: its attribute table (a dataclass's __post_init__ reads
            # `self.__dict__.get(field)`, as HF's ModelOutput does)
            return _AttrsDictVar(self)
        return super().opaque_attr(tx, name)

    # -- the protocol, through the class --
    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)

    def _user_method(self, tx, name):
        method = class_attr(tx, self.cls, name)
        return method if isinstance(method, types.FunctionType) else None

    def _inline(self, tx, method, args):
        return UserFunctionVar(method).call(tx, [self, *args], {})

    def call(self, tx, args, kwargs):
        method = self._user_method(tx, "__call__")
        if method is None:
            unsupported(f"TypeError: '{self.cls.__name__}' object is not callable")
        return UserFunctionVar(method).call(tx, [self, *args], kwargs)

    def getitem(self, tx, key):
        method = self._user_method(tx, "__getitem__")
        if method is not None:
            return self._inline(tx, method, [key])
        return self._base_getitem(tx, key)

    def _base_getitem(self, tx, key):
        if isinstance(self, DictVar) and key.is_const() and key.as_const() not in self.items:
            missing = self._user_method(tx, "__missing__")
            if missing is not None:      # dict.__getitem__ calls it for a missing key
                return self._inline(tx, missing, [key])
        return self._base().getitem(self, tx, key)

    def setitem(self, tx, key, value):
        method = self._user_method(tx, "__setitem__")
        if method is not None:
            self._inline(tx, method, [key, value])
            return
        self._base().setitem(self, tx, key, value)

    def delitem(self, tx, key):
        method = self._user_method(tx, "__delitem__")
        if method is not None:
            self._inline(tx, method, [key])
            return
        self._base().delitem(self, tx, key)

    def contains(self, tx, item) -> bool:
        method = self._user_method(tx, "__contains__")
        if method is not None:
            return self._inline(tx, method, [item]).truth(tx)
        return self._base_contains(tx, item)

    def _base_contains(self, tx, item) -> bool:
        return contains(tx, self.plain(), item)

    def length(self, tx):
        method = self._user_method(tx, "__len__")
        if method is not None:
            return checked_len(self._inline(tx, method, []))
        return self._base().length(self, tx)

    def truth(self, tx):
        for name in ("__bool__", "__len__"):
            method = self._user_method(tx, name)
            if method is not None:
                result = self._inline(tx, method, [])
                return checked_bool(tx, result) if name == "__bool__" else checked_len(result) > 0
        return self._base().truth(self, tx)

    def unpack(self, tx):
        method = self._user_method(tx, "__iter__")
        if method is not None:
            iterator = self._inline(tx, method, [])
            if iterator is self:
                unsupported(f"iterating over {self.cls.__name__}, its own iterator")
            return iterator.unpack(tx)
        return self._base().unpack(self, tx)

    def _base(self):
        """The builtin container Var class behind the mixin."""
        return _var_types()[self.base_class()]

    # -- the builtin base's methods --
    def base_call(self, tx, name, args, kwargs):
        """``base.name(self, *args)``: the builtin method, whatever the class overrides."""
        base = self.base_class()
        if name == "__init__":
            return self._base_init(tx, args, kwargs)
        if name == "__new__":
            unsupported(f"{base.__name__}.__new__ called directly")
        if kwargs and base is not dict and name != "update":
            unsupported(f"{base.__name__}.{name} with keyword arguments")
        if name == "__getitem__" and len(args) == 1:
            return self._base_getitem(tx, args[0])
        if name == "__setitem__" and len(args) == 2:
            self._base().setitem(self, tx, *args)
            return ConstVar(None)
        if name == "__delitem__" and len(args) == 1:
            self._base().delitem(self, tx, args[0])
            return ConstVar(None)
        if name == "__contains__" and len(args) == 1:
            return ConstVar(self._base_contains(tx, args[0]))
        if name == "__len__" and not args:
            return ConstVar(self._base().length(self, tx))
        if name == "__iter__" and not args:
            return iter_of(tx, self.plain())
        if name in ("__repr__", "__str__") and not args:
            return ConstVar(base_repr(self))
        if name in _OPERATOR_DUNDERS:
            return _base_binary(tx, self, name, args)
        if base is collections.OrderedDict and name in ("copy", "__or__", "__ror__", "fromkeys"):
            unsupported(f"OrderedDict.{name} on a subclass (calls the subclass)")
        self._check_odict_hooks(tx, name)
        return self._base().call_method(self, tx, name, args, kwargs)

    def _check_odict_hooks(self, tx, name):
        """OrderedDict's methods (update, setdefault, pop, __init__ ...) go through the
        item methods of a subclass, which the builtin Var's code does not call."""
        if self.base_class() is collections.OrderedDict and name not in _ITEM_HOOKS and \
                name not in _ODICT_DIRECT and \
                any(self._user_method(tx, n) is not None for n in _ODICT_CALLS.get(name, _ITEM_HOOKS)):
            unsupported(f"OrderedDict.{name} on a subclass with its own item methods")

    def _base_init(self, tx, args, kwargs):
        """The builtin __init__: refills a mutable container (immutable ones got their
        contents from __new__)."""
        base = self.base_class()
        if args or kwargs:
            self._check_odict_hooks(tx, "__init__")
        if base in (tuple, frozenset):
            return ConstVar(None)
        made = BuiltinVar(dict if base is collections.OrderedDict else base).call(tx, list(args), kwargs)
        if base is set:
            self.real, self.members = made.real, made.members
            self._sync()
        elif isinstance(self, DictVar):
            self._mutating(tx)
            self.items.clear()
            self.items.update(made.items)
        else:
            self._check_mutable(tx)
            self.items[:] = made.items
        return ConstVar(None)

    def reconstruct(self, cg):
        if self.source is not None:
            return self.source.reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        cg.call_const(rebuild_container, [lambda cg: cg.load_const(self.cls),
                                          self._emit_contents,
                                          attrs_dict(self.attrs)])
        cg.keep_rebuilt(self)

    def copy_with(self, items):
        if self.base_class() is collections.OrderedDict:
            unsupported(f"{self.cls.__name__} | ...: OrderedDict calls the subclass")
        return self._base().copy_with(self, items)

    def _emit_contents(self, cg):
        """Push the builtin part as a plain container (a new one: never one rebuilt
        before, which a plain() copy's reused id could name)."""
        if isinstance(self, SetVar):
            SetVar.reconstruct(self, cg)
        elif isinstance(self, DictVar):
            for k, v in self.items.items():
                emit_key(cg, k)
                v.reconstruct(cg)
            cg.build(dict, len(self.items))
        else:
            for v in self.items:
                v.reconstruct(cg)
            cg.build(tuple if self.base_class() is tuple else list, len(self.items))

    def __repr__(self):
        return f"{self.cls.__name__}<{self._base().__repr__(self)}>"


_ITEM_HOOKS = ("__setitem__", "__getitem__", "__delitem__", "__contains__", "__iter__", "keys")
# OrderedDict's methods that read its table and linked list directly, whatever the
# subclass overrides (its views' iterators too): the others call the subclass's items.
_ODICT_DIRECT = ("keys", "values", "items", "get", "__len__", "__contains__", "__iter__",
                 "__reversed__", "move_to_end", "clear")
# ... and of the others, those that call only the subclass's __setitem__ (through
# MutableMapping.update's PyObject_SetItem; the argument's own methods are its own)
_ODICT_CALLS = {"__init__": ("__setitem__",), "update": ("__setitem__",)}


class BaseMethodVar(MethodVar):
    """``obj.name`` where the class inherits `name` from its builtin container base."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return self.obj.base_call(tx, self.name, args, kwargs)


_SUB_VAR_TYPES: dict = {}


def _sub_var_type(base_var):
    t = _SUB_VAR_TYPES.get(base_var)
    if t is None:
        t = type(f"User{base_var.__name__}", (UserContainerMixin, base_var),
                 {"__slots__": ("cls", "attrs", "value"), "__module__": __name__})
        _SUB_VAR_TYPES[base_var] = t
    return t


def _copy_slots(target_type, src, src_type):
    out = object.__new__(target_type)
    for klass in src_type.__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot in ("cls", "attrs", "value"):
                continue
            try:
                value = getattr(src, slot)
            except AttributeError:
                continue
            if isinstance(value, (list, dict, set, frozenset)):
                value = type(value)(value)      # the copy owns its contents
            setattr(out, slot, value)
    out.source = None
    return out


def adopt(cls, base: Var) -> UserContainerMixin:
    """A `cls` object whose builtin part is the contents of `base` (a fresh container
    Var of cls's builtin base)."""
    if is_user_container(base):
        base = base.plain()
    sub = _copy_slots(_sub_var_type(type(base)), base, type(base))
    sub.cls = cls
    sub.attrs = {}
    sub.value = None
    return sub


def construct_container_subclass(tx, cls, args, kwargs):
    """Calling a user subclass of a builtin container: __new__ (the builtin one) makes
    the object, with the contents for an immutable base; __init__ runs as the class
    has it (inlined when written in Python)."""
    base = container_base(cls)
    new = class_lookup(cls, "__new__")
    if isinstance(new, staticmethod) or isinstance(new, types.FunctionType):
        unsupported(f"{cls.__name__} defines __new__")
    if type(cls) is not type and type(cls).__module__ != "abc" and \
            class_attr(tx, type(cls), "__call__") is not type.__call__:
        unsupported(f"class {cls.__name__} has metaclass {type(cls).__name__} with its own __call__")
    if not cls.__dictoffset__:
        unsupported(f"{cls.__name__} has __slots__")
    class_attr(tx, cls, "__new__")
    if base in (tuple, frozenset):
        if kwargs or len(args) > 1:
            unsupported(f"{cls.__name__}() with {len(args)} arguments")
        contents = BuiltinVar(base).call(tx, list(args), {})
    else:
        contents = _var_types()[base]({}) if base in (dict, collections.OrderedDict) else \
            _var_types()[base]([])
    obj = adopt(cls, contents)
    init = class_attr(tx, cls, "__init__")
    if isinstance(init, types.FunctionType):
        UserFunctionVar(init).call(tx, [obj, *args], kwargs)
    elif getattr(init, "__objclass__", None) in _BASES or init is object.__init__:
        obj.base_call(tx, "__init__", args, kwargs)
    else:
        unsupported(f"{cls.__name__}.__init__ is not a Python function")
    return obj


def rebuild_container(cls, value, attrs):
    """The `cls` object with builtin part `value`, made without the class's own
    __new__/__init__ (they ran while tracing)."""
    base = container_base(cls)
    if base in (tuple, frozenset):
        obj = base.__new__(cls, value)
    else:
        obj = base.__new__(cls)
        base.__init__(obj)
        if base is list:
            list.extend(obj, value)
        elif base is set:
            set.update(obj, value)
        else:
            for k, v in value.items():
                base.__setitem__(obj, k, v)
    if attrs:
        obj.__dict__.update(attrs)
    return obj


def base_repr(var) -> str:
    """repr() as the builtin base writes it, for a container of constants."""
    if not is_user_container(var):
        return repr(_const_of(var))
    base = var.base_class()
    if base in (set, frozenset):
        # The set's own order (a copy can order its members differently), as set_repr
        # writes a subclass: Name({...}).
        members = _const_of(var)
        return f"{var.cls.__name__}({{{repr(list(members))[1:-1]}}})" if members else \
            f"{var.cls.__name__}()"
    return base.__repr__(rebuild_container(var.cls, _const_of(var.plain()), {}))


def _const_of(var):
    if isinstance(var, SetVar):
        if not all(m.is_const() for m in var.members.values()):
            unsupported(f"formatting {var} into a string")
        return var.real           # (the same history of adds and removes: the same order)
    if isinstance(var, DictVar):
        if has_var_keys(var.items):
            unsupported(f"formatting {var} into a string (keys hashed by identity)")
        return {k: _const_of(v) for k, v in var.items.items()} if type(var) is DictVar \
            else var.as_const()
    if isinstance(var, (ListVar, TupleVar)) and type(var) in (ListVar, TupleVar):
        return var.python_type()(_const_of(v) for v in var.items)
    if is_user_container(var) and class_lookup(var.cls, "__repr__") is \
            class_lookup(var.base_class(), "__repr__"):
        return rebuild_container(var.cls, _const_of(var.plain()), {})
    if var.is_const():
        return var.as_const()
    unsupported(f"formatting {var} into a string")


def container_format(tx, var, conv: str):
    """str() / repr() of a container Var whose text is known while tracing (constants
    inside), or None for other Vars.  A user __repr__/__str__ is inlined."""
    if not isinstance(var, (SetVar, DictVar, ListVar, TupleVar)) or var.is_const():
        return None
    if is_user_container(var):
        for name in (("__str__", "__repr__") if conv == "str" else ("__repr__",)):
            method = var._user_method(tx, name)
            if method is not None:
                result = var._inline(tx, method, [])
                if not (result.is_const() and isinstance(result.as_const(), str)):
                    unsupported(f"{var.cls.__name__}.{name} returned {result}")
                return result.as_const()
            if class_lookup(var.cls, name) is not class_lookup(var.base_class(), name):
                if name == "__str__" and class_lookup(var.cls, name) is object.__str__:
                    continue
                unsupported(f"{var.cls.__name__}.{name} is not a Python function")
        return base_repr(var)
    if isinstance(var, DefaultDictVar):
        # (its text names the factory, a Var; its as_const() is a plain dict)
        unsupported(f"{conv}() of a defaultdict")
    return repr(_const_of(var))


# --------------------------------------------------------------------------- operators
_OPERATOR_DUNDERS = {
    "__or__": operator.or_, "__and__": operator.and_, "__sub__": operator.sub,
    "__xor__": operator.xor, "__add__": operator.add, "__mul__": operator.mul,
    "__eq__": operator.eq, "__ne__": operator.ne, "__lt__": operator.lt,
    "__le__": operator.le, "__gt__": operator.gt, "__ge__": operator.ge,
    "__ior__": operator.ior, "__iand__": operator.iand, "__isub__": operator.isub,
    "__ixor__": operator.ixor, "__iadd__": operator.iadd, "__imul__": operator.imul,
    "__ror__": operator.or_, "__rand__": operator.and_, "__rsub__": operator.sub,
    "__rxor__": operator.xor, "__rmul__": operator.mul,
}
_DUNDER_OF = {operator.or_: "__or__", operator.and_: "__and__", operator.sub: "__sub__",
              operator.xor: "__xor__", operator.add: "__add__", operator.mul: "__mul__",
              operator.eq: "__eq__", operator.ne: "__ne__", operator.lt: "__lt__",
              operator.le: "__le__", operator.gt: "__gt__", operator.ge: "__ge__",
              operator.ior: "__ior__", operator.iand: "__iand__", operator.isub: "__isub__",
              operator.ixor: "__ixor__", operator.iadd: "__iadd__", operator.imul: "__imul__"}
_REFLECTED = {operator.or_: "__ror__", operator.and_: "__rand__", operator.sub: "__rsub__",
              operator.xor: "__rxor__", operator.add: "__radd__", operator.mul: "__rmul__",
              operator.eq: "__eq__", operator.ne: "__ne__", operator.lt: "__gt__",
              operator.le: "__ge__", operator.gt: "__lt__", operator.ge: "__le__"}
_INPLACE_PLAIN = {operator.ior: operator.or_, operator.iand: operator.and_,
                  operator.isub: operator.sub, operator.ixor: operator.xor,
                  operator.iadd: operator.add, operator.imul: operator.mul}


def user_container_binary_op(tx, fn, a, b):
    """``fn(a, b)`` where a or b is a user container subclass: the user's operator
    methods (b's reflected one first when b's class derives from a's), inlined; else
    the builtin base's."""
    if _INPLACE_PLAIN.get(fn, fn) is operator.or_ and any(
            is_user_container(v) and v.base_class() is collections.OrderedDict for v in (a, b)):
        unsupported("| on an OrderedDict subclass (OrderedDict calls the subclass)")
    if fn in _INPLACE_PLAIN:
        if is_user_container(a):
            name = _DUNDER_OF[fn]
            method = a._user_method(tx, name)
            if method is not None:
                result = a._inline(tx, method, [b])
                if not _is_not_implemented(result):
                    return result
            elif class_lookup(a.cls, name) is not None:     # the base's (list +=, set |=)
                a._check_odict_hooks(tx, name)
                return _base_binary(tx, a, name, [b])
        return user_container_binary_op(tx, _INPLACE_PLAIN[fn], a, b)
    tries = [(a, _DUNDER_OF.get(fn), b), (b, _REFLECTED.get(fn), a)]
    if is_user_container(b) and _derives_from(b, a):
        tries.reverse()
    for self, name, other in tries:
        if name is None or not is_user_container(self):
            continue
        method = self._user_method(tx, name)
        if method is not None:
            result = self._inline(tx, method, [other])
            if not _is_not_implemented(result):
                return result
    return binary_op(tx, fn, a.plain() if is_user_container(a) else a,
                     b.plain() if is_user_container(b) else b)


def _derives_from(b, a) -> bool:
    try:
        ta = a.python_type()
    except Exception:
        return False
    return b.cls is not ta and issubclass(b.cls, ta)


def _base_binary(tx, self, name, args):
    """The builtin base's operator method on `self`: in-place ones change the builtin
    part and return self; the others give a plain container."""
    if len(args) != 1:
        unsupported(f"{name} takes one argument")
    fn = _OPERATOR_DUNDERS[name]
    other = args[0]
    other = other.plain() if is_user_container(other) else other
    if name.startswith("__r"):
        return binary_op(tx, fn, other, self.plain())
    if fn in _INPLACE_PLAIN:
        base_var = self._base()
        if base_var is ListVar or issubclass(base_var, ListVar):
            return binary_op(tx, fn, self, other)
        if isinstance(self, SetVar) and self.kind is set or isinstance(self, DictVar) and \
                not isinstance(self, SetVar) and fn is operator.ior:
            base_var.call_method(self, tx, name, [other], {})
            return self
        fn = _INPLACE_PLAIN[fn]      # immutable bases: a new plain object
    return binary_op(tx, fn, self.plain(), other)


def _is_not_implemented(v) -> bool:
    return v.is_const() and v.as_const() is NotImplemented


@register
def base_container_method(obj, klass, name, attr):
    """``super().name`` found as `attr` on the builtin container `klass`, on an instance
    `obj` of a user subclass of it: the base's method bound to the instance (classmethods
    and staticmethods are read as any class's), else None."""
    if klass in CONTAINER_BASES and is_user_container(obj) and \
            not isinstance(attr, (classmethod, staticmethod, types.ClassMethodDescriptorType)):
        return BaseMethodVar(obj, name)
    return None


@register
def call_unbound_builtin(tx, method, args, kwargs):
    """``set.__and__(a, b)``, ``dict.update(d, ...)``, ``list.append(l, x)``: a builtin
    container's method called through its class on a traced container (or None when
    this is not such a call).  It runs the builtin method, whatever the class of the
    object overrides."""
    owner = getattr(method, "__objclass__", None)
    if owner not in _BASES or not args:
        return None
    self = args[0]
    name = method.__name__
    types_ = _var_types()
    if not isinstance(self, types_[owner]) and not (
            owner is dict and isinstance(self, DictVar)) or not _is_instance_of(self, owner):
        return None
    if is_user_container(self):
        return self.base_call(tx, name, args[1:], kwargs)
    if name == "__init__":
        unsupported(f"{owner.__name__}.__init__ on an existing {owner.__name__}")
    if name in _OPERATOR_DUNDERS:
        if len(args) != 2:
            unsupported(f"{owner.__name__}.{name} takes one argument")
        fn = _OPERATOR_DUNDERS[name]
        if name.startswith("__r"):
            return binary_op(tx, fn, args[1], self)
        return binary_op(tx, fn, self, args[1])
    if name == "__getitem__" and len(args) == 2:
        return self.getitem(tx, args[1])
    if name == "__setitem__" and len(args) == 3:
        self.setitem(tx, args[1], args[2])
        return ConstVar(None)
    if name == "__contains__" and len(args) == 2:
        return ConstVar(contains(tx, self, args[1]))
    if name == "__len__" and len(args) == 1:
        return ConstVar(self.length(tx))
    return self.call_method(tx, name, args[1:], kwargs)


def _is_instance_of(var, owner) -> bool:
    try:
        return issubclass(var.python_type(), owner)
    except Exception:
        return False


def fromkeys(tx, cls, args, kwargs):
    """``cls.fromkeys(iterable, value=None)`` for dict and its subclasses: a subclass
    is made by calling it, then filled through its __setitem__, as CPython does."""
    if kwargs or not 1 <= len(args) <= 2:
        unsupported("fromkeys() takes 1 or 2 arguments")
    value = args[1] if len(args) == 2 else ConstVar(None)
    keys = var_list(tx, args[0])
    if cls is dict:
        return DictVar({_dict_key(k): value for k in keys})
    if cls is collections.OrderedDict:
        return OrderedDictVar({_dict_key(k): value for k in keys})
    if cls is collections.defaultdict:
        # (dict.fromkeys through defaultdict's class: no default factory)
        return DefaultDictVar(ConstVar(None), {_dict_key(k): value for k in keys})
    if container_base(cls) not in (dict, collections.OrderedDict):
        return None
    obj = construct_container_subclass(tx, cls, [], {})
    for k in keys:
        obj.setitem(tx, k, value)
    return obj


class _FromKeysVar(Var):
    """``cls.fromkeys`` for dict, OrderedDict and their subclasses."""
    __slots__ = ("cls",)

    def __init__(self, cls):
        super().__init__(None)
        self.cls = cls

    def call(self, tx, args, kwargs):
        made = fromkeys(tx, self.cls, args, kwargs)
        if made is None:
            unsupported(f"{self.cls.__name__}.fromkeys")
        return made


@register
def fromkeys_var(tx, cls):
    """The Var of ``cls.fromkeys`` when it is the builtin dict's, else None."""
    if cls not in (dict, collections.OrderedDict, collections.defaultdict) and \
            container_base(cls) not in (dict, collections.OrderedDict):
        return None
    attr = class_attr(tx, cls, "fromkeys")
    if not isinstance(attr, types.ClassMethodDescriptorType):
        return None             # the class wrote its own
    return _FromKeysVar(cls)


# What reading a container from outside relies on (its guards and its Var's answers):
# a class that writes one of these itself stays a plain user object (UserObjectVar).
_READERS = {dict: ("__getitem__", "__iter__", "__len__", "keys", "__contains__", "items",
                   "values", "get", "__eq__"),
            list: ("__getitem__", "__iter__", "__len__", "__contains__", "__eq__")}
_READERS[collections.OrderedDict] = _READERS[dict]
_READERS[tuple] = _READERS[list]


def wrap_container_subclass(tx, value, source, guards):
    """The Var of a dict, OrderedDict, list or tuple subclass object from outside the
    frame, guarded as the builtin one is (type, keys or length, items through their own
    sources) and by the names in its __dict__ (its attributes by value); None when it
    is not one such (then it is a plain user object)."""
    cls = type(value)
    if cls in (collections.OrderedDict, collections.defaultdict):
        return _wrap_stdlib_dict(tx, value, source, guards)
    base = container_base(cls)
    if base not in _READERS or not cls.__dictoffset__ or type(cls) is not type or \
            hasattr(cls, "_fields") or any(class_lookup(cls, n) is not class_lookup(base, n)
                                           for n in (*_READERS[base], "__getattribute__", "__getattr__")):
        return None
    is_map = base in (dict, collections.OrderedDict)
    if is_map and not all(map(constant_key, value)):
        return None
    own = vars(value)
    if any(is_data_descriptor(class_lookup(cls, n)) for n in own):
        return None
    if guards is not None:
        e = source.guard_expr()
        guards.type_match(source, value)
        shape = tuple(base.keys(value)) if is_map else base.__len__(value)
        reader = guards.const(base.keys if is_map else base.__len__)
        expr = f"___same_keys({reader}({e}), {guards.const(shape)})" if is_map else \
            f"{reader}({e}) == {shape}"
        guards._add(source, "KEYS" if is_map else "LEN", expr,
                    f"{source.name()} has {'keys ' + repr(list(shape)) if is_map else f'length {shape}'}")
        guards._add(source, "DICT", f"___same_keys({e}.__dict__, {guards.const(tuple(own))})",
                    f"{source.name()}.__dict__ has names {list(own)}")

    def sub(key):
        return GetItemSource(source, key) if source is not None else None
    g = guards is not None
    if is_map:
        items = {k: wrap(tx, base.__getitem__(value, k), sub(k), g) for k in base.keys(value)}
        var = _sub_var_type(_var_types()[base])(items, source)
    else:
        items = [wrap(tx, v, sub(i), g) for i, v in enumerate(base.__iter__(value))]
        var = _sub_var_type(_var_types()[base])(items, source)
    var.cls, var.value = cls, value
    var.attrs = {n: wrap(tx, v, AttrSource(source, n) if source is not None else None, g)
                 for n, v in own.items()}
    return var


def _wrap_stdlib_dict(tx, value, source, guards):
    """An OrderedDict or defaultdict from outside (constant keys): guarded by
    type and keys in order, items through their own sources; changes are written back."""
    cls = type(value)
    if getattr(value, "__dict__", None):
        return None             # (attributes, as a state_dict's _metadata: an object as before)
    if not all(map(constant_key, value)):
        return wrap_tensor_keyed_dict(tx, value, source, guards)
    keys = tuple(cls.keys(value))
    if guards is not None:
        guards.type_match(source, value)
        # (the type is exactly cls, which iterates its keys in keys()' order)
        # (keys by type and value, as guards.c's same_key: True is not the key 1)
        guards._add(source, "KEYS", f"___same_keys({guards.const(cls.keys)}({source.guard_expr()}), "
                    f"{guards.const(keys)})", f"{source.name()} has keys {list(keys)}",
                    spec=one_check(source, "TUPLE_EQ", keys))
    g = guards is not None
    items = {k: wrap(tx, dict.__getitem__(value, k), GetItemSource(source, k) if source is not None
                     else None, g) for k in keys}
    if cls is collections.OrderedDict:
        return OrderedDictVar(items, source)
    factory = wrap(tx, value.default_factory,
                   AttrSource(source, "default_factory") if source is not None else None, g)
    return DefaultDictVar(factory, items, source)


# Keys hashed and compared by identity, each guarded to be that object (a registry
# keyed by classes, a TypeVar's table).
_IDENTITY_KEYS = (type, typing.TypeVar)


def wrap_tensor_keyed_dict(tx, value, source, guards):
    """A dict, OrderedDict or defaultdict from outside keyed by tensors, classes or
    TypeVars (and constants): an optimizer's `state`, keyed by its parameters.  Guarded by type and length; each
    key is read as the i-th of its keys (a tensor input, one Var per tensor, so a
    lookup by a parameter read elsewhere finds it, guarded to be the same object) and
    each value as the i-th of its values.  None for other keys, or without a source."""
    cls = type(value)
    if source is None or cls not in (dict, collections.OrderedDict, collections.defaultdict) or \
            not all(type(k) in (str, int) or isinstance(k, (torch.Tensor, *_IDENTITY_KEYS)) for k in value):
        return None
    g = guards is not None
    if any(isinstance(k, torch.Tensor) for k in value):
        tx.output.tensor_keyed_reads = True
    if g:
        e = source.guard_expr()
        guards._add(source, "LEN", f"___type({e}) is {guards.const(cls)} and ___len({e}) == {len(value)}",
                    f"type({source.name()}) is {cls.__name__} and len({source.name()}) == {len(value)}",
                    spec=one_check(source, "LEN", cls, n=len(value)))
    keys = CallMethodSource(source, "keys", as_list=True)
    values = CallMethodSource(source, "values", as_list=True)
    items = {}
    for i, (k, v) in enumerate(dict.items(value)):
        key = wrap(tx, k, GetItemSource(keys, i), g)
        if not isinstance(key, TensorVar) and not key.is_const() and \
                not (type(key) is ObjectVar and isinstance(k, _IDENTITY_KEYS)):
            return None
        items[_dict_key(key)] = wrap(tx, v, GetItemSource(values, i), g)
    if cls is dict:
        return DictVar(items, source)
    if cls is collections.OrderedDict:
        return OrderedDictVar(items, source)
    factory = wrap(tx, value.default_factory, AttrSource(source, "default_factory"), g)
    return DefaultDictVar(factory, items, source)
