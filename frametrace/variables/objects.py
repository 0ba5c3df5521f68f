"""Python objects known at trace time: modules, torch functions, builtins, bound
methods of traced values, and nn.Modules."""
from __future__ import annotations

import builtins
import math
import operator
import types

import torch

from ..source import AttrSource, GetItemSource
from .base import ValueVar, Var, unsupported
from .constant import ConstVar, is_constant_value
from .containers import DictVar, IteratorVar, ListVar, TupleVar
from .tensor import TensorVar


class ObjectVar(ValueVar):
    """An object used as-is while tracing (guarded by identity when it has a source)."""
    __slots__ = ()

    def getattr(self, tx, name):
        from .builder import wrap
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            unsupported(f"{self.value!r} has no attribute {name!r}")
        source = AttrSource(self.source, name) if self.source is not None else None
        # Attributes of torch and the standard library are taken as constants.
        return wrap(tx, attr, source, guard=not _is_library_object(self.value))

    def call(self, tx, args, kwargs):
        value = self.value
        if isinstance(value, type) and value in _CONST_CLASSES and _all_const(args, kwargs):
            return ConstVar(value(*_consts(args), **_const_kwargs(kwargs)))
        if value in _PURE_LIBRARY_FUNCTIONS and _all_const(args, kwargs):
            return ConstVar(value(*_consts(args), **_const_kwargs(kwargs)))
        if value in _OPERATORS and any(isinstance(a, TensorVar) for a in args):
            return tx.output.call("call_function", value, tuple(args), kwargs)
        what = getattr(value, "__qualname__", None) or repr(value)
        if isinstance(value, (types.FunctionType, types.MethodType)):
            unsupported(f"calling Python function {what} (inlining user functions is not "
                        "supported yet)")
        unsupported(f"calling {what}")

    def __repr__(self):
        return f"ObjectVar({self.value!r})"


class TorchFnVar(ObjectVar):
    """A torch function, Tensor method or operator: its calls become graph nodes."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        fn = self.value
        if fn in _GLOBAL_STATE_READERS:
            value = fn()
            tx.guards.global_state(fn.__name__, fn, value)
            return ConstVar(value)
        if fn in _GLOBAL_STATE_WRITERS:
            unsupported(f"torch.{fn.__name__} changes global state")
        return tx.output.call("call_function", fn, tuple(args), kwargs)


class MethodVar(Var):
    """``obj.name`` where obj is a traced value: calling it calls obj.call_method."""
    __slots__ = ("obj", "name")

    def __init__(self, obj, name):
        super().__init__(None)
        self.obj = obj
        self.name = name

    def call(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def __repr__(self):
        return f"MethodVar({self.obj!r}.{self.name})"


class NNModuleVar(Var):
    """An nn.Module reached from the frame (guarded by identity)."""
    __slots__ = ("module",)

    def __init__(self, module, source):
        super().__init__(source)
        self.module = module

    def python_type(self):
        return type(self.module)

    def getattr(self, tx, name):
        from .builder import wrap
        m = self.module
        source = AttrSource(self.source, name) if self.source is not None else None
        d = m.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            table = d.get(store)
            if table is not None and name in table:
                # Read the table directly: nn.Module.__getattr__ is slow, and guards on
                # parameters run on every call.
                if self.source is not None:
                    source = GetItemSource(AttrSource(self.source, store), name)
                return wrap(tx, table[name], source)
        if name in d:
            return wrap(tx, d[name], source)
        cls_attr = getattr(type(m), name, None)
        if isinstance(cls_attr, (types.FunctionType, property, staticmethod, classmethod)):
            unsupported(f"{type(m).__name__}.{name}: calling methods of modules (inlining) "
                        "is not supported yet")
        if cls_attr is not None and is_constant_value(cls_attr):
            return wrap(tx, cls_attr, source)
        unsupported(f"attribute {name!r} of module {type(m).__name__}")

    def call(self, tx, args, kwargs):
        unsupported(f"calling submodule {type(self.module).__name__} (inlining submodules is "
                    "not supported yet)")

    def __repr__(self):
        return f"NNModuleVar({type(self.module).__name__})"


class BuiltinVar(ObjectVar):
    """A Python builtin: evaluated at trace time on constants, or given meaning on
    traced values (len of a list, isinstance of a tensor, ...)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        fn = self.value
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is not None:
            result = handler(tx, args, kwargs)
            if result is not None:
                return result
        if fn in _FOLDABLE_BUILTINS and _all_const(args, kwargs):
            try:
                return ConstVar(fn(*_consts(args), **_const_kwargs(kwargs)))
            except Exception as e:
                unsupported(f"{fn.__name__}() raised {type(e).__name__}: {e}")
        unsupported(f"builtin {fn.__name__}() on {args}")


# ---------------------------------------------------------------- helpers

def _all_const(args, kwargs):
    return all(a.is_const() for a in args) and all(v.is_const() for v in kwargs.values())


def _consts(args):
    return [a.as_const() for a in args]


