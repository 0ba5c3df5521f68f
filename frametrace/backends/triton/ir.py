"""The loop-level IR the lowering builds and the scheduler and code generator consume.

Values are lazy: a `Pointwise` is a function from an output index to a value, written
into whichever kernel loads it; it costs nothing until something `realize`s it.  Realized
values are `Computed` (a pointwise or reduction node that a kernel evaluates, and writes
to memory when something outside that kernel reads it), or `Buffer`s (memory: graph
inputs, constants, extern outputs, strided views of those).  `Extern` calls stay aten.
"""
from __future__ import annotations

import math

import torch

from . import indexing


class Unsupported(Exception):
    """An op, a dtype or a shape the lowering does not handle: the op runs as aten."""


def contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1) if indexing.is_static(size) else size
    return tuple(reversed(strides))


class IRNode:
    __slots__ = ("shape", "dtype")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Buffer(IRNode):
    """Memory: the tensor named `name` in the wrapper, read with `stride` and `offset`
    (elements, relative to that tensor's first one).  A view of a buffer is a Buffer of
    the same name with other strides (`is_view`)."""
    __slots__ = ("name", "stride", "offset", "device", "is_view")

    def __init__(self, name, shape, stride, dtype, device, offset=0, is_view=False):
        self.name, self.shape, self.stride = name, tuple(shape), tuple(stride)
        self.dtype, self.device, self.offset, self.is_view = dtype, device, offset, is_view

    def index(self, idx):
        return _buffer_index(self.offset, self.stride, self.shape, tuple(idx))

    def load(self, k, idx):
        return k.load(self, self.index(idx))

    @property
    def symbolic(self) -> bool:
        return not all(indexing.is_static(v) for v in self.shape + self.stride + (self.offset,))

    def meta(self):
        """A meta tensor with this buffer's layout, to compute the layout of a view (None
        for symbolic sizes: views of those are index maps)."""
        if self.symbolic:
            return None
        span = 1 + self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride) if n)
        base = torch.empty(span, dtype=self.dtype, device="meta")
        return base.as_strided(self.shape, self.stride, self.offset)

    def __repr__(self):
        return f"Buffer({self.name}, {self.shape}, {self.stride}, {self.dtype})"


@indexing.memoized
def _buffer_index(offset, stride, shape, idx):
    """The element offset of index `idx` in a buffer of this layout."""
    # (one Add of all the terms: a running sum rebuilt, flattened and sorted a growing Add
    # for each term, quadratic in the dims; the canonical Add is the same either way)
    return indexing.simplify(offset + indexing.Add(
        indexing.Integer(0), *(i * s for i, s, n in zip(idx, stride, shape) if n != 1)))


class Pointwise(IRNode):
    """`fn(kernel, index) -> value`.  `reads` counts the memory loads it inlines (to
    decide when recomputing it in every consumer costs more than storing it once).
    `alias` is (base, view_fn) when it is a view of something that memory can hold."""
    __slots__ = ("fn", "reads", "alias", "realized", "stride")

    def __init__(self, shape, dtype, fn, reads, alias=None):
        self.shape, self.dtype, self.fn, self.reads = tuple(shape), dtype, fn, reads
        self.alias, self.realized = alias, None
        self.stride = None  # the strides the op asked for (a copy's memory_format)

    def load(self, k, idx):
        if self.realized is not None:
            return self.realized.load(k, idx)
        return self.fn(k, idx)


class Reduction(IRNode):
    """Reduces `fn(kernel, index, rindex)` over `rshape` for each output `index`, with
    `rtype` in sum, prod, max, min, any, argmax, argmin."""
    __slots__ = ("rshape", "rtype", "fn", "src_dtype")

    def __init__(self, shape, dtype, rshape, rtype, fn, src_dtype):
        self.shape, self.dtype, self.rshape = tuple(shape), dtype, tuple(rshape)
        self.rtype, self.fn, self.src_dtype = rtype, fn, src_dtype

    @property
    def rnumel(self) -> int:
        return math.prod(self.rshape)


class ExpSum(Reduction):
    """A "sum" of `fn` = exp(row - shift), where the per-row `shift(kernel, index)` is
    computed from the row's max (`max`: that max's Computed, or None): softmax,
    log_softmax, logsumexp.  `row(kernel, index, rindex)` is the row in `row_dtype`.
    A looped row is read once (an online max whose running sum is rescaled) instead of
    once for the max and once for the sum."""
    __slots__ = ("row", "row_dtype", "shift", "max")

    def __init__(self, shape, dtype, rshape, fn, src_dtype, row, row_dtype, shift, max):
        super().__init__(shape, dtype, rshape, "sum", fn, src_dtype)
        self.row, self.row_dtype, self.shift, self.max = row, row_dtype, shift, max


