"""Python functions the tracer inlines: their bytecode runs in a child interpreter that
records into the same graph, so calls of user code cost nothing at run time."""
from __future__ import annotations

import collections
import functools
import inspect
import sys
import types
import dis
import torch

from ..source import AttrSource, CallMethodSource, ConstSource, GetItemSource
from .base import Var, call_in_grad_mode, object_var, registrar, unsupported, wrap
from .constant import ConstVar, MethodVar, is_constant_value
from .containers import DictVar, TupleVar
from .lazy import Lazy
from .optimizers import dynamo_disabled_traced, in_traced_torch_package, trace_time_call, use_grad_wrapped
from .tensor import TensorVar

_VARARGS, _VARKEYWORDS = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


class Cell:
    """A closure cell while tracing: holds a Var (or a not-yet-wrapped value), or None
    when empty.  `source` is set for cells that exist outside the trace."""
    __slots__ = ("value", "source", "written", "cell_source")

    def __init__(self, value=None, source=None):
        self.value = value
        self.source = source
        self.written = False
        self.cell_source = None     # where the cell object itself is, for aliasing guards


class CellRefVar(Var):
    """What LOAD_CLOSURE pushes: a reference to a traced cell, for MAKE_FUNCTION."""
    __slots__ = ("cell",)

    def __init__(self, cell):
        super().__init__(None)
        self.cell = cell


def bind_arguments(code, name: str, args: list, kwargs: dict, defaults: list, kwdefaults: dict):
    """Bind call arguments to a code object's parameters, like CPython does; returns
    {parameter: Var}.  Mismatches raise Unsupported (CPython then raises the real
    TypeError)."""
    nargs, nkwonly = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    positional = names[:nargs]
    kwonly = names[nargs:nargs + nkwonly]
    i = nargs + nkwonly
    varargs = names[i] if code.co_flags & _VARARGS else None
    i += bool(varargs)
    varkw = names[i] if code.co_flags & _VARKEYWORDS else None
    bound = dict(zip(positional, args))
    extra_pos = list(args[nargs:])
    if extra_pos and varargs is None:
        unsupported(f"{name}() takes {nargs} positional arguments but {len(args)} were given")
    extra_kw = {}
    keywordable = set(positional[code.co_posonlyargcount:]) | set(kwonly)
    for k, v in kwargs.items():
        if k in keywordable:
            if k in bound:
                unsupported(f"{name}() got multiple values for argument {k!r}")
            bound[k] = v
        elif varkw is not None:
            extra_kw[k] = v
        else:
            unsupported(f"{name}() got an unexpected keyword argument {k!r}")
    first_default = nargs - len(defaults)
    for idx, p in enumerate(positional):
        if p not in bound:
            if idx < first_default:
                unsupported(f"{name}() missing required argument {p!r}")
            bound[p] = defaults[idx - first_default]
    for p in kwonly:
        if p not in bound:
            if p not in kwdefaults:
                unsupported(f"{name}() missing required keyword-only argument {p!r}")
            bound[p] = kwdefaults[p]
    if varargs is not None:
        bound[varargs] = TupleVar(extra_pos)
    if varkw is not None:
        bound[varkw] = DictVar(extra_kw)
    return bound


def _real_cells(tx, fn, fn_source):
    cells = []
    for i, (name, cell) in enumerate(zip(fn.__code__.co_freevars, fn.__closure__ or ())):
        if fn_source is not None:
            # Through the function's own path: a new closure of the same code (made on
            # every call of its parent) reuses the compiled entry.
            cell_source = GetItemSource(AttrSource(fn_source, "__closure__"), i)
        else:
            # Through the function, held by the entry (its closure tuple cannot be
            # assigned): a cached entry finds the function again by name, and so the cell.
            cell_source = GetItemSource(AttrSource(ConstSource(fn, fn.__qualname__), "__closure__"), i)
        cells.append(traced_cell(tx, cell, cell_source))
    return cells


def traced_cell(tx, cell, cell_source):
    """The one Cell of the trace for a real closure cell (reached at `cell_source`):
    every closure sharing the cell sees the writes of the others.  Reached again by
    another path, the trace relies on the two paths giving the same cell: guarded."""
    known = tx.output.object_vars.get(id(cell))
    if known is not None and known[0] is cell:
        traced = known[1]
        if traced.cell_source != cell_source:
            tx.guards.same_object(cell_source, traced.cell_source)
        return traced
    source = AttrSource(cell_source, "cell_contents")
    try:
        contents = cell.cell_contents
    except ValueError:
        traced = Cell(None, source)
    else:
        traced = Cell(Lazy(contents, source), source)
    traced.cell_source = cell_source
    tx.output.object_vars[id(cell)] = (cell, traced)
    return traced


