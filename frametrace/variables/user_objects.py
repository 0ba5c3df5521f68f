"""Instances of user classes: objects from outside the frame (guarded by type, their
attributes by value), and dataclass / ModelOutput instances made while tracing (rebuilt
by calling the class in the transformed code)."""
from __future__ import annotations

import collections.abc
import dataclasses
import types
from collections import OrderedDict

from ..source import AttrSource, BuiltinCallSource, GetItemSource
from .base import Var, unsupported
from .constant import ConstVar
from .containers import DictVar, ListVar, TupleVar
from .functions import BoundMethodVar, UserFunctionVar
from .modules import _class_lookup

# Keys a guard can spell with repr().
_REPR_KEYS = (str, int, bool, type(None))


class UserObjectVar(Var):
    """An object of a user class from outside the trace."""
    __slots__ = ("value",)

    def __init__(self, value, source):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def getattr(self, tx, name):
        from .builder import wrap
        written = tx.side_effects.load_attr(self.value, name)
        if written is not None:
            return written
        obj = self.value
        cls_attr = _class_lookup(type(obj), name)
        if isinstance(cls_attr, property) and cls_attr.fget is not None and \
                isinstance(cls_attr.fget, types.FunctionType):
            return wrap(tx, cls_attr.fget, None, guard=False).call(tx, [self], {})
        if isinstance(cls_attr, types.FunctionType) and name not in getattr(obj, "__dict__", {}):
            return BoundMethodVar(UserFunctionVar(cls_attr), self)
        if isinstance(cls_attr, classmethod):
            from .objects import ObjectVar
            return BoundMethodVar(wrap(tx, cls_attr.__func__, None, guard=False), ObjectVar(type(obj)))
        if isinstance(cls_attr, staticmethod):
            return wrap(tx, cls_attr.__func__, None, guard=False)
        try:
            value = getattr(obj, name)
        except AttributeError:
            unsupported(f"{type(obj).__name__} object has no attribute {name!r}")
        return wrap(tx, value, AttrSource(self.source, name) if self.source is not None else None)

    def setattr(self, tx, name, value):
        tx.side_effects.store_attr(self, self.value, name, value)

    def call(self, tx, args, kwargs):
        call = _class_lookup(type(self.value), "__call__")
        if isinstance(call, types.FunctionType):
            return UserFunctionVar(call).call(tx, [self, *args], kwargs)
        unsupported(f"calling {type(self.value).__name__} object")

    def _dunder(self, tx, name, args):
        """Call a special method: inlined when written in Python, evaluated on the real
        object when it is a builtin base's read-only method (a dict subclass's get)."""
        method = _class_lookup(type(self.value), name)
        if isinstance(method, types.FunctionType):
            return UserFunctionVar(method).call(tx, [self, *args], {})
        if method is not None and name in ("__getitem__", "__len__", "__contains__") and \
                all(a.is_const() for a in args):
            return self._builtin_read(tx, name, method, [a.as_const() for a in args])
        unsupported(f"{type(self.value).__name__}.{name}")

    def _builtin_read(self, tx, name, method, args):
        """Evaluate a builtin base's read-only method on the real object; the result is a
        fact about its contents, so it is guarded (read again by the check) like an input."""
        from .builder import wrap
        result = method(self.value, *args)
        if self.source is None:
            return wrap(tx, result, None, guard=False)
        if any(type(a) not in _REPR_KEYS for a in args):
            unsupported(f"{type(self.value).__name__}.{name} with key {args[0]!r}")
        if name == "__getitem__":
            return wrap(tx, result, GetItemSource(self.source, args[0]))
        source = BuiltinCallSource(self.source, "len" if name == "__len__" else "contains", args)
        tx.guards.equals(source, result)
        return ConstVar(result, source)

    def getitem(self, tx, key):
        return self._dunder(tx, "__getitem__", [key])

    def setitem(self, tx, key, value):
        self._dunder(tx, "__setitem__", [key, value])

    def length(self, tx):
        n = self._dunder(tx, "__len__", [])
        return n.as_const()

    def unpack(self, tx):
        return _unpack_user(tx, self, type(self.value))

    def truth(self, tx):
        cls = type(self.value)
        if _class_lookup(cls, "__bool__") is None and _class_lookup(cls, "__len__") is None:
            return True
        if isinstance(_class_lookup(cls, "__bool__"), types.FunctionType):
            return self._dunder(tx, "__bool__", []).truth(tx)
        return self.length(tx) > 0

    def __repr__(self):
        return f"UserObjectVar({type(self.value).__name__})"


