"""The memory layout of a stored pointwise value.  It follows the value's dominant input,
as eager's TensorIterator does: the epilogue of a channels-last convolution is stored
channels-last, so that its kernel reads and writes memory in the same order (both
contiguous) and the next convolution gets the layout it returned, with no copy.  Graph
outputs take eager's strides instead (a caller may test `is_contiguous(memory_format=)`).
"""
from __future__ import annotations

import contextlib
import operator

import sympy
import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode

from . import config, context, indexing


class _Reads:
    """Stands in for a kernel while a pointwise function runs: records each buffer it
    loads with the load's index, over one symbol per output dimension."""
    __slots__ = ("reads", "_n")

    def __init__(self):
        self.reads, self._n = [], 0

    def _var(self, *_, **__) -> str:
        self._n += 1
        return f"tmp{self._n}"

    op = index = _var

    def load(self, buf, index, reduction=False):
        self.reads.append((index, reduction))
        return self._var()

    def computed(self, c, idx):
        return self.load(c.buffer, c.buffer.index(idx), c.is_reduction)

    def cast(self, v, src, dst):
        return v

    def literal(self, value, dtype):
        return repr(value)

    def indirect(self, var):
        return sympy.Symbol(var, integer=True)

    def check(self, cond, msg):
        pass

    @staticmethod
    def tl(dtype):
        return "tl.float32"

    @contextlib.contextmanager
    def masked(self, cond, other=None):
        # (`other`: as KernelCodegen.masked takes it; max pooling's padding taps load -inf.
        # A TypeError here made `preferred` give up: the pooling stored row-major)
        yield


def _static(shape) -> bool:
    return all(indexing.is_static(n) for n in shape)


def static_strides(t) -> tuple | None:
    """A traced tensor's strides as ints, or None where one is symbolic.  A SymInt whose
    expression is a constant (a graph AOTAutograd traced with symbolic sizes that
    specialized them: a training forward's outputs) counts as its int."""
    try:
        stride = tuple(indexing.sym(n) for n in t.stride())
    except ValueError:
        return None
    return tuple(int(n) for n in stride) if _static(stride) else None


def dense(shape, stride) -> bool:
    """Whether `stride` lays `shape` out densely (a permutation of a contiguous layout)."""
    dims = sorted((i for i, n in enumerate(shape) if n != 1), key=lambda i: stride[i])
    step = 1
    for i in dims:
        if stride[i] != step:
            return False
        step *= shape[i]
    return True


def same(shape, a, b) -> bool:
    """The same layout: equal strides wherever the size is not 1."""
    return all(x == y for n, x, y in zip(shape, a, b) if n != 1)


def strides_in_order(shape, order) -> tuple:
    """Dense strides with the dimensions of size > 1 nested as in `order` (outermost first)."""
    stride, step = [0] * len(shape), 1
    for i in reversed(order):
        stride[i] = step
        step *= shape[i]
    for i, n in enumerate(shape):
        if n == 1:
            stride[i] = step
    return tuple(stride)


def fill_order(shape, stride) -> tuple | None:
    """The dimensions of size > 1, outermost first, or None where that order is the
    row-major one (then the layout is contiguous for what any index can tell)."""
    dims = [i for i, n in enumerate(shape) if n != 1]
    order = sorted(dims, key=lambda i: (-stride[i], i))
    return None if order == dims else tuple(order)


def _steps(index, dims, shape) -> list | None:
    """How far the load moves in memory per step along each output dimension."""
    zero = {d: sympy.Integer(0) for d in dims}
    try:
        index = sympy.sympify(index)
        # (xreplace: the dims are plain symbols, replaced structurally; the index's
        # FloorDiv/ModIdx evaluate as they are rebuilt.  subs' search for patterns took
        # most of a CNN's lowering time)
        base = index.xreplace(zero)
        steps = [index.xreplace({**zero, d: sympy.Integer(1)}) - base if n != 1 else sympy.Integer(0)
                 for d, n in zip(dims, shape)]
    except Exception:
        return None
    return [abs(int(s)) for s in steps] if all(s.is_Integer for s in steps) else None


