"""Instances of user classes: objects from outside the frame (guarded by type, their
attributes by value), and dataclass / ModelOutput instances made while tracing (rebuilt
by calling the class in the transformed code)."""
from __future__ import annotations

import collections.abc
import dataclasses
import functools
import operator
import types
from collections import OrderedDict
import copy
import copyreg

from ..source import AttrSource, CallMethodSource, ConstSource, GetItemSource, InstanceDictSource
from .attributes import MISSING, InstanceAttrs, class_value_var, guard_hasattr, is_data_descriptor
from .base import DELETED, Var, a_type, raise_builtin, register, unsupported, var_list, wrap
from .constant import ConstVar
from .containers import DictVar, ListVar, TupleVar, _ITEMS, _dict_key, attrs_dict
from .functions import BoundMethodVar, UserFunctionVar, call_rule
from .classes import class_attr, class_defines, class_lookup
from .objects import ObjectVar, _PURE_READERS, _RealMethodVar, call_hint, object_noun
from .symbolic import SymNodeVar


def has_own_getattribute(cls) -> bool:
    """The class (or a base) defines __getattribute__ in Python."""
    return isinstance(class_lookup(cls, "__getattribute__"), types.FunctionType)


def _instance_dict(obj):
    """The instance dict as object.__getattribute__ finds it (past a class's own
    __getattribute__ and __getattr__), or None."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return d if isinstance(d, dict) else None


class UserObjectVar(InstanceAttrs, Var):
    """An object of a user class from outside the trace.  `cls` is its class, as the
    trace has it (an `obj.__class__ = D` while tracing changes it)."""
    __slots__ = ("value", "cls")

    def __init__(self, value, source):
        super().__init__(source)
        self.value = value
        self.cls = type(value)

    def python_type(self):
        return self.cls

    def instance_class(self):
        return self.cls

    def own_attr(self, tx, name):
        written = tx.side_effects.load_attr(self.value, name)
        if written is not None:
            return MISSING if written is DELETED else written
        obj = self.value
        as_dict = self._dict_var(tx)
        if as_dict is not None:
            # The trace holds obj.__dict__ (and may have changed it): it is the truth.
            return as_dict.lookup(name, MISSING)
        hooked = has_own_getattribute(type(obj))
        d = _instance_dict(obj)
        if name not in (d or ()) and \
                not isinstance(class_lookup(self.cls, name), types.MemberDescriptorType):
            if self.source is not None and d is not None:
                # What the class gives (a method) holds while the instance does not
                # shadow it.
                tx.guards.not_in_dict(self.source, name, past_hook=hooked, obj=obj)
            return MISSING
        try:
            value = object.__getattribute__(obj, name)
        except AttributeError:
            return MISSING
        if hooked and self.source is not None and d is not None and name in d:
            # Read from the instance dict past the class's own __getattribute__: the
            # guard reads the dict item (a C lookup), not the hook.  What the class
            # holds for `name` is guarded by the caller (generic lookup).
            return wrap(tx, value, GetItemSource(InstanceDictSource(self.source), name))
        return wrap(tx, value, self.attr_source(name))

    def attr_source(self, name):
        # A class's own __getattribute__ may answer `obj.name` otherwise than the plain
        # lookup the trace did: the guard repeats the plain one.
        if self.source is None:
            return None
        if has_own_getattribute(type(self.value)):
            if name == "__dict__":
                return InstanceDictSource(self.source)     # (the same read, loaded in C)
            return CallMethodSource(self.source, "__getattribute__", (name,),
                                    through=object.__getattribute__)
        return AttrSource(self.source, name)

    def class_value_attr(self, tx, name, attr):
        if self.cls is not type(self.value):
            return class_value_var(tx, self.cls, name, attr)
        if name in _PURE_READERS and isinstance(attr, types.MethodDescriptorType) and \
                attr.__objclass__ in _BUILTIN_BASES and isinstance(self.value, attr.__objclass__):
            # A builtin base's reader (a ModelOutput's keys(), an OrderedDict subclass's
            # get): the object's contents, read now and guarded by reading them again.
            return _RealMethodVar(attr, self.value, self.source)
        if has_own_getattribute(self.cls) and attr is not None and \
                getattr(type(attr), "__get__", None) is None and getattr(self.cls, name, None) is attr:
            # Past the class's own __getattribute__: the class's value, guarded through
            # the class (the instance's dict was found not to shadow it).
            return wrap(tx, attr, AttrSource(ConstSource(self.cls, self.cls.__qualname__), name))
        # Read through the object, as before any write: guarded by value there.
        return wrap(tx, object.__getattribute__(self.value, name), self.attr_source(name))

    def hooked_attr(self, tx, name, getattribute):
        # The hook inlined: its guards are on what it read (the instance dict past the
        # hook, a map on the class), lookups the C check makes without running the
        # hook on every call.  A hook the trace cannot follow is not run by the trace
        # or by a guard (it may count, log or cache: CPython runs it once per read):
        # the graph breaks and CPython makes the read.
        return super().hooked_attr(tx, name, getattribute)

    def _dict_var(self, tx):
        d = _instance_dict(self.value)      # (getattr would run a hook of the class's)
        known = tx.output.object_vars.get(id(d)) if d is not None else None
        return known[1] if known is not None and known[0] is d else None

    def opaque_attr(self, tx, name):
        if name == "__class__":
            return ObjectVar(self.cls)      # (object's slot: the type, as the trace has it)
        if name == "__dict__" and tx.side_effects.has_attr_writes(self.value):
            if self.cls is not type(self.value) or _instance_dict(self.value) is None:
                unsupported(f"__dict__ of a {self.cls.__name__} object whose attributes the trace changed")
            # The dict as the trace's writes left it: they are applied to its Var (and
            # replayed once, as attribute stores).
            as_dict = wrap(tx, object.__getattribute__(self.value, name), self.attr_source(name))
            if as_dict is not self._dict_var(tx):
                unsupported(f"__dict__ of a {self.cls.__name__} object whose attributes the trace changed")
            for written, value in tx.side_effects.attr_writes(self.value):
                self._write_through_dict(tx, written, value)
            return as_dict
        if self.cls is not type(self.value):
            # Answered by the real object only while the trace has not changed it.
            return super().opaque_attr(tx, name)
        return wrap(tx, object.__getattribute__(self.value, name), self.attr_source(name))

    def set_own_attr(self, tx, name, value):
        self._write_through_dict(tx, name, value)
        tx.side_effects.store_attr(self, self.value, name, value, plain=True)

    def del_own_attr(self, tx, name):
        self._write_through_dict(tx, name, DELETED)
        tx.side_effects.store_attr(self, self.value, name, DELETED, plain=True)

    def _write_through_dict(self, tx, name, value):
        """The trace holds this object's __dict__ (a class's own __getattribute__ read
        it, `vars(obj)`): a plain store is a write of that dict's item, so the dict
        the trace holds sees it too.  The store is replayed as object.__setattr__ (one
        record: the dict's own write-back, if the trace writes it directly as well,
        comes later and holds the same final items)."""
        as_dict = self._dict_var(tx)
        if as_dict is None:
            return
        if as_dict._lazy is not None and (value is DELETED or name not in as_dict._lazy[0]):
            # (a key it does not have, or one to remove: the dict is wrapped whole
            # first, its items then the truth)
            as_dict.items
        items = _ITEMS.__get__(as_dict)
        if value is DELETED:
            items.pop(name, None)
        else:
            items[name] = value

    def set_class(self, tx, cls):
        tx.side_effects.store_attr(self, self.value, "__class__",
                                   ObjectVar(cls, ConstSource(cls, cls.__qualname__)), plain=True)
        self.cls = cls

    def call(self, tx, args, kwargs):
        call = class_attr(tx, self.cls, "__call__")
        if isinstance(call, types.FunctionType):
            return UserFunctionVar(call).call(tx, [self, *args], kwargs)
        unsupported(f"calling {object_noun(self.value)}", hint=call_hint(self.value))

    def _dunder(self, tx, name, args):
        """Call a special method: inlined when written in Python, evaluated on the real
        object when it is a builtin base's read-only method (a dict subclass's get)."""
        method = class_attr(tx, self.cls, name)
        if isinstance(method, types.FunctionType):
            return UserFunctionVar(method).call(tx, [self, *args], {})
        if method is not None and self.cls is type(self.value) and \
                name in ("__getitem__", "__len__", "__contains__") and all(a.is_const() for a in args):
            # A builtin base's reader (a dict subclass): the object's contents, which
            # can change between calls, guarded through a source that reads them again.
            consts = [a.as_const() for a in args]
            result = method(self.value, *consts)
            if self.source is None:
                return wrap(tx, result, None, guard=False)
            if not CallMethodSource.supports(consts):
                unsupported(f"{self.cls.__name__}.{name} on arguments a guard cannot name")
            source = GetItemSource(self.source, consts[0]) \
                if name == "__getitem__" and type(consts[0]) in (str, int) else \
                CallMethodSource(self.source, name, consts)
            return wrap(tx, result, source)
        unsupported(f"{self.cls.__name__}.{name}")

    def getitem(self, tx, key):
        return self._dunder(tx, "__getitem__", [key])

    def setitem(self, tx, key, value):
        self._dunder(tx, "__setitem__", [key, value])

    def length(self, tx):
        return checked_len(self._dunder(tx, "__len__", []))

    def unpack(self, tx):
        return _unpack_user(tx, self, self.cls)

    def mapping_items(self, tx):
        return _mapping_items(tx, self, self.cls)

    def truth(self, tx):
        cls = self.cls
        if class_attr(tx, cls, "__bool__") is None and class_attr(tx, cls, "__len__") is None:
            return True
        if isinstance(class_attr(tx, cls, "__bool__"), types.FunctionType):
            return checked_bool(tx, self._dunder(tx, "__bool__", []))
        return self.length(tx) > 0

    def noun(self):
        return a_type(self.cls)

    def __repr__(self):
        return f"UserObjectVar({self.cls.__name__})"


class NewObjectVar(InstanceAttrs, Var):
    """An instance of a user class made while tracing: its __init__ was inlined and its
    attributes are Vars.  If it escapes the frame, the transformed code rebuilds it
    (cls.__new__ and the attributes), once, however many places refer to it."""
    __slots__ = ("cls", "attrs")

    def __init__(self, cls, attrs=None):
        super().__init__(None)
        self.cls = cls
        self.attrs = dict(attrs or {})

    def python_type(self):
        return self.cls

    def instance_class(self):
        return self.cls

    def own_attr(self, tx, name):
        return self.attrs.get(name, MISSING)

    def set_own_attr(self, tx, name, value):
        self.attrs[name] = value

    def del_own_attr(self, tx, name):
        if name not in self.attrs:
            unsupported(f"AttributeError: {self.cls.__name__!r} object has no attribute {name!r}")
        del self.attrs[name]

    def set_class(self, tx, cls):
        self.cls = cls

    def _dunder(self, tx, name, args):
        method = class_attr(tx, self.cls, name)
        if isinstance(method, types.FunctionType):
            return UserFunctionVar(method).call(tx, [self, *args], {})
        unsupported(f"{self.cls.__name__}.{name}")

    def getitem(self, tx, key):
        return self._dunder(tx, "__getitem__", [key])

    def setitem(self, tx, key, value):
        self._dunder(tx, "__setitem__", [key, value])

    def length(self, tx):
        return checked_len(self._dunder(tx, "__len__", []))

    def unpack(self, tx):
        return _unpack_user(tx, self, self.cls)

    def mapping_items(self, tx):
        return _mapping_items(tx, self, self.cls)

    def call(self, tx, args, kwargs):
        return self._dunder(tx, "__call__", [*args]) if not kwargs else \
            UserFunctionVar(class_attr(tx, self.cls, "__call__")).call(tx, [self, *args], kwargs)

    def truth(self, tx):
        if class_attr(tx, self.cls, "__bool__") is None and class_attr(tx, self.cls, "__len__") is None:
            return True
        if class_attr(tx, self.cls, "__bool__") is not None:
            return checked_bool(tx, self._dunder(tx, "__bool__", []))
        return self.length(tx) > 0

    def opaque_attr(self, tx, name):
        if name == "__class__":
            return ObjectVar(self.cls)
        if name == "__dict__":
            return _AttrsDictVar(self)
        return super().opaque_attr(tx, name)

    def reconstruct(self, cg):
        if cg.load_rebuilt(self):
            return
        cg.call_const(rebuild_object, [lambda cg: cg.load_const(self.cls), attrs_dict(self.attrs)])
        cg.keep_rebuilt(self)

    def noun(self):
        return a_type(self.cls)

    def __repr__(self):
        return f"NewObjectVar({self.cls.__name__})"


_BUILTIN_BASES = (dict, OrderedDict, list, tuple)


def checked_bool(tx, result) -> bool:
    """What __bool__ returned, as CPython takes it: a bool, else the TypeError it raises
    (stopping the trace there, so it raises in place)."""
    if result.is_const():
        if type(result.as_const()) is bool:
            return result.as_const()
        unsupported(f"TypeError: __bool__ should return bool, returned "
                    f"{type(result.as_const()).__name__}")
    if isinstance(result, SymNodeVar) and result.python_type() is bool:
        return result.truth(tx)          # a symbolic comparison: guarded
    unsupported(f"__bool__ returned {result}, not a bool known while tracing")


def checked_len(result) -> int:
    """What __len__ returned, as len() takes it: an int >= 0 (or an __index__ of one),
    else the error CPython raises."""
    if not result.is_const():
        unsupported(f"__len__ returned a value unknown while tracing ({result})")
    try:
        return len(_Sized(result.as_const()))
    except (TypeError, ValueError, OverflowError) as e:
        unsupported(f"{type(e).__name__}: {e}")


class _Sized:
    """len() of this is len() of an object whose __len__ returns `n`: CPython's checks."""
    __slots__ = ("n",)

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def _mapping_items(tx, var, cls):
    """What ``dict.update(d, obj)`` and ``**obj`` take from an object of a user class
    with a keys() method (a collections.abc.Mapping): ``obj[k]`` for each k of
    ``obj.keys()``, in order.  None without keys(): an iterable of pairs."""
    keys = class_attr(tx, cls, "keys")
    if keys is None:
        return None
    if keys is collections.abc.Mapping.keys:
        found = var_list(tx, var)        # (Mapping's KeysView iterates the mapping)
    else:
        found = var_list(tx, var.getattr(tx, "keys").call(tx, [], {}))
    return {_dict_key(k): var.getitem(tx, k) for k in found}


