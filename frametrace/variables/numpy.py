"""NumPy traced into the graph: an ndarray is a tensor in the graph, and NumPy's API
runs on it through torch's NumPy-compatible layer (`torch._numpy`).

Each NumPy call becomes one graph node whose target (`NumpyCall`) turns its tensor
arguments into `torch._numpy` arrays, calls the `torch._numpy` twin of the function,
method or operator, and returns tensors again; the FakeTensors give the result's dtype
and shape at trace time.  Values the user sees (returned, or live at a graph break) are
real `numpy.ndarray`s (or NumPy scalars) again, sharing memory with the graph's tensor.
Array arguments are graph inputs through `torch.as_tensor` (memory shared, so in-place
writes reach the caller), guarded on type, writeability and the tensor facts.

Where `torch._numpy` is known to differ from NumPy (the random stream, views it copies,
results it aliases, integer powers and divisions NumPy raises or warns on, 0-d results
whose scalar-ness is unknown) the trace stops instead: a graph break, never another
answer.
"""
from __future__ import annotations

import functools
import operator

import torch
import warnings
from .objects import _read_global_state, torch_call_rule
from .symbolic import SliceVar
from ..shapes import _is_argument

try:
    import numpy as np
except ImportError:         # NumPy is optional: without it there is nothing to trace
    np = None

from .base import ValueVar, Var, binary_op, unsupported
from .constant import INPLACE_TO_PLAIN, ConstVar, MethodVar, is_constant_value
from .containers import DictVar, ListVar, TupleVar
from .symbolic import SymNodeVar
from .tensor import TensorVar, tensor_method
from ..source import ConstSource, Source
from .fx_values import to_fake


def _tnp():
    """torch._numpy, with NumPy's default dtypes set first: left unset, it reads them
    from torch._dynamo's config (an import we must not make)."""
    import torch._numpy as tnp  # (lazy: start-up time)
    from torch._numpy import _dtypes_impl  # (lazy: start-up time)
    if _dtypes_impl._default_dtypes is None:
        _dtypes_impl._default_dtypes = _dtypes_impl.DefaultDTypes(
            float_dtype=torch.float64, complex_dtype=torch.complex128, int_dtype=torch.int64)
    return tnp


# ------------------------------------------------------------------ the graph target
def _to_tnp(v):
    tnp = _tnp()
    if isinstance(v, torch.Tensor):
        return tnp.ndarray(v)
    if isinstance(v, (tuple, list)):
        return type(v)(_to_tnp(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_tnp(x) for k, x in v.items()}
    return v


def _to_tensors(v):
    tnp = _tnp()
    if isinstance(v, tnp.ndarray):
        return v.tensor
    if isinstance(v, (tuple, list)):
        return type(v)(_to_tensors(x) for x in v)
    return v


class NumpyCall:
    """A graph node's target: `fn` (a torch._numpy callable, a method name of
    torch._numpy's ndarray, or an operator) applied to arrays given as tensors.  NumPy's
    default float is float64; torch makes some results in its own default dtype, so the
    call runs with float64 as that default.  A backend that retraces the graph (AOT)
    records no default, so calls whose result depends on it are made independent of it
    (`cast_ints`: integer inputs converted to float64 first) or not traced."""

    def __init__(self, fn, label: str, method: bool = False, cast_ints: bool = False,
                 default=torch.float64):
        self.fn = fn
        self.method = method
        self.cast_ints = cast_ints
        self.default = default
        self.__name__ = "np_" + "".join(c if c.isalnum() else "_" for c in label)

    def __repr__(self):
        return f"<numpy {self.__name__[3:]}>"

    def __call__(self, *args, **kwargs):
        if self.cast_ints:
            args, kwargs = _ints_to_float(args), _ints_to_float(kwargs)
        args, kwargs = _to_tnp(args), _to_tnp(kwargs)
        default = torch.get_default_dtype()
        torch.set_default_dtype(self.default)
        try:
            if self.method:
                out = getattr(args[0], self.fn)(*args[1:], **kwargs)
            else:
                out = self.fn(*args, **kwargs)
        finally:
            torch.set_default_dtype(default)
        return _to_tensors(out)


def _ints_to_float(v):
    if isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex()):
        return v.to(torch.float64)
    if isinstance(v, (tuple, list)):
        return type(v)(_ints_to_float(x) for x in v)
    if isinstance(v, dict):
        return {k: _ints_to_float(x) for k, x in v.items()}
    return v


class NumpyConst:
    """A graph node's target making a NumPy scalar constant (np.float32(0.5), finfo's
    eps) as a 0-d tensor of its dtype."""

    def __init__(self, value):
        self.value = value.item()
        self.dtype = torch_dtype(value.dtype)
        self.__name__ = f"np_const_{value.dtype.name}"

    def __repr__(self):
        return f"<numpy constant {self.value!r}>"

    def __call__(self):
        return torch.tensor(self.value, dtype=self.dtype)


# ------------------------------------------------------------------ runtime helpers
def to_numpy(t: torch.Tensor):
    """A graph output handed back to the user as the ndarray it stands for."""
    return t.detach().numpy()


def to_numpy_scalar(t: torch.Tensor):
    return t.detach().numpy()[()]


# ------------------------------------------------------------------ dtypes
_NP_TO_TORCH = {} if np is None else {np.dtype(n): getattr(torch, t) for n, t in (
    ("bool", "bool"), ("int8", "int8"), ("uint8", "uint8"), ("int16", "int16"),
    ("int32", "int32"), ("int64", "int64"), ("float16", "float16"), ("float32", "float32"),
    ("float64", "float64"), ("complex64", "complex64"), ("complex128", "complex128"))}
_TORCH_TO_NP = {t: n for n, t in _NP_TO_TORCH.items()}


def torch_dtype(dtype):
    t = _NP_TO_TORCH.get(np.dtype(dtype))
    if t is None:
        unsupported(f"NumPy dtype {dtype} has no torch equivalent")
    return t