class UserFunctionVar(Var):
    """A Python function object from outside the trace (guarded by identity)."""
    __slots__ = ("fn",)

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return type(self.fn)

    def as_const(self):
        return self.fn

    def call(self, tx, args, kwargs):
        fn = self.fn
        if fn in TRACE_TIME_EVALUATED:
            return _evaluate_now(tx, fn, args, kwargs)
        rule = _CALL_RULES.get(fn)
        if rule is not None:
            made = rule(tx, args, kwargs)
            if made is not None:
                return made
        if fn is collections.namedtuple:
            return _make_namedtuple(tx, args, kwargs)
        made = trace_time_call(tx, fn, args, kwargs)
        if made is not None:
            return made         # (in a traced package, but its answer is the process's)
        step = use_grad_wrapped(fn)
        if step is not None:
            return _call_use_grad(tx, step, args, kwargs)
        traced = dynamo_disabled_traced(fn)
        if traced is not None:
            return UserFunctionVar(traced).call(tx, args, kwargs)
        grad_decorated = _grad_mode_decorator(fn)
        if grad_decorated is not None:
            mode, inner = grad_decorated
            return call_in_grad_mode(tx, mode, UserFunctionVar(inner), args, kwargs)
        anchor = self.source if self.source is not None and fn.__closure__ else \
            ConstSource(fn, fn.__qualname__)
        # The function object is fixed (by identity, or for a closure by code), but its
        # code and defaults can be assigned: guard the ones inlined here.
        fixed = anchor is not self.source
        tx.guards.function_state(anchor, fn, fixed)
        defaults = [_default(tx, d, GetItemSource(AttrSource(anchor, "__defaults__"), i), fixed)
                    for i, d in enumerate(fn.__defaults__ or ())]
        kwdefaults = {k: _default(tx, d, GetItemSource(AttrSource(anchor, "__kwdefaults__"), k), False)
                      for k, d in (fn.__kwdefaults__ or {}).items()}
        bound = bind_arguments(fn.__code__, fn.__qualname__, args, kwargs, defaults, kwdefaults)
        out = tx.inline_call(fn.__code__, fn.__globals__, bound, _real_cells(tx, fn, self.source),
                             fn.__qualname__)
        return _note_maker(out, self, args, kwargs)

    def getattr(self, tx, name):
        if name == "__get__" and "__get__" not in getattr(self.fn, "__dict__", {}):
            return MethodVar(self, name)
        try:
            value = getattr(self.fn, name)
        except AttributeError:
            unsupported(f"function {self.fn.__qualname__} has no attribute {name!r}")
        # The function is fixed by identity, its attributes are not (`f.k = 2`).
        base = self.source if self.source is not None else ConstSource(self.fn, self.fn.__qualname__)
        return wrap(tx, value, AttrSource(base, name))

    def call_method(self, tx, name, args, kwargs):
        if name == "__get__" and 1 <= len(args) <= 2 and not kwargs and \
                not (args[0].is_const() and args[0].as_const() is None):
            # `fn.__get__(obj, cls)`: the method bound to obj (a wrapper that rebinds
            # the function it wraps, as the LR schedulers' patched `optimizer.step`).
            return BoundMethodVar(self, args[0])
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        # Fixed by identity where the trace took it from (a class's dict, guarded there).
        if self.source is not None:
            return super().reconstruct(cg)
        cg.load_const(self.fn)

    def truth(self, tx):
        return True           # functions and methods have no __bool__ or __len__

    def noun(self):
        return f"function {self.fn.__qualname__}"

    def __repr__(self):
        return f"UserFunctionVar({self.fn.__qualname__})"


def _make_namedtuple(tx, args, kwargs):
    """collections.namedtuple(...) of constants, made while tracing: a pure function of
    its arguments, but for the module it names, which it reads off its caller's frame
    (here frametrace's): the frame's module is given instead.  The class is one for
    every run of the compiled code, where CPython makes one per call."""
    if not all(v.is_const() for v in (*args, *kwargs.values())):
        unsupported("collections.namedtuple of traced arguments")
    kw = {k: v.as_const() for k, v in kwargs.items()}
    kw.setdefault("module", tx.f_globals.get("__name__", "__main__"))
    try:
        cls = collections.namedtuple(*[a.as_const() for a in args], **kw)
    except (TypeError, ValueError) as e:
        unsupported(f"collections.namedtuple raised {type(e).__name__}: {e}")
    return wrap(tx, cls, None, guard=False)