def _const_kwargs(kwargs):
    return {k: v.as_const() for k, v in kwargs.items()}


def _is_library_object(value) -> bool:
    if isinstance(value, types.ModuleType):
        name = value.__name__
    else:
        name = getattr(value, "__module__", None) or ""
    root = name.split(".")[0]
    return root in ("torch", "math", "operator", "builtins", "functools", "itertools",
                    "collections", "typing", "numbers") or (
        isinstance(value, type) and value.__module__ == "builtins")


def _python_type_of(tx, v: Var) -> type:
    return v.python_type()


def _len(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return ConstVar(args[0].length(tx))


def _isinstance(tx, args, kwargs):
    if len(args) != 2 or kwargs or not args[1].is_const() and not isinstance(args[1], ObjectVar) \
            and not isinstance(args[1], TupleVar):
        return None
    classes = args[1].as_const() if args[1].is_const() else (
        args[1].value if isinstance(args[1], ObjectVar)
        else tuple(c.value if isinstance(c, ObjectVar) else c.as_const() for c in args[1].items))
    t = _python_type_of(tx, args[0])
    if isinstance(args[0], TensorVar):
        # A FakeTensor stands for a plain tensor or a Parameter.
        probe = torch.nn.Parameter if t is torch.nn.Parameter else torch.Tensor
        return ConstVar(_class_covers(probe, classes))
    return ConstVar(_class_covers(t, classes))


def _class_covers(t, classes):
    try:
        return issubclass(t, classes)
    except TypeError:
        unsupported(f"isinstance with {classes!r}")


def _range(tx, args, kwargs):
    if _all_const(args, kwargs):
        return ConstVar(range(*_consts(args)))


def _tuple_list(kind):
    def handler(tx, args, kwargs):
        if kwargs or len(args) > 1:
            return None
        items = args[0].unpack(tx) if args else []
        return TupleVar(items) if kind is tuple else ListVar(items)
    return handler


def _dict(tx, args, kwargs):
    if args:
        return None
    return DictVar(kwargs)


def _enumerate(tx, args, kwargs):
    if len(args) in (1, 2) and not kwargs:
        start = args[1].as_const() if len(args) == 2 else 0
        return ListVar([TupleVar([ConstVar(i + start), v]) for i, v in enumerate(args[0].unpack(tx))])


def _zip(tx, args, kwargs):
    if not kwargs:
        cols = [a.unpack(tx) for a in args]
        return ListVar([TupleVar(list(row)) for row in zip(*cols)])


def _reversed(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return ListVar(list(reversed(args[0].unpack(tx))))


def _iter(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return IteratorVar(args[0].unpack(tx))


def _abs(tx, args, kwargs):
    if len(args) == 1 and isinstance(args[0], TensorVar):
        return tx.output.call("call_function", operator.abs, (args[0],), {})


def _getattr(tx, args, kwargs):
    if len(args) in (2, 3) and args[1].is_const() and not kwargs:
        try:
            return args[0].getattr(tx, args[1].as_const())
        except Exception:
            if len(args) == 3:
                return args[2]
            raise


def _type(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        from .builder import wrap
        return wrap(tx, _python_type_of(tx, args[0]), None, guard=False)


_BUILTIN_HANDLERS = {
    len: _len, isinstance: _isinstance, range: _range, tuple: _tuple_list(tuple),
    list: _tuple_list(list), dict: _dict, enumerate: _enumerate, zip: _zip,
    reversed: _reversed, iter: _iter, abs: _abs, getattr: _getattr, type: _type,
}

_FOLDABLE_BUILTINS = {abs, min, max, int, float, bool, str, round, divmod, pow, len, sum,
                      all, any, hash, repr, chr, ord, hex, oct, bin, sorted, complex}

_CONST_CLASSES = {torch.Size, torch.device, torch.finfo, torch.iinfo, slice}

_PURE_LIBRARY_FUNCTIONS = set()
for _name in ("sqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan", "tanh", "floor",
              "ceil", "pow", "isclose", "isfinite", "isinf", "isnan", "prod", "gcd", "fabs",
              "erf", "atan", "atan2", "degrees", "radians", "hypot", "comb", "factorial"):
    if hasattr(math, _name):
        _PURE_LIBRARY_FUNCTIONS.add(getattr(math, _name))
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pos", "not_",
              "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "index"):
    _PURE_LIBRARY_FUNCTIONS.add(getattr(operator, _name))

_OPERATORS = {v for k, v in vars(operator).items() if callable(v) and not k.startswith("_")
              and not isinstance(v, type)} - {operator.attrgetter, operator.itemgetter,
                                              operator.methodcaller}

_GLOBAL_STATE_READERS = {torch.is_grad_enabled, torch.get_default_dtype,
                         torch.is_inference_mode_enabled, torch.are_deterministic_algorithms_enabled}
_GLOBAL_STATE_WRITERS = {torch.manual_seed, torch.set_grad_enabled, torch.set_default_dtype,
                         torch.use_deterministic_algorithms, torch.set_printoptions,
                         torch.seed}