def _unpack_user(tx, var, cls):
    it = class_attr(tx, cls, "__iter__")
    if it is collections.abc.Sequence.__iter__:
        # Sequence.__iter__ indexes until IndexError: the same as indexing below len().
        return [var.getitem(tx, ConstVar(i)) for i in range(var.length(tx))]
    if isinstance(it, types.FunctionType):
        iterator = UserFunctionVar(it).call(tx, [var], {})
        if iterator is var:
            # An iterator whose __iter__ returns itself: items come from __next__ until
            # it raises StopIteration (unpacking it again would recurse for ever).
            unsupported(f"iterating over {cls.__name__}, an iterator (__next__)")
        return iterator.unpack(tx)
    unsupported(f"iterating over {cls.__name__}")


def construct_user_object(tx, cls, args, kwargs):
    """Calling a user class while tracing, as type.__call__ does: its __new__ (a
    NewObjectVar, unless the class wrote __new__ in Python: that is inlined), then, if
    that made an instance of the class, __init__ inlined on it."""
    if isinstance(cls, type) and issubclass(cls, BaseException):
        unsupported(f"creating exception {cls.__name__}")
    if type(cls) is not type and type(cls).__module__ not in ("abc",):
        unsupported(f"class {cls.__name__} has metaclass {type(cls).__name__}")
    if class_lookup(cls, "__new__") not in (None, object.__new__) and \
            not isinstance(class_lookup(cls, "__new__"), staticmethod):
        unsupported(f"{cls.__name__} defines __new__")
    if any(getattr(k, "__module__", "") == "builtins" and k is not object for k in cls.__mro__):
        unsupported(f"{cls.__name__} subclasses a builtin type")
    new_new = class_attr(tx, cls, "__new__")
    if isinstance(new_new, staticmethod) and new_new.__func__ is not object.__new__:
        if not isinstance(new_new.__func__, types.FunctionType):
            unsupported(f"{cls.__name__}.__new__ is not a Python function")
        obj = UserFunctionVar(new_new.__func__).call(tx, [ObjectVar(cls), *args], kwargs)
        made = obj.python_type()
        if not (isinstance(made, type) and issubclass(made, cls)):
            return obj          # (type.__call__ runs no __init__ on another class's object)
        _run_init(tx, made, obj, args, kwargs, own_new=True)
        return obj
    obj = NewObjectVar(cls)
    _run_init(tx, cls, obj, args, kwargs, own_new=False)
    return obj


