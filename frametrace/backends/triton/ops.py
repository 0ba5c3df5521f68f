"""Aten op → IR.  Each lowering takes the graph lowering `L`, the FX node (its
`meta["val"]` gives the output's shape and dtype) and the node's arguments with tensors
replaced by IR values; it returns IR, or raises `Unsupported` to leave the op to aten.

Values inside kernels are code strings in the op's *compute* dtype: float16 and bfloat16
are loaded and computed as float32 and rounded once, when stored.
"""
from __future__ import annotations

import bisect
import math
import operator

import sympy
import torch

from . import autotune, config, indexing, layout, logsumexp, row_partials, splits
from .indexing import flatten, unflatten
from .ir import Buffer, CentredSq, Computed, IRNode, Pointwise, Reduction, Scan, Unsupported
from .lowering_base import (LOWERINGS, bcast, compute_dtype, is_symbolic, operand, out_of_bounds, pointwise,  # noqa: F401
                            register, shape_of, slice_bounds, slice_start, val_of)  # (tests patch ops.LOWERINGS)

aten, prims = torch.ops.aten, torch.ops.prims


def _meta_arg(a):
    if isinstance(a, torch.fx.Node):
        return a.meta.get("val")
    return a


def promoted(node):
    """The dtype the op computes in: type promotion over its tensor and number args."""
    args = [_meta_arg(a) for a in node.args if isinstance(a, (torch.fx.Node, int, float, bool))]
    args = [a for a in args if isinstance(a, (torch.Tensor, int, float, bool))]
    try:
        return torch.result_type(*args[:2]) if len(args) >= 2 else args[0].dtype
    except Exception:
        return node.meta["val"].dtype


# -- elementwise ------------------------------------------------------------------------
def elementwise(template, compute=None):
    """Lower with `template(k, *values)` or `template.format(*values)`; inputs are cast to
    `compute(node, out_dtype)` (default: the output dtype)."""
    def lower(L, node, *args, **kwargs):
        shape, dtype = val_of(node)
        cdt = compute(node, dtype) if compute else dtype
        if cdt.is_complex:
            raise Unsupported("complex")
        tmpl = template(kwargs) if getattr(template, "takes_kwargs", False) else template

        def fn(k, idx):
            vals = [operand(k, a, idx, cdt) for a in args]
            if callable(tmpl):
                return tmpl(k, cdt, *vals)
            return k.op(tmpl.format(*vals))
        return pointwise(shape, dtype, fn, *args)
    return lower


def _by_input(node, dtype):
    return promoted(node)


def _float_in(node, dtype):
    return dtype if dtype.is_floating_point else torch.float32


def _ew(ops, template, compute=None):
    register(*ops)(elementwise(template, compute))


def _number(v) -> str:
    """A Python number as kernel source (inf and nan as `float("inf")`: a bare `inf`
    is a NameError)."""
    return f'float("{v}")' if isinstance(v, float) and not math.isfinite(v) else repr(v)


def _with_alpha(sign):
    def make(kwargs):
        alpha = kwargs.get("alpha", 1)
        rhs = "{1}" if alpha == 1 else f"({{1}} * {_number(alpha)})"
        return "{0} " + sign + " " + rhs
    make.takes_kwargs = True
    return make


_ew([aten.add], _with_alpha("+"))
_ew([aten.sub], _with_alpha("-"))
_ew([aten.rsub], lambda k, d, a, b: k.op(f"{b} - {a}"))


def _mul(k, dtype, a, b):
    return k.op(f"{a} & {b}" if dtype == torch.bool else f"{a} * {b}")


_ew([aten.mul], _mul)
_ew([aten.neg], "-{0}")
_ew([aten.abs], "tl.abs({0})")
_ew([aten.exp], "tl.exp({0})")
_ew([aten.exp2], "tl.exp2({0})")
_ew([aten.log], "tl.log({0})")
_ew([aten.log2], "tl.log2({0})")
_ew([aten.log10], "tl.log({0}) * 0.4342944819032518")
_ew([aten.sqrt], "tl.sqrt({0})")
_ew([aten.rsqrt], "tl.rsqrt({0})")
_ew([aten.sin], "tl.sin({0})")
_ew([aten.cos], "tl.cos({0})")
_ew([aten.tan], "tl.sin({0}) / tl.cos({0})")
_ew([aten.sigmoid], "1.0 / (1.0 + tl.exp(-{0}))")
def _erf(k, dtype, x, half=False):
    if half:
        # The result is rounded to bf16/fp16: erf(x) = 1 - erfc(|x|) (sign restored), with
        # log2(erfc(t)) = t * P6(t) fitted on [0, 4] (erfc's relative error < 5.3e-6, erf's
        # absolute < 4.7e-6, a thousandth of a bf16 rounding): one exp2 and no division.
        t = k.op(f"tl.minimum(tl.abs({x}), 4.0, propagate_nan=tl.PropagateNan.ALL)")
        poly = k.op(f"((((((-2.1365707652876154e-05 * {t} + 0.0005006541032344103) * {t} "
                    f"- 0.005302324425429106) * {t} + 0.0341181680560112) * {t} "
                    f"- 0.15270547568798065) * {t} - 0.9169146418571472) * {t} "
                    f"- 1.6280968189239502) * {t}")
        y = k.op(f"1.0 - tl.exp2({poly})")
        return k.op(f"tl.where({x} < 0, -{y}, {y})")
    if not config.fast_erf:
        return k.op(f"tl.math.erf({x})")
    # Abramowitz & Stegun 7.1.26: absolute error under 1.5e-7, a few FMAs and one exp
    # where libdevice's erf costs enough to make gelu compute-bound.
    t = k.op(f"1.0 / (1.0 + 0.3275911 * tl.abs({x}))")
    poly = k.op(f"((((1.061405429 * {t} - 1.453152027) * {t} + 1.421413741) * {t} "
                f"- 0.284496736) * {t} + 0.254829592) * {t}")
    y = k.op(f"1.0 - {poly} * tl.exp(-{x} * {x})")
    return k.op(f"tl.where({x} < 0, -{y}, {y})")


_HALF = (torch.float16, torch.bfloat16)
# fp32 ops that carry a value on to where it is rounded (gelu's decomposition: erf + 1, * x / 2)
_CARRY = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.neg.default}


