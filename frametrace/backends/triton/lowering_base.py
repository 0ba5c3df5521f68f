"""What every lowering builds on, below ops.py and the modules that lower beside it
(grad_ops, logsumexp, rng, foreach, splits) and the kernel source generator: the lowering
registry, the dtype a kernel computes in, an FX node's shape and dtype, broadcasting of an
index, and making a `Pointwise`.  It imports no other lowering module, so that those can
import it without importing each other."""
from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import Max as TorchMax

from . import config, indexing
from .ir import IRNode, Pointwise, Unsupported

LOWERINGS: dict = {}


def register(*ops):
    def deco(fn):
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS.setdefault(getattr(op, name), fn)
            else:
                LOWERINGS[op] = fn
        return fn
    return deco


def compute_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def val_of(node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{node.target} returns {type(val).__name__}")
    if val.is_complex():
        raise Unsupported("complex")
    return shape_of(val.shape), val.dtype


def shape_of(sizes) -> tuple:
    try:
        return tuple(indexing.sym(n) for n in sizes)
    except ValueError as e:
        raise Unsupported(str(e)) from None


def is_symbolic(v) -> bool:
    return isinstance(v, sympy.Basic) and not v.is_number


def out_of_bounds(exc, dim, size) -> str:
    """An index check's message, as eager words it; a symbolic size is left out (the
    message is written when the kernel is, and would name the symbol, not the size)."""
    at = "" if is_symbolic(size) else f" with size {size}"
    return f"{exc}: index out of bounds for dimension {dim}{at}"


def reads_of(x) -> int:
    if isinstance(x, Pointwise):
        return 1 if x.realized is not None else x.reads
    return 1 if isinstance(x, IRNode) else 0


def bcast(idx, shape):
    """The index into a tensor of `shape` broadcast to the output index `idx`."""
    idx = idx[len(idx) - len(shape):]
    return [indexing.Integer(0) if n == 1 else i for i, n in zip(idx, shape)]


def operand(k, x, idx, dtype):
    if isinstance(x, IRNode):
        return k.cast(x.load(k, bcast(idx, x.shape)), x.dtype, dtype)
    if is_symbolic(x):  # a size: the kernel's int arguments
        return k.cast(k.op(indexing.pexpr(x), level=0), torch.int64, dtype)
    return k.literal(x, dtype)


# an input of at most 1/_BROADCAST_REUSE of a pointwise value's elements (per-row
# statistics, a bias) is read from cache when the value is computed again: not a load
# counted against recomputing it (a log_softmax's output, its row max and log-sum read
# beside the row, is recomputed by a second reader from the row instead of stored and
# loaded again)
_BROADCAST_REUSE = 8


def _numel(shape):
    n = 1
    for s in shape:
        if not isinstance(s, int):
            return None
        n *= s
    return n


def pointwise(shape, dtype, fn, *inputs, alias=None):
    out = _numel(shape) if config.broadcast_reads_cached else None

    def counted(x):
        if out is not None and isinstance(x, IRNode):
            n = _numel(x.shape)
            if n is not None and n * _BROADCAST_REUSE <= out:
                return 0
        return reads_of(x)
    return Pointwise(shape, dtype, fn, sum(counted(x) for x in inputs), alias)


def slice_bounds(size, start, end, step):
    if is_symbolic(size) or is_symbolic(start) or is_symbolic(end):
        # symbolic: from a non-negative start to the end (or to a symbolic end), only
        start = 0 if start is None else start
        if end is None or (isinstance(end, int) and end >= 2 ** 62):
            end = size
        if is_symbolic(start) or start < 0 or (isinstance(end, int) and end < 0) or step != 1:
            raise Unsupported("a slice of a symbolic size")
        return start, end
    start, end, _ = slice(start, end, step).indices(size)
    return start, max(end, start)


def slice_start(L, size, start, step):
    """Where a slice of a symbolic size (or with symbolic bounds) starts: its index map
    needs no end (the traced value's size, a derived size, says how many elements it
    has).  A start past the end makes it empty; a negative one (an int, or a symbolic
    one provably <= 0: x[-(n // 2):]) counts from the end, Max(0, size + start), a
    derived size."""
    if not isinstance(step, int) or step < 1:
        raise Unsupported("a slice with a symbolic step")
    if start is None:
        return 0
    if is_symbolic(start):
        if indexing.le(0, start):
            return start
        if not indexing.le(start, 0):
            raise Unsupported("a slice from a symbolic position that may be either sign")
    elif start >= 0:
        return start
    elif not is_symbolic(size):
        return max(size + start, 0)
    return L.size(TorchMax(sympy.Integer(0), sympy.sympify(size) + start))
