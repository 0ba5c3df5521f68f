"""Turning the frame hook on and off around user code: `optimize`, `disable`, `reset`."""
from __future__ import annotations

import functools
import inspect
import types

import torch

from . import _C, convert, distributed, interop
from .backends import _BACKENDS, lookup_backend


def optimize(model=None, *, fullgraph: bool = False, dynamic=None, backend="default", mode=None,
             options=None, disable: bool = False):
    """Compile a function or nn.Module as it runs, with torch.compile's call shapes::

        @frametrace.optimize
        def f(x, y):
            return (x.sin() + y).relu() * 2

        model = frametrace.optimize(model, backend="aot_eager")   # returns a wrapper module
        g = frametrace.optimize(g, backend="triton", mode="reduce-overhead")

        @frametrace.optimize("aot_eager", fullgraph=True)         # backend first, as before
        def h(x): ...

    `backend` is a registered name (see `list_backends()`) or a torch.compile-style
    callable ``backend(gm, example_inputs) -> callable``; passed first instead of the
    target, a name or a callable shaped so (``(gm, example_inputs)``, or registered) is
    the backend.  With ``fullgraph=True`` anything that cannot be traced raises
    `frametrace.Unsupported` instead of running in CPython.  `dynamic`: None (default)
    compiles static sizes first and makes the sizes that change symbolic on the next
    compile; True makes every input size symbolic from the first compile; False keeps
    sizes static (each new shape compiles a new entry).  See `mark_dynamic`.

    The "default" backend chooses per graph: the "triton" backend's kernels for graphs
    on CUDA tensors, the "eager" backend for the others (frametrace/backends/default.py).

    `mode` ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    and `options` (a dict of settings) tune the backend: for "triton", and the default's
    CUDA graphs (a log line for its other graphs), they are settings
    of `frametrace.backends.triton.config` (`config.MODES` lists what each mode sets;
    unknown options raise ValueError); "inductor" takes them as torch.compile gives them
    to Inductor; any other backend gets them as ``mode=``/``options=`` keywords, as
    torch.compile passes them, and one that takes no such keyword is refused here.
    ``disable=True`` returns the target unchanged.
    """
    if model is not None and not _is_target(model):
        if backend != "default":
            raise TypeError(f"optimize() got two backends: {model!r} and backend={backend!r}")
        model, backend = None, model
    if dynamic not in (None, False, True):
        raise ValueError("dynamic must be None, True or False")
    if disable:
        return model if model is not None else (lambda target: target)
    callback = convert.make_callback(_configured(backend, mode, options), fullgraph, dynamic)
    settings = dict(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options)

    def wrap(target):
        if isinstance(target, OptimizedModule):
            target = target._orig_mod
        if isinstance(target, torch.nn.Module):
            return OptimizedModule(target, callback, settings)
        if not callable(target):
            raise TypeError(f"frametrace.optimize expects a function or nn.Module, not {target!r}")
        hooked = _C.Hooked(target, callback)
        try:
            functools.update_wrapper(hooked, target)
        except (AttributeError, TypeError):
            pass
        return interop.mark_ours(hooked)

    return wrap(model) if model is not None else wrap


MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_configured_backends: dict = {}


def _configured(backend, mode, options):
    """The backend to compile with, `mode` and `options` applied (the same object for
    the same settings, so optimize() calls with equal settings share compiled code)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if mode not in (None, "default") and options:
        raise ValueError("give mode= or options=, not both (as torch.compile)")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict, not {type(options).__name__}")
    fn = lookup_backend(backend)
    if mode in (None, "default") and not options:
        return fn
    key = (id(fn), mode, repr(sorted((options or {}).items(), key=lambda kv: kv[0])))
    known = _configured_backends.get(key)
    if known is not None:
        return known[1]
    configure = getattr(fn, "__frametrace_configure__", None)
    if configure is not None:
        configured_fn = configure(mode, options)
    else:
        _check_takes(fn, backend, "mode" if mode not in (None, "default") else "options")
        kwargs = {"mode": mode} if mode not in (None, "default") else {"options": dict(options)}
        configured_fn = functools.partial(fn, **kwargs)
    _configured_backends[key] = (fn, configured_fn)
    return configured_fn


def _check_takes(fn, backend, keyword):
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if keyword not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        name = backend if isinstance(backend, str) else getattr(fn, "__name__", repr(fn))
        raise ValueError(f"backend {name!r} takes no {keyword}= (mode= and options= tune the "
                         f"'triton' and 'inductor' backends, or a backend that accepts them)")


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
    if isinstance(fn, OptimizedModule):
        disable(fn._orig_mod)   # (its own forward calls the original's: that one is disabled)
        return fn
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

    # Where the module is, for a trace that meets this wrapper (variables/builder.py,
    # which does not import this class): its own class's attribute, so a subclass is
    # not taken for one.
    __frametrace_wraps__ = "_orig_mod"

    def __init__(self, mod: torch.nn.Module, callback, settings=None):
        super().__init__()
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_call", interop.mark_ours(_C.Hooked(mod, callback)))
        object.__setattr__(self, "_settings", dict(settings or {}))
        object.__setattr__(self, "_forward_codes", _forward_codes(mod))
        object.__setattr__(self, "_forced_for", None)
        object.__setattr__(self, "_callback", callback)
        self._force_forward()

    def _force_forward(self):
        """The module's forward is traced even from a skipped file (torch.nn's own
        modules); reset() forgets that, and the next call says it again."""
        if self.__dict__["_forced_for"] != convert.generation():
            for code in self.__dict__["_forward_codes"]:
                convert.force_trace(code)
            object.__setattr__(self, "_forced_for", convert.generation())

    def __call__(self, *args, **kwargs):
        self._force_forward()
        return self._call(*args, **kwargs)

    def forward(self, *args, **kwargs):
        self._force_forward()
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

    # copy.deepcopy (an EMA copy) and pickle (torch.save(model)) give an optimized
    # module of the copied module, with the same settings, as torch.compile's does;
    # compiled code is not copied: the copy compiles on its first call.
    def __reduce__(self):
        return (_reoptimize, (self._orig_mod, self._settings))


def _forward_codes(mod) -> list:
    """The forwards traced under `mod` even where their files are skipped (torch.nn's own
    modules): the module's own, or for a DistributedDataParallel wrapper, whose forward
    runs in CPython (the reducer's bookkeeping), the wrapped module's; and the forwards
    of FSDP2 modules under it, called by CPython after their hooks."""
    codes = []
    inner = mod.module if distributed.is_ddp(mod) else mod
    if not isinstance(inner, OptimizedModule):
        codes.append(getattr(type(inner).forward, "__code__", None))
    codes += [getattr(type(m).forward, "__code__", None) for m in inner.modules()
              if m is not inner and distributed.is_fsdp_managed(m)]
    return [c for c in dict.fromkeys(codes) if c is not None]


def _reoptimize(mod, settings):
    return optimize(mod, **settings)


def _delegate(name):
    def method(self, *args, **kwargs):
        return getattr(self._orig_mod, name)(*args, **kwargs)
    method.__name__ = name
    method.__doc__ = getattr(torch.nn.Module, name).__doc__
    return method


for _name in _DELEGATED:
    setattr(OptimizedModule, _name, _delegate(_name))