class NewObjectVar(Var):
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

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        cls_attr = _class_lookup(self.cls, name)
        if isinstance(cls_attr, property) and isinstance(cls_attr.fget, types.FunctionType):
            return UserFunctionVar(cls_attr.fget).call(tx, [self], {})
        if isinstance(cls_attr, types.FunctionType):
            return BoundMethodVar(UserFunctionVar(cls_attr), self)
        if isinstance(cls_attr, classmethod):
            from .objects import ObjectVar
            return BoundMethodVar(UserFunctionVar(cls_attr.__func__), ObjectVar(self.cls))
        if isinstance(cls_attr, staticmethod):
            from .builder import wrap
            return wrap(tx, cls_attr.__func__, None, guard=False)
        if cls_attr is not None:
            from .builder import wrap
            return wrap(tx, cls_attr, None, guard=False)
        getattr_hook = _class_lookup(self.cls, "__getattr__")
        if isinstance(getattr_hook, types.FunctionType):
            return UserFunctionVar(getattr_hook).call(tx, [self, ConstVar(name)], {})
        unsupported(f"{self.cls.__name__} object has no attribute {name!r}")

    def setattr(self, tx, name, value):
        setter = _class_lookup(self.cls, name)
        if isinstance(setter, property):
            if setter.fset is None:
                unsupported(f"can't set property {name!r}")
            UserFunctionVar(setter.fset).call(tx, [self, value], {})
            return
        self.attrs[name] = value

    def _dunder(self, tx, name, args):
        method = _class_lookup(self.cls, name)
        if isinstance(method, types.FunctionType):
            return UserFunctionVar(method).call(tx, [self, *args], {})
        unsupported(f"{self.cls.__name__}.{name}")

    def getitem(self, tx, key):
        return self._dunder(tx, "__getitem__", [key])

    def setitem(self, tx, key, value):
        self._dunder(tx, "__setitem__", [key, value])

    def length(self, tx):
        return self._dunder(tx, "__len__", []).as_const()

    def unpack(self, tx):
        return _unpack_user(tx, self, self.cls)

    def call(self, tx, args, kwargs):
        return self._dunder(tx, "__call__", [*args]) if not kwargs else \
            UserFunctionVar(_class_lookup(self.cls, "__call__")).call(tx, [self, *args], kwargs)

    def truth(self, tx):
        if _class_lookup(self.cls, "__bool__") is None and _class_lookup(self.cls, "__len__") is None:
            return True
        if _class_lookup(self.cls, "__bool__") is not None:
            return self._dunder(tx, "__bool__", []).truth(tx)
        return self.length(tx) > 0

    def reconstruct(self, cg):
        if cg.load_rebuilt(self):
            return
        from ..codegen import rebuild_object
        names = list(self.attrs)

        def attrs(cg):
            for n in names:
                cg.load_const(n)
                self.attrs[n].reconstruct(cg)
            cg.build(dict, len(names))
        cg.call_const(rebuild_object, [lambda cg: cg.load_const(self.cls), attrs])
        cg.keep_rebuilt(self)

    def __repr__(self):
        return f"NewObjectVar({self.cls.__name__})"


def _unpack_user(tx, var, cls):
    it = _class_lookup(cls, "__iter__")
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
    """Calling a user class while tracing: a NewObjectVar with __init__ inlined."""
    if isinstance(cls, type) and issubclass(cls, BaseException):
        unsupported(f"creating exception {cls.__name__}")
    if type(cls) is not type and type(cls).__module__ not in ("abc",):
        unsupported(f"class {cls.__name__} has metaclass {type(cls).__name__}")
    if _class_lookup(cls, "__new__") not in (None, object.__new__) and \
            not isinstance(_class_lookup(cls, "__new__"), staticmethod):
        unsupported(f"{cls.__name__} defines __new__")
    if any(getattr(k, "__module__", "") == "builtins" and k is not object for k in cls.__mro__):
        unsupported(f"{cls.__name__} subclasses a builtin type")
    new_new = _class_lookup(cls, "__new__")
    if isinstance(new_new, staticmethod) and new_new.__func__ is not object.__new__:
        unsupported(f"{cls.__name__} defines __new__")
    obj = NewObjectVar(cls)
    init = _class_lookup(cls, "__init__")
    if isinstance(init, types.FunctionType):
        UserFunctionVar(init).call(tx, [obj, *args], kwargs)
    elif init not in (None, object.__init__):
        unsupported(f"{cls.__name__}.__init__ is not a Python function")
    elif args or kwargs:
        unsupported(f"{cls.__name__}() takes no arguments")
    return obj