def _note_maker(out, fn, args, kwargs):
    """A generator made by calling `fn` remembers the call (see InlinedGeneratorVar)."""
    if hasattr(out, "maker"):
        out.maker = (fn, list(args), dict(kwargs))
    return out


def _default(tx, value, source, in_fixed_tuple):
    if in_fixed_tuple and is_constant_value(value):
        # The defaults tuple is guarded by identity, and a tuple cannot change.
        return ConstVar(value, source)
    # A mutable default (a list), or one of a closure's defaults: guarded.
    return wrap(tx, value, source)


class NestedFunctionVar(Var):
    """A function made by MAKE_FUNCTION while tracing (a closure or lambda).
    `root_names[i]` names the cell of the frame being compiled that free variable i
    is (None for a cell made by an inlined call, or one from outside the trace): the
    transformed code makes the function again over the frame's own cells, over new
    cells holding the traced contents, or over the real cells.  `attrs` are the
    attributes set on it while tracing."""
    __slots__ = ("code", "f_globals", "defaults", "kwdefaults", "cells", "qualname", "in_root",
                 "root_names", "same_globals", "attrs", "namespace")

    def __init__(self, code, f_globals, defaults, kwdefaults, cells, qualname, in_root=False,
                 root_names=None, same_globals=None):
        super().__init__(None)
        self.code = code
        self.f_globals = f_globals
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.cells = cells
        self.qualname = qualname
        self.in_root = in_root
        self.root_names = list(root_names) if root_names is not None else \
            list(code.co_freevars) if in_root else [None] * len(cells)
        self.same_globals = in_root if same_globals is None else same_globals
        self.attrs = {}             # the special attributes set ({name: Var})
        self.namespace = None       # its __dict__ (a FunctionDictVar), once used

    def reconstruct(self, cg):
        """MAKE_FUNCTION again in the transformed code (one function object however
        often it is referred to), then the attributes set on it."""
        if cg.load_rebuilt(self):
            return
        if not self.same_globals:
            unsupported(f"function {self.qualname} made in another module's code outlives the call")
        flags = 0
        if self.defaults:
            for v in self.defaults:
                v.reconstruct(cg)
            cg.build(tuple, len(self.defaults))
            flags |= 0x01
        if self.kwdefaults:
            for k, v in self.kwdefaults.items():
                cg.load_const(k)
                v.reconstruct(cg)
            cg.build(dict, len(self.kwdefaults))
            flags |= 0x02
        if self.code.co_freevars:
            for cell, root_name in zip(self.cells, self.root_names):
                _load_cell(cg, cell, root_name)
            cg.build(tuple, len(self.code.co_freevars))
            flags |= 0x08
        cg.load_const(self.code)
        cg.make_function(flags)
        cg.keep_rebuilt(self)
        names = self.namespace.items if self.namespace is not None else {}
        if any(type(k) is not str for k in names):
            unsupported(f"a key of {self.qualname}.__dict__ that is no string")
        for name, v in (*self.attrs.items(), *names.items()):
            cg.emit("COPY", 1)
            v.reconstruct(cg)
            cg.emit("SWAP", 2)
            cg.store_attr(name)

    def function_dict(self):
        """Its __dict__: the attributes set on it that are not special (functools.wraps
        reads and updates it; `f.x = 1` writes it)."""
        if self.namespace is None:
            self.namespace = FunctionDictVar(self)
        return self.namespace

    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        bound = bind_arguments(self.code, self.qualname, args, kwargs, self.defaults,
                               self.kwdefaults)
        out = tx.inline_call(self.code, self.f_globals, bound, self.cells, self.qualname)
        return _note_maker(out, self, args, kwargs)

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if self.namespace is not None and name in self.namespace.items:
            return self.namespace.items[name]
        if name == "__dict__":
            return self.function_dict()
        if name == "__type_params__" and name in _FUNCTION_ATTRS:     # (3.12+)
            return TupleVar([])
        if name in ("__name__", "__qualname__"):
            return ConstVar(self.qualname.rsplit(".", 1)[-1] if name == "__name__" else self.qualname)
        if name == "__module__":
            return ConstVar(self.f_globals.get("__name__"))
        if name == "__code__":
            return object_var(self.code)
        if name == "__defaults__":
            return TupleVar(list(self.defaults)) if self.defaults else ConstVar(None)
        if name == "__kwdefaults__":
            return DictVar(dict(self.kwdefaults)) if self.kwdefaults else ConstVar(None)
        if name == "__annotations__":
            # made empty on first read, then that same dict
            self.attrs[name] = DictVar({})
            return self.attrs[name]
        if name == "__doc__":
            return ConstVar(_docstring(self.code))
        if name not in _FUNCTION_ATTRS:
            unsupported(f"AttributeError: 'function' object has no attribute {name!r}")
        unsupported(f"attribute {name!r} of a function made while tracing")

    def has_attr(self, name) -> bool:
        return name in self.attrs or name in _FUNCTION_ATTRS or \
            (self.namespace is not None and name in self.namespace.items)

    def setattr(self, tx, name, value):
        # A new function's __dict__ is its own; the special attributes change what
        # calls do, and are not followed.
        if name in _FUNCTION_ATTRS and name not in ("__doc__", "__module__", "__name__",
                                                    "__qualname__", "__annotations__",
                                                    "__type_params__"):
            unsupported(f"setting {name!r} of a function made while tracing")
        if name in ("__name__", "__qualname__", "__module__") and not \
                (value.is_const() and isinstance(value.as_const(), str)):
            unsupported(f"setting {name!r} of a function to {value}")
        if name == "__type_params__" and not (isinstance(value, TupleVar) or (
                value.is_const() and type(value.as_const()) is tuple)):
            unsupported(f"setting {name!r} of a function to {value}")   # (CPython: TypeError)
        if name in _FUNCTION_ATTRS:
            self.attrs[name] = value
        else:
            self.function_dict().items[name] = value

    def noun(self):
        return f"function {self.qualname}"

    def __repr__(self):
        return f"NestedFunctionVar({self.qualname})"


