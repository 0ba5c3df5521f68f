"""Python values known at trace time: numbers, strings, None, dtypes, devices, shapes,
slices, ranges.  Operations on them are folded while tracing."""
from __future__ import annotations

import enum
import operator

import torch

from .base import ValueVar, Var, iter_of, nouns, raise_folded, short_repr, unsupported, var_list
from ..guards import is_constant_value  # noqa: F401  (read here by variables/)

# Methods safe to evaluate at trace time on constants (no mutation, no I/O).  Every
# public method of str and bytes qualifies: both are immutable.
_STR_DUNDERS = {"__getitem__", "__len__", "__contains__", "__add__", "__mul__", "__rmul__",
                "__mod__", "__format__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
                "__ge__", "__hash__", "__iter__"}
_PURE_METHODS = {
    str: {n for n in dir(str) if not n.startswith("_")} | _STR_DUNDERS,
    bytes: {n for n in dir(bytes) if not n.startswith("_")} | _STR_DUNDERS,
    int: {"bit_length", "to_bytes", "__index__", "__int__", "__float__", "conjugate"},
    float: {"is_integer", "__int__", "__float__", "conjugate", "hex"},
    torch.Size: {"numel", "index", "count", "__getitem__", "__len__"},
    tuple: {"index", "count"},
    range: {"index", "count"},
    torch.dtype: {"to_complex", "to_real"},
}


def is_pure_method(cls: type, name: str) -> bool:
    """Whether ``cls.name`` called on constants may be evaluated at trace time."""
    return name in _PURE_METHODS.get(cls, ())


class ConstVar(ValueVar):
    __slots__ = ()

    def is_const(self):
        return True

    def as_const(self):
        return self.value

    def getattr(self, tx, name):
        value = self.value
        if isinstance(value, (torch.dtype, torch.device, torch.finfo, torch.iinfo)) or (
                isinstance(value, (int, float, complex, slice, range)) and not name.startswith("__")):
            try:
                attr = getattr(value, name)
            except AttributeError:
                unsupported(f"{type(value).__name__} has no attribute {name!r}")
            if callable(attr):
                return MethodVar(self, name)
            return ConstVar(attr)
        if any(isinstance(value, t) and name in names for t, names in _PURE_METHODS.items()) or \
                name == "__iter__" and isinstance(value, (str, bytes, tuple, range, torch.Size)):
            return MethodVar(self, name)
        if isinstance(value, enum.Enum) and name in ("value", "name", "_value_", "_name_"):
            return _enum_member_attr(value, name)
        unsupported(f"attribute {name!r} of constant {value!r}")

    def call_method(self, tx, name, args, kwargs):
        if name == "__iter__" and not args and not kwargs:
            return iter_of(tx, self)       # a traced iterator, not the real one
        if name == "join" and isinstance(self.value, (str, bytes)) and len(args) == 1 and \
                not kwargs and not args[0].is_const():
            # Of strings computed here (a generator, a list of them): joined now.
            parts = var_list(tx, args[0])
            if not all(p.is_const() for p in parts):
                unsupported(f"{type(self.value).__name__}.join of {nouns(parts)}")
            return self._call_pure_method(tx, name, [ConstVar([p.as_const() for p in parts])], {})
        return self._call_pure_method(tx, name, args, kwargs)

    def _call_pure_method(self, tx, name, args, kwargs):
        if not all(a.is_const() for a in args) or not all(v.is_const() for v in kwargs.values()):
            unsupported(f"{type(self.value).__name__}.{name} with non-constant arguments")
        fn = getattr(self.value, name)
        try:
            return ConstVar(fn(*[a.as_const() for a in args],
                               **{k: v.as_const() for k, v in kwargs.items()}))
        except Exception as e:      # CPython raises it at this call
            raise_folded(e, f"{type(self.value).__name__}.{name}")

    def getitem(self, tx, key):
        if not key.is_const():
            unsupported(f"indexing constant {self.value!r} with {key}")
        try:
            return ConstVar(self.value[key.as_const()])
        except (TypeError, IndexError, KeyError) as e:
            raise_folded(e, f"indexing {self.value!r}")

    def unpack(self, tx):
        try:
            return [ConstVar(v) for v in self.value]
        except TypeError as e:          # 'int' object is not iterable
            raise_folded(e, f"iterating over {self.value!r}")

    def truth(self, tx):
        return bool(self.value)

    def length(self, tx):
        return len(self.value)

    def reconstruct(self, cg):
        v = self.value
        if self.source is not None and (type(v) is float or type(v) is complex) and v != v:
            # A NaN from outside is loaded from where it came: which NaN object it is
            # (`x in [x]`, a dict key) is not what its guard ("a NaN") states.
            return self.source.reconstruct(cg)
        cg.load_const(v)

    def noun(self):
        return short_repr(self.value)

    def __repr__(self):
        return f"ConstVar({self.value!r})"


def _enum_member_attr(member, name):
    """An enum member's value or name: set when its class was made (a member is
    guarded by identity), unless the class overrides the attribute."""
    attr = None
    for klass in type(member).__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            break
    if name in ("value", "name") and attr is not enum.Enum.__dict__.get(name):
        unsupported(f"{type(member).__name__}.{name} is overridden")
    got = getattr(member, name)
    if not is_constant_value(got):
        unsupported(f"{type(member).__name__} member with a value of type {type(got).__name__}")
    return ConstVar(got)


BINARY_FOLD = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
               operator.mod, operator.pow, operator.lshift, operator.rshift, operator.and_,
               operator.or_, operator.xor, operator.matmul, operator.lt, operator.le,
               operator.eq, operator.ne, operator.gt, operator.ge, operator.is_,
               operator.is_not, operator.contains}

# An in-place operator to its plain form (`a op= b` where `a` does not change in place).
INPLACE_TO_PLAIN = {operator.iadd: operator.add, operator.iand: operator.and_,
                     operator.ifloordiv: operator.floordiv, operator.ilshift: operator.lshift,
                     operator.imatmul: operator.matmul, operator.imul: operator.mul,
                     operator.imod: operator.mod, operator.ior: operator.or_,
                     operator.ipow: operator.pow, operator.irshift: operator.rshift,
                     operator.isub: operator.sub, operator.itruediv: operator.truediv,
                     operator.ixor: operator.xor}


class MethodVar(Var):
    """``obj.name`` where obj is a traced value: calling it calls obj.call_method."""
    __slots__ = ("obj", "name")

    def __init__(self, obj, name):
        super().__init__(None)
        self.obj = obj
        self.name = name

    def call(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def getattr(self, tx, name):
        if name == "__name__":          # a builtin value's method: its own name
            return ConstVar(self.name)
        if name == "__self__":
            return self.obj
        return super().getattr(tx, name)

    def reconstruct(self, cg):
        self.obj.reconstruct(cg)
        cg.load_attr(self.name)

    def noun(self):
        return f"method {self.name}() of {self.obj}"

    def __repr__(self):
        return f"MethodVar({self.obj!r}.{self.name})"


def fold_call(fn, args, kwargs, name: str) -> ConstVar:
    """``fn(*args, **kwargs)`` evaluated now, on constant Vars; an exception it raises
    stops the trace with its message (CPython would raise it at this call)."""
    try:
        return ConstVar(fn(*[a.as_const() for a in args], **{k: v.as_const() for k, v in kwargs.items()}))
    except Exception as e:
        raise_folded(e, f"{name}()")
