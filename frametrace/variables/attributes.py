"""Attribute access on instances of user classes, in the order object.__getattribute__
and object.__setattr__ follow: a data descriptor of the class (property, __slots__
member, a user class with __set__) wins over the instance's own attributes, which win
over the rest of the class; a class's own __setattr__ / __getattr__ is inlined.

An instance Var mixes in `InstanceAttrs` and says where its own attributes live.  A
store CPython would refuse (a read-only property, a name outside __slots__, a frozen
dataclass) stops the trace at that store, so it raises there, in the user's try block,
never later in a replay."""
from __future__ import annotations

import types

from ..exc import Unsupported
from ..source import AttrSource, ConstSource
from .base import raise_builtin, unsupported, wrap
from .constant import ConstVar
from .classes import class_attr, class_defines, class_lookup, guard_class_none
from .functions import BoundMethodVar, UserFunctionVar
from .objects import ObjectVar, class_source

MISSING = object()
_CLASS_SLOT = object.__dict__["__class__"]
_IMMUTABLE_TYPE = 1 << 8       # Py_TPFLAGS_IMMUTABLETYPE: builtin types, not patchable


def is_data_descriptor(attr) -> bool:
    t = type(attr)
    return hasattr(t, "__set__") or hasattr(t, "__delete__")


class AttrDeleting:
    """`del obj.name` by object.__delattr__'s rules (a class's own __delattr__ is
    inlined); an instance Var says how its own attribute goes (`del_own_attr`)."""
    __slots__ = ()

    def delattr(self, tx, name):
        cls = self.instance_class()
        hook = class_attr(tx, cls, "__delattr__")
        if hook is not object.__delattr__:
            if not isinstance(hook, types.FunctionType):
                unsupported(f"{cls.__name__}.__delattr__ is not a Python function")
            UserFunctionVar(hook).call(tx, [self, ConstVar(name)], {})
            return
        attr = class_lookup(cls, name)
        _guard_class_attr(tx, cls, name, attr)
        if attr is not None and is_data_descriptor(attr):
            if isinstance(attr, property) and isinstance(attr.fdel, types.FunctionType):
                UserFunctionVar(attr.fdel).call(tx, [self], {})
                return
            if not isinstance(attr, types.MemberDescriptorType):
                unsupported(f"del of {name!r} through descriptor {type(attr).__name__} of {cls.__name__}")
        if self.own_attr(tx, name) is MISSING:
            unsupported(f"AttributeError: {cls.__name__!r} object has no attribute {name!r}")
        self.del_own_attr(tx, name)


