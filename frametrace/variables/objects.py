"""Python objects known at trace time: modules, torch functions, builtins, bound
methods of traced values, and nn.Modules."""
from __future__ import annotations

import functools
import math
import sys
import operator
import types

import torch

from ..source import AttrSource, GetItemSource
from .base import ValueVar, Var, unsupported
from .contexts import GradModeSetVar, NullContextVar, grad_mode_class
from .constant import ConstVar, is_pure_method
from .containers import ListVar, SizeVar
from .tensor import TensorVar


class ObjectVar(ValueVar):
    """An object used as-is while tracing (guarded by identity when it has a source)."""
    __slots__ = ()

    # Read-only methods of plain objects (mapping proxies, os.environ, OrderedDicts from
    # outside), answered on the real object.
    def call_method(self, tx, name, args, kwargs):
        if name in _PURE_READERS and not isinstance(self.value, (type, types.ModuleType)) and \
                _all_const(args, kwargs):
            from .builder import wrap
            method = getattr(self.value, name, None)
            if method is not None:
                result = method(*_consts(args))
                source = None
                if name in ("get", "__getitem__") and args and self.source is not None and \
                        isinstance(args[0].as_const(), (str, int)):
                    source = GetItemSource(self.source, args[0].as_const())
                if isinstance(result, (type({}.keys()), type({}.values()), type({}.items()))):
                    result = list(result)
                return wrap(tx, result, source, guard=False) if source is None or \
                    not isinstance(result, torch.Tensor) else wrap(tx, result, source)
        return super().call_method(tx, name, args, kwargs)

    def unpack(self, tx):
        from .builder import wrap
        try:
            items = list(self.value)
        except TypeError:
            unsupported(f"iterating over {type(self.value).__name__}")
        if any(isinstance(i, torch.Tensor) for i in items):
            unsupported(f"iterating over {type(self.value).__name__} holding tensors")
        return [wrap(tx, i, None, guard=False) for i in items]

    def length(self, tx):
        try:
            return len(self.value)
        except TypeError:
            unsupported(f"len() of {type(self.value).__name__}")

    def is_const(self):
        # Classes, functions and modules: fixed objects, usable as constants.
        return isinstance(self.value, (type, types.FunctionType, types.ModuleType,
                                       types.BuiltinFunctionType))

    def as_const(self):
        return self.value

    def getattr(self, tx, name):
        from .builder import wrap
        if name in _PURE_READERS and not isinstance(self.value, (type, types.ModuleType)) and \
                callable(getattr(self.value, name, None)):
            return MethodVar(self, name)
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            unsupported(f"{self.value!r} has no attribute {name!r}")
        source = AttrSource(self.source, name) if self.source is not None else None
        # Attributes of torch and the standard library are taken as constants.
        return wrap(tx, attr, source, guard=not _is_library_object(self.value))

    def call(self, tx, args, kwargs):
        value = self.value
        if value is torch.Size and len(args) == 1 and not kwargs:
            return SizeVar(args[0].unpack(tx))       # symbolic sizes stay symbolic
        if isinstance(value, type) and value in _CONST_CLASSES and _all_const(args, kwargs):
            return ConstVar(value(*_consts(args), **_const_kwargs(kwargs)))
        if isinstance(value, type):
            made = _construct(tx, value, args, kwargs)
            if made is not None:
                return made
        if value in TRACE_TIME_ANSWERS:
            return ConstVar(TRACE_TIME_ANSWERS[value])
        if value in _GLOBAL_STATE_READERS and not args and not kwargs:
            return _read_global_state(tx, value)
        if value in _PURE_LIBRARY_FUNCTIONS and _all_const(args, kwargs):
            return ConstVar(value(*_consts(args), **_const_kwargs(kwargs)))
        if isinstance(value, types.MethodDescriptorType) and args and _all_const(args, kwargs) \
                and is_pure_method(value.__objclass__, value.__name__) \
                and type(args[0].as_const()) is value.__objclass__:
            return fold_call(value, args, kwargs, value.__qualname__)     # str.upper(s)
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
        if fn in TRACE_TIME_ANSWERS:
            return ConstVar(TRACE_TIME_ANSWERS[fn])
        if fn is torch._C._set_grad_enabled:
            return GradModeSetVar().call(tx, args, kwargs)
        if fn in _GLOBAL_STATE_READERS:
            return _read_global_state(tx, fn)
        if fn in _GLOBAL_STATE_WRITERS:
            unsupported(f"torch.{fn.__name__} changes global state")
        if not args and not kwargs and _is_state_reader(fn) and _is_flag(fn()):
            return _read_global_state(tx, fn)       # torch.autograd._profiler_enabled()
        if _is_state_writer(fn):
            unsupported(f"torch.{fn.__name__} changes global state")
        out = tx.output.call("call_function", fn, tuple(args), kwargs)
        if not args and not kwargs and isinstance(out, (ConstVar, ListVar)):
            # Computed from nothing but torch's global state, which nothing guards.
            unsupported(f"torch.{getattr(fn, '__name__', fn)}() returned a constant")
        return out


