"""Instances of user classes: objects from outside the frame (guarded by type, their
attributes by value), and dataclass / ModelOutput instances made while tracing (rebuilt
by calling the class in the transformed code)."""
from __future__ import annotations

import dataclasses
import types
from collections import OrderedDict

from ..source import AttrSource
from .base import Var, unsupported
from .constant import ConstVar
from .containers import DictVar, ListVar, TupleVar
from .functions import BoundMethodVar, UserFunctionVar
from .modules import _class_lookup


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

    def truth(self, tx):
        cls = type(self.value)
        if _class_lookup(cls, "__bool__") is None and _class_lookup(cls, "__len__") is None:
            return True
        unsupported(f"truth value of {cls.__name__} object")

    def __repr__(self):
        return f"UserObjectVar({type(self.value).__name__})"


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