class InstanceAttrs(AttrDeleting):
    """The attribute protocol over `own_attr` / `set_own_attr` (the instance's __dict__
    or slot values) and `instance_class`."""
    __slots__ = ()

    def instance_class(self) -> type:
        raise NotImplementedError

    def own_attr(self, tx, name):
        """The Var of the instance's own attribute `name`, or MISSING."""
        raise NotImplementedError

    def set_own_attr(self, tx, name, value):
        raise NotImplementedError

    def class_value_attr(self, tx, name, attr):
        """A class attribute that is no descriptor (an int, a tensor, a nested class)."""
        return class_value_var(tx, self.instance_class(), name, attr)

    def set_class(self, tx, cls):
        raise NotImplementedError

    def opaque_attr(self, tx, name):
        """An attribute computed by code the protocol does not follow: a descriptor
        written in C (a namedtuple field; no traced store changes what it reads)."""
        unsupported(f"attribute {name!r} of {self.instance_class().__name__} is computed in C")

    # -- reading --
    def getattr(self, tx, name):
        cls = self.instance_class()
        getattribute = class_lookup(cls, "__getattribute__")
        if isinstance(getattribute, types.FunctionType):
            tx.guards.class_attr(cls, "__getattribute__", getattribute)
            return self.hooked_attr(tx, name, getattribute)
        return self._generic_getattr(tx, cls, name, getattribute)

    def hooked_attr(self, tx, name, getattribute):
        """``obj.name`` for a class with its own __getattribute__ (written in Python):
        the hook inlined; its super().__getattribute__ is `generic_getattr`."""
        from .exceptions import caught  # (lazy: import cycle, to break)
        try:
            return UserFunctionVar(getattribute).call(tx, [self, ConstVar(name)], {})
        except Unsupported as e:
            # CPython asks __getattr__ when the hook raised AttributeError.
            hook = class_attr(tx, self.instance_class(), "__getattr__") if caught(e, AttributeError) else None
            if not isinstance(hook, types.FunctionType):
                raise
        return UserFunctionVar(hook).call(tx, [self, ConstVar(name)], {})

    def generic_getattr(self, tx, name):
        """object.__getattribute__(self, name): the protocol without the class's hook,
        and without __getattr__ (CPython calls that after the hook raised, not here)."""
        cls = self.instance_class()
        return self._generic_getattr(tx, cls, name, class_lookup(cls, "__getattribute__"),
                                     fallback=False)

    def _generic_getattr(self, tx, cls, name, getattribute, fallback=True):
        attr = class_lookup(cls, name)
        got = self._lookup(tx, cls, name, attr, fallback)
        if not self._read_through_source(got, name):
            # The answer rests on what the class holds (no __getattribute__ of its own;
            # for `name` a data descriptor or none, a method, a value): classes can be
            # patched, in a base too.
            tx.guards.class_attr(cls, "__getattribute__", getattribute)
            _guard_class_attr(tx, cls, name, attr)
        return got

    def _read_through_source(self, var, name) -> bool:
        """`var` was read as ``obj.name`` through the object's source: its guard repeats
        CPython's whole lookup, so what the class held needs no guard of its own."""
        return self.source is not None and var.source == self.attr_source(name)

    def attr_source(self, name):
        """The source of what the trace read as the instance's own `name`."""
        return AttrSource(self.source, name) if self.source is not None else None

    def _lookup(self, tx, cls, name, attr, fallback=True):
        if attr is not None and is_data_descriptor(attr):
            got = _descriptor_get(tx, self, cls, name, attr)
            if got is not MISSING:
                return got
        own = self.own_attr(tx, name)
        if own is not MISSING:
            return own
        if attr is not None:
            return _class_attr(tx, self, cls, name, attr)
        if class_defines(cls, name):
            return self.class_value_attr(tx, name, None)     # a class attribute set to None
        hook = class_attr(tx, cls, "__getattr__") if fallback else None
        if isinstance(hook, types.FunctionType):
            return UserFunctionVar(hook).call(tx, [self, ConstVar(name)], {})
        self._missing(tx, cls, name)

    def _missing(self, tx, cls, name):
        """CPython raises AttributeError.  The instance's own attributes were guarded
        (own_attr) unless it came from outside with no source; the class is guarded here."""
        if getattr(self, "value", None) is not None and self.source is None:
            unsupported(f"AttributeError: {cls.__name__!r} object has no attribute {name!r}")
        tx.guards.class_attr(cls, "__getattribute__", class_lookup(cls, "__getattribute__"))
        _guard_class_attr(tx, cls, name, None)
        raise_builtin(AttributeError, f"{cls.__name__!r} object has no attribute {name!r}")

    # -- writing --
    def setattr(self, tx, name, value):
        cls = self.instance_class()
        hook = class_attr(tx, cls, "__setattr__")
        if hook is not object.__setattr__:
            if not isinstance(hook, types.FunctionType):
                unsupported(f"{cls.__name__}.__setattr__ is not a Python function")
            UserFunctionVar(hook).call(tx, [self, ConstVar(name), value], {})
            return
        self.generic_setattr(tx, name, value)

    def del_own_attr(self, tx, name):
        unsupported(f"deleting attribute {name!r} of a {self.instance_class().__name__} object")

    def generic_setattr(self, tx, name, value):
        """object.__setattr__(self, name, value)."""
        cls = self.instance_class()
        attr = class_lookup(cls, name)
        _guard_class_attr(tx, cls, name, attr)
        if attr is _CLASS_SLOT:
            self.set_class(tx, _class_to_assign(cls, value))
            return
        if attr is not None and is_data_descriptor(attr):
            _descriptor_set(tx, self, cls, name, attr, value)
            return
        if not cls.__dictoffset__:
            unsupported(f"AttributeError: {cls.__name__!r} object has no attribute {name!r} "
                        "(no __dict__)")
        self.set_own_attr(tx, name, value)


def class_value_var(tx, cls, name, attr):
    """The Var of `attr`, what `cls` holds for `name` (no descriptor: ``cls.name`` gives
    it as is), read through ``cls.name``: what the trace reads inside it (a list's
    items, a dict's keys) is guarded there, and what it writes into it is written
    back there.  (Without a source, a class-level registry's contents went unguarded
    and its appends were lost.)"""
    try:
        plain = getattr(type(attr), "__get__", None) is None and \
            type.__getattribute__(cls, name) is attr if isinstance(cls, type) else False
    except Exception:
        plain = False
    return wrap(tx, attr, AttrSource(class_source(cls), name) if plain else None, guard=plain)


def class_read_runs_code(var) -> bool:
    """Reading ``var.__class__`` runs Python code of its class (a __getattribute__ of
    its own, or a `__class__` property)."""
    if not isinstance(var, InstanceAttrs):
        return False
    cls = var.instance_class()
    return isinstance(class_lookup(cls, "__getattribute__"), types.FunctionType) or \
        class_lookup(cls, "__class__") is not _CLASS_SLOT


