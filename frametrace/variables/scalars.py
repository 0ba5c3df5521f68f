"""Numbers read out of tensors inside the graph (``config.capture_scalar_outputs``);
``torch._check`` facts about them are `symbolic_calls`'.

``t.item()`` is a graph node whose value the trace does not know: an *unbacked* symbol
of the ShapeEnv (FakeTensorMode makes it when the ShapeEnv allows scalar outputs).  It
flows into later ops (``torch.zeros(n)``, ``x[:n]``, arithmetic) as a symbolic number.
Nothing is ever guarded on it: no guard could read it before the graph runs.  A fact the
trace needs about it must follow from what the ShapeEnv knows (its range, ``torch._check``
facts); otherwise the code that needs it is a graph break (see `symbolic.plain`).  Facts
assumed without proof (``torch._check(n < 10)``, ``n >= 0`` for ``torch.zeros(n)``) are
checked when the graph runs (`graph.insert_runtime_asserts`).
"""
from __future__ import annotations

import itertools

import torch

from .base import unsupported
from .constant import ConstVar
from .containers import ListVar
from .. import interop

# Tensor methods that read the tensor's value as a Python number.
SCALAR_METHODS = {"item", "tolist", "__int__", "__float__", "__bool__", "__index__"}


def capturing() -> bool:
    return interop.capture_scalar_outputs()


def scalar_method(tx, t, name, args, kwargs):
    """``t.item()`` and friends as graph values (only with capture_scalar_outputs)."""
    if args or kwargs:
        unsupported(f"Tensor.{name}() with arguments")
    if name == "item":
        return _item(tx, t)
    if name == "tolist":
        return _tolist(tx, t)
    dtype = t.example.dtype
    if name == "__index__":
        if dtype.is_floating_point or dtype.is_complex:
            unsupported("__index__ of a floating-point tensor (TypeError)")
        return _item(tx, _to(tx, t, torch.int64) if dtype == torch.bool else t)
    if dtype.is_complex:
        unsupported(f"{name[2:-2]}() of a complex tensor")
    if name == "__int__":
        if dtype == torch.bool:
            return _item(tx, _to(tx, t, torch.int64))
        value = _item(tx, t)
        # int() of a float truncates (and raises on NaN or inf, as CPython's does).
        return value if value.python_type() is int else \
            tx.output.call("call_function", torch.sym_int, (value,), {})
    if name == "__float__":
        # An int64 rounds to a double as Python's float(int) does.
        return _item(tx, t if dtype.is_floating_point else _to(tx, t, torch.float64))
    # __bool__: nonzero (NaN is true)
    return _item(tx, t if dtype == torch.bool else _to(tx, t, torch.bool))


def _to(tx, t, dtype):
    return tx.output.call("call_method", "to", (t, ConstVar(dtype)), {})


def _item(tx, t):
    # (A tensor of other than one element fails on the FakeTensor: a break.)
    return tx.output.call("call_method", "item", (t,), {})


def _tolist(tx, t):
    """A (nested) list of the elements' values: one item() per element, so the shape
    must be known (its symbolic sizes are specialized, unbacked ones break)."""
    shape = [s.as_const() for s in tx.output.size_of(t).items]
    if not shape:
        return _item(tx, t)
    flat = [_item(tx, t.getitem(tx, ConstVar(idx)) if len(idx) > 1 else
                  t.getitem(tx, ConstVar(idx[0])))
            for idx in itertools.product(*map(range, shape))]
    return _nest(flat, shape)


def _nest(flat, shape):
    if len(shape) == 1:
        return ListVar(list(flat))
    step = len(flat) // shape[0] if shape[0] else 0
    return ListVar([_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])])