_FUNCTION_ATTRS = frozenset(dir(lambda: None))
# 3.14 marks a code object with a docstring (CO_HAS_DOCSTRING); before, the compiler
# makes a function's first constant its docstring or None
_CO_HAS_DOCSTRING = 0x4000000 if sys.version_info >= (3, 14) else 0


def _docstring(code):
    """The __doc__ a function made from `code` starts with (as CPython's function
    constructor sets it)."""
    if _CO_HAS_DOCSTRING and not code.co_flags & _CO_HAS_DOCSTRING:
        return None
    first = code.co_consts[0] if code.co_consts else None
    return first if isinstance(first, str) else None


class FunctionDictVar(DictVar):
    """The __dict__ of a function made while tracing: its items are the function's
    attributes that are not special; rebuilt as the function's own __dict__ (the
    function rebuilt stores them)."""
    __slots__ = ("function",)

    def __init__(self, function):
        super().__init__({})
        self.function = function

    def reconstruct(self, cg):
        self.function.reconstruct(cg)
        cg.load_attr("__dict__")


def _load_cell(cg, cell, root_name):
    """Push the real cell for a traced Cell: the frame's own, the one from outside,
    or a new one (shared by every function rebuilt over it) holding the contents."""
    if root_name is not None:
        cg.load_closure(root_name)
        return
    if cell.source is not None:
        if cell.cell_source is None:
            unsupported("a closure over a cell the trace cannot name")
        cell.cell_source.reconstruct(cg)
        return
    if cg.load_rebuilt(cell):
        return
    value = cell.value
    if value is None:
        cg.call_const(types.CellType, [])
    elif type(value) is Lazy:
        cg.call_const(types.CellType, [lambda cg: value.source.reconstruct(cg)])
    else:
        cg.call_const(types.CellType, [value.reconstruct])
    cg.keep_rebuilt(cell)


class BoundMethodVar(Var):
    """``obj.method``: a function with its first argument bound."""
    __slots__ = ("fn", "obj")

    def __init__(self, fn: Var, obj: Var, source=None):
        super().__init__(source)
        self.fn = fn
        self.obj = obj

    def python_type(self):
        return types.MethodType

    def call(self, tx, args, kwargs):
        return self.fn.call(tx, [self.obj, *args], kwargs)

    def getattr(self, tx, name):
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return self.fn
        return self.fn.getattr(tx, name)

    def reconstruct(self, cg):
        # A method bound while tracing that outlives the frame: bound again, to the
        # same function and object, as CPython binds it.
        if self.source is not None:
            return super().reconstruct(cg)
        cg.call_const(types.MethodType, [self.fn.reconstruct, self.obj.reconstruct])

    def truth(self, tx):
        return True           # functions and methods have no __bool__ or __len__

    def noun(self):
        return f"{self.fn} bound to {self.obj}"

    def __repr__(self):
        return f"BoundMethodVar({self.fn!r} of {self.obj!r})"