def preferred(node) -> tuple | None:
    """Strides for storing the Pointwise `node`: the dimension order of its first input
    that varies along every output dimension (not broadcast), when that order is not
    row-major; else None (row-major)."""
    shape = node.shape
    if not _static(shape) or len(shape) < 2:
        return None
    dims = [sympy.Symbol(f"_d{i}", integer=True, nonnegative=True) for i in range(len(shape))]
    ctx = context.current()
    saved = ctx.ranges
    rec = _Reads()
    try:
        ctx.ranges = {**saved, **{d: n for d, n in zip(dims, shape)}}
        node.fn(rec, dims)
    except Exception:  # an op the recorder cannot stand in for: row-major, as before
        return None
    finally:
        ctx.ranges = saved
    big = [i for i, n in enumerate(shape) if n != 1]
    reads = [(_steps(index, dims, shape), reduction) for index, reduction in rec.reads]
    reads = [(steps, [i for i in big if steps[i] == 0], reduction)  # (broadcast dims)
             for steps, reduction in reads if steps is not None]
    if any(red and flat and big[len(big) - len(flat):] == flat for _, flat, red in reads):
        # `x - mean` over the innermost dimensions: row-major, it shares the
        # reduction's kernel (whose rows are row-major)
        return None
    for steps, flat, _ in reads:
        if flat or len({steps[i] for i in big}) < len(big):
            continue  # broadcast, or two dimensions at one stride: no order to follow
        order = fill_order(shape, steps)
        return None if order is None else strides_in_order(shape, order)
    return None


# -- the layouts of the values a training forward saves for its backward --------------
# GraphModule.meta keys: the forward's (how many of its outputs are the user's, and the
# dict its lowering fills with the layout it stored each saved value in, by FX name) and
# the backward's (that same dict, read when the backward is built)
SAVED_FROM, SAVED_LAYOUTS = "frametrace_saved_from", "frametrace_saved_layouts"


def link_saved_layouts(fw, bw, num_fwd_outputs: int) -> None:
    """Let the forward's lowering choose the layouts of the values it saves and tell the
    backward's (config.saved_values_own_layout): a backward placeholder is named as the
    forward output it receives (AOTAutograd's split keeps the joint graph's names).  A
    value the backward reads through its storage (`as_strided`...) keeps eager's."""
    layouts: dict = {}
    pinned = frozenset(n.name for n in bw.graph.nodes if n.op == "placeholder" and reads_storage(n))
    fw.meta[SAVED_FROM] = (num_fwd_outputs, layouts, pinned)
    bw.meta[SAVED_LAYOUTS] = layouts


# Ops whose result depends on how their operand is laid out in memory, not only on its
# values: an operand of theirs must have eager's strides (as_strided addresses storage, a
# dtype view of another element size needs a dense last dim).  Ops outside aten and prims
# (a custom op, a higher-order op) count among them: their layout contract is unknown.
_STORAGE_READS = {"as_strided", "as_strided_", "as_strided_scatter", "as_strided_copy", "_reshape_alias",
                  "set_", "view_as_real", "view_as_complex"}
_THROUGH_VIEWS = {"view", "_unsafe_view", "reshape", "expand", "permute", "t", "transpose", "unsqueeze",
                  "squeeze", "alias", "detach", "slice", "select", "split", "split_with_sizes", "unbind",
                  "narrow", "flatten", "unflatten"}


def reads_storage(node, depth=0) -> bool:
    """Whether some user of `node` (or of a view of it) reads its memory layout."""
    for u in node.users:
        if u.op == "output":
            continue
        if u.op != "call_function":
            return True
        target = u.target
        if target is operator.getitem:
            if depth < 8 and reads_storage(u, depth + 1):
                return True
            continue
        packet = getattr(target, "overloadpacket", None)
        name = getattr(packet, "__name__", None)
        if packet is None or getattr(target, "namespace", None) not in ("aten", "prims"):
            return True
        if name in _STORAGE_READS or (target is torch.ops.aten.view.dtype):
            return True
        if name in _THROUGH_VIEWS and depth < 8 and reads_storage(u, depth + 1):
            return True
    return False


