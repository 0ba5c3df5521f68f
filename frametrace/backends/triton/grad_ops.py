"""Lowerings of the ops backward graphs are made of and forward graphs rarely: writes of
one tensor into a copy of another that are pointwise in the output (each output element
takes the source's or the base's), so they fuse like any pointwise op.

- `scatter` with one index per row (`index.shape[dim] == 1`): the gradients of max/min
  along a dim, of nll_loss and cross_entropy (a one-hot row);
- `slice_scatter` and `select_scatter`: the gradients of slicing and indexing."""
from __future__ import annotations

import sympy
import torch

from . import config, indexing
from .ir import IRNode, Unsupported
from .lowering_base import bcast, operand, out_of_bounds, pointwise, register, slice_bounds, slice_start, val_of

aten = torch.ops.aten


def _scatter_value(src, dtype):
    """(what each written element holds, at source index `sub`)."""
    def value(k, sub):
        if isinstance(src, IRNode):
            return k.cast(src.load(k, bcast(sub, src.shape)), src.dtype, dtype)
        return k.literal(src, dtype)
    return value


@register(aten.scatter.value, aten.scatter.src)
def _scatter(L, node, x, dim, index, src):
    """out = x, then out[..., index[..., 0, ...], ...] = src[..., 0, ...] (one per row)."""
    shape, dtype = val_of(node)
    dim %= max(len(shape), 1)
    if not isinstance(index, IRNode) or len(index.shape) != len(shape) or index.shape[dim] != 1 \
            or any(a != b for d, (a, b) in enumerate(zip(index.shape, shape)) if d != dim):
        raise Unsupported("a scatter of more than one element per row (or of part of the rows)")
    if isinstance(src, IRNode) and len(src.shape) != len(shape):
        raise Unsupported("a scatter from a source of another rank")
    value = _scatter_value(src, dtype)

    def fn(k, idx):
        sub = idx[:dim] + [indexing.Integer(0)] + idx[dim + 1:]
        target = k.cast(index.load(k, sub), index.dtype, torch.int64)
        if config.check_indices:  # (eager's scatter takes no negative index)
            k.check(f"({target} >= 0) & ({target} < {indexing.pexpr(sympy.sympify(shape[dim]))})",
                    out_of_bounds("RuntimeError", dim, shape[dim]))
        hit = k.op(f"({k.index(idx[dim])} == {target})")
        return k.op(f"tl.where({hit}, {value(k, sub)}, {operand(k, x, idx, dtype)})")
    return pointwise(shape, dtype, fn, x, index, src)


def _symbolic_slice_scatter(L, shape, dtype, x, src, dim, lo, step):
    """slice_scatter over a symbolic size (or from symbolic bounds): element i of `dim`
    takes src's element (i - lo) // step where i >= lo, (i - lo) is a multiple of step and
    below step * src's length (the slice's end needs no say: src's size, a derived
    size, is the number of elements it has)."""
    lo_s = indexing.pexpr(sympy.sympify(lo))
    n_s = indexing.pexpr(sympy.sympify(src.shape[dim]))
    return _scatter_into_slice(shape, dtype, x, src, dim, lo, lo_s, step,
                               lambda i: [f"({i} >= {lo_s})", f"(({i} - {lo_s}) < {step} * {n_s})"])


def _scatter_into_slice(shape, dtype, x, src, dim, lo, lo_text, step, bounds):
    """x with src written into its slice along `dim` from `lo` (`lo_text` in the kernel's
    source) by `step`, where `bounds(i)` (conditions on the index i along dim) holds."""
    def fn(k, idx):
        i = k.index(idx[dim])
        conds = bounds(i) + ([f"((({i} - {lo_text}) % {step}) == 0)"] if step != 1 else [])
        cond = k.op(" & ".join(conds))
        sub = idx[:dim] + [indexing.floordiv(idx[dim] - lo, step) if step != 1 else idx[dim] - lo] + idx[dim + 1:]
        with k.masked(cond):
            v = k.cast(src.load(k, sub), src.dtype, dtype)
        return k.op(f"tl.where({cond}, {v}, {operand(k, x, idx, dtype)})")
    return pointwise(shape, dtype, fn, x, src)


@register(aten.slice_scatter)
def _slice_scatter(L, node, x, src, dim=0, start=None, end=None, step=1):
    shape, dtype = val_of(node)
    dim %= len(shape)
    if config.derived_sizes and isinstance(src, IRNode) and \
            any(isinstance(v, sympy.Basic) and not v.is_number for v in (shape[dim], start, end)):
        return _symbolic_slice_scatter(L, shape, dtype, x, src, dim, slice_start(L, shape[dim], start, step), step)
    lo, hi = slice_bounds(shape[dim], start, end, step)
    if any(isinstance(v, sympy.Basic) and not v.is_number for v in (lo, hi)):
        raise Unsupported("a slice_scatter at symbolic positions")
    return _scatter_into_slice(shape, dtype, x, src, dim, lo, lo, step,
                               lambda i: [f"({i} >= {lo})", f"({i} < {hi})"])


@register(aten.select_scatter)
def _select_scatter(L, node, x, src, dim, index):
    shape, dtype = val_of(node)
    dim %= len(shape)
    if any(isinstance(v, sympy.Basic) and not v.is_number for v in (index, shape[dim])):
        raise Unsupported("a select_scatter at a symbolic position")
    index %= shape[dim]

    def fn(k, idx):
        cond = k.op(f"({k.index(idx[dim])} == {index})")
        with k.masked(cond):
            v = k.cast(src.load(k, idx[:dim] + idx[dim + 1:]), src.dtype, dtype)
        return k.op(f"tl.where({cond}, {v}, {operand(k, x, idx, dtype)})")
    return pointwise(shape, dtype, fn, x, src)