class PartialVar(Var):
    """functools.partial(fn, *args, **kwargs), from outside (`real`, reached at
    `source`) or made while tracing."""
    __slots__ = ("fn", "args", "kwargs", "real")

    def __init__(self, fn: Var, args: list, kwargs: dict, source=None, real=None):
        super().__init__(source)
        self.fn = fn
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.real = real if source is not None else None

    def python_type(self):
        return functools.partial

    def call(self, tx, args, kwargs):
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def getattr(self, tx, name):
        if name == "func":
            return self.fn
        if name == "args":
            return TupleVar(self.args)
        if name == "keywords":
            return DictVar(self.kwargs)
        if self.real is not None and hasattr(self.real, name):
            # Set on the object (`p.__name__ = ...`), or its class's: read through it.
            return wrap(tx, getattr(self.real, name), AttrSource(self.source, name))
        unsupported(f"attribute {name!r} of functools.partial")

    def reconstruct(self, cg):
        # Made while tracing and leaving the frame (handed to CPython at a break): made
        # again from its parts, as CPython made it.
        if self.source is not None:
            return super().reconstruct(cg)

        def keywords(c):
            for name, value in self.kwargs.items():
                c.load_const(name)
                value.reconstruct(c)
            c.build(dict, len(self.kwargs))

        def positional(c):
            for a in self.args:
                a.reconstruct(c)
            c.build(tuple, len(self.args))
        cg.call_const(_make_partial, [self.fn.reconstruct, positional, keywords])

    def noun(self):
        return f"functools.partial of {self.fn}"

    def __repr__(self):
        return f"PartialVar({self.fn!r})"


def _make_partial(fn, args, kwargs):
    return functools.partial(fn, *args, **kwargs)


# torch's pure-Python helpers over containers, which make no graph ops: traced through.
_INLINED_TORCH_MODULES = frozenset({"torch.utils._pytree"})

# Python over tensors traced through where model code calls it, but whose frames run in
# CPython when CPython calls them: weight initialisation, probability distributions.
INLINED_TORCH_PACKAGES = ("torch.nn.init", "torch.distributions")


def _call_use_grad(tx, inner, args, kwargs):
    """`_use_grad(self, ...)` (torch.optim's step wrapper): `inner` traced with grad mode
    set to `self.defaults['differentiable']` (restored after, as its `finally` does)."""
    if not args:
        unsupported("an optimizer step called without its optimizer")
    flag = args[0].getattr(tx, "defaults").getitem(tx, ConstVar("differentiable"))
    if not flag.is_const():
        unsupported("an optimizer whose `differentiable` flag is not a constant")
    return call_in_grad_mode(tx, bool(flag.as_const()), UserFunctionVar(inner), args, kwargs)


def in_inlined_torch_package(module: str) -> bool:
    """Functions and classes of torch that the tracer runs as user code, when reached."""
    if in_traced_torch_package(module):
        return True
    if module.startswith("torch.distributions") and _distributions_validate():
        # Validating its arguments, a distribution branches on their values (`if not
        # torch._is_all_true(valid): raise`), a break in every constructor and
        # log_prob: called whole in CPython, it breaks once.  (Importing torch._dynamo
        # turns validation off by default, as do most programs that compile.)
        return False
    return any(module == p or module.startswith(p + ".") for p in INLINED_TORCH_PACKAGES)


def _distributions_validate() -> bool:
    distribution = getattr(sys.modules.get("torch.distributions"), "Distribution", None)
    return getattr(distribution, "_validate_args", True) is not False


def is_inlinable(fn) -> bool:
    """Python functions whose bytecode the tracer runs: user code, and torch.nn module
    code (forward methods), but not torch's own internals, which are graph ops."""
    if not isinstance(fn, types.FunctionType):
        return False
    module = getattr(fn, "__module__", None) or ""
    if module.startswith("torch.nn.modules") or module.startswith("torch.nn.utils.parametriz"):
        return True
    if module in _INLINED_TORCH_MODULES or in_inlined_torch_package(module):
        return True
    if module == "torch" or module.startswith("torch.") or module.startswith("frametrace"):
        return False
    return True