def is_model_output(cls) -> bool:
    """Dataclasses that are also dicts, like Hugging Face ModelOutput."""
    return dataclasses.is_dataclass(cls) and issubclass(cls, (dict, OrderedDict))


class DataclassVar(Var):
    """A dataclass instance made while tracing: its fields are Vars.  For dict-like
    dataclasses (ModelOutput) indexing follows ModelOutput: by key, or by position over
    the fields that are not None."""
    __slots__ = ("cls", "fields")

    def __init__(self, cls, fields: dict):
        super().__init__(None)
        self.cls = cls
        self.fields = dict(fields)

    def python_type(self):
        return self.cls

    def _present(self):
        return [(k, v) for k, v in self.fields.items() if not _is_none(v)]

    def getattr(self, tx, name):
        if name in self.fields:
            return self.fields[name]
        cls_attr = _class_lookup(self.cls, name)
        if isinstance(cls_attr, property) and isinstance(cls_attr.fget, types.FunctionType):
            return UserFunctionVar(cls_attr.fget).call(tx, [self], {})
        if isinstance(cls_attr, types.FunctionType):
            return BoundMethodVar(UserFunctionVar(cls_attr), self)
        if cls_attr is not None:
            from .builder import wrap
            return wrap(tx, cls_attr, None, guard=False)
        unsupported(f"{self.cls.__name__} has no attribute {name!r}")

    def setattr(self, tx, name, value):
        self.fields[name] = value

    def call_method(self, tx, name, args, kwargs):
        if is_model_output(self.cls):
            present = self._present()
            if name == "to_tuple" and not args:
                return TupleVar([v for _, v in present])
            if name == "keys":
                return ListVar([ConstVar(k) for k, _ in present])
            if name == "values":
                return ListVar([v for _, v in present])
            if name == "items":
                return ListVar([TupleVar([ConstVar(k), v]) for k, v in present])
            if name == "get" and args and args[0].is_const():
                default = args[1] if len(args) > 1 else ConstVar(None)
                return dict(present).get(args[0].as_const(), default)
            if name == "__getitem__":
                return self.getitem(tx, args[0])
            if name == "__contains__":
                return ConstVar(args[0].as_const() in dict(present))
        return self.getattr(tx, name).call(tx, args, kwargs)

    def getitem(self, tx, key):
        if not is_model_output(self.cls) or not key.is_const():
            unsupported(f"indexing {self.cls.__name__}")
        k = key.as_const()
        present = self._present()
        if isinstance(k, str):
            return dict(present)[k]
        if isinstance(k, slice):
            return TupleVar([v for _, v in present][k])
        return present[k][1]

    def unpack(self, tx):
        if is_model_output(self.cls):
            return [ConstVar(k) for k, _ in self._present()]
        unsupported(f"iterating over {self.cls.__name__}")

    def length(self, tx):
        return len(self._present())

    def truth(self, tx):
        return True

    def reconstruct(self, cg):
        init_fields = [f.name for f in dataclasses.fields(self.cls) if f.init]
        names = [n for n in init_fields if n in self.fields]
        cg.load_constructor(self.cls)
        for n in names:
            self.fields[n].reconstruct(cg)
        cg.call_kw(len(names), tuple(names))

    def __repr__(self):
        return f"DataclassVar({self.cls.__name__})"


def make_dataclass_instance(tx, cls, args, kwargs) -> DataclassVar:
    """Run a dataclass's generated __init__ (and __post_init__, inlined) on Vars."""
    from .builder import wrap
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
            unsupported(f"{cls.__name__}.{f.name} has a default_factory")
        elif f.init:
            unsupported(f"{cls.__name__}() missing argument {f.name!r}")
    obj = DataclassVar(cls, values)
    post_init = _class_lookup(cls, "__post_init__")
    if post_init is not None and not is_model_output(cls):
        UserFunctionVar(post_init).call(tx, [obj], {})
    return obj


def _is_none(v):
    return isinstance(v, ConstVar) and v.value is None


__all__ = ["UserObjectVar", "DataclassVar", "make_dataclass_instance", "is_model_output",
           "DictVar"]