def _read_global_state(tx, fn):
    value = fn()
    if fn is not torch.is_grad_enabled:
        # Grad mode is guarded at frame entry, and changes inside the frame are traced;
        # the others can only change outside it.
        tx.guards.global_state(fn.__name__, fn, value)
    return ConstVar(value)


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
        # super(C, obj) searches type(obj)'s MRO; super(C, klass) in a classmethod,
        # klass's own (and binds classmethods to it).
        start = self.obj.value if isinstance(self.obj, ObjectVar) and isinstance(self.obj.value, type) \
            and isinstance(cls, type) and issubclass(self.obj.value, cls) else self.obj.python_type()
        mro = start.__mro__
        if cls not in mro:
            unsupported(f"super({cls!r}, {self.obj}): not an instance or subtype")
        for klass in mro[mro.index(cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return BoundMethodVar(wrap(tx, attr, None, guard=False), self.obj)
                if isinstance(attr, classmethod):
                    return BoundMethodVar(wrap(tx, attr.__func__, None, guard=False), ObjectVar(start))
                if isinstance(attr, staticmethod):
                    return wrap(tx, attr.__func__, None, guard=False)
                if isinstance(attr, property):
                    return wrap(tx, attr.fget, None, guard=False).call(tx, [self.obj], {})
                if klass is object or getattr(klass, "__module__", "") == "builtins":
                    if name == "__init__":
                        return _NoOpVar()
                    if name in _PURE_READERS and hasattr(self.obj, "value"):
                        return _RealMethodVar(attr, self.obj.value)
                    unsupported(f"super().{name} of a builtin class")
                if isinstance(attr, (types.WrapperDescriptorType, types.MethodDescriptorType)):
                    unsupported(f"super().{name} is implemented in C")
                return wrap(tx, attr, None, guard=False)
        unsupported(f"super() has no attribute {name!r}")


_PURE_READERS = {"get", "__getitem__", "__contains__", "__len__", "keys", "values", "items",
                 "count", "index"}


class _RealMethodVar(Var):
    """A read-only method of a builtin type, called on the real object at trace time
    (e.g. dict.get on a registry that is a dict subclass)."""
    __slots__ = ("method", "obj")

    def __init__(self, method, obj):
        super().__init__(None)
        self.method = method
        self.obj = obj

    def call(self, tx, args, kwargs):
        from .builder import wrap
        if not _all_const(args, kwargs):
            unsupported(f"{self.method.__qualname__} with traced arguments")
        return wrap(tx, self.method(self.obj, *_consts(args), **_const_kwargs(kwargs)), None,
                    guard=False)


class ContextVarVar(ValueVar):
    """A contextvars.ContextVar: set/get/reset while tracing act on a traced value, which
    must be reset before the frame returns (no lasting side effect)."""
    __slots__ = ()

    def call_method(self, tx, name, args, kwargs):
        state = tx.output.context_vars
        cv = self.value
        if name == "set" and len(args) == 1:
            token = _TokenVar(cv, state.get(id(cv)))
            state[id(cv)] = args[0]
            return token
        if name == "get":
            if id(cv) in state and state[id(cv)] is not None:
                return state[id(cv)]
            from .builder import wrap
            try:
                return wrap(tx, cv.get(*_consts(args)), None, guard=False)
            except LookupError:
                unsupported(f"ContextVar {cv.name} has no value")
        if name == "reset" and len(args) == 1 and isinstance(args[0], _TokenVar):
            state[id(cv)] = args[0].previous
            if args[0].previous is None:
                state.pop(id(cv), None)
            return ConstVar(None)
        unsupported(f"ContextVar.{name}")


class _TokenVar(Var):
    __slots__ = ("cv", "previous")

    def __init__(self, cv, previous):
        super().__init__(None)
        self.cv = cv
        self.previous = previous


class _NoOpVar(Var):
    """object.__init__ reached through super(): does nothing."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return ConstVar(None)


def _construct(tx, cls, args, kwargs):
    """Calling a class while tracing."""
    import contextlib
    import dataclasses
    if cls is contextlib.nullcontext and len(args) <= 1 and not kwargs:
        return NullContextVar(args[0] if args else ConstVar(None))
    made = grad_mode_class(tx, cls, args, kwargs)
    if made is not None:
        return made
    if cls is functools.partial and args:
        from .functions import PartialVar
        return PartialVar(args[0], args[1:], kwargs)
    if dataclasses.is_dataclass(cls):
        from .user_objects import make_dataclass_instance
        return make_dataclass_instance(tx, cls, args, kwargs)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        from .containers import NamedTupleVar
        names = list(cls._fields)
        values = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
        if len(values) != len(names):
            unsupported(f"{cls.__name__}() with missing fields")
        return NamedTupleVar(values, names, cls=cls)
    module = getattr(cls, "__module__", "") or ""
    if not module.startswith(("torch", "builtins")) and module.split(".")[0] not in sys.stdlib_module_names \
            and not issubclass(cls, torch.nn.Module):
        from .user_objects import construct_user_object
        return construct_user_object(tx, cls, args, kwargs)
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

    def reconstruct(self, cg):
        self.obj.reconstruct(cg)
        cg.load_attr(self.name)

    def __repr__(self):
        return f"MethodVar({self.obj!r}.{self.name})"


# ---------------------------------------------------------------- helpers

def _all_const(args, kwargs):
    return all(a.is_const() for a in args) and all(v.is_const() for v in kwargs.values())


def _consts(args):
    return [a.as_const() for a in args]


def _const_kwargs(kwargs):
    return {k: v.as_const() for k, v in kwargs.items()}


def fold_call(fn, args, kwargs, name: str) -> ConstVar:
    """``fn(*args, **kwargs)`` evaluated now, on constant Vars; an exception it raises
    stops the trace with its message (CPython would raise it at this call)."""
    try:
        return ConstVar(fn(*_consts(args), **_const_kwargs(kwargs)))
    except Exception as e:
        unsupported(f"{name}() raised {type(e).__name__}: {e}")


def _is_library_object(value) -> bool:
    if isinstance(value, (types.CodeType, types.MappingProxyType)):
        return True     # immutable: nothing to guard below them
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

# What libraries ask to choose their compile-friendly paths: while frametrace traces,
# the program is being compiled (as under torch.compile), and not scripted or traced.
TRACE_TIME_ANSWERS = {
    torch.compiler.is_compiling: True,
    torch.compiler.is_dynamo_compiling: True,
    torch.compiler.is_exporting: False,
    torch.jit.is_scripting: False,
    torch.jit.is_tracing: False,
    torch._C._get_tracing_state: None,
}

_GLOBAL_STATE_READERS = {torch.is_grad_enabled, torch.get_default_dtype,
                         torch.is_inference_mode_enabled, torch.are_deterministic_algorithms_enabled,
                         torch.backends.mha.get_fastpath_enabled}
def _is_state_reader(fn) -> bool:
    """A torch function of no arguments that reads a flag (is_*, get_*, *_enabled):
    evaluated again by the guard."""
    name = getattr(fn, "__name__", "").lstrip("_")
    return name.startswith(("is_", "get_", "are_")) or name.endswith("_enabled")


def _is_flag(value) -> bool:
    """Values the global-state guard can compare with `is`."""
    return value is None or type(value) is bool or isinstance(value, torch.dtype)


def _is_state_writer(fn) -> bool:
    """torch.set_num_threads, torch._C._set_cudnn_enabled ...: run at trace time, they
    would change the state once and never again."""
    return getattr(fn, "__name__", "").lstrip("_").startswith("set_")


_GLOBAL_STATE_WRITERS = {torch.manual_seed, torch.set_grad_enabled, torch.set_default_dtype,
                         torch.use_deterministic_algorithms, torch.set_printoptions,
                         torch.seed}