# Introspection from the standard library, evaluated on the real objects at trace time
# (inlining `inspect` would trace pages of Python for a constant answer).
TRACE_TIME_EVALUATED = {inspect.signature, inspect.getfullargspec, inspect.isclass,
                        inspect.isfunction, inspect.ismethod, inspect.isgeneratorfunction,
                        inspect.iscoroutinefunction, inspect.unwrap, inspect.getmodule}


def _evaluate_now(tx, fn, args, kwargs):
    real = []
    for a in args:
        value = _real_value(a)
        if value is _NO_VALUE:
            unsupported(f"{fn.__qualname__}() on a value known only while tracing ({a})")
        real.append(value)
    if kwargs and not all(v.is_const() for v in kwargs.values()):
        unsupported(f"{fn.__qualname__}() with traced keyword arguments")
    return wrap(tx, fn(*real, **{k: v.as_const() for k, v in kwargs.items()}), None, guard=False)


_NO_VALUE = object()


def _real_value(v):
    if isinstance(v, UserFunctionVar):
        return v.fn
    if isinstance(v, BoundMethodVar):
        fn, obj = _real_value(v.fn), _real_value(v.obj)
        if fn is _NO_VALUE or obj is _NO_VALUE:
            return _NO_VALUE
        return types.MethodType(fn, obj)
    for attr in ("module", "value"):
        if attr in getattr(type(v), "__slots__", ()):
            return getattr(v, attr)
    if v.is_const():
        return v.as_const()
    return _NO_VALUE


# The code of torch's context decorator (torch.utils._contextlib's decorate_context).
# From torch 2.15 each decorated function gets its own copy, renamed after the context
# manager ("no_grad"...), so copies are told by where they were written, not by name.
_DECORATE_CONTEXT = torch.no_grad()(lambda: None).__code__


def _is_decorate_context(code) -> bool:
    ref = _DECORATE_CONTEXT
    return code is ref or (code.co_firstlineno == ref.co_firstlineno and code.co_filename == ref.co_filename
                           and code.co_code == ref.co_code and code.co_freevars == ref.co_freevars)


def _grad_mode_decorator(fn):
    """(mode, inner function) for a function decorated with @torch.no_grad() /
    @torch.enable_grad(), else None."""
    if not fn.__closure__ or not _is_decorate_context(fn.__code__):
        return None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__))
    try:
        factory = cells["ctx_factory"].cell_contents
        inner = cells["func"].cell_contents
    except (KeyError, ValueError):
        return None
    ctx = getattr(factory, "__self__", None)
    if type(ctx) is torch.no_grad:
        return False, inner
    if type(ctx) is torch.enable_grad:
        return True, inner
    if type(ctx) is torch.set_grad_enabled:
        return ctx.mode, inner
    return None


def module_calls():
    """nn.Module's Python functions that call a module (its __call__ and the
    implementations behind it)."""
    m = torch.nn.Module
    return {f for f in (m.__call__, getattr(m, "_wrapped_call_impl", None),
                        getattr(m, "_call_impl", None)) if isinstance(f, types.FunctionType)}


# Calls of particular Python functions that the module of a kind above this one
# answers (nn.Module.__call__ spelled out: modules; copy.deepcopy: user_objects), so
# that functions need not import them: fn -> rule(tx, args, kwargs), which answers
# None for a call it leaves to be inlined as any other.
_CALL_RULES: dict = {}


call_rule = registrar(_CALL_RULES)     # (registers a rule for calls of each of its callables)


def _immutable(value) -> bool:
    if type(value) is tuple:
        return all(map(_immutable, value))
    return is_constant_value(value)


def _pinned_arg(tx, fn, arg):
    """An object argument of a cached call (``logger.warning_once(msg)``'s logger): the
    cache keys it by its hash, so the object itself is guarded by identity and the
    guard's call names it as a constant.  Only objects the trace did not change."""
    obj = getattr(arg, "value", None)
    if arg.source is None or obj is None or isinstance(arg, TensorVar) or \
            type(obj).__hash__ is not object.__hash__ or tx.side_effects.has_attr_writes(obj):
        unsupported(f"calling {fn.__qualname__} (lru_cache) on traced arguments")
    tx.guards.identity(arg.source, obj)
    return ConstSource(obj, arg.source.name())


