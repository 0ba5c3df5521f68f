"""Turning the frame hook on and off around user code: `optimize`, `disable`, `reset`."""
from __future__ import annotations

import functools
import inspect
import types

import torch

from . import _C, convert
from .backends import _BACKENDS, lookup_backend


def optimize(backend="eager", *, fullgraph: bool = False, dynamic=None):
    """Compile a function or nn.Module as it runs.

    Use bare, with arguments, or called on a target::

        @frametrace.optimize
        def f(x, y):
            return (x.sin() + y).relu() * 2

        @frametrace.optimize("aot_eager", fullgraph=True)
        def g(x): ...

        model = frametrace.optimize(model)           # nn.Module: returns a wrapper module
        h = frametrace.optimize(backend=my_backend)(h)

    `backend` is a registered name (see `list_backends()`) or a torch.compile-style
    callable ``backend(gm, example_inputs) -> callable``; pass callables by keyword, or
    register them, so they are not taken for the function to compile.  With
    ``fullgraph=True`` anything that cannot be traced raises `frametrace.Unsupported`
    instead of running in CPython.  `dynamic`: None (default) compiles static
    sizes first and makes the sizes that change symbolic on the next compile; True
    makes every input size symbolic from the first compile; False keeps sizes static
    (each new shape compiles a new entry).  See `mark_dynamic` and `mark_static`.
    """
    if _is_target(backend):
        return optimize()(backend)
    if dynamic not in (None, False, True):
        raise ValueError("dynamic must be None, True or False")
    callback = convert.make_callback(lookup_backend(backend), fullgraph, dynamic)

    def wrap(target):
        if isinstance(target, OptimizedModule):
            target = target._orig_mod
        if isinstance(target, torch.nn.Module):
            return OptimizedModule(target, callback)
        if not callable(target):
            raise TypeError(f"frametrace.optimize expects a function or nn.Module, not {target!r}")
        hooked = _C.Hooked(target, callback)
        try:
            functools.update_wrapper(hooked, target)
        except (AttributeError, TypeError):
            pass
        return hooked

    return wrap


def _is_target(obj) -> bool:
    """Whether a positional argument to optimize() is the thing to compile rather than
    a backend: nn.Modules and plain functions are targets; registered backends,
    callable objects and functions shaped like ``backend(gm, example_inputs)`` are not."""
    if isinstance(obj, str) or obj is None:
        return False
    if isinstance(obj, torch.nn.Module):
        return True
    if getattr(obj, "__frametrace_backend__", False) or obj in _BACKENDS.values():
        return False
    if isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)):
        try:
            params = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return True
        return not (params[:1] and params[0] in ("gm", "graph_module", "fx_graph", "fx_g"))
    return False


def disable(fn=None):
    """Run `fn` (and everything it calls) in CPython, never traced::

        @frametrace.disable
        def log_stats(x): ...
    """
    if fn is None:
        return disable
    if isinstance(fn, torch.nn.Module):
        fn.forward = disable(fn.forward)
        return fn
    unhooked = _C.Unhooked(fn)
    try:
        functools.update_wrapper(unhooked, fn)
    except (AttributeError, TypeError):
        pass
    return unhooked


def reset():
    """Drop every compiled entry: the next calls trace and compile again."""
    convert.reset()


_DELEGATED = ("state_dict", "load_state_dict", "parameters", "named_parameters", "buffers",
              "named_buffers", "children", "named_children", "modules", "named_modules",
              "zero_grad", "extra_repr", "get_submodule", "get_parameter", "get_buffer",
              "register_forward_hook", "register_forward_pre_hook", "register_buffer",
              "register_parameter", "register_module", "add_module", "requires_grad_")


class OptimizedModule(torch.nn.Module):
    """What `optimize(module)` returns: calls run the module under the frame hook;
    attributes, parameters and `state_dict` are the original module's (no prefix)."""

    def __init__(self, mod: torch.nn.Module, callback):
        super().__init__()
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_call", _C.Hooked(mod, callback))
        forward = getattr(type(mod).forward, "__code__", None)
        if forward is not None:
            convert.force_trace(forward)
        object.__setattr__(self, "_callback", callback)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return _C.Hooked(self._orig_mod.forward, self._callback)(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.__dict__["_orig_mod"], name)

    def __setattr__(self, name, value):
        if name == "training":
            object.__setattr__(self, name, value)       # the property below
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        delattr(self._orig_mod, name)

    # The wrapper has no mode of its own: `m.eval()` on the original shows through it.
    @property
    def training(self):
        return self._orig_mod.training

    @training.setter
    def training(self, mode):
        orig = self.__dict__.get("_orig_mod")
        if orig is not None:        # nn.Module.__init__ sets it before _orig_mod exists
            orig.training = mode

    def train(self, mode: bool = True):
        self._orig_mod.train(mode)
        return self

    def _apply(self, fn, *args, **kwargs):
        self._orig_mod._apply(fn, *args, **kwargs)
        return self

    def __dir__(self):
        return sorted(set(dir(self._orig_mod)) | set(super().__dir__()))

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"


def _delegate(name):
    def method(self, *args, **kwargs):
        return getattr(self._orig_mod, name)(*args, **kwargs)
    method.__name__ = name
    method.__doc__ = getattr(torch.nn.Module, name).__doc__
    return method


for _name in _DELEGATED:
    setattr(OptimizedModule, _name, _delegate(_name))