def _run_init(tx, cls, obj, args, kwargs, own_new):
    init = class_attr(tx, cls, "__init__")
    if isinstance(init, types.FunctionType):
        UserFunctionVar(init).call(tx, [obj, *args], kwargs)
    elif init not in (None, object.__init__):
        unsupported(f"{cls.__name__}.__init__ is not a Python function")
    elif (args or kwargs) and not own_new:
        # (object.__init__ takes extra arguments only where the class wrote __new__)
        unsupported(f"{cls.__name__}() takes no arguments")


def new_plain_object(tx, cls_var, args, kwargs):
    """``object.__new__(cls)`` (directly or as super().__new__ in a class's own __new__):
    a new, empty instance of a plain Python class."""
    cls = cls_var.value if isinstance(cls_var, ObjectVar) else \
        cls_var.as_const() if cls_var.is_const() else None
    if not isinstance(cls, type):
        unsupported(f"object.__new__({cls_var})")
    if args or kwargs:
        unsupported(f"object.__new__({cls.__name__}, ...) with arguments")
    if type(cls) is not type and type(cls).__module__ not in ("abc",) or \
            any(getattr(k, "__module__", "") == "builtins" and k is not object for k in cls.__mro__) \
            or issubclass(cls, BaseException) or cls.__module__ == "builtins":
        unsupported(f"object.__new__ of {cls.__name__}, not a plain Python class")
    return NewObjectVar(cls)