def _call_on_fresh_tensor(tx, fn, args):
    """A cached function called on a tensor made in this frame (with constants): the
    cache, keyed by that new object, has no entry for it, so CPython calls the function
    (inlined here).  A second call with the same key in the frame is CPython's cache
    hit: the first call's result, and the function does not run again.  The tensor must
    not outlive the frame (convert's _check_fresh_cache_keys), or a later call outside
    it would find in CPython's cache what the compiled code never put there."""
    inputs = {id(i.node.meta.get("example_value")) for i in tx.output.inputs}
    fresh = [a for a in args if isinstance(a, TensorVar) and a.source is None and
             id(a.example) not in inputs]
    if not fresh or not all(isinstance(a, (TensorVar, ConstVar)) for a in args) or \
            not isinstance(getattr(fn, "__wrapped__", None), types.FunctionType):
        return None
    typed = fn.cache_parameters().get("typed", False)
    key = [id(fn)]
    for a in args:
        if isinstance(a, TensorVar):
            key.append(("tensor", id(a.example)))
        else:
            try:
                hash(a.value)
            except TypeError:
                return None         # (CPython raises TypeError)
            key.append(("const", a.value, type(a.value)) if typed else ("const", a.value))
    key = tuple(key)
    known = tx.output.cache_results.get(key)
    if known is not None:
        return known
    result = UserFunctionVar(fn.__wrapped__).call(tx, list(args), {})
    tx.output.cache_results[key] = result
    tx.output.fresh_cache_keys.update(id(a.example) for a in fresh)
    return result


def cached_call(tx, fn_var, args, kwargs):
    """A call of a functools.lru_cache-wrapped function on constants (a version check):
    the real call, whose answer is the cached one from the second call on.  The guard
    calls it again (a cache hit, unless someone cleared the cache), so a changed answer
    recompiles.  Only immutable constant answers: a cached list is one object shared
    by every caller, which a Var could not follow."""
    fn = fn_var.value
    if kwargs:
        unsupported(f"calling {fn.__qualname__} (lru_cache) with keyword arguments")
    fresh = _call_on_fresh_tensor(tx, fn, args)
    if fresh is not None:
        return fresh
    consts = [a.as_const() if a.is_const() else _pinned_arg(tx, fn, a) for a in args]
    if not CallMethodSource.supports(consts):
        unsupported(f"calling {fn.__qualname__} (lru_cache) on arguments a guard cannot name")
    try:
        result = fn(*[c.obj if isinstance(c, ConstSource) else c for c in consts])
    except Exception as e:
        unsupported(f"{fn.__qualname__}() raised {type(e).__name__}")
    if not _immutable(result):
        unsupported(f"{fn.__qualname__} (lru_cache) returned a {type(result).__name__}")
    base = fn_var.source if fn_var.source is not None else ConstSource(fn, fn.__qualname__)
    return wrap(tx, result, CallMethodSource(base, "__call__", consts))


# Opcodes by which a function's own code changes state outside its frame.
_OUTSIDE_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR", "DELETE_ATTR"})
_CELL_STORES = frozenset({"STORE_DEREF", "DELETE_DEREF"})


def visible_outside_writes(fn) -> str | None:
    """What the code of `fn` (of functions defined in it, and of the functions of its
    module it names, transitively) writes outside its own frame, by its own
    instructions: a global, a `nonlocal` of an enclosing function, an attribute of
    anything (an object's, a module's; a tensor's cannot be told apart).  None when
    there is none, or when `fn` is not a Python function.  Writes made by functions of
    other modules, and by methods, are not seen."""
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or not isinstance(code, types.CodeType):
        return None
    g = fn.__globals__

    def scan(c, free):
        # `free`: the names of c's cells that are cells of its caller's (a nonlocal)
        for inst in dis.get_instructions(c):
            if inst.opname in _OUTSIDE_STORES:
                what = "global" if "GLOBAL" in inst.opname else "attribute"
                return f"writes the {what} {inst.argval!r}"
            if inst.opname in _CELL_STORES and inst.argval in free:
                return f"writes the nonlocal {inst.argval!r}"
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                found = scan(const, set(const.co_freevars) & free)
                if found:
                    return found
        return None

    seen = set()
    todo = [(code, set(code.co_freevars))]
    while todo and len(seen) < 64:
        c, free = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        found = scan(c, free)
        if found:
            return found if c is code else f"calls {c.co_name}(), which {found}"
        for name in c.co_names:
            v = g.get(name)
            if isinstance(v, types.FunctionType) and v.__globals__ is g:
                todo.append((v.__code__, set(v.__code__.co_freevars)))
    return None