def numpy_dtype(dtype: torch.dtype):
    d = _TORCH_TO_NP.get(dtype)
    if d is None:
        unsupported(f"torch dtype {dtype} has no NumPy equivalent")
    return d


def _dtype_of(v: Var):
    """The NumPy dtype a Var describes, if it is a constant dtype-like value."""
    if isinstance(v, NumpyDTypeVar):
        return v.value
    if isinstance(v, NumpyTypeVar):
        return np.dtype(v.value)
    if isinstance(v, NdarrayVar):
        return numpy_dtype(v.base.example.dtype)
    if v.is_const():
        value = v.as_const()
        if isinstance(value, str) or value in (float, int, bool, complex):
            try:
                return np.dtype(value)
            except TypeError:
                pass
    return None


# ------------------------------------------------------------------ which callables
_MODULES = ("", "linalg", "fft")        # np.random is left out: its stream is NumPy's own


@functools.lru_cache(maxsize=1)
def _callables():
    """id(NumPy callable) -> (the NumPy callable, its torch._numpy twin, dotted name)."""
    tnp = _tnp()
    table = {}
    for sub in _MODULES:
        np_mod = getattr(np, sub) if sub else np
        tnp_mod = getattr(tnp, sub) if sub else tnp
        for name, twin in vars(tnp_mod).items():
            if name.startswith("_") or not callable(twin) or isinstance(twin, type):
                continue
            ours = getattr(np_mod, name, None)
            if callable(ours) and not isinstance(ours, type):
                table[id(ours)] = (ours, twin, f"{sub + '.' if sub else ''}{name}")
    for name in (*_DATA_FUNCTIONS, *_DIFFERENT):
        table.pop(id(getattr(np, name, None)), None)
    return table


# Functions whose results are data (Python numbers), or that print or read files.
_DATA_FUNCTIONS = ("count_nonzero", "array_equal", "array_equiv", "allclose", "isscalar")
# Functions where torch._numpy's answer is known to differ from NumPy's: a (1,)-shaped
# result where NumPy gives a scalar, read-only views NumPy makes writable here, bin
# edges rounded otherwise (a value lands in another bin).
_DIFFERENT = ("median", "nanmedian", "percentile", "quantile", "nanpercentile", "nanquantile",
              "diag", "diagonal", "histogram", "histogram2d", "histogramdd",
              "histogram_bin_edges", "digitize")
_WIDENED_ACCUMULATIONS = {"cumsum", "cumprod"}
# Sequence results: lists in NumPy (tuples in torch._numpy), everything else a tuple.
_LIST_RESULTS = {"split", "array_split", "hsplit", "vsplit", "dsplit"}

# Functions and methods that NumPy always answers with a view of their argument.
_ALWAYS_VIEW = {"flip", "fliplr", "flipud", "broadcast_to", "diagonal", "rot90", "split",
                "array_split", "hsplit", "vsplit", "dsplit", "broadcast_arrays"}
# Those that return a view when the layout allows (as torch decides too), or the array
# itself (asarray).
_MAY_VIEW = {"reshape", "ravel", "transpose", "T", "mT", "swapaxes", "moveaxis", "squeeze",
             "expand_dims", "atleast_1d", "atleast_2d", "atleast_3d", "real", "imag", "asarray",
             "asanyarray", "ascontiguousarray", "view", "__getitem__",
             "rollaxis"}
# 0-d results of these are NumPy scalars (ufuncs, reductions, and a few more); a 0-d
# result of anything else is a 0-d array only where listed in _ZERO_D_ARRAY.
_REDUCTIONS = {"sum", "prod", "mean", "var", "std", "min", "max", "amin", "amax", "argmin",
               "argmax", "any", "all", "ptp", "nansum", "nanprod", "nanmean", "nanvar", "nanstd",
               "nanmin", "nanmax", "nanargmin", "nanargmax", "median", "nanmedian", "average",
               "dot", "vdot", "inner", "trace", "norm", "det", "clip", "round", "around", "einsum",
               "matmul"}
_ZERO_D_ARRAY = {"array", "asarray", "asanyarray", "copy", "where", "reshape", "squeeze",
                 "astype", "zeros", "ones", "empty", "full", "zeros_like", "ones_like",
                 "full_like", "empty_like", "transpose", "T"}


@functools.lru_cache(maxsize=1)
def _ufunc_names():
    from torch._numpy import _ufuncs  # (lazy: start-up time)
    return set(_ufuncs._binary) | set(_ufuncs._unary)


def _scalar_result(label: str) -> bool | None:
    """Whether a 0-d result of `label` is a NumPy scalar (True), a 0-d array (False),
    or unknown (None)."""
    name = label.rsplit(".", 1)[-1]
    if name in _REDUCTIONS or name in _ufunc_names() or name.startswith("__"):
        return True
    if name in _ZERO_D_ARRAY:
        return False
    return None