def saved_only(gm):
    """(the forward's output nodes only its backward reads, the dict their layouts go
    in), or (empty, None) where the layouts are eager's: not a linked training forward,
    or the switch off.  A value either graph reads through its storage is not one."""
    linked = gm.meta.get(SAVED_FROM)
    if linked is None or not config.saved_values_own_layout:
        return frozenset(), None
    n, layouts, pinned = linked
    outs = next(node for node in reversed(gm.graph.nodes) if node.op == "output").args[0]
    users = set(outs[:n])
    return frozenset(x for x in outs[n:] if isinstance(x, torch.fx.Node) and x not in users
                     and x.name not in pinned and not reads_storage(x)), layouts


def backward_examples(gm, example_inputs) -> list:
    """A backward's examples with the strides its forward stored the saved values in
    (recorded by the forward's lowering; fake stand-ins), so that it is built once for
    the layouts it will read.  Unchanged where nothing was recorded or sizes differ."""
    layouts = gm.meta.get(SAVED_LAYOUTS)
    if not layouts:
        return example_inputs
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out, mode = list(example_inputs), None
    for i, (node, ex) in enumerate(zip(placeholders, example_inputs)):
        got = layouts.get(node.name)
        if got is None or not isinstance(ex, torch.Tensor) or not _static(ex.shape) or \
                tuple(ex.shape) != got[0] or same(got[0], tuple(ex.stride()), got[1]):
            continue
        if mode is None:   # (fake: a stand-in allocates nothing)
            mode = detect_fake_mode(example_inputs) or FakeTensorMode()
        with mode:
            out[i] = torch.empty_strided(got[0], got[1], dtype=ex.dtype, device=ex.device)
    return out


# relative time of a conv kind in channels-last (Inductor's measured multipliers):
# grouped convs with several channels a group run slower, the others faster
_CL_COST = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}


def convs_prefer_channels_last(gm, device) -> bool:
    """Whether this graph's convolutions (or their backwards) should take channels-last
    operands."""
    setting = config.channels_last_convs
    if setting != "auto":
        return bool(setting)
    if device.type != "cuda":
        return False
    aten = torch.ops.aten
    # (a backward's convolution_backward(grad_output, input, weight, ..., groups, mask):
    # weighed as the convolution whose gradient it is)
    convs = [n for n in gm.graph.nodes if n.target in (aten.convolution.default, aten.convolution_backward.default)]
    total = weighted = 0.0
    for n in convs:
        forward = n.target is aten.convolution.default
        x, w, out = (n.args[0], n.args[1], n) if forward else (n.args[1], n.args[2], n.args[0])
        x, w, out = (t.meta.get("val") if isinstance(t, torch.fx.Node) else None for t in (x, w, out))
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and _static(t.shape) for t in (x, w, out)):
            return False
        cout, cin_g, kh, kw = w.shape
        flops = 2.0 * out.numel() * cin_g * kh * kw
        groups = n.args[8] if forward else n.args[9]
        kind = ("grouped" if groups > 1 and cin_g > 1 else
                "small" if cout <= 64 and cin_g <= 64 else
                "in_out" if cout * 2 <= cin_g and kh > 1 else "default")
        total += flops
        weighted += flops * _CL_COST[kind]
    return bool(convs) and weighted < total


# Attention kernels (cuDNN, memory-efficient, flash) reject an operand whose strides are
# not multiples of 8 elements, even a size-1 dim's ("attn_bias is not correctly aligned
# (strideH)"; ATen's preprocess_mask pads masks to 8): eager's expanded masks pass, a mask
# our kernel stores densely (a key length of 129) does not.  An operand whose layout in
# eager is itself rejected is passed as eager has it, so the call raises as eager's does.
ATTENTION_OPS = frozenset(
    op for op in (getattr(torch.ops.aten, n, None) for n in (
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention", "_efficient_attention_forward",
        "_flash_attention_forward", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_fused_attention_overrideable")) if op is not None)
ATTENTION_ALIGNMENT = 8


def aligned_strides(shape, stride) -> bool:
    """The last dim is dense and every other stride a multiple of ATTENTION_ALIGNMENT."""
    if len(shape) and shape[-1] > 1 and stride[-1] != 1:
        return False
    return all(s % ATTENTION_ALIGNMENT == 0 for s in stride[:-1])