_EMPTY = object()


class OutsideState:
    """The globals a function's code can reach by name (its own, and those of the
    functions of its module it names, transitively), the contents of its closure
    cells, and the contents of the lists, dicts, sets and deques these hold, as they
    were: `undo()` puts back what a call changed and says whether it changed anything.
    For a run the trace makes of user code that CPython will make again
    (allow_in_graph's run on FakeTensors): a write it made through a helper, or
    `LOG.append(...)`, must not happen twice.  Only names the code can reach are
    compared (another thread's writes to the rest of the module are not undone);
    deeper state (an object's attributes) is not compared."""
    __slots__ = ("globals", "before", "cells", "containers")

    def __init__(self, fn):
        g = getattr(fn, "__globals__", None)
        self.globals = g if isinstance(g, dict) else None
        names = _reachable_names(fn, self.globals) if self.globals is not None else ()
        self.before = {n: self.globals.get(n, _EMPTY) for n in names}
        self.cells = [(c, _cell_value(c)) for c in (getattr(fn, "__closure__", None) or ())]
        self.containers = {id(v): (v, _contents(v))
                           for v in (*self.before.values(), *(v for _, v in self.cells))
                           if type(v) in _CONTAINERS}

    def undo(self) -> bool:
        changed = False
        g = self.globals
        for name, value in self.before.items():
            if g.get(name, _EMPTY) is not value:
                if value is _EMPTY:
                    del g[name]
                else:
                    g[name] = value
                changed = True
        for cell, value in self.cells:
            if _cell_value(cell) is not value:
                if value is _EMPTY:
                    del cell.cell_contents
                else:
                    cell.cell_contents = value
                changed = True
        for obj, (raw, key) in self.containers.values():
            if _contents(obj)[1] != key:
                obj.clear()
                if isinstance(obj, dict):
                    obj.update(raw)
                elif isinstance(obj, set):
                    obj.update(raw)
                else:
                    obj.extend(raw)
                changed = True
        return changed


_CONTAINERS = (list, dict, set, collections.deque)


def _reachable_names(fn, g, limit=64) -> set:
    """The global names the code of `fn` uses, with those of the functions of the same
    module it names (and of the code objects nested in any of them)."""
    names, seen, todo = set(), set(), [fn.__code__] if isinstance(fn, types.FunctionType) else []
    while todo and len(seen) < limit:
        code = todo.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        for name in code.co_names:
            names.add(name)
            v = g.get(name)
            if isinstance(v, types.FunctionType) and v.__globals__ is g:
                todo.append(v.__code__)
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _contents(obj):
    """(a copy of `obj`'s contents, what identifies them): items compared by identity,
    never by their own == (a tensor's is elementwise)."""
    if isinstance(obj, dict):
        items = list(obj.items())
        return dict(items), tuple((id(k), id(v)) for k, v in items)
    if isinstance(obj, set):
        return set(obj), frozenset(map(id, obj))
    items = list(obj)
    return items, tuple(map(id, items))


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def make_function(tx, code, defaults, kwdefaults, cells, annotations=None) -> NestedFunctionVar:
    """The function MAKE_FUNCTION (and 3.13's SET_FUNCTION_ATTRIBUTE) makes of `code` in
    the frame `tx`; `annotations` a DictVar or 3.11/3.12's (name, value, ...) tuple."""
    root_cells = tx.root.cells
    root_names = [n if root_cells.get(n) is c else None for n, c in zip(code.co_freevars, cells)]
    fn = NestedFunctionVar(code, tx.f_globals, list(defaults), kwdefaults, cells,
                           code.co_qualname, in_root=tx.parent is None,
                           root_names=root_names,
                           same_globals=tx.f_globals is tx.root.f_globals)
    if isinstance(annotations, DictVar):
        fn.attrs["__annotations__"] = annotations
    elif annotations is not None:
        # (name, value, name, value ...): its __annotations__, set again on the
        # function the transformed code makes
        fn.attrs["__annotations__"] = DictVar({annotations[i].as_const(): annotations[i + 1]
                                               for i in range(0, len(annotations), 2)})
    return fn


def cell_full(cell) -> bool:
    """Whether a real closure cell holds a value."""
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