class ObjectNewVar(Var):
    """object.__new__, reached as super().__new__ or by name: `new_plain_object`."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        if not args:
            unsupported("object.__new__() without a class")
        return new_plain_object(tx, args[0], args[1:], kwargs)


class DataclassVar(Var):
    """A dataclass instance made while tracing: its fields are Vars.  (A dataclass
    that is also a dict, as Hugging Face's ModelOutput, is a container subclass object:
    see subclasses.py.)"""
    __slots__ = ("cls", "fields")

    def __init__(self, cls, fields: dict):
        super().__init__(None)
        self.cls = cls
        self.fields = dict(fields)

    def python_type(self):
        return self.cls

    def value_key(self):
        """The object itself, made now, where it is hashed and compared by its fields
        alone (a frozen dataclass's generated __hash__ and __eq__) and they are all
        constants: what stands for it as a dict key or set member.  Else None."""
        cls = self.cls
        params = getattr(cls, "__dataclass_params__", None)
        if params is None or not (params.frozen and params.eq) or \
                not _generated(cls, "__hash__") or not _generated(cls, "__eq__") or \
                not all(v.is_const() for v in self.fields.values()) or \
                set(self.fields) != {f.name for f in dataclasses.fields(cls)}:
            return None
        return _new_with_attrs(cls, {k: v.as_const() for k, v in self.fields.items()})

    def getattr(self, tx, name):
        if name in self.fields:
            return self.fields[name]
        cls_attr = class_attr(tx, self.cls, name)
        if isinstance(cls_attr, property) and isinstance(cls_attr.fget, types.FunctionType):
            return UserFunctionVar(cls_attr.fget).call(tx, [self], {})
        if isinstance(cls_attr, types.FunctionType):
            return BoundMethodVar(UserFunctionVar(cls_attr), self)
        if cls_attr is not None:
            return class_value_var(tx, self.cls, name, cls_attr)
        unsupported(f"{self.cls.__name__} has no attribute {name!r}")

    def setattr(self, tx, name, value):
        # A frozen dataclass's __setattr__ raises; a property or slot runs its code.
        hook = class_attr(tx, self.cls, "__setattr__")
        attr = class_attr(tx, self.cls, name)
        if hook is not object.__setattr__ or attr is not None and is_data_descriptor(attr):
            unsupported(f"setting {name!r} on {self.cls.__name__} runs "
                        f"{'its __setattr__' if hook is not object.__setattr__ else 'a descriptor'}")
        self.fields[name] = value

    def plain_setattr(self, tx, name, value):
        """object.__setattr__(self, name, value) (how a frozen dataclass's
        __post_init__ sets fields): no __setattr__ of the class, but descriptors and
        __slots__ still apply."""
        attr = class_attr(tx, self.cls, name)
        if isinstance(attr, types.MemberDescriptorType):
            self.fields[name] = value           # a slot of the class
            return
        if attr is not None and is_data_descriptor(attr) or not self.cls.__dictoffset__:
            unsupported(f"object.__setattr__ of {name!r} on {self.cls.__name__} (a descriptor, "
                        "or no such slot)")
        self.fields[name] = value

    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)

    def getitem(self, tx, key):
        unsupported(f"indexing {self.cls.__name__}")

    def unpack(self, tx):
        unsupported(f"iterating over {self.cls.__name__}")

    def length(self, tx):
        method = class_attr(tx, self.cls, "__len__")
        if not isinstance(method, types.FunctionType):
            unsupported(f"len() of a {self.cls.__name__}")
        return checked_len(UserFunctionVar(method).call(tx, [self], {}))

    def truth(self, tx):
        for name in ("__bool__", "__len__"):
            method = class_attr(tx, self.cls, name)
            if isinstance(method, types.FunctionType):
                result = UserFunctionVar(method).call(tx, [self], {})
                return checked_bool(tx, result) if name == "__bool__" else checked_len(result) > 0
            if method is not None:
                unsupported(f"{self.cls.__name__}.{name} is not a Python function")
        return True

    def reconstruct(self, cg):
        if cg.load_rebuilt(self):
            return
        if not _generated_init(self.cls):
            # Its own __init__ took other arguments: the state it left, set directly.
            def attrs(cg):
                for n, v in self.fields.items():
                    cg.load_const(n)
                    v.reconstruct(cg)
                cg.build(dict, len(self.fields))
            cg.call_const(_new_with_attrs, [lambda cg: cg.load_const(self.cls), attrs])
            cg.keep_rebuilt(self)
            return
        init_fields = [f.name for f in dataclasses.fields(self.cls) if f.init]
        names = [n for n in init_fields if n in self.fields]
        extras = [n for n in self.fields if n not in init_fields]

        def construct(cg):
            cg.load_constructor(self.cls)
            for n in names:
                self.fields[n].reconstruct(cg)
            cg.call_kw(len(names), tuple(names))
        if not extras:
            construct(cg)
        else:
            # Fields outside __init__ and attributes set later, set as __post_init__ did.
            def attrs(cg):
                for n in extras:
                    cg.load_const(n)
                    self.fields[n].reconstruct(cg)
                cg.build(dict, len(extras))
            cg.call_const(_set_attrs, [construct, attrs])
        cg.keep_rebuilt(self)

    def noun(self):
        return a_type(self.cls)

    def __repr__(self):
        return f"DataclassVar({self.cls.__name__})"


def make_dataclass_instance(tx, cls, args, kwargs) -> DataclassVar:
    """Run a dataclass's generated __init__ (and __post_init__, inlined) on Vars."""
    if not _generated_init(cls):
        # The class wrote its own __init__ (dataclass(init=True) keeps it): that runs.
        init = class_lookup(cls, "__init__")
        if not isinstance(init, types.FunctionType):
            unsupported(f"{cls.__name__}.__init__ is not a Python function")
        obj = DataclassVar(cls, {})
        UserFunctionVar(init).call(tx, [obj, *args], kwargs)
        return obj
    fields = [f for f in dataclasses.fields(cls)]
    values = {}
    init_fields = [f for f in fields if f.init]
    if len(args) > len(init_fields):
        unsupported(f"{cls.__name__}() takes {len(init_fields)} positional arguments")
    for f, a in zip(init_fields, args):
        values[f.name] = a
    for k, v in kwargs.items():
        if k in values or k not in {f.name for f in init_fields}:
            unsupported(f"{cls.__name__}() got an unexpected keyword argument {k!r}")
        values[k] = v
    for f in fields:
        if f.name in values:
            continue
        if f.default is not dataclasses.MISSING:
            values[f.name] = wrap(tx, f.default, None, guard=False)
        elif f.default_factory is not dataclasses.MISSING:
            # called each time, as the generated __init__ does (a new list per object)
            values[f.name] = wrap(tx, f.default_factory, None, guard=False).call(tx, [], {})
        elif f.init:
            unsupported(f"{cls.__name__}() missing argument {f.name!r}")
    obj = DataclassVar(cls, values)
    post_init = class_attr(tx, cls, "__post_init__")
    if post_init is not None:
        UserFunctionVar(post_init).call(tx, [obj], {})
    return obj


def _generated(cls, name) -> bool:
    """Whether cls.name is one @dataclass wrote (compiled from a string)."""
    fn = class_lookup(cls, name)
    return getattr(getattr(fn, "__code__", None), "co_filename", None) == "<string>"


def _generated_init(cls) -> bool:
    """Whether cls.__init__ is the one @dataclass wrote (compiled from a string)."""
    init = class_lookup(cls, "__init__")
    return getattr(getattr(init, "__code__", None), "co_filename", None) == "<string>"


def _new_with_attrs(cls, attrs):
    return _set_attrs(object.__new__(cls), attrs)


def _set_attrs(obj, attrs):
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


class _AttrsDictVar(DictVar):
    """``obj.__dict__`` of an object made in the frame: its attribute table itself, so
    writes through either are seen by both.  It stays in the frame (rebuilt on its own
    it would no longer be the object's __dict__)."""
    __slots__ = ("owner",)

    def __init__(self, owner):
        super().__init__({})
        self.items = owner.attrs
        self.owner = owner

    def reconstruct(self, cg):
        unsupported(f"the __dict__ of a {self.owner.cls.__name__} made in the frame leaves it")


@call_rule(copy.deepcopy)
def _call_deepcopy(tx, args, kwargs):
    return deepcopy_var(tx, args[0], {}) if len(args) == 1 and not kwargs else None


def deepcopy_var(tx, var, memo):
    """``copy.deepcopy(var)`` on Vars, as copy.deepcopy does it for what it supports:
    immutable atoms stay, lists, dicts and tuples are copied item by item, and objects
    of plain classes (no __deepcopy__, __reduce__, __getstate__, __setstate__ or
    __slots__ of their own) become a new object with deep copies of their __dict__ (what
    object.__reduce_ex__ and copy._reconstruct do).  `memo` keeps shared parts shared."""
    if id(var) in memo:
        return memo[id(var)][1]
    if isinstance(var, ConstVar) or isinstance(var, SymNodeVar):
        return var                          # immutable: deepcopy returns it (or an equal)
    if isinstance(var, ObjectVar) and isinstance(var.value, (type, types.FunctionType,
                                                             types.BuiltinFunctionType)):
        return var                          # copy's atomic types
    if type(var) is TupleVar:
        items = [deepcopy_var(tx, v, memo) for v in var.items]
        return var if all(a is b for a, b in zip(items, var.items)) else TupleVar(items)
    if type(var) is ListVar:
        copied = ListVar([])
        memo[id(var)] = (var, copied)
        copied.items = [deepcopy_var(tx, v, memo) for v in var.items]
        return copied
    if type(var) is DictVar or type(var) is _AttrsDictVar:
        copied = DictVar({})
        memo[id(var)] = (var, copied)
        copied.items = {k: deepcopy_var(tx, v, memo) for k, v in var.items.items()}
        return copied
    if isinstance(var, (UserObjectVar, NewObjectVar)):
        state = _plain_object_state(tx, var)
        copied = NewObjectVar(var.cls)
        memo[id(var)] = (var, copied)
        copied.attrs = {k: deepcopy_var(tx, v, memo) for k, v in state.items()}
        return copied
    unsupported(f"copy.deepcopy of {var}")


_NO_COPY_HOOKS = ("__deepcopy__", "__setstate__", "__getattr__")


def _plain_object_state(tx, var) -> dict:
    """The attributes deepcopy copies from an object of a plain Python class (checked,
    and guarded, to be one), as Vars."""
    cls = var.cls
    if type(cls) is not type or any(k.__module__ == "builtins" and k is not object
                                    for k in cls.__mro__):
        unsupported(f"copy.deepcopy of a {cls.__name__} (a builtin subclass or a metaclass)")
    expected = {"__new__": object.__new__, "__reduce_ex__": object.__reduce_ex__,
                "__reduce__": object.__reduce__,
                "__getstate__": getattr(object, "__getstate__", None)}
    for name, want in [*expected.items(), *((n, None) for n in _NO_COPY_HOOKS)]:
        if class_attr(tx, cls, name) is not want:
            unsupported(f"copy.deepcopy of a {cls.__name__}: it has its own {name}")
    if any("__slots__" in k.__dict__ for k in cls.__mro__) or cls in copy._deepcopy_dispatch:
        unsupported(f"copy.deepcopy of a {cls.__name__} (slots or a registered copier)")
    if cls in copyreg.dispatch_table:
        unsupported(f"copy.deepcopy of a {cls.__name__} (a copyreg reducer)")
    tx.guards.global_state(f"{cls.__qualname__} has no copyreg reducer",
                           functools.partial(operator.contains, copyreg.dispatch_table, cls), False,
                           text=f"{cls.__qualname__} has no copyreg reducer")
    hook = class_lookup(cls, "__getattribute__")
    if isinstance(var, NewObjectVar):
        if hook is not object.__getattribute__:
            # deepcopy asks the object itself for __deepcopy__ / __setstate__.
            for name in ("__deepcopy__", "__setstate__"):
                if new_object_hasattr(tx, var, name) is not False:
                    unsupported(f"copy.deepcopy of a {cls.__name__}: its __getattribute__ "
                                f"may give {name}")
        return dict(var.attrs)
    value = var.value
    as_dict = var._dict_var(tx)
    if var.source is None or cls is not type(value) or tx.side_effects.has_attr_writes(value) \
            or as_dict is not None and tx.side_effects.container_mutated(as_dict):
        unsupported(f"copy.deepcopy of a {cls.__name__} the trace changed")
    if hook is not object.__getattribute__:
        # deepcopy asks the object itself for __deepcopy__ / __setstate__.
        for name in ("__deepcopy__", "__setstate__"):
            found = hasattr(value, name)
            guard_hasattr(tx, var.source, name, found)
            if found:
                unsupported(f"copy.deepcopy of a {cls.__name__}: its __getattribute__ gives {name}")
    d = object.__getattribute__(value, "__dict__")
    tx.guards.dict_keys(var.attr_source("__dict__"), d)
    return {k: var.own_attr(tx, k) for k in d}


def new_object_hasattr(tx, var, name):
    """hasattr() of an object made in the frame: True, False, or None (cannot tell).
    With a __getattribute__ of its class's own, the hook answers, run for real on a
    scratch object given the same (constant) attributes, by the guard too: what it reads
    beside them (class attributes, say) can change between calls."""
    cls = var.cls
    if name in var.attrs:
        return True
    hook = class_attr(tx, cls, "__getattribute__")
    if hook is object.__getattribute__:
        attr = class_attr(tx, cls, name)
        if isinstance(attr, types.MemberDescriptorType):
            return False                    # a slot not set (set ones are in attrs)
        if attr is not None and is_data_descriptor(attr):
            return None                     # a property's getter may raise
        if attr is not None or class_defines(cls, name):
            return True
        return None if class_attr(tx, cls, "__getattr__") is not None else False
    if not isinstance(hook, types.FunctionType) or \
            not all(v.is_const() for v in var.attrs.values()):
        return None
    state = {k: v.as_const() for k, v in var.attrs.items()}
    probe = functools.partial(_scratch_hasattr, cls, state, name)
    try:
        found = probe()
    except Exception:
        return None
    tx.guards.global_state(f"hasattr(<a {cls.__qualname__} made in the frame>, {name!r})",
                           probe, found)
    return found


def _scratch_hasattr(cls, state, name):
    obj = cls.__new__(cls)
    for k, v in copy.deepcopy(state).items():
        object.__setattr__(obj, k, v)
    return hasattr(obj, name)


__all__ = ["UserObjectVar", "DataclassVar", "make_dataclass_instance",
           "DictVar"]


# What the transformed code calls to make an object the trace made (reconstruct above).
def rebuild_object(cls, attrs):
    """Make an object of `cls` with these attributes, without running __init__ (the
    traced __init__ already computed them).  They are what the object held itself:
    each goes where CPython had it, its slot or its __dict__.  object.__setattr__
    would instead go through a class's data descriptor of that name: a read-only
    property filled by `self.__dict__[name] = v` raised, a property's setter ran."""
    obj = cls.__new__(cls)
    own = _own_dict(obj, cls)
    for name, value in attrs.items():
        if own is not None and not _is_slot(cls, name):
            own[name] = value
        else:
            object.__setattr__(obj, name, value)
    return obj


def _own_dict(obj, cls):
    # The instance dict through type's own descriptor: a class's `__dict__` of its own
    # (a property) would run its code.
    for klass in cls.__mro__:
        descr = klass.__dict__.get("__dict__")
        if descr is not None:
            return descr.__get__(obj, cls) if type(descr) is types.GetSetDescriptorType else None
    return None


def _is_slot(cls, name) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return type(klass.__dict__[name]) is types.MemberDescriptorType
    return False


# -- operators on instances of user classes ------------------------------------------
_OP_DUNDERS = {operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
               operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
               operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
               operator.pow: ("__pow__", "__rpow__"), operator.matmul: ("__matmul__", "__rmatmul__"),
               operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__"),
               operator.xor: ("__xor__", "__rxor__"), operator.lshift: ("__lshift__", "__rlshift__"),
               operator.rshift: ("__rshift__", "__rrshift__"),
               operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"),
               operator.lt: ("__lt__", "__gt__"), operator.gt: ("__gt__", "__lt__"),
               operator.le: ("__le__", "__ge__"), operator.ge: ("__ge__", "__le__")}
_INPLACE_DUNDERS = {operator.iadd: (operator.add, "__iadd__"), operator.isub: (operator.sub, "__isub__"),
                    operator.imul: (operator.mul, "__imul__"),
                    operator.itruediv: (operator.truediv, "__itruediv__"),
                    operator.ifloordiv: (operator.floordiv, "__ifloordiv__"),
                    operator.imod: (operator.mod, "__imod__"), operator.ipow: (operator.pow, "__ipow__"),
                    operator.imatmul: (operator.matmul, "__imatmul__"),
                    operator.iand: (operator.and_, "__iand__"), operator.ior: (operator.or_, "__ior__"),
                    operator.ixor: (operator.xor, "__ixor__"),
                    operator.ilshift: (operator.lshift, "__ilshift__"),
                    operator.irshift: (operator.rshift, "__irshift__")}
_COMPARISONS = (operator.eq, operator.ne, operator.lt, operator.gt, operator.le, operator.ge)
_SYMBOLS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
            operator.floordiv: "//", operator.mod: "%", operator.pow: "** or pow()",
            operator.matmul: "@", operator.and_: "&", operator.or_: "|", operator.xor: "^",
            operator.lshift: "<<", operator.rshift: ">>", operator.lt: "<", operator.gt: ">",
            operator.le: "<=", operator.ge: ">="}


