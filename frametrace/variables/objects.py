"""Python objects known at trace time: modules, torch functions, builtins, bound
methods of traced values, and nn.Modules."""
from __future__ import annotations

import functools
import math
import operator
import types

import torch

from ..source import AttrSource
from .base import ValueVar, Var, unsupported
from .constant import ConstVar
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
        if isinstance(value, type):
            made = _construct(tx, value, args, kwargs)
            if made is not None:
                return made
        if value in _PURE_LIBRARY_FUNCTIONS and _all_const(args, kwargs):
            return ConstVar(value(*_consts(args), **_const_kwargs(kwargs)))
        if value in _OPERATORS and any(isinstance(a, TensorVar) for a in args):
            return tx.output.call("call_function", value, tuple(args), kwargs)
        what = getattr(value, "__qualname__", None) or repr(value)
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


class SuperVar(Var):
    """super(cls, obj): attribute lookup starts after cls in obj's MRO."""
    __slots__ = ("cls", "obj")

    def __init__(self, cls: Var, obj: Var):
        super().__init__(None)
        self.cls = cls
        self.obj = obj

    def getattr(self, tx, name):
        from .builder import wrap
        from .functions import BoundMethodVar
        cls = self.cls.as_const() if not isinstance(self.cls, ObjectVar) else self.cls.value
        mro = self.obj.python_type().__mro__
        for klass in mro[mro.index(cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return BoundMethodVar(wrap(tx, attr, None, guard=False), self.obj)
                if isinstance(attr, classmethod):
                    return BoundMethodVar(wrap(tx, attr.__func__, None, guard=False), ObjectVar(cls))
                if isinstance(attr, staticmethod):
                    return wrap(tx, attr.__func__, None, guard=False)
                if isinstance(attr, property):
                    return wrap(tx, attr.fget, None, guard=False).call(tx, [self.obj], {})
                if klass is object or getattr(klass, "__module__", "") == "builtins":
                    if name == "__init__":
                        return _NoOpVar()
                    unsupported(f"super().{name} of a builtin class")
                if isinstance(attr, (types.WrapperDescriptorType, types.MethodDescriptorType)):
                    unsupported(f"super().{name} is implemented in C")
                return wrap(tx, attr, None, guard=False)
        unsupported(f"super() has no attribute {name!r}")


class _NoOpVar(Var):
    """object.__init__ reached through super(): does nothing."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return ConstVar(None)


class GradModeVar(Var):
    """torch.no_grad() / enable_grad() / set_grad_enabled(mode) as a context manager (or
    set_grad_enabled called as a function).  The mode switch is a node of the graph, and
    applies while tracing, so FakeTensors get the right requires_grad."""
    __slots__ = ("mode", "prev")

    def __init__(self, mode: bool):
        super().__init__(None)
        self.mode = mode
        self.prev = None

    def _set(self, tx, mode):
        torch._C._set_grad_enabled(mode)
        tx.output.graph.create_node("call_function", torch._C._set_grad_enabled, (mode,))

    def enter(self, tx):
        self.prev = torch.is_grad_enabled()
        self._set(tx, self.mode)
        return ConstVar(None)

    def exit(self, tx):
        self._set(tx, self.prev)

    def call(self, tx, args, kwargs):
        # Used as a decorator: @torch.no_grad() def f(...)
        if len(args) == 1 and not kwargs:
            return _DecoratedVar(self.mode, args[0])
        unsupported("calling a grad-mode context object")


class _DecoratedVar(Var):
    """A function decorated with a grad-mode context while tracing."""
    __slots__ = ("mode", "fn")

    def __init__(self, mode, fn):
        super().__init__(None)
        self.mode = mode
        self.fn = fn

    def call(self, tx, args, kwargs):
        ctx = GradModeVar(self.mode)
        ctx.enter(tx)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            ctx.exit(tx)


class AutocastVar(Var):
    """torch.autocast(...) as a context manager: entered for real while tracing (so
    FakeTensors get autocast dtypes) and recorded as enter/exit nodes in the graph."""
    __slots__ = ("args", "kwargs", "ctx", "node")

    def __init__(self, args, kwargs):
        super().__init__(None)
        self.args = args
        self.kwargs = kwargs
        self.ctx = None
        self.node = None

    def enter(self, tx):
        from torch.amp.autocast_mode import _enter_autocast
        self.ctx = torch.autocast(*self.args, **self.kwargs)
        self.ctx.__enter__()
        self.node = tx.output.graph.create_node(
            "call_function", _enter_autocast,
            (*self.args, *[self.kwargs.get(k) for k in ("dtype", "enabled", "cache_enabled")]))
        return ConstVar(None)

    def exit(self, tx):
        from torch.amp.autocast_mode import _exit_autocast
        self.ctx.__exit__(None, None, None)
        tx.output.graph.create_node("call_function", _exit_autocast, (self.node,))


def _grad_mode_class(tx, cls, args, kwargs):
    if cls is torch.no_grad:
        return GradModeVar(False)
    if cls is torch.enable_grad:
        return GradModeVar(True)
    if cls is torch.set_grad_enabled and len(args) == 1 and args[0].is_const():
        mode = bool(args[0].as_const())
        # set_grad_enabled(mode) takes effect when called, also outside a `with`.
        var = GradModeVar(mode)
        var.prev = torch.is_grad_enabled()
        var._set(tx, mode)
        var.enter = lambda tx, var=var: ConstVar(None)
        return var
    if cls is torch.autocast and all(a.is_const() for a in args) and \
            all(v.is_const() for v in kwargs.values()):
        return AutocastVar([a.as_const() for a in args],
                           {k: v.as_const() for k, v in kwargs.items()})
    return None


def _construct(tx, cls, args, kwargs):
    """Calling a class while tracing."""
    import dataclasses
    made = _grad_mode_class(tx, cls, args, kwargs)
    if made is not None:
        return made
    if cls is functools.partial and args:
        from .functions import PartialVar
        return PartialVar(args[0], args[1:], kwargs)
    if dataclasses.is_dataclass(cls):
        from .user_objects import make_dataclass_instance
        return make_dataclass_instance(tx, cls, args, kwargs)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        from ..graph import NamedTupleVar
        names = list(cls._fields)
        values = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
        if len(values) != len(names):
            unsupported(f"{cls.__name__}() with missing fields")
        return NamedTupleVar(values, names, cls=cls)
    return None


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