# ------------------------------------------------------------------ Vars
class NdarrayVar(Var):
    """A numpy.ndarray (or, with `scalar`, a NumPy scalar) whose data is the tensor
    `base` of the graph.  `base` is named so that the frame's outputs are collected
    through it."""
    __slots__ = ("base", "scalar", "known")

    def __init__(self, base: TensorVar, scalar: bool = False, source=None, known=None):
        super().__init__(source)
        self.base = base
        self.scalar = scalar
        self.known = known      # a scalar argument's value, read only by `convert`

    def convert(self, tx, kind):
        """int(s), float(s) ... of a NumPy scalar argument: its value, now guarded (a
        change recompiles); of anything else, the data is not known while tracing."""
        if self.known is None or self.source is None:
            unsupported(f"{kind.__name__}() of an array needs its data")
        try:
            value = kind(self.known)
        except Exception as e:
            unsupported(f"{kind.__name__}() of {self.known!r} raised {type(e).__name__}")
        tx.guards.equals(self.source, self.known)
        return ConstVar(value)

    @property
    def dtype(self):
        return numpy_dtype(self.base.example.dtype)

    def python_type(self):
        return self.dtype.type if self.scalar else np.ndarray

    def getattr(self, tx, name):
        t = self.base
        if name == "shape":
            return TupleVar(list(tx.output.size_of(t).items))
        if name == "ndim":
            return ConstVar(t.example.dim())
        if name == "dtype":
            return NumpyDTypeVar(self.dtype)
        if name == "itemsize":
            return ConstVar(self.dtype.itemsize)
        if name in ("size", "nbytes"):
            n = tx.output.size_of(t).call_method(tx, "numel", [], {})
            if name == "nbytes":
                n = binary_op(tx, operator.mul, n, ConstVar(self.dtype.itemsize))
            return n
        if name == "imag" and not t.example.is_complex():
            unsupported("imag of a real array (read-only in NumPy)")
        if name in ("T", "mT", "real", "imag"):
            return call_numpy(tx, name, operator.attrgetter(name), [self], {},
                              np_fn=operator.attrgetter(name))
        if name in _DATA_METHODS:
            unsupported(f"ndarray.{name} needs the array's data")
        if callable(getattr(_tnp().ndarray, name, None)) and callable(getattr(np.ndarray, name, None)):
            return MethodVar(self, name)
        unsupported(f"ndarray attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        if name in _DATA_METHODS:
            unsupported(f"ndarray.{name}() needs the array's data")
        if not callable(getattr(_tnp().ndarray, name, None)) or name in _DIFFERENT:
            unsupported(f"ndarray.{name}() is not in torch._numpy, or differs there")
        if name in ("conj", "conjugate") and not args and not kwargs and \
                not self.base.example.is_complex():
            return self             # NumPy returns the real array itself
        if self.scalar and name not in _REDUCTIONS and name not in ("astype", "conj", "conjugate"):
            unsupported(f"{name}() of a NumPy scalar")
        return call_numpy(tx, name, name, [self, *args], kwargs, method=True,
                          inplace=name in _INPLACE_METHODS, scalar=True if self.scalar else None)

    def getitem(self, tx, key):
        if self.scalar:
            unsupported("indexing a NumPy scalar")
        _check_steps(key)
        out = call_numpy(tx, "__getitem__", operator.getitem, [self, key], {}, np_fn=operator.getitem)
        if isinstance(out, NdarrayVar) and out.base.example.dim() == 0:
            if isinstance(key, TupleVar):
                keys = key.items
            elif key.is_const() and type(key.as_const()) is tuple:
                keys = [ConstVar(k) for k in key.as_const()]
            else:
                keys = [key]
            # An integer in every dimension gives a NumPy scalar; anything else (an
            # Ellipsis, an array) keeps a 0-d array.
            out.scalar = all(isinstance(k, SymNodeVar) or k.is_const() and type(k.as_const()) is int
                             for k in keys)
        return out

    def setitem(self, tx, key, value):
        if self.scalar:
            unsupported("item assignment on a NumPy scalar")
        _check_steps(key)
        call_numpy(tx, "__setitem__", operator.setitem, [self, key, value], {}, inplace=True,
                   np_fn=operator.setitem)

    def unpack(self, tx):
        return [self.getitem(tx, ConstVar(i)) for i in range(self.length(tx))]

    def length(self, tx):
        if self.base.example.dim() == 0:
            unsupported("len() of a 0-d array")
        n = tx.output.size_of(self.base).items[0]
        if not n.is_const():
            unsupported("len() of an array of symbolic length")
        return n.as_const()

    def truth(self, tx):
        unsupported("branching on an array's value (data-dependent control flow)")

    def reconstruct(self, cg):
        if self.source is not None:
            return self.source.reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        cg.call_const(to_numpy_scalar if self.scalar else to_numpy,
                      [lambda cg: cg.load_tensor(self.base)])
        cg.keep_rebuilt(self)

    def noun(self):
        return "a NumPy scalar" if self.scalar else "a NumPy array"

    def __repr__(self):
        kind = "scalar" if self.scalar else "ndarray"
        return f"NdarrayVar({kind} {self.base!r})"


def _check_steps(key):
    """A negative slice step is a view in NumPy; torch has none, and torch._numpy copies
    (a write through it would be lost)."""
    keys = key.items if isinstance(key, TupleVar) else \
        [ConstVar(k) for k in key.as_const()] if key.is_const() and type(key.as_const()) is tuple else [key]
    for k in keys:
        step = (k.parts[2] if len(k.parts) > 2 else None) if isinstance(k, SliceVar) else \
            ConstVar(k.as_const().step) if k.is_const() and type(k.as_const()) is slice else None
        if step is not None and not (step.is_const() and (step.as_const() is None or
                                                          isinstance(step.as_const(), int) and step.as_const() > 0)):
            unsupported("a slice with a negative (or unknown) step of an array")


_DATA_METHODS = {"item", "tolist", "tobytes", "tostring", "__array__", "__bool__", "__int__",
                 "__float__", "__index__", "__complex__", "__repr__", "__str__", "__format__",
                 "dump", "dumps", "tofile", "data", "ctypes", "base", "flags", "strides",
                 "__array_interface__", "__dlpack__", "__reduce__", "__setstate__", "itemset",
                 "resize", "byteswap", "setflags", "getfield", "setfield", "partition",
                 "argpartition", "nonzero", "searchsorted"}
_INPLACE_METHODS = {"fill", "sort", "put", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                    "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                    "__ilshift__", "__irshift__", "__imatmul__", "__setitem__"}


class _NumpyValueVar(ValueVar):
    """A NumPy object known at trace time (a scalar, dtype, scalar type, function): a
    constant to the trace, loaded as one by the transformed code."""
    __slots__ = ()

    def is_const(self):
        return True

    def as_const(self):
        return self.value

    def reconstruct(self, cg):
        cg.load_const(self.value)


class NumpyScalarVar(_NumpyValueVar):
    """A NumPy scalar known at trace time (an argument guarded by value, finfo's eps,
    np.float32(0.5)): arithmetic among such constants is NumPy's own, done while
    tracing; beside an array it becomes a 0-d tensor of its dtype in the graph."""
    __slots__ = ()

    def truth(self, tx):
        return bool(self.value)

    def getattr(self, tx, name):
        if name == "dtype":
            return NumpyDTypeVar(self.value.dtype)
        if name in ("ndim", "shape", "size", "itemsize", "nbytes", "real", "imag"):
            return fold(getattr(self.value, name))
        if name in _SCALAR_METHODS:
            return MethodVar(self, name)
        unsupported(f"attribute {name!r} of a NumPy scalar")

    def call_method(self, tx, name, args, kwargs):
        if name not in _SCALAR_METHODS or not all(a.is_const() for a in (*args, *kwargs.values())):
            unsupported(f"{type(self.value).__name__}.{name}()")
        consts = [_const_arg(a) for a in args]
        try:
            return fold(getattr(self.value, name)(*consts, **{k: _const_arg(v) for k, v in kwargs.items()}))
        except Exception as e:
            unsupported(f"{type(self.value).__name__}.{name}() raised {type(e).__name__}")

    def __repr__(self):
        return f"NumpyScalarVar({self.value!r})"


_SCALAR_METHODS = {"item", "astype", "tolist", "__round__", "__float__", "__int__", "__index__",
                   "__bool__", "conjugate", "is_integer", "as_integer_ratio", "__abs__", "__neg__"}


def _const_arg(v):
    if isinstance(v, (NumpyDTypeVar, NumpyTypeVar)):
        return _dtype_of(v)
    return v.as_const()


def fold(value):
    """A value NumPy computed at trace time, as a Var."""
    if isinstance(value, np.generic):
        if value.dtype not in _NP_TO_TORCH:
            unsupported(f"NumPy scalar of dtype {value.dtype}")
        return NumpyScalarVar(value)
    if isinstance(value, np.dtype):
        return NumpyDTypeVar(value)
    if is_constant_value(value) or type(value) is tuple and all(map(is_constant_value, value)):
        return ConstVar(value)
    unsupported(f"NumPy gave {type(value).__name__} at trace time")


class NumpyDTypeVar(_NumpyValueVar):
    """A numpy.dtype: a constant, compared and read at trace time."""
    __slots__ = ()

    def __init__(self, value, source=None):
        super().__init__(np.dtype(value), source)

    def getattr(self, tx, name):
        if name in ("name", "kind", "char", "itemsize", "num", "str", "byteorder", "isbuiltin",
                    "alignment", "ndim", "shape"):
            return ConstVar(getattr(self.value, name))
        if name == "type":
            return NumpyTypeVar(self.value.type)
        unsupported(f"numpy.dtype attribute {name!r}")


class NumpyTypeVar(_NumpyValueVar):
    """A NumPy scalar type (np.float32): a dtype-like constant that, called, makes a
    scalar (or, on an array, a converted copy)."""
    __slots__ = ()

    def getattr(self, tx, name):
        if name == "__name__":
            return ConstVar(self.value.__name__)
        unsupported(f"attribute {name!r} of {self.value.__name__}")

    def call(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            unsupported(f"{self.value.__name__}() with these arguments")
        arg = args[0]
        if arg.is_const() and is_constant_value(arg.as_const()) and \
                isinstance(arg.as_const(), (bool, int, float, complex)):
            try:
                made = self.value(arg.as_const())
            except Exception as e:
                unsupported(f"{self.value.__name__}({arg.as_const()!r}) raised {type(e).__name__}")
            return fold(made)
        if isinstance(arg, NumpyScalarVar):
            try:
                return fold(self.value(arg.value))
            except Exception as e:
                unsupported(f"{self.value.__name__}() raised {type(e).__name__}")
        return call_numpy(tx, self.value.__name__, _tnp().array, [arg],
                          {"dtype": ConstVar(np.dtype(self.value).name)}, copy=True, scalar=True,
                          np_fn=np.array)


class NumpyInfoVar(ValueVar):
    """np.finfo / np.iinfo of a constant dtype: NumPy's own answer, read at trace time."""
    __slots__ = ()

    def getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            unsupported(f"{type(self.value).__name__} has no attribute {name!r}")
        return fold(attr)

    def reconstruct(self, cg):
        cg.load_const(self.value)


class NumpyFnVar(_NumpyValueVar):
    """A NumPy function (or ufunc) that torch._numpy has a twin for."""
    __slots__ = ("twin", "label")

    def __init__(self, value, twin, label, source=None):
        super().__init__(value, source)
        self.twin = twin
        self.label = label

    def getattr(self, tx, name):
        if name == "__name__":
            return ConstVar(self.value.__name__)
        unsupported(f"attribute {name!r} of numpy.{self.label}")

    def call(self, tx, args, kwargs):
        if self.label in _DTYPE_FUNCTIONS:
            return _fold_dtype_function(self.value, args, kwargs)
        return call_numpy(tx, self.label, self.twin, args, kwargs, np_fn=self.value)

    def reconstruct(self, cg):
        if self.source is not None:
            return self.source.reconstruct(cg)
        cg.load_const(self.value)


# Functions of dtypes alone: NumPy answers them at trace time.
_DTYPE_FUNCTIONS = {"issubdtype", "result_type", "promote_types", "can_cast", "min_scalar_type"}


def _fold_dtype_function(fn, args, kwargs):
    def value(v):
        if isinstance(v, (NumpyDTypeVar, NumpyTypeVar, NumpyScalarVar)):
            return v.value
        if isinstance(v, NdarrayVar):
            unsupported(f"numpy.{fn.__name__} of an array")
        if v.is_const() or isinstance(getattr(v, "value", None), type) and \
                issubclass(v.value, np.generic):
            return v.as_const() if v.is_const() else v.value
        unsupported(f"numpy.{fn.__name__} of {v}")
    try:
        return fold(fn(*map(value, args), **{k: value(v) for k, v in kwargs.items()}))
    except Exception as e:
        unsupported(f"numpy.{fn.__name__} raised {type(e).__name__}")


class _InfoFnVar(_NumpyValueVar):
    """np.finfo, np.iinfo and np.dtype: answered by NumPy at trace time on a constant
    dtype."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        dtype = _dtype_of(args[0]) if len(args) == 1 and not kwargs else None
        if dtype is None:
            unsupported(f"numpy.{self.value.__name__}() of a value not known at trace time")
        if self.value is np.dtype:
            return NumpyDTypeVar(dtype)
        try:
            return NumpyInfoVar(self.value(dtype))
        except Exception as e:
            unsupported(f"numpy.{self.value.__name__}({dtype}) raised {type(e).__name__}")


# ------------------------------------------------------------------ making Vars
def numpy_constant(tx, value: np.generic) -> NdarrayVar:
    """A NumPy scalar known at trace time, as a 0-d tensor made in the graph."""
    torch_dtype(value.dtype)
    t = tx.output.call("call_function", NumpyConst(value), (), {})
    return NdarrayVar(t, scalar=True)


# What `wrap` hands to `wrap_numpy_value`.
VALUE_TYPES = (np.ndarray, np.generic, np.dtype) if np is not None else ()


def numpy_callable_var(value, source):
    """The Var for a NumPy function, type or module attribute, or None."""
    if np is None:
        return None
    if value is np.finfo or value is np.iinfo or value is np.dtype:
        return _InfoFnVar(value, source)
    if isinstance(value, type):
        if issubclass(value, np.generic) and value in {d.type for d in _NP_TO_TORCH}:
            return NumpyTypeVar(value, source)
        return None
    try:
        hit = _callables().get(id(value))
    except Exception:
        return None
    if hit is None or hit[0] is not value:
        return None
    return NumpyFnVar(value, hit[1], hit[2], source)


class ArrayTensorSource(Source):
    """``torch.as_tensor(base)``: the graph input standing for an ndarray argument (the
    same memory)."""
    __slots__ = ("base", "through")

    def __init__(self, base: Source):
        self.base = base
        self.through = ConstSource(torch.as_tensor, "torch.as_tensor")

    def key(self):
        return self.base

    def guard_expr(self):
        return f"{self.through.guard_expr()}({self.base.guard_expr()})"

    def name(self):
        return f"torch.as_tensor({self.base.name()})"

    def reconstruct(self, cg):
        cg.call_const(torch.as_tensor, [self.base.reconstruct])


def wrap_numpy_value(tx, value, source, guards):
    """An ndarray, NumPy scalar or dtype found in the frame."""
    if isinstance(value, np.dtype):
        if guards is not None:
            guards.equals(source, value)
        return NumpyDTypeVar(value, source)
    if isinstance(value, np.generic):
        if value.dtype not in _NP_TO_TORCH:
            unsupported(f"NumPy scalar of dtype {value.dtype}")
        if guards is not None and _unspecialized(tx, source):
            # Data: a 0-d graph input (a copy: scalars are immutable), so new values
            # reuse the graph.
            guards.type_match(source, value)
            t = tx.output.add_input(torch.as_tensor(value), ArrayTensorSource(source))
            return NdarrayVar(t, scalar=True, source=source, known=value)
        if guards is not None:
            guards.equals(source, value)
        return NumpyScalarVar(value, source)
    if type(value) is not np.ndarray:
        unsupported(f"ndarray subclass {type(value).__name__}")
    if source is None:
        unsupported("an ndarray reached without a source")
    if value.dtype not in _NP_TO_TORCH or not value.dtype.isnative:
        unsupported(f"ndarray of dtype {value.dtype}")
    if not value.flags.writeable:
        unsupported("a read-only ndarray")
    if any(s < 0 or s % value.itemsize for s in value.strides):
        unsupported("an ndarray with strides torch cannot view")
    if guards is not None:
        guards.type_match(source, value)
        e = source.guard_expr()
        guards._add(source, "WRITEABLE", f"{e}.flags.writeable is True", f"{source.name()} is writeable")
    _guard_no_overlap(tx, value, source, guards)
    t = tx.output.add_input(torch.as_tensor(value), ArrayTensorSource(source))
    var = NdarrayVar(t, source=source)
    tx.output.object_vars[id(value)] = (value, var)
    return var


def _guard_no_overlap(tx, value, source, guards):
    """Array inputs become tensors of their own even where their memory overlaps another
    input's (views of one buffer, `t` and `t.numpy()`), which a graph that writes one
    and reads the other cannot see (a functionalized graph writes inputs back at its
    end): such inputs are not traced, and the trace relies on them staying apart."""
    seen = tx.output.numpy_inputs
    others = [(v, s) for v, s in seen] + [(i.value, i.source) for i in tx.output.inputs
                                          if isinstance(i.value, torch.Tensor)]
    for other, other_source in others:
        _keep_apart(guards, value, source, other, other_source)
    seen.append((value, source))


def keep_tensor_apart(output, value, source):
    """A tensor input of a graph that has array inputs: see `_guard_no_overlap`."""
    for arr, arr_source in output.numpy_inputs:
        _keep_apart(output.guards, arr, arr_source, value, source)


def _keep_apart(guards, value, source, other, other_source):
    if isinstance(other_source, ArrayTensorSource):
        return                  # the array itself, compared as an array
    if memory_overlaps(value, other):
        unsupported("an ndarray argument sharing memory with another input")
    if guards is not None:
        fn = guards.const(memory_overlaps)
        guards._add(None, f"NP_APART {source.name()} {other_source.name()}",
                    f"not {fn}({source.guard_expr()}, {other_source.guard_expr()})",
                    f"{source.name()} and {other_source.name()} do not share memory")


def _byte_range(x):
    if isinstance(x, np.ndarray):
        start = x.__array_interface__["data"][0]
        sizes, strides, item = x.shape, x.strides, x.itemsize
    else:
        if x.device.type != "cpu" or x.numel() == 0:
            return None
        item = x.element_size()
        start = x.data_ptr()
        sizes, strides = x.shape, [st * item for st in x.stride()]
    if 0 in sizes:
        return None
    low = start + sum(st * (n - 1) for n, st in zip(sizes, strides) if st < 0)
    high = start + sum(st * (n - 1) for n, st in zip(sizes, strides) if st > 0) + item
    return low, high


def memory_overlaps(a, b) -> bool:
    """Whether two arrays or tensors may share bytes (their extents overlap)."""
    ra, rb = _byte_range(a), _byte_range(b)
    return ra is not None and rb is not None and ra[0] < rb[1] and rb[0] < ra[1]


def _unspecialized(tx, source) -> bool:
    """NumPy scalar arguments are constants (guarded by value), as Python numbers are
    before they change; with dynamic=True they are data from the first call, as
    torch.compile has them."""
    return tx.output.policy.dynamic is True and _is_argument(source)


@tensor_method("numpy")
def tensor_to_ndarray(tx, t: TensorVar, args, kwargs) -> NdarrayVar:
    """``t.numpy()``: the same memory, seen as an ndarray."""
    if args or kwargs:
        unsupported("Tensor.numpy() with arguments")
    ex = t.example
    if ex.requires_grad or ex.device.type != "cpu" or ex.is_conj() or ex.is_neg() or \
            ex.dtype not in _TORCH_TO_NP or t.python_type() is not torch.Tensor:
        unsupported("Tensor.numpy() of a tensor NumPy cannot share (grad, device, dtype)")
    return NdarrayVar(tx.output.call("call_function", torch.ops.aten.alias.default, (t,), {}))


@torch_call_rule(torch.from_numpy, torch.as_tensor, torch.asarray, torch.tensor)
def torch_call_on_ndarray(tx, fn, args, kwargs):
    """torch.from_numpy(a), torch.as_tensor(a) and torch.tensor(a) of a traced array;
    None for other torch functions (which then do not take arrays)."""
    if not args or not isinstance(args[0], NdarrayVar):
        return None
    a = args[0].base
    if fn is torch.from_numpy and len(args) == 1 and not kwargs or \
            fn in (torch.as_tensor, torch.asarray) and len(args) == 1 and \
            set(kwargs) <= {"dtype", "device"} and _same_dtype(kwargs.get("dtype"), a) and \
            _cpu(kwargs.get("device")):
        return tx.output.call("call_function", torch.ops.aten.alias.default, (a,), {})
    if fn is torch.tensor and len(args) == 1 and not kwargs:
        return tx.output.call("call_method", "clone", (a,), {})
    if fn in (torch.as_tensor, torch.asarray, torch.tensor) and len(args) == 1 and \
            set(kwargs) <= {"dtype", "device"}:
        # A conversion: a new tensor (as_tensor shares memory only without one).
        return tx.output.call("call_method", "to", (a,), kwargs)
    return None


def _same_dtype(d, t):
    return d is None or d.is_const() and d.as_const() in (None, t.example.dtype)


def _cpu(d):
    return d is None or d.is_const() and (d.as_const() is None or str(d.as_const()) == "cpu")


# ------------------------------------------------------------------ calls
def _node_arg(tx, v: Var):
    """An argument of a NumPy call as the graph node takes it."""
    if isinstance(v, NdarrayVar):
        return v.base
    if isinstance(v, TensorVar):
        ex = v.example
        if ex.requires_grad or ex.device.type != "cpu" or v.python_type() is not torch.Tensor:
            unsupported("a tensor NumPy cannot convert passed to NumPy")
        return v
    if isinstance(v, (NumpyDTypeVar, NumpyTypeVar)):
        return ConstVar(_dtype_of(v).name)
    if isinstance(v, NumpyScalarVar):
        return numpy_constant(tx, v.value).base
    if isinstance(v, SymNodeVar):
        return v
    if isinstance(v, (TupleVar, ListVar)) and type(v) in (TupleVar, ListVar):
        return type(v)([_node_arg(tx, x) for x in v.items])
    if isinstance(v, DictVar) and type(v) is DictVar:
        return DictVar({k: _node_arg(tx, x) for k, x in v.items.items()})
    if isinstance(v, SliceVar):
        return SliceVar([_node_arg(tx, p) for p in v.parts])
    if v.is_const() and v.as_const() in (float, int, bool, complex) if isinstance(v.as_const(), type) \
            else False:
        return ConstVar(np.dtype(v.as_const()).name)      # FX writes names, not classes
    if v.is_const() and _plain(v.as_const()):
        return ConstVar(v.as_const())
    unsupported(f"passing {v} to NumPy")


def _plain(value) -> bool:
    """Python values NumPy and torch._numpy read alike (numbers, strings, None, slices,
    the builtin number types as dtypes), nested in tuples and lists."""
    if type(value) in (tuple, list):
        return all(map(_plain, value))
    return value is None or value is Ellipsis or type(value) in (bool, int, float, complex, str, slice)


_INT_DIVISIONS = {"floor_divide", "remainder", "mod", "fmod", "divmod", "__floordiv__",
                  "__mod__", "__ifloordiv__", "__imod__", "floordiv", "ifloordiv", "imod"}
_POWERS = {"power", "pow", "__pow__", "__ipow__", "ipow", "float_power"}


def call_numpy(tx, label: str, fn, args, kwargs, method: bool = False, inplace: bool = False,
               copy: bool = False, scalar: bool | None = None, np_fn=None):
    """Record one NumPy call in the graph; its array results become NdarrayVars."""
    node_args = [_node_arg(tx, a) for a in args]
    node_kwargs = {k: _node_arg(tx, v) for k, v in kwargs.items()}
    name = label.rsplit(".", 1)[-1]
    _check_known_differences(name, node_args, node_kwargs)
    if name == "imag" and not any(a.example.is_complex() for a in node_args if isinstance(a, TensorVar)):
        unsupported("imag of a real array (read-only in NumPy)")
    arrays = [a for a in (*node_args, *node_kwargs.values()) if isinstance(a, TensorVar)]
    target = _default_free_target(tx, fn, label, method, node_args, node_kwargs)
    out = tx.output.call("call_function", target, tuple(node_args), node_kwargs)
    _check_integer_semantics(name, args, out)
    expected = _numpy_dry_run(np_fn, method and fn, args, kwargs) if np_fn is not None or method \
        else _NO_RUN
    scalar = _check_against_numpy(label, out, expected, scalar)
    if "out" in kwargs and isinstance(kwargs["out"], NdarrayVar):
        return kwargs["out"]
    return _result(tx, label, name, out, args, arrays, inplace, copy, scalar)


def _dtypes_of(out):
    if isinstance(out, torch.Tensor):
        return out.dtype
    if isinstance(out, (tuple, list)):
        return tuple(_dtypes_of(o) for o in out)
    return None


def _default_free_target(tx, fn, label, method, node_args, node_kwargs):
    """The NumpyCall whose result does not depend on torch's default dtype (checked by
    running it on FakeTensors under float64 and float32 defaults)."""
    fake_args = [to_fake(a) for a in node_args]
    fake_kwargs = {k: to_fake(v) for k, v in node_kwargs.items()}

    def dtypes(cast, default):
        try:
            with tx.output.fake_mode:
                return _dtypes_of(NumpyCall(fn, label, method, cast, default)(*fake_args, **fake_kwargs))
        except Exception:
            return _FAILED
    want = dtypes(False, torch.float64)
    if want is _FAILED or dtypes(False, torch.float32) == want:
        return NumpyCall(fn, label, method)
    if dtypes(True, torch.float64) == want and dtypes(True, torch.float32) == want:
        return NumpyCall(fn, label, method, cast_ints=True)
    unsupported(f"numpy.{label}'s result dtype would depend on torch's default dtype")


_FAILED = object()
_NO_RUN = object()


def _dummy(v):
    """A small real NumPy value like the traced `v` (same dtype and ndim), or raise."""
    if isinstance(v, NdarrayVar):
        if v.scalar:
            return v.dtype.type(0)
        return _dummy_array(v.base.example)
    if isinstance(v, TensorVar):
        return _dummy_array(v.example)
    if isinstance(v, (NumpyScalarVar, NumpyDTypeVar, NumpyTypeVar)):
        return v.value
    if isinstance(v, (TupleVar, ListVar)) and type(v) in (TupleVar, ListVar):
        items = [_dummy(x) for x in v.items]
        return tuple(items) if isinstance(v, TupleVar) else items
    if v.is_const() and not isinstance(v, SymNodeVar):
        value = v.as_const()
        if _plain(value) or isinstance(value, type) and value in (float, int, bool, complex):
            return value
    raise TypeError("no dummy")


def _dummy_array(t):
    dtype = numpy_dtype(t.dtype)
    shape = [int(n) if type(n) is int else 1 for n in t.shape]
    if any(type(n) is not int for n in t.shape) or int(np.prod(shape)) > 4096:
        shape = [1] * len(shape)
    return np.ones(shape, dtype)


def _numpy_dry_run(np_fn, method, args, kwargs):
    """NumPy's own answer on small stand-ins of the arguments (same dtypes and ndims):
    its dtypes and scalar-ness are what the traced call must give.  _NO_RUN when the
    stand-ins cannot be made or NumPy refuses them (a shape they do not fit)."""
    try:
        dargs = [_dummy(a) for a in args]
        dkwargs = {k: _dummy(v) for k, v in kwargs.items()}
    except Exception:
        return _NO_RUN
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if method:
                return getattr(dargs[0], method)(*dargs[1:], **dkwargs)
            return np_fn(*dargs, **dkwargs)
    except Exception:
        return _NO_RUN


def _check_against_numpy(label, out, expected, scalar):
    """Compare the traced result with NumPy's dry run: a different dtype (or structure)
    is a graph break; a 0-d result takes NumPy's scalar-ness."""
    if expected is _NO_RUN:
        return scalar
    outs = out.items if isinstance(out, (TupleVar, ListVar)) else [out]
    exps = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    if len(outs) != len(exps) and isinstance(out, (TupleVar, ListVar)):
        unsupported(f"numpy.{label}: torch._numpy's result differs from NumPy's in structure")
    for o, e in zip(outs, exps):
        if isinstance(o, TensorVar) and isinstance(e, (np.ndarray, np.generic)):
            if numpy_dtype(o.example.dtype) != e.dtype:
                unsupported(f"numpy.{label} gives {e.dtype} in NumPy, "
                            f"{o.example.dtype} in torch._numpy")
            if o.example.dim() != np.ndim(e):
                unsupported(f"numpy.{label}: torch._numpy's result has another ndim")
    if isinstance(out, TensorVar) and out.example.dim() == 0 and \
            isinstance(expected, (np.ndarray, np.generic)) and scalar is None:
        return isinstance(expected, np.generic)
    return scalar


def _check_known_differences(name, args, kwargs):
    if name == "argsort":
        kind = kwargs.get("kind", args[2] if len(args) > 2 else None)
        # NumPy's default (introsort) orders ties its own way; stable sorts agree.
        if kind is None or not kind.is_const() or kind.as_const() != "stable":
            unsupported("numpy.argsort without kind='stable' (ties ordered differently)")
    if name in _WIDENED_ACCUMULATIONS and "dtype" not in kwargs:
        first = args[0] if args else None
        if not isinstance(first, TensorVar) or not (first.example.is_floating_point() or
                                                    first.example.is_complex()):
            unsupported(f"numpy.{name} of integers (NumPy widens them)")


def _check_integer_semantics(name, args, out):
    """Integer division by zero warns in NumPy and raises in torch; an integer to a
    negative power raises in NumPy: only constant operands that rule both out are
    traced."""
    results = out.items if isinstance(out, TupleVar) else [out]
    if not any(isinstance(r, TensorVar) and not r.example.is_floating_point()
               and not r.example.is_complex() for r in results):
        return
    if name in _INT_DIVISIONS or name in _POWERS:
        other = args[1] if len(args) > 1 else None
        ok = other is not None and other.is_const() and type(other.as_const()) is int and (
            other.as_const() != 0 if name in _INT_DIVISIONS else other.as_const() >= 0)
        if not ok:
            unsupported(f"integer {name} of operands not known at trace time")


def _shares_memory(a, b) -> bool:
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except Exception:
        return True


def _result(tx, label, name, out, args, arrays, inplace, copy, scalar=None):
    """`scalar` says whether a 0-d result is a NumPy scalar, where the caller knows."""
    if isinstance(out, (TupleVar, ListVar)):
        items = [_result(tx, label, name, o, args, arrays, False, copy, scalar) for o in out.items]
        return (ListVar if name in _LIST_RESULTS else TupleVar)(items)
    if not isinstance(out, TensorVar):
        return out
    if inplace:
        for a in args:
            if isinstance(a, NdarrayVar) and a.base is out:
                return a
        return NdarrayVar(out)
    ex = out.example
    aliases = any(_shares_memory(ex, a.example) for a in arrays)
    if aliases and (copy or name not in _MAY_VIEW and name not in _ALWAYS_VIEW):
        # torch._numpy answered with its argument (astype to the same dtype, +a) or a
        # view of it, where NumPy makes a new array.
        out = tx.output.call("call_method", "clone", (out,), {})
    elif aliases and name in ("asarray", "asanyarray", "ascontiguousarray") and \
            len(args) == 1 and isinstance(args[0], NdarrayVar) and args[0].base is out:
        return args[0]          # NumPy's answer is the array itself
    elif not aliases and name in _ALWAYS_VIEW and arrays:
        unsupported(f"numpy.{name} is a view in NumPy and a copy in torch._numpy")
    if ex.dim() != 0:
        scalar = False
    elif scalar is None:
        scalar = _scalar_result(label)
        if scalar is None:
            unsupported(f"numpy.{label} of 0-d arrays (scalar or array result unknown)")
    return NdarrayVar(out, scalar=scalar)


def _as_weak_scalar(tx, scalar, tensor_dtype):
    """A traced NumPy scalar (a 0-d tensor of the graph) as torch takes the scalar at
    run time next to a tensor of `tensor_dtype`: as a Python int (NumPy integers) or
    float (the rest), which never changes the tensor's dtype within its kind, and is
    of the default dtype next to integers.  A 0-d tensor of that dtype does the same
    to the result's dtype and values."""
    kind = scalar.base.example.dtype
    if kind.is_complex:
        unsupported("a complex NumPy scalar with a tensor (torch drops its imaginary part, warning)")
    if kind == torch.bool or kind.is_floating_point:
        target = torch.float64 if tensor_dtype.is_floating_point or tensor_dtype.is_complex \
            else _read_global_state(tx, torch.get_default_dtype).as_const()     # (guarded)
    else:
        target = torch.int64
    return tx.output.call("call_method", "to", (scalar.base, ConstVar(target)), {})


def numpy_binary_op(tx, fn, a: Var, b: Var):
    """``a <op> b`` where either side is a traced array or NumPy scalar."""
    if isinstance(a, (NumpyDTypeVar, NumpyTypeVar)) or isinstance(b, (NumpyDTypeVar, NumpyTypeVar)):
        return _dtype_compare(fn, a, b)
    if isinstance(a, TensorVar) or isinstance(b, TensorVar):
        other = b if isinstance(a, TensorVar) else a
        if isinstance(other, NumpyScalarVar) and isinstance(other.value, (np.integer, np.floating, np.bool_)) \
                and not isinstance(other.value, np.longdouble):
            # torch takes a NumPy number as the Python number it equals (a weak scalar):
            # an integer as an int, anything else (np.bool_ too) as a float
            value = ConstVar(int(other.value) if isinstance(other.value, np.integer) else float(other.value))
            return binary_op(tx, fn, *((a, value) if other is b else (value, b)))
        if isinstance(other, NdarrayVar) and other.scalar and isinstance(a if other is b else b, TensorVar):
            value = _as_weak_scalar(tx, other, (a if other is b else b).example.dtype)
            return binary_op(tx, fn, *((a, value) if other is b else (value, b)))
        unsupported(f"{fn.__name__} between a tensor and an ndarray")
    if not isinstance(a, NdarrayVar) and not isinstance(b, NdarrayVar):
        # NumPy scalars and Python constants: NumPy's own answer, now.
        if not (a.is_const() and b.is_const()):
            unsupported(f"{fn.__name__} of a NumPy scalar and {a if not a.is_const() else b}")
        try:
            return fold(fn(a.as_const(), b.as_const()))
        except Exception as e:
            unsupported(f"{fn.__name__} of NumPy scalars raised {type(e).__name__}")
    inplace = fn.__name__.startswith("i") and fn.__name__ not in ("is_", "is_not") and \
        isinstance(a, NdarrayVar)
    if inplace and a.scalar:
        fn, inplace = INPLACE_TO_PLAIN.get(fn, fn), False   # NumPy scalars are immutable
    if fn in (operator.is_, operator.is_not, operator.contains):
        unsupported(f"{fn.__name__} on arrays")
    out = call_numpy(tx, f"__{fn.__name__.strip('_')}__", fn, [a, b], {}, inplace=inplace, np_fn=fn)
    return out


def numpy_unary_op(tx, fn, v: Var):
    if isinstance(v, NumpyScalarVar):
        try:
            return fold(fn(v.value))
        except Exception as e:
            unsupported(f"{fn.__name__} of a NumPy scalar raised {type(e).__name__}")
    if fn is operator.not_ or fn is operator.truth:
        unsupported("truth value of an array")
    return call_numpy(tx, f"__{fn.__name__.strip('_')}__", fn, [v], {}, np_fn=fn)


def _dtype_compare(fn, a, b):
    if fn not in (operator.eq, operator.ne):
        unsupported(f"{fn.__name__} on NumPy dtypes")
    da, db = _dtype_of(a), _dtype_of(b)
    if da is None or db is None or isinstance(a, NdarrayVar) or isinstance(b, NdarrayVar):
        unsupported("comparing a NumPy dtype with a value not known at trace time")
    left = a.as_const() if not isinstance(a, NumpyDTypeVar) else a.value
    right = b.as_const() if not isinstance(b, NumpyDTypeVar) else b.value
    return ConstVar(bool(fn(left, right)))


def is_numpy_var(v: Var) -> bool:
    return isinstance(v, (NdarrayVar, NumpyDTypeVar, NumpyTypeVar, NumpyScalarVar))