def is_user_object(v) -> bool:
    """An instance of a plain user class, from outside the frame or made in it."""
    return isinstance(v, (UserObjectVar, NewObjectVar))


def user_object_binary_op(tx, fn, a, b, same):
    """``fn(a, b)`` where a or b is an instance of a user class, as CPython's
    binary_op1 / do_richcompare run it: the in-place method first (`+=`), the right
    operand's reflected method first when its class derives from the left's, the
    methods written in Python inlined, NotImplemented passing to the other side, and
    `==` / `!=` falling back to identity (`same(a, b)`).  None where an operand's
    method is not one this can run (a C method of a builtin, a tensor's)."""
    if fn in _INPLACE_DUNDERS:
        plain, name = _INPLACE_DUNDERS[fn]
        if is_user_object(a):
            result = _call_dunder(tx, a, name, b, same)
            if result is None:
                return None
            if not _not_implemented(result):
                return result
        fn = plain
    if fn not in _OP_DUNDERS:
        return None
    name, reflected = _OP_DUNDERS[fn]
    ta, tb = _type_or_none(a), _type_or_none(b)
    if ta is None or tb is None:
        return None
    tries = [(a, name, b)]
    if tb is not ta:
        tries.append((b, reflected, a))
        if issubclass(tb, ta) and (fn in _COMPARISONS or class_lookup(tb, reflected) is not
                                   class_lookup(ta, reflected)):
            tries.reverse()
    for self, method, other in tries:
        if not is_user_object(self):
            if not _knows_no_user_class(self, fn):
                return None
            continue            # a builtin's method answers NotImplemented to it
        result = _call_dunder(tx, self, method, other, same)
        if result is None:
            return None
        if not _not_implemented(result):
            return result
    if fn is operator.eq:
        return ConstVar(same(a, b))
    if fn is operator.ne:
        return ConstVar(not same(a, b))
    what = f"'{_SYMBOLS[fn]}' not supported between instances of" if fn in _COMPARISONS else \
        f"unsupported operand type(s) for {_SYMBOLS[fn]}:"
    raise_builtin(TypeError, f"{what} '{ta.__name__}' and '{tb.__name__}'")