def plain_class_of(tx, var):
    """``var.__class__`` when no Python code of the object's class runs for it (no
    __getattribute__ of its own, no `__class__` property): its type, as the trace has
    it.  None: the read goes through the attribute protocol (the hook runs, as in
    CPython, once per read)."""
    if isinstance(var, InstanceAttrs):
        cls = var.instance_class()
        if class_read_runs_code(var):
            return None
        tx.guards.class_attr(cls, "__getattribute__", class_lookup(cls, "__getattribute__"))
        # (no class's dict takes a `__class__` once made: a new base is the one way in)
        tx.guards.class_mro(cls)
        return wrap(tx, cls, None, guard=False)
    return wrap(tx, var.python_type(), None, guard=False)


def _guard_class_attr(tx, cls, name, attr):
    """Guard what `cls` holds for `name` (`attr`), and, for an object of a user class
    (a descriptor), what its class holds for the descriptor protocol."""
    if attr is None and class_defines(cls, name):
        guard_class_none(tx, cls, name)
        return
    tx.guards.class_attr(cls, name, attr)
    t = type(attr)
    if attr is not None and not t.__flags__ & _IMMUTABLE_TYPE:
        for dunder in ("__get__", "__set__", "__delete__"):
            class_attr(tx, t, dunder)


def _descriptor_var(tx, attr, cls, name):
    return wrap(tx, attr, ConstSource(attr, f"{cls.__qualname__}.{name}"))


def _descriptor_get(tx, obj, cls, name, attr):
    if isinstance(attr, property):
        if not isinstance(attr.fget, types.FunctionType):
            unsupported(f"property {name!r} of {cls.__name__} has no Python getter")
        return UserFunctionVar(attr.fget).call(tx, [obj], {})
    if isinstance(attr, types.MemberDescriptorType):
        own = obj.own_attr(tx, name)
        if own is MISSING:
            unsupported(f"AttributeError: slot {name!r} of {cls.__name__} is not set")
        return own
    get = getattr(type(attr), "__get__", None)
    if get is None:
        return MISSING          # a data descriptor without __get__: the instance's own wins
    if isinstance(get, types.FunctionType):
        return UserFunctionVar(get).call(
            tx, [_descriptor_var(tx, attr, cls, name), obj, wrap(tx, cls, None, guard=False)], {})
    return obj.opaque_attr(tx, name)


def _descriptor_set(tx, obj, cls, name, attr, value):
    if isinstance(attr, property):
        if not isinstance(attr.fset, types.FunctionType):
            unsupported(f"AttributeError: property {name!r} of {cls.__name__!r} object has no "
                        "Python setter")
        UserFunctionVar(attr.fset).call(tx, [obj, value], {})
        return
    if isinstance(attr, types.MemberDescriptorType):
        obj.set_own_attr(tx, name, value)
        return
    setter = getattr(type(attr), "__set__", None)
    if isinstance(setter, types.FunctionType):
        UserFunctionVar(setter).call(tx, [_descriptor_var(tx, attr, cls, name), obj, value], {})
        return
    unsupported(f"setting {name!r} through descriptor {type(attr).__name__} of {cls.__name__}")


def _class_attr(tx, obj, cls, name, attr):
    """A class attribute no instance attribute shadows: methods bind, descriptors run."""
    if isinstance(attr, types.FunctionType):
        return BoundMethodVar(UserFunctionVar(attr), obj)
    if isinstance(attr, classmethod):
        return BoundMethodVar(wrap(tx, attr.__func__, None, guard=False), ObjectVar(cls))
    if isinstance(attr, staticmethod):
        return wrap(tx, attr.__func__, None, guard=False)
    get = getattr(type(attr), "__get__", None)
    if isinstance(get, types.FunctionType):
        return UserFunctionVar(get).call(
            tx, [_descriptor_var(tx, attr, cls, name), obj, wrap(tx, cls, None, guard=False)], {})
    return obj.class_value_attr(tx, name, attr)


def _class_to_assign(cls, value):
    """The class in `obj.__class__ = value`, checked as CPython checks it (layouts must
    match), on a blank instance of the old class."""
    new = value.as_const() if value.is_const() else getattr(value, "value", None)
    if not isinstance(new, type):
        unsupported(f"TypeError: __class__ must be set to a class, not {value}")
    try:
        probe = object.__new__(cls)
        probe.__class__ = new
    except TypeError as e:
        unsupported(f"TypeError: {e}")
    return new


def guard_hasattr(tx, source, name, found):
    """The trace relies on whether the object at `source` has attribute `name`."""
    has_attr = getattr(tx.guards, "has_attr", None)
    if has_attr is not None:
        has_attr(source, name, found)