def _rounded_to_half(node, depth=6) -> bool:
    """Whether every use of `node`'s value ends, through a few arithmetic ops, in a
    conversion to fp16/bf16 (so that its error below those dtypes' rounding is lost)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype in _HALF:
        return True
    if depth == 0 or not node.users:
        return False
    for user in node.users:
        if user.target in (aten._to_copy.default, prims.convert_element_type.default):
            out = user.meta.get("val")
            if isinstance(out, torch.Tensor) and out.dtype in _HALF:
                continue
            return False
        if user.target not in _CARRY or not _rounded_to_half(user, depth - 1):
            return False
    return True


@register(aten.erf)
def _erf_op(L, node, x):
    half = config.half_erf and config.fast_erf and _rounded_to_half(node)
    return elementwise(lambda k, d, v: _erf(k, d, v, half))(L, node, x)


_ew([aten.floor], lambda k, d, x: k.op(f"tl.floor({x})") if d.is_floating_point else x)
_ew([aten.ceil], lambda k, d, x: k.op(f"tl.ceil({x})") if d.is_floating_point else x)
_ew([aten.trunc], lambda k, d, x: k.op(f"tl.where({x} < 0, tl.ceil({x}), tl.floor({x}))")
    if d.is_floating_point else x)
_ew([aten.reciprocal], "1.0 / {0}")
_ew([aten.relu], "tl.where({0} < 0, 0, {0})")
# tanh and expm1 through exp: libdevice is not available to Triton's interpreter.
_ew([aten.tanh], "1.0 - 2.0 / (tl.exp(2.0 * {0}) + 1.0)")
_ew([aten.expm1], "tl.where(tl.abs({0}) < 1e-5, {0} + 0.5 * {0} * {0}, tl.exp({0}) - 1.0)")
_ew([aten.log1p], lambda k, d, x: k.op(
    f"tl.where({k.op(f'1.0 + {x}')} == 1.0, {x}, tl.log(1.0 + {x}) * ({x} / ((1.0 + {x}) - 1.0)))"))
_ew([aten.sign, aten.sgn], lambda k, d, x: k.op(
    f"({x} > 0).to({k.tl(d)}) - ({x} < 0).to({k.tl(d)})") if d != torch.bool else x)
_ew([aten.isnan], "{0} != {0}", _by_input)
_ew([aten.isinf], lambda k, d, x: k.op(f"tl.abs({x}) == float('inf')") if d.is_floating_point
    else "False", _by_input)
_ew([aten.logical_not], "{0} == 0", _by_input)
_ew([aten.bitwise_not], lambda k, d, x: k.op(f"{x} == 0" if d == torch.bool else f"~{x}"))


def _compare(sym):
    """Half-precision operands rounded to their dtype first: eager compares the rounded
    values, and a value computed in the kernel is float32 (a max's backward compares the
    input, recomputed, with the stored max)."""
    def tmpl(k, d, a, b):
        if d in (torch.float16, torch.bfloat16):
            a, b = (k.op(f"{v}.to({k.tl(d)}).to(tl.float32)") if v in getattr(k, "levels", ()) else v
                    for v in (a, b))
        return k.op(f"{a} {sym} {b}")
    return tmpl


for _op, _sym in ((aten.eq, "=="), (aten.ne, "!="), (aten.lt, "<"), (aten.le, "<="),
                  (aten.gt, ">"), (aten.ge, ">=")):
    _ew([_op], _compare(_sym), _by_input)
for _op, _sym in ((aten.logical_and, "&"), (aten.logical_or, "|"), (aten.logical_xor, "^")):
    _ew([_op], "({0} != 0) %s ({1} != 0)" % _sym, _by_input)
for _op, _sym in ((aten.bitwise_and, "&"), (aten.bitwise_or, "|"), (aten.bitwise_xor, "^")):
    _ew([_op], "{0} %s {1}" % _sym)


def _extreme(k, d, fn, a, b, cuda):
    """max/min of a and b as eager's on the device: NaN wins; zeros of both signs are a
    tie that gives `a` on the CPU (maximum(-0.0, 0.0) and clamp(-0.0, min=0.0) are -0.0
    there), while CUDA's eager orders -0.0 below 0.0, as the hardware's max/min do."""
    if not d.is_floating_point:
        return k.op(f"tl.{fn}({a}, {b})")
    if cuda:
        return k.op(f"tl.{fn}({a}, {b}, propagate_nan=tl.PropagateNan.ALL)")
    cmp = ">" if fn == "maximum" else "<"
    return k.op(f"tl.where(({b} {cmp} {a}) | (({b} != {b}) & ({a} == {a})), {b}, {a})")


def _on_cuda(L) -> bool:
    return getattr(L.device, "type", None) == "cuda"


@register(aten.maximum, aten.minimum)
def _maximum(L, node, a, b):
    fn = "maximum" if node.target.overloadpacket is aten.maximum else "minimum"
    cuda = _on_cuda(L)
    return elementwise(lambda k, d, x, y: _extreme(k, d, fn, x, y, cuda))(L, node, a, b)


def _int_divs(k, a, b, check=False):
    """(trunc, floor) quotients of integers, the same under C's and Python's rules.
    `check`: a zero divisor raises, as eager's integer division does on the CPU (on CUDA
    eager returns a number, and so does the kernel)."""
    if check and b in k.levels:
        k.check(f"{b} != 0", "RuntimeError: ZeroDivisionError")
    elif check and int(b) == 0:  # a literal divisor
        k.check("xindex * 0 != 0", "RuntimeError: ZeroDivisionError")
    neg = k.op(f"({a} < 0) != ({b} < 0)")
    q = k.op(f"tl.abs({a}) // tl.abs({b})")
    trunc = k.op(f"tl.where({neg}, -{q}, {q})")
    floor = k.op(f"tl.where({neg} & ({trunc} * {b} != {a}), {trunc} - 1, {trunc})")
    return trunc, floor


def _dividing(template):
    """Lower an op that divides with `template(k, d, a, b, check, **kwargs)`: `check` says
    whether an integer divisor of zero must raise (on the CPU, as eager's)."""
    def lower(L, node, *args, **kwargs):
        check = getattr(L.device, "type", None) == "cpu"
        return elementwise(lambda k, d, a, b: template(k, d, a, b, check, **kwargs))(L, node, *args)
    return lower


@register(aten.div)
@_dividing
def _div(k, d, a, b, check, rounding_mode=None):
    if rounding_mode is None:
        return k.op(f"{a} / {b}")
    if d.is_floating_point:
        q = k.op(f"{a} / {b}")
        return k.op(f"tl.floor({q})" if rounding_mode == "floor" else
                    f"tl.where({q} < 0, tl.ceil({q}), tl.floor({q}))")
    return _int_divs(k, a, b, check)[rounding_mode == "floor"]


@register(aten.remainder)
@_dividing
def _remainder(k, d, a, b, check):
    if d.is_floating_point:
        return k.op(f"{a} - tl.floor({a} / {b}) * {b}")
    return k.op(f"{a} - {_int_divs(k, a, b, check)[1]} * {b}")


@register(aten.fmod)
@_dividing
def _fmod(k, d, a, b, check):
    if d.is_floating_point:
        q = k.op(f"{a} / {b}")
        return k.op(f"{a} - tl.where({q} < 0, tl.ceil({q}), tl.floor({q})) * {b}")
    return k.op(f"{a} - {_int_divs(k, a, b, check)[0]} * {b}")


@register(aten.floor_divide)
@_dividing
def _floor_divide(k, d, a, b, check):
    if d.is_floating_point:
        return k.op(f"tl.floor({a} / {b})")
    return _int_divs(k, a, b, check)[1]


@register(aten.pow)
def _pow(L, node, base, exp):
    shape, dtype = val_of(node)
    if isinstance(exp, (int, float)) and isinstance(base, IRNode):
        e = float(exp)

        def fn(k, idx):
            x = operand(k, base, idx, dtype)
            if e == int(e) and 0 <= e <= 4:
                return k.op(" * ".join([x] * int(e))) if e else k.literal(1, dtype)
            if e in (-1.0, 0.5, -0.5):
                return k.op({-1.0: f"1.0 / {x}", 0.5: f"tl.sqrt({x})", -0.5: f"tl.rsqrt({x})"}[e])
            if not dtype.is_floating_point:
                raise Unsupported("integer pow")
            return _general_pow(k, x, k.literal(e, dtype), e == int(e) and int(e) % 2 == 1)
        return pointwise(shape, dtype, fn, base)
    if not dtype.is_floating_point:
        raise Unsupported("integer pow")

    def fn(k, idx):
        e = operand(k, exp, idx, dtype)
        x = operand(k, base, idx, dtype)
        mag = k.op(f"tl.exp2({e} * tl.log2(tl.abs({x})))")
        # x < 0: NaN unless e is an integer, negative when e is odd
        whole = k.op(f"tl.floor({e}) == {e}")
        odd = k.op(f"{whole} & (tl.floor({e} * 0.5) * 2.0 != {e})")
        signed = k.op(f"tl.where({odd}, -{mag}, tl.where({whole}, {mag}, float('nan')))")
        return k.op(f"tl.where({x} < 0, {signed}, {mag})")
    return pointwise(shape, dtype, fn, base, exp)


def _general_pow(k, x, e, odd):
    """x ** e for a constant e; x < 0 gives NaN unless e is an integer (`odd` or even)."""
    mag = k.op(f"tl.exp2({e} * tl.log2(tl.abs({x})))")
    if float(e) != int(float(e)):
        return k.op(f"tl.where({x} < 0, float('nan'), {mag})")
    return k.op(f"tl.where({x} < 0, -{mag}, {mag})") if odd else mag


@register(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def _where(L, node, cond, a, b):
    shape, dtype = val_of(node)

    def fn(k, idx):
        c = operand(k, cond, idx, torch.bool)
        return k.op(f"tl.where({c}, {operand(k, a, idx, dtype)}, {operand(k, b, idx, dtype)})")
    return pointwise(shape, dtype, fn, cond, a, b)


@register(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(L, node, x, lo=None, hi=None):
    shape, dtype = val_of(node)
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    cdt, cuda = compute_dtype(dtype), _on_cuda(L)

    def fn(k, idx):
        v = operand(k, x, idx, dtype)
        if lo is not None:
            v = _extreme(k, cdt, "maximum", v, operand(k, lo, idx, dtype), cuda)
        if hi is not None:
            v = _extreme(k, cdt, "minimum", v, operand(k, hi, idx, dtype), cuda)
        return v
    return pointwise(shape, dtype, fn, x, lo, hi)


@register(prims.convert_element_type, aten._to_copy, aten.clone, aten.lift_fresh_copy)
def _copy(L, node, x, dtype=None, **kwargs):
    shape, out_dtype = val_of(node)
    if not isinstance(x, IRNode) or node.meta["val"].device != L.device:
        raise Unsupported("a copy to another device")
    return pointwise(shape, out_dtype, lambda k, idx: k.cast(x.load(k, idx), x.dtype, out_dtype), x)


# -- constants and ranges -----------------------------------------------------------------
@register(aten.full, aten.scalar_tensor, aten.zeros, aten.ones, aten.full_like,
          aten.zeros_like, aten.ones_like)
def _full(L, node, *args, **kwargs):
    shape, dtype = val_of(node)
    name = node.target.overloadpacket.__name__
    value = {"zeros": 0, "ones": 1, "zeros_like": 0, "ones_like": 1}.get(
        name, args[0] if name == "scalar_tensor" else args[-1])
    if not isinstance(value, (int, float, bool)) or isinstance(value, sympy.Basic):
        raise Unsupported("a non-constant fill value")
    return pointwise(shape, dtype, lambda k, idx: k.literal(value, dtype))


@register(aten.fill.Scalar)
def _fill(L, node, x, value):
    shape, dtype = val_of(node)
    return pointwise(shape, dtype, lambda k, idx: k.literal(value, dtype))


@register(aten.arange.start_step, aten.arange.start, aten.arange.default, prims.iota)
def _arange(L, node, *args, **kwargs):
    shape, dtype = val_of(node)
    if node.target is prims.iota.default:
        start, step = kwargs.get("start", args[1] if len(args) > 1 else 0), kwargs.get("step", 1)
    else:
        start = args[0] if len(args) > 1 else 0
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    if is_symbolic(start) or is_symbolic(step):
        raise Unsupported("arange with a symbolic start or step")

    def fn(k, idx):
        i = k.cast(k.index(idx[0]), torch.int32, dtype)
        return k.op(f"{k.literal(start, dtype)} + {i} * {k.literal(step, dtype)}")
    return pointwise(shape, dtype, fn)


# -- views ----------------------------------------------------------------------------------
def view(L, node, x, index_map, view_fn):
    """A view of `x`: strides on the same memory when x is a buffer, else an index map."""
    shape, dtype = val_of(node)
    if not isinstance(x, IRNode):
        raise Unsupported("a view of a non-tensor")
    if isinstance(x, Pointwise) and x.realized is not None:
        x = x.realized  # a view of its buffer, not a copy of it
    root = _view_root(L, node, x) if config.symbolic_views and _returned(node) else None
    if root is not None:
        # a returned view of a value stored with symbolic sizes (a graph output, with its
        # traced strides), directly or through views the graph does not return (the
        # no-op dim-0 slice before `y[:, ::2]`): that memory where the buffer has the
        # traced layout, as eager's view shares it (else a copy kernel, and the view
        # shared nothing with the value returned beside it)
        src, base = root
        b = L.symbolic_view(base.buffer, node, src)
        if b is not None:
            L.realize(base.buffer)   # (the wrapper reads it: stored)
            return b
    if isinstance(x, Buffer):
        b = L.view_buffer(x, view_fn)
        if b is None and x.symbolic:
            b = L.symbolic_view(x, node)
        if b is not None:
            return b
    # a view of a lazy value that holds no more elements than the view (a transpose, a
    # reshape, an expand): stored, it is a view of that value stored, so that a value
    # realized both as it is and viewed (a cast weight: saved, and transposed for a
    # matmul) is one buffer and one kernel
    # (and a view the graph returns: eager returns a view of the value, sharing its
    # memory and strides with the other views returned, unbind's pieces of a stack)
    aliasable = isinstance(x, Computed) or (isinstance(x, Pointwise) and (
        x.alias is not None or layout._static(x.shape) and layout._static(shape) and x.numel <= math.prod(shape)
        or _returned(node) and layout._static(x.shape)))
    return pointwise(shape, dtype, lambda k, idx: x.load(k, index_map(idx)), x,
                     alias=(x, view_fn) if aliasable else None)


@register(aten.view.default, aten._unsafe_view, aten.reshape)
def _reshape(L, node, x, size):
    shape, _ = val_of(node)
    old = x.shape
    return view(L, node, x, lambda idx: unflatten(flatten(idx, shape), old),
                lambda t: t.view(shape))


@register(aten.expand)
def _expand(L, node, x, size, implicit=False):
    shape, _ = val_of(node)
    return view(L, node, x, lambda idx: bcast(idx, x.shape), lambda t: t.expand(shape))


@register(aten.permute)
def _permute(L, node, x, dims):
    dims = [d % len(x.shape) for d in dims]

    def index_map(idx):
        old = [None] * len(dims)
        for i, d in enumerate(dims):
            old[d] = idx[i]
        return old
    return view(L, node, x, index_map, lambda t: t.permute(dims))


@register(aten.t, aten.transpose.int)
def _transpose(L, node, x, d0=0, d1=1):
    n = len(x.shape)
    if n < 2:
        return view(L, node, x, lambda idx: idx, lambda t: t)
    dims = list(range(n))
    dims[d0 % n], dims[d1 % n] = dims[d1 % n], dims[d0 % n]
    return _permute(L, node, x, dims)


@register(aten.alias, aten.detach)
def _alias(L, node, x):
    return view(L, node, x, lambda idx: idx, lambda t: t.view(t.shape))


@register(aten.unsqueeze)
def _unsqueeze(L, node, x, dim):
    shape, _ = val_of(node)
    dim %= len(shape)
    return view(L, node, x, lambda idx: idx[:dim] + idx[dim + 1:], lambda t: t.unsqueeze(dim))


@register(aten.squeeze, prims.squeeze)
def _squeeze(L, node, x, dims=None):
    shape, _ = val_of(node)
    n = len(x.shape)
    if dims is None:
        dims = [d for d in range(n) if x.shape[d] == 1]
    # (a 0-d tensor's dim 0 or -1 is no dim: squeezing it is the tensor itself)
    dims = {d % n for d in ([dims] if isinstance(dims, int) else dims) if x.shape[d % n] == 1} if n else set()

    def index_map(idx):
        it = iter(idx)
        return [indexing.Integer(0) if d in dims else next(it) for d in range(n)]
    return view(L, node, x, index_map, lambda t: t.squeeze(tuple(sorted(dims))))


@register(aten.slice.Tensor)
def _slice(L, node, x, dim=0, start=None, end=None, step=1):
    dim %= len(x.shape)
    if config.derived_sizes and any(is_symbolic(v) for v in (x.shape[dim], start, end)):
        start = slice_start(L, x.shape[dim], start, step)
    else:
        start, end = slice_bounds(x.shape[dim], start, end, step)

    def index_map(idx):
        return idx[:dim] + [start + idx[dim] * step] + idx[dim + 1:]
    return view(L, node, x, index_map, lambda t: t[(slice(None),) * dim + (slice(start, end, step),)])


@register(aten.select.int)
def _select(L, node, x, dim, index):
    dim %= len(x.shape)
    if is_symbolic(index) or (is_symbolic(x.shape[dim]) and index < 0):
        raise Unsupported("select at a symbolic position")
    if index < 0:   # (a symbolic length refused above: index % n is no number)
        index %= x.shape[dim]
    return view(L, node, x, lambda idx: idx[:dim] + [indexing.Integer(index)] + idx[dim:],
                lambda t: t.select(dim, index))


class _Sub:
    """A stand-in FX node for one piece of a split: its own meta val, and the users of
    the getitem that takes it (`piece`: its index)."""
    def __init__(self, val, node=None, piece=None):
        self.meta = {"val": val}
        self.args = node.args[:1] if node is not None else ()   # (the input: its layout)
        self.users = {u: None for g in (node.users if node is not None else ())
                      if g.target is operator.getitem and g.args[1] == piece for u in g.users}


def _view_root(L, node, x):
    """(FX node, Computed) of the symbolic value stored that `node` views, through the
    chain of views before it (lazy index maps over that value: Pointwise with an alias),
    or None.  The FX node's fake value is the layout the view's traced strides and offset
    are relative to."""
    src = node.args[0] if getattr(node, "args", None) else None
    for _ in range(64):
        if not isinstance(src, torch.fx.Node):
            return None
        held = L.env.get(src)
        if not (held is x or getattr(held, "realized", None) is x):
            return None     # (src is not the FX node of the value x: no layout to go by)
        if isinstance(x, Pointwise) and x.realized is not None:
            x = x.realized
        if isinstance(x, Computed):
            return (src, x) if x.buffer.symbolic else None
        if isinstance(x, Pointwise) and x.alias is None and _is_view_node(src) and \
                isinstance(L.env.get(src.args[0]), IRNode):
            # a view lowered as an index map with no alias (a strided slice of a lazy value
            # with symbolic sizes): the value it views, through the graph
            src = src.args[0]
            x = L.env[src]
            continue
        if isinstance(x, Pointwise) and x.alias is None:
            # a lazy value with symbolic sizes the graph does not return as it is (only
            # views of it): stored in its traced layout, as eager's views share its memory
            if not any(is_symbolic(n) for n in x.shape):
                return None
            vin, vout = src.meta.get("val"), node.meta.get("val")
            stride = L.traced_strides(x.shape, vin)
            if stride is None or not isinstance(vout, torch.Tensor) or not torch._C._is_alias_of(vout, vin):
                return None
            L.realize(x, wrapper=False, stride=stride)
            return src, x.realized
        if not (isinstance(x, Pointwise) and x.alias is not None):
            return None
        x = x.alias[0]
        src = src.args[0] if src.args else None
        if isinstance(src, torch.fx.Node) and isinstance(L.env.get(src), (list, tuple)):
            src = src.args[0] if src.args else None     # (a piece of a split: its input)
    return None


def _is_view_node(node) -> bool:
    """Whether FX `node` is a view op of its first argument (its value aliases it)."""
    target = getattr(node, "target", None)
    if not (isinstance(target, torch._ops.OpOverload) and target.is_view and node.args and
            isinstance(node.args[0], torch.fx.Node)):
        return False
    vout, vin = node.meta.get("val"), node.args[0].meta.get("val")
    return isinstance(vout, torch.Tensor) and isinstance(vin, torch.Tensor) and torch._C._is_alias_of(vout, vin)


def _returned(node) -> bool:
    """Whether `node`'s value is one of the graph's outputs as it is."""
    return any(getattr(u, "op", None) == "output" for u in getattr(node, "users", ()))


@register(aten.split.Tensor, aten.split_with_sizes, aten.unbind.int)
def _split(L, node, x, sizes=0, dim=0):
    vals = node.meta["val"]
    if node.target is aten.unbind.int:
        dim = sizes
        return [_select(L, _Sub(v, node, i), x, dim, i) for i, v in enumerate(vals)]
    dim %= len(x.shape)
    out, start = [], 0
    for i, v in enumerate(vals):
        n = shape_of(v.shape)[dim]
        out.append(_slice(L, _Sub(v, node, i), x, dim, start, start + n))
        start += n
    return out


@register(aten.as_strided)
def _as_strided(L, node, x, size, stride, storage_offset=None):
    # (an aten result we laid out otherwise than eager, a convolution's run channels-last:
    # fresh memory in eager too, so a copy in eager's layout is what eager's call reads)
    relaid = isinstance(x, Buffer) and not x.is_view and x.name in L.relaid
    if not isinstance(x, Computed) and not isinstance(x, Pointwise) and not relaid:
        raise Unsupported("as_strided of an input (its storage offset is the caller's)")
    # as_strided reads memory: the value must be stored as eager stores it
    val = _meta_arg(node.args[0])
    eager = layout.static_strides(val) if isinstance(val, torch.Tensor) else None
    if eager is None or not layout.dense(x.shape, eager):
        raise Unsupported("as_strided of a value eager stores sparsely")
    if isinstance(x, Pointwise) and x.alias is not None and x.realized is None:
        raise Unsupported("as_strided of a view")
    base = L.realize(x, wrapper=False, stride=eager)
    if base.offset or not layout.same(base.shape, base.stride, eager):
        # stored earlier in another layout (for an extern, say): a copy in eager's
        base = L.realize(Pointwise(x.shape, x.dtype, lambda k, idx: x.load(k, idx), 1),
                         wrapper=False, stride=eager)
    b = L.view_buffer(base, lambda t: t.as_strided(size, stride, storage_offset or 0))
    if b is None:
        raise Unsupported("as_strided")
    return b


# -- indexing with tensors ------------------------------------------------------------------
def _wrap(k, x, idx, size, error, negative=False):
    """A symbol for the run-time index loaded from `x`, checked to lie in [0, size) as
    eager checks it (`error`: eager's exception, and a message), after wrapping negative
    ones where eager accepts them (`negative`: x[idx])."""
    v = k.cast(x.load(k, bcast(idx, x.shape)), x.dtype, torch.int64)
    n = indexing.pexpr(sympy.sympify(size))
    if negative:
        v = k.op(f"tl.where({v} < 0, {v} + {n}, {v})")
    if config.check_indices:
        k.check(f"({v} >= 0) & ({v} < {n})", error)
    return k.indirect(v)


@register(aten.gather)
def _gather(L, node, x, dim, index, sparse_grad=False):
    shape, dtype = val_of(node)
    dim %= max(len(x.shape), 1)
    error = out_of_bounds("RuntimeError", dim, x.shape[dim] if x.shape else 1)

    def fn(k, idx):
        i = _wrap(k, index, idx, x.shape[dim] if x.shape else 1, error)
        return x.load(k, idx[:dim] + [i] + idx[dim + 1:])
    return logsumexp.realize_gather(L, node, pointwise(shape, dtype, fn, x, index))


@register(aten.index_select)
def _index_select(L, node, x, dim, index):
    shape, dtype = val_of(node)
    if not x.shape:
        # a 0-d tensor's one element (index_add's gradient of a 0-d source): eager takes an
        # index of one value, 0-d or of one element, and raises for another count, which
        # the meta function lets through (aten's kernel raises it)
        if not all(n == 1 for n in index.shape):
            raise Unsupported("index_select of a 0-d tensor by an index of other than one value")
        first = [indexing.Integer(0)] * len(index.shape)

        def element(k, idx):
            _wrap(k, index, first, 1, "IndexError: index out of range in self")
            return x.load(k, [])
        return logsumexp.realize_gather(L, node, pointwise(shape, dtype, element, x, index))
    dim %= len(x.shape)

    def fn(k, idx):
        i = _wrap(k, index, [idx[dim]], x.shape[dim], "IndexError: index out of range in self")
        return x.load(k, idx[:dim] + [i] + idx[dim + 1:])
    return logsumexp.realize_gather(L, node, pointwise(shape, dtype, fn, x, index))


@register(aten.index.Tensor)
def _index(L, node, x, indices):
    shape, dtype = val_of(node)
    used = [d for d, i in enumerate(indices) if i is not None]
    if any(not isinstance(indices[d], IRNode) or indices[d].dtype == torch.bool for d in used):
        raise Unsupported("boolean or constant index")
    # the indices' broadcast rank (the trace checked that they broadcast; torch's
    # broadcast_shapes cannot compare a size the data decides, u0, with 0)
    nb = max(len(indices[d].shape) for d in used)
    adjacent = used == list(range(used[0], used[-1] + 1))
    first = used[0] if adjacent else 0

    def fn(k, idx):
        bidx = idx[first:first + nb]
        rest = idx[:first] + idx[first + nb:]
        it = iter(rest)
        src = []
        for d in range(len(x.shape)):
            if d in used:
                src.append(_wrap(k, indices[d], bidx, x.shape[d],
                                 out_of_bounds("IndexError", d, x.shape[d]), negative=True))
            else:
                src.append(next(it))
        return x.load(k, src)
    return logsumexp.realize_gather(L, node, pointwise(shape, dtype, fn, x, *[indices[d] for d in used]))


@register(aten.cat)
def _cat(L, node, tensors, dim=0):
    shape, dtype = val_of(node)
    dim %= len(shape)
    parts, start = [], 0
    for t in tensors:
        if t.numel:
            parts.append((t, start, start + t.shape[dim]))
            start += t.shape[dim]

    starts = _int_starts(parts)

    def fn(k, idx):
        part = _static_part(parts, starts, idx[dim])
        if part is not None:
            # a constant position (torch.optim's stacked bias corrections, read one per
            # parameter): only its part is read, not a where over every part (a stack of
            # 148 scalars read 148 times made a GPT-2 step's compile quadratic)
            t, lo, _ = part
            sub = idx[:dim] + [idx[dim] - lo] + idx[dim + 1:]
            return k.cast(t.load(k, bcast(sub, t.shape)), t.dtype, dtype)
        i = k.index(idx[dim])
        out = None
        for n, (t, lo, hi) in enumerate(reversed(parts)):
            conds = ([f"({i} >= {indexing.pexpr(sympy.sympify(lo))})"] if lo != 0 else []) + \
                ([f"({i} < {indexing.pexpr(sympy.sympify(hi))})"] if hi != shape[dim] else [])
            cond = k.op(" & ".join(conds)) if conds else None
            sub = idx[:dim] + [idx[dim] - lo] + idx[dim + 1:]
            with k.masked(cond):
                v = k.cast(t.load(k, bcast(sub, t.shape)), t.dtype, dtype)
            out = v if out is None else k.op(f"tl.where({cond}, {v}, {out})")
        return out
    return pointwise(shape, dtype, fn, *[t for t, _, _ in parts])


def _int_starts(parts) -> list | None:
    """The parts' start positions as ints, or None when one is symbolic."""
    try:
        return [operator.index(sympy.Integer(lo)) for _, lo, _ in parts]
    except (TypeError, ValueError):
        return None


def _static_part(parts, starts, at):
    """The (tensor, lo, hi) of `parts` that holds position `at` when it is an integer
    (and the parts' `starts` are known), else None."""
    if starts is None or not (isinstance(at, int) or getattr(at, "is_Integer", False)):
        return None
    i = bisect.bisect_right(starts, int(at)) - 1
    return parts[i] if 0 <= i and int(at) < operator.index(sympy.Integer(parts[i][2])) else None


@register(aten.constant_pad_nd)
def _pad(L, node, x, pad, value=0):
    shape, dtype = val_of(node)
    n = len(shape)
    before = {n - 1 - j // 2: pad[j] for j in range(0, len(pad), 2)}

    def fn(k, idx):
        src, conds = list(idx), []
        for d, p in before.items():
            src[d] = idx[d] - p
            i = k.index(idx[d])
            end = sympy.sympify(p + x.shape[d])
            conds += ([f"({i} >= {p})"] if p > 0 else []) + \
                     ([f"({i} < {indexing.pexpr(end)})"] if end != shape[d] else [])
        if not conds:
            return k.cast(x.load(k, src), x.dtype, dtype)
        cond = k.op(" & ".join(conds))
        with k.masked(cond):
            v = k.cast(x.load(k, src), x.dtype, dtype)
        return k.op(f"tl.where({cond}, {v}, {k.literal(value, dtype)})")
    return pointwise(shape, dtype, fn, x)


# -- pooling ---------------------------------------------------------------------------------
def _pair(v, default):
    v = default if v is None or (isinstance(v, (list, tuple)) and len(v) == 0) else v
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


@register(aten.max_pool2d_with_indices)
def _max_pool2d(L, node, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Each output the max of its window, unrolled; the indices are a second value,
    computed only where something reads them (inference reads only the max).  The input
    is stored first (as Inductor does): windows overlap, so an inlined epilogue would be
    recomputed for each window that covers it."""
    (kh, kw), (dh, dw) = _pair(kernel_size, None), _pair(dilation, 1)
    (sh, sw), (ph, pw) = _pair(stride, [kh, kw]), _pair(padding, 0)
    vals = node.meta["val"]
    shape, dtype = shape_of(vals[0].shape), vals[0].dtype
    if not isinstance(x, IRNode) or len(x.shape) not in (3, 4) or \
            (not config.derived_sizes and any(is_symbolic(n) for n in x.shape)):
        raise Unsupported("max_pool2d")
    # (a symbolic height or width as Triton source, in parentheses: the kernel takes its
    # symbols; the output's size, a derived size, only bounds the kernel)
    H, W = (n if indexing.is_static(n) else f"({indexing.pexpr(sympy.sympify(n))})" for n in x.shape[-2:])
    cdt = compute_dtype(dtype)
    if isinstance(x, Pointwise):
        x = L.realize(x, wrapper=False)

    def bounds(k, idx):
        """Each window row's and column's in-bounds condition, once each (a tap's is its
        row's and its column's)."""
        oh, ow = k.index(idx[-2]), k.index(idx[-1])
        rows, cols = [], []
        for i in range(kh):
            ih_s = f"({oh} * {sh} + {i * dh - ph})"
            rows.append((ih_s, k.op(f"({ih_s} >= 0) & ({ih_s} < {H})")))
        for j in range(kw):
            iw_s = f"({ow} * {sw} + {j * dw - pw})"
            cols.append((iw_s, k.op(f"({iw_s} >= 0) & ({iw_s} < {W})")))
        return rows, cols

    def tap(k, idx, i, j, rows, cols, other=None):
        """(in-bounds condition, value) of window tap (i, j); `other`: what a tap in the
        padding loads (default 0)."""
        cond = k.op(f"{rows[i][1]} & {cols[j][1]}")
        ih, iw = idx[-2] * sh + (i * dh - ph), idx[-1] * sw + (j * dw - pw)
        with k.masked(cond, other=other):
            v = k.cast(x.load(k, list(idx[:-2]) + [ih, iw]), x.dtype, cdt)
        return cond, v

    lowest = float("-inf") if cdt.is_floating_point else torch.iinfo(cdt).min

    def window(k, idx, index=True):
        """(max, flat index into H*W) of the window of output `idx`; `index` False: the
        max alone (nothing reads the indices: inference), no index carried through the
        taps, nor the first-valid-tap test that only the index needs."""
        rows, cols = bounds(k, idx)
        if not index:
            return max_alone(k, idx, rows, cols), None
        best, arg = k.literal(lowest, cdt), "-1"
        for i in range(kh):
            for j in range(kw):
                cond, v = tap(k, idx, i, j, rows, cols)
                nan = f" | ({v} != {v})" if cdt.is_floating_point else ""
                first = f" | ({arg} < 0)" if index else ""
                take = k.op(f"{cond} & (({v} > {best}){nan}{first})")
                best = k.op(f"tl.where({take}, {v}, {best})")
                if index:
                    arg = k.op(f"tl.where({take}, {rows[i][0]} * {W} + {cols[j][0]}, {arg})")
        return best, arg

    def max_alone(k, idx, rows, cols):
        """The window's max: padding taps load the dtype's lowest value (-inf), which no tap
        loses to, so each tap is one compare and a select with no bounds in it (3x3 stride-2
        pooling on the H200: 204 us, against 242 testing each tap's bounds in its select;
        Inductor's 206).  NaN wins, as in eager: once the max is NaN no tap replaces it; a
        window of padding alone is -inf, as before."""
        other = 'float("-inf")' if x.dtype.is_floating_point else str(torch.iinfo(x.dtype).min)
        best = None
        for i in range(kh):
            for j in range(kw):
                _, v = tap(k, idx, i, j, rows, cols, other)
                if best is None:
                    best = v
                elif hardware_max:
                    best = _extreme(k, cdt, "maximum", best, v, True)
                else:
                    nan = f" | ({v} != {v})" if cdt.is_floating_point else ""
                    best = k.op(f"tl.where(({v} > {best}){nan}, {v}, {best})")
        return best

    hardware_max = config.pool_hardware_max and _on_cuda(L)

    indices_read = any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users)
    alone = config.pool_max_alone and not indices_read
    values = lambda k, idx: window(k, idx, index=not alone)[0]  # noqa: E731
    out = pointwise(shape, dtype, values, x)
    ind = pointwise(shape, torch.int64, lambda k, idx: k.cast(window(k, idx)[1], torch.int32, torch.int64), x)
    return [out, ind]


@register(aten.max_pool2d_with_indices_backward)
def _max_pool2d_backward(L, node, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each input element's gradient: the sum of the output gradients of the windows
    whose max it was (their saved flat index names it), over the few windows that can
    cover it, added in eager's order (output rows, then columns, ascending: eager adds
    each output's gradient into its max's slot in that order)."""
    (kh, kw), (dh, dw) = _pair(kernel_size, None), _pair(dilation, 1)
    (sh, sw), (ph, pw) = _pair(stride, [kh, kw]), _pair(padding, 0)
    shape, dtype = val_of(node)
    if (dh, dw) != (1, 1) or not isinstance(grad, IRNode) or not isinstance(indices, IRNode) or \
            any(is_symbolic(n) for n in (*shape, *grad.shape)) or len(shape) not in (3, 4):
        raise Unsupported("max_pool2d backward")
    H, W = shape[-2:]
    OH, OW = grad.shape[-2:]
    cdt = compute_dtype(dtype)
    grad, indices = (L.realize(t, wrapper=False) if isinstance(t, Pointwise) else t for t in (grad, indices))

    def fn(k, idx):
        h, w = k.index(idx[-2]), k.index(idx[-1])
        acc = k.literal(0, cdt)
        for i in reversed(range(-(-kh // sh))):
            oh = k.op(f"({h} + {ph}) // {sh} - {i}")
            for j in reversed(range(-(-kw // sw))):
                ow = k.op(f"({w} + {pw}) // {sw} - {j}")
                cond = k.op(f"({oh} >= 0) & ({oh} < {OH}) & ({ow} >= 0) & ({ow} < {OW}) & "
                            f"({h} + {ph} - {oh} * {sh} < {kh}) & ({w} + {pw} - {ow} * {sw} < {kw})")
                at = list(idx[:-2]) + [k.indirect(oh), k.indirect(ow)]
                with k.masked(cond):
                    g = k.cast(grad.load(k, at), grad.dtype, cdt)
                    arg = indices.load(k, at)
                hit = k.op(f"{cond} & ({arg} == {h} * {W} + {w})")
                acc = k.op(f"tl.where({hit}, {acc} + {g}, {acc})")
        return k.cast(acc, cdt, dtype)
    return pointwise(shape, dtype, fn, grad, indices)


# -- reductions -------------------------------------------------------------------------------
def _dims(x, dims):
    n = len(x.shape)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(n))
    dims = [dims] if isinstance(dims, int) else dims
    return sorted({d % max(n, 1) for d in dims})


def reduction(L, x, dims, keepdim, rtype, dtype, src_dtype=None, value=None):
    """A realized Reduction of `x` (or of `value(k, xindex)`, an index into x's shape),
    split in two when it has too few outputs for its length (splits.py), or reduced per
    row first when it reads a row reduction's per-row values (row_partials.py)."""
    r = reduction_node(x, dims, keepdim, rtype, dtype, src_dtype, value)
    k = row_partials.row_dims(L, x, _dims(x, dims), r)
    if k:
        lead = len(x.shape) - k
        part = L.computed(reduction_node(x, list(range(lead, len(x.shape))), False, rtype,
                                         row_partials.partial_dtype(r), r.src_dtype, value))
        r = row_partials.over_rows(r, part, x.shape[:lead], _dims(x, dims), keepdim)
    s = splits.count(L, r)
    return splits.split(L, r, s) if s > 1 else L.computed(r)


def reduction_node(x, dims, keepdim, rtype, dtype, src_dtype=None, value=None) -> Reduction:
    if not isinstance(x, IRNode):
        raise Unsupported("reduction of a number")
    dims = _dims(x, dims)
    n = len(x.shape)
    if 0 in x.shape:
        raise Unsupported("empty reduction")
    rshape = [x.shape[d] for d in dims]
    kept = [d for d in range(n) if d not in dims]
    shape = [1 if d in dims else x.shape[d] for d in range(n)] if keepdim else [x.shape[d] for d in kept]
    value = value or (lambda k, xi: x.load(k, xi))

    def fn(k, oidx, ridx):
        outer = iter([oidx[d] for d in kept] if keepdim else oidx)
        inner = iter(ridx)
        return value(k, [next(inner) if d in dims else next(outer) for d in range(n)])
    return Reduction(shape, dtype, rshape, rtype, fn, src_dtype or x.dtype)


@register(aten.sum.dim_IntList, aten.sum.default, prims.sum)
def _sum(L, node, x, dims=None, keepdim=False, dtype=None, **kwargs):
    _, out = val_of(node)
    found = logsumexp.lower_sum(L, node)
    if found is None:
        return reduction(L, x, dims, keepdim, "sum", out)
    s, summed = found
    return s if keepdim else _squeezed(L, s, node.meta["val"], summed)


@register(aten.prod.dim_int, aten.prod.default)
def _prod(L, node, x, *args, **kwargs):
    raise Unsupported("prod")


def _scale(L, node, r, factor):
    """r * factor, a float or (symbolic) ("div", n): r / n."""
    shape, dtype = val_of(node)
    if isinstance(factor, tuple):
        n = factor[1]
        return pointwise(shape, dtype, lambda k, idx: k.op(
            f"{r.load(k, idx)} / {operand(k, n, idx, torch.float32)}"), r)
    # (k.literal: a factor of inf, a variance over one element, is `float("inf")`)
    return pointwise(shape, dtype, lambda k, idx: k.op(f"{r.load(k, idx)} * {k.literal(factor, torch.float32)}"), r)


def _inverse(n):
    """1 / n as a factor for `_scale`."""
    return ("div", n) if is_symbolic(n) else 1.0 / n


@register(aten.mean.dim, aten.mean.default)
def _mean(L, node, x, dims=None, keepdim=False, dtype=None):
    _, out = val_of(node)
    dims = _dims(x, dims)
    # (the sum is no output but the mean's numerator, kept in its accumulator's dtype, as
    # eager's: stored in half precision, for a kernel that reads it (a scan of the means),
    # 4 x 1000 fp16 values about 1000 summed to inf)
    s = reduction(L, x, dims, keepdim, "sum", compute_dtype(out))
    return _scale(L, node, s, _inverse(math.prod(x.shape[d] for d in dims)))


def _var(L, node, x, dims, correction, keepdim):
    """The centred sum of squares and the sum of x, in one kernel: two passes over a row
    in registers, one (Welford's) over a looped row (ir.CentredSq)."""
    if not x.dtype.is_floating_point:
        # eager's kernels refuse integer and bool inputs ("std and var only support floating
        # point and complex dtypes"), which aten.var's meta function lets through: the aten
        # call raises as eager does, where a kernel would have computed a variance
        raise Unsupported(f"the variance of {x.dtype}")
    dims = _dims(x, dims)
    n = math.prod(x.shape[d] for d in dims)
    # (the sum and the centred sum of squares are intermediates, in their accumulator's
    # dtype as in eager: float32 for half inputs, which either could overflow when stored
    # for another kernel, the sum of 1000 values about 1000, M2 of 1000 values of spread 10)
    dtype = compute_dtype(x.dtype)
    total = reduction_node(x, dims, True, "sum", dtype)
    chunks = splits.count(L, total, in_registers=True)
    if chunks > 1:
        shape = [1 if d in dims else x.shape[d] for d in range(len(x.shape))] if keepdim else \
            [x.shape[d] for d in range(len(x.shape)) if d not in dims]

        def keep_index(oidx):
            it = iter(oidx)
            return [indexing.Integer(0) if d in dims else next(it) for d in range(len(x.shape))]
        sq, mean = splits.split_var(L, total, chunks, shape, (lambda i: i) if keepdim else keep_index)
        return sq, mean, *_var_factors(n, correction)
    mean = L.computed(total)

    def centred_sq(k, xi):
        s = mean.load(k, [indexing.Integer(0) if d in dims else i for d, i in enumerate(xi)])
        m = k.op(f"{s} / {operand(k, n, xi, torch.float32)}" if is_symbolic(n) else f"{s} * {1.0 / n!r}")
        c = k.op(f"{k.cast(x.load(k, xi), x.dtype, dtype)} - {m}")
        return k.op(f"{c} * {c}")
    r = reduction_node(x, dims, keepdim, "sum", dtype, src_dtype=dtype, value=centred_sq)
    sq = L.computed(CentredSq(r.shape, r.dtype, r.rshape, r.fn, r.src_dtype, mean))
    return sq, mean, *_var_factors(n, correction)


def _var_factors(n, correction):
    """The factors turning a centred sum of squares into the variance, a sum into the mean."""
    if is_symbolic(n):
        c = 1 if correction is None else correction
        if c != int(c):
            raise Unsupported(f"a correction of {c} with a symbolic element count")
        # (int: aten.var.correction's Scalar is a float 1.0, and s0 - 1.0 is no index)
        denom = n - int(c)  # 0: x / 0, as torch
        return ("div", denom), ("div", n)
    denom = max(n - (1 if correction is None else correction), 0)
    return (1.0 / denom if denom else float("inf")), 1.0 / n


@register(aten.var.correction, aten.var.dim)
def _var_op(L, node, x, dims=None, *args, correction=None, keepdim=False):
    if node.target is aten.var.dim:
        unbiased, keepdim = (args + (True, False))[:2]
        correction = 1 if unbiased else 0
    sq, _, f, _ = _var(L, node, x, dims, correction, keepdim)
    return _scale(L, node, sq, f)


@register(aten.var_mean.correction)
def _var_mean(L, node, x, dims=None, *, correction=None, keepdim=False):
    sq, mean, f, inv_n = _var(L, node, x, dims, correction, keepdim)
    var_val, mean_val = node.meta["val"]
    var = _scale(L, _Sub(var_val), sq, f)
    m = mean if keepdim else _squeezed(L, mean, mean_val, _dims(x, dims))
    return var, _scale(L, _Sub(mean_val), m, inv_n)


def _squeezed(L, x, val, dims):
    return _squeeze(L, _Sub(val), x, dims)


@register(aten.amax, aten.amin)
def _amax(L, node, x, dims=(), keepdim=False):
    _, out = val_of(node)
    return reduction(L, x, dims, keepdim, "max" if node.target is aten.amax.default else "min", out)


@register(aten.max.default, aten.min.default)
def _max_all(L, node, x):
    _, out = val_of(node)
    return reduction(L, x, None, False, "max" if node.target is aten.max.default else "min", out)


@register(aten.max.dim, aten.min.dim)
def _max_dim(L, node, x, dim, keepdim=False):
    vals = node.meta["val"]
    kind = "max" if node.target is aten.max.dim else "min"
    return (reduction(L, x, [dim], keepdim, kind, vals[0].dtype),
            reduction(L, x, [dim], keepdim, "arg" + kind, torch.int64))


@register(aten.argmax, aten.argmin)
def _argmax(L, node, x, dim=None, keepdim=False):
    kind = "argmax" if node.target is aten.argmax.default else "argmin"
    if dim is None:
        if keepdim:
            raise Unsupported("argmax without dim, keepdim")
        flat = pointwise((x.numel,), x.dtype, lambda k, idx: x.load(k, unflatten(idx[0], x.shape)), x)
        return reduction(L, flat, [0], False, kind, torch.int64)
    return reduction(L, x, [dim], keepdim, kind, torch.int64)


@register(aten.any.dim, aten.any.dims, aten.any.default)
def _any(L, node, x, dims=None, keepdim=False):
    return reduction(L, x, dims, keepdim, "any", torch.bool)



# -- scans ------------------------------------------------------------------------------------
def _scan_input(x, shape, dim, acc):
    """(dim, fn giving x in `acc`); dim None when rows have one element (no scan)."""
    if not isinstance(x, IRNode):
        raise Unsupported("scan of a number")
    if 0 in shape:
        raise Unsupported("empty scan")

    def value(k, idx):
        return k.cast(x.load(k, idx), x.dtype, acc)
    if not shape or shape[dim % len(shape)] == 1:
        return None, value
    dim %= len(shape)
    r, rows = shape[dim], math.prod(n for d, n in enumerate(shape) if d != dim)
    if rows == 1 and not (indexing.is_static(r) and autotune.is_persistent(r)):
        # one row too long for a block would be walked by one program, chunk after chunk:
        # aten's device-wide scan is far faster
        raise Unsupported("a scan of one long row")
    return dim, value


def scan(L, node, x, dim, stype):
    """A realized Scan of `x` along `dim`, accumulated in the output's compute dtype
    (float32 for half outputs; int64 when torch promotes an integer cumsum)."""
    shape, dtype = val_of(node)
    acc = compute_dtype(dtype)
    if acc == torch.bool or (stype == "logaddexp" and not acc.is_floating_point):
        raise Unsupported(f"a {stype} scan to {dtype}")
    dim, value = _scan_input(x, shape, dim, acc)
    if dim is None:  # one element a row: the input itself
        return pointwise(shape, dtype, value, x)
    return L.computed(Scan(shape, dtype, dim, stype, value))


@register(aten.cumsum.default)
def _cumsum(L, node, x, dim, dtype=None):
    return scan(L, node, x, dim, "sum")


@register(aten.cumprod.default)
def _cumprod(L, node, x, dim, dtype=None):
    return scan(L, node, x, dim, "prod")


@register(aten.logcumsumexp.default)
def _logcumsumexp(L, node, x, dim):
    return scan(L, node, x, dim, "logaddexp")


@register(aten.cummax.default, aten.cummin.default)
def _cummax(L, node, x, dim):
    """Values and indices: two scans of one input, which a kernel computing both scans
    as one (value, index) `tl.associative_scan`."""
    kind = "max" if node.target is aten.cummax.default else "min"
    vals, _ = node.meta["val"]
    shape, dtype = shape_of(vals.shape), vals.dtype
    if dtype == torch.bool or dtype.is_complex:
        raise Unsupported(f"cum{kind} of {dtype}")
    dim, value = _scan_input(x, shape, dim, compute_dtype(dtype))
    if dim is None:
        return (pointwise(shape, dtype, value, x),
                pointwise(shape, torch.int64, lambda k, idx: k.literal(0, torch.int64)))
    return (L.computed(Scan(shape, dtype, dim, kind, value)),
            L.computed(Scan(shape, torch.int64, dim, "arg" + kind, value, src_dtype=dtype)))