def _type_or_none(v):
    if isinstance(v, (ConstVar, SymNodeVar)) or is_user_object(v) or \
            isinstance(v, (DictVar, ListVar, TupleVar)):
        return v.python_type()
    return None


def _knows_no_user_class(v, fn) -> bool:
    """A constant whose operator method returns NotImplemented for an object of a user
    class: a number or None for any operator; a str, bytes or container only for a
    comparison (`"%s" % obj` formats it, `[0] * obj` asks it for __index__)."""
    if not isinstance(v, ConstVar):
        return False
    if v.value is None or type(v.value) in (int, float, complex, bool):
        return True
    return fn in _COMPARISONS and type(v.value) in (str, bytes, tuple, frozenset)


def _not_implemented(v) -> bool:
    return v.is_const() and v.as_const() is NotImplemented


def _call_dunder(tx, self, name, other, same):
    """``type(self).name(self, other)``: a Python method inlined, object's defaults
    emulated; NotImplemented (a ConstVar) where the class has no such method; None
    where it is something else."""
    cls = self.python_type()
    method = class_attr(tx, cls, name)
    if method is None:
        return ConstVar(NotImplemented)
    if isinstance(method, types.FunctionType):
        return UserFunctionVar(method).call(tx, [self, other], {})
    if method is getattr(object, name, None):
        if name == "__eq__":
            return ConstVar(True) if same(self, other) else ConstVar(NotImplemented)
        if name == "__ne__":
            # object.__ne__ inverts what type(self).__eq__ answers
            result = _call_dunder(tx, self, "__eq__", other, same)
            if result is None or _not_implemented(result):
                return result
            return ConstVar(not result.truth(tx))
        return ConstVar(NotImplemented)
    return None