class CentredSq(Reduction):
    """A variance's centred sum of squares: a "sum" of `fn` = (x - mean)^2, where `mean`
    is the Computed sum of x over the same rows (kept dims; its Reduction's `fn` is the
    row of x) that `fn` reads, divided by the row's length.  A looped row is read once
    (config.welford: Welford's running mean and M2 per lane, the sum for the mean beside
    them) instead of once for the sum and again for the squares."""
    __slots__ = ("mean",)

    def __init__(self, shape, dtype, rshape, fn, src_dtype, mean):
        super().__init__(shape, dtype, rshape, "sum", fn, src_dtype)
        self.mean = mean


class Scan(IRNode):
    """The inclusive scan of `fn(kernel, index)` along `dim` (the value at each index of
    the output, which has the input's shape), with `stype` in sum, prod, logaddexp, max,
    min (the running extreme) and argmax, argmin (its index); `fn` gives `src_dtype`.  Its
    kernel runs over rows along `dim` like a reduction: xnumel rows of rnumel."""
    __slots__ = ("dim", "stype", "fn", "src_dtype")

    def __init__(self, shape, dtype, dim, stype, fn, src_dtype=None):
        self.shape, self.dtype, self.dim, self.stype, self.fn = tuple(shape), dtype, dim, stype, fn
        self.src_dtype = dtype if src_dtype is None else src_dtype

    @property
    def rnumel(self):
        return self.shape[self.dim]

    @property
    def xnumel(self):
        return math.prod(n for d, n in enumerate(self.shape) if d != self.dim)


class Computed(IRNode):
    """A realized pointwise, reduction or scan node, `name`d buffer when stored.  A pointwise
    node may be stored with other dense strides (`fill`: its dimensions of size > 1,
    outermost first; None when row-major): its kernel then walks memory in that order."""
    __slots__ = ("name", "node", "buffer", "order", "fill")

    def __init__(self, name, node, device, order, stride=None):
        self.name, self.node, self.shape, self.dtype = name, node, node.shape, node.dtype
        self.order = order  # position in program order: kernels launched before read it
        self.fill = None
        if stride is None:
            stride = contiguous_strides(node.shape)
        else:
            stride = tuple(stride)
            dims = [i for i, n in enumerate(node.shape) if n != 1]
            # (symbolic strides: ordered by their size hints)
            fill = sorted(dims, key=lambda i: -indexing.hint(stride[i]))
            self.fill = None if fill == dims else tuple(fill)
        self.buffer = Buffer(name, node.shape, stride, node.dtype, device)

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.node, Reduction)

    @property
    def is_scan(self) -> bool:
        return isinstance(self.node, Scan)

    def load(self, k, idx):
        return k.computed(self, idx)

    def __repr__(self):
        return f"Computed({self.name}, {type(self.node).__name__}, {self.shape})"


class Extern:
    """An aten call in the wrapper: `op(*args, **kwargs)`, its tensors as Buffers;
    `outputs` mirrors what it returns (Buffers where tensors are).  `graph_op`: the
    graph's op, where `op` is its in-place twin writing a buffer of this graph.  `exact`:
    the positions of arguments passed with eager's layout, never adjusted for the op."""
    __slots__ = ("op", "args", "kwargs", "outputs", "name", "graph_op", "exact", "binds")

    def __init__(self, name, op, args, kwargs, outputs, graph_op=None, exact=frozenset()):
        self.name, self.op, self.args, self.kwargs, self.outputs = name, op, args, kwargs, outputs
        self.graph_op = op if graph_op is None else graph_op
        self.exact = exact
        # sizes the data decides that this call makes: symbol -> (name, path, dim)
        # (`GraphLowering.bind_late`), read by the wrapper right after the call
        self.binds: dict = {}

    def reads(self) -> set:
        """The names of the buffers (or of the bases of views) it is called on."""
        names, stack = set(), [self.args, self.kwargs]
        while stack:
            a = stack.pop()
            if isinstance(a, (list, tuple)):
                stack += list(a)
            elif isinstance(a, dict):
                stack += list(a.values())
            elif isinstance(a, Buffer):
                names.add(a.name)
        return names

    @property
    def may_alias(self) -> bool:
        """Whether what it returns may share an argument's memory (a view, `self`): not
        known of a callable that is not an aten op."""
        schema = getattr(self.op, "_schema", None)
        return schema is None or any(r.alias_info is not None for r in schema.returns)


class GraphObject:
    """A graph input that is no tensor nor number: a torch.Generator (AOTAutograd's
    graph-safe RNG state).  Kernels never read it; the wrapper passes its variable `name`
    to the calls that take it (graphsafe_run_with_rng_state), so each call gets the
    object of that call, not the example's.  `example`: the compile's object (for fake
    runs of those calls)."""
    __slots__ = ("name", "example")

    def __init__(self, name, example):
        self.name, self.example = name, example

    def __repr__(self):
        return f"GraphObject({self.name}: {type(self.example).__name__})"


class HostScalar(IRNode):
    """One float of host memory read by kernels on the GPU: the wrapper reads it once per
    call into its variable `name` (a Python float, as eager reads a CPU scalar tensor that
    meets a CUDA one), and kernels take it as an fp32 argument, not a pointer."""
    __slots__ = ("name",)

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype

    def load(self, k, idx):
        return k.op(k.arg(self.name, "ks"), level=0)