def user_object_text(tx, v, kind):
    """``str(v)`` / ``repr(v)`` (`kind`) of an instance of a user class: its __str__ /
    __repr__ written in Python, inlined (object.__str__ goes on to __repr__).  None
    where the text is object's default (it names the object's address) or a C
    method's."""
    name = "__str__" if kind is str else "__repr__"
    method = class_attr(tx, v.python_type(), name)
    if method is object.__str__:
        return user_object_text(tx, v, repr)
    if not isinstance(method, types.FunctionType):
        return None
    text = UserFunctionVar(method).call(tx, [v], {})
    if not (text.is_const() and isinstance(text.as_const(), str)):
        unsupported(f"{name} returned {text}, not a string known while tracing")
    return ConstVar(str(text.as_const()))


@register
def namedtuple_member(tx, var, name):
    """A method, property, classmethod or staticmethod that a namedtuple subclass (a
    typing.NamedTuple class body) wrote in Python, read on its instance `var`."""
    attr = class_attr(tx, var.cls, name)
    if isinstance(attr, types.FunctionType):
        return BoundMethodVar(UserFunctionVar(attr), var)
    if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
        return UserFunctionVar(attr.fget).call(tx, [var], {})
    if isinstance(attr, classmethod) and isinstance(attr.__func__, types.FunctionType):
        return BoundMethodVar(UserFunctionVar(attr.__func__), ObjectVar(var.cls))
    if isinstance(attr, staticmethod) and isinstance(attr.__func__, types.FunctionType):
        return UserFunctionVar(attr.__func__)
    return None
