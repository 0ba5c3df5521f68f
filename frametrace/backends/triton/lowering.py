"""Walks an aten FX graph and builds IR: lazy pointwise values, realized `Computed` nodes
and `Extern` aten calls, in program order (`items`), plus the graph's outputs."""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._sympy.functions import Max as TorchMax
from torch.utils._sympy.printers import PythonPrinter

from . import config, grad_ops, indexing, layout, logsumexp, ops  # noqa: F401  (grad_ops and ops register lowerings)
from .context import CompileContext
from .derived import DerivedSize
from .fallback import Fallback, by_design, ir_values, trace, wrapped_op
from .ir import Buffer, Computed, Extern, GraphObject, IRNode, Pointwise, Unsupported, contiguous_strides
from .lowering_base import LOWERINGS, compute_dtype
from .placement import Placement, device_of, is_view, reaches_output

aten = torch.ops.aten
prims = torch.ops.prims

# Functional ops the wrapper runs as aten calls, and the in-place op that writes the
# same result into its first operand.
_IN_PLACE_TWINS = {f: t for f, t in (
    (getattr(aten.index_put, "default", None), getattr(aten.index_put_, "default", None)),
    (getattr(aten.index_add, "default", None), getattr(aten.index_add_, "default", None)),
    (getattr(aten.index_copy, "default", None), getattr(aten.index_copy_, "default", None)),
    (getattr(aten.scatter_add, "default", None), getattr(aten.scatter_add_, "default", None)),
    (getattr(aten.scatter, "src", None), getattr(aten.scatter_, "src", None)),
    (getattr(aten.scatter, "value", None), getattr(aten.scatter_, "value", None)),
    (getattr(aten.scatter_reduce, "two", None), getattr(aten.scatter_reduce_, "two", None)),
    (getattr(aten.masked_scatter, "default", None), getattr(aten.masked_scatter_, "default", None)),
) if f is not None and t is not None}

# Convolutions whose operands go channels-last where the graph's convs prefer it
_CONVS = frozenset((aten.convolution.default, aten.convolution_backward.default))

# Ops whose SymInt result is a size of their tensor argument (an expression of symbols
# bound already), not a number read from data.
_SIZE_READS = {getattr(getattr(aten, n), o) for n, o in (("sym_size", "int"), ("sym_stride", "int"),
               ("sym_numel", "default"), ("sym_storage_offset", "default")) if hasattr(aten, n)}

# A pointwise value used more than once is stored rather than recomputed by each user
# once it inlines this many memory reads (a residual sum, say, read by a norm and by the
# next residual add).
REALIZE_READS = 2


class GraphLowering(Placement):
    def __init__(self, gm: torch.fx.GraphModule, example_inputs, device, aten_nodes=None, ctx=None):
        self.gm, self.example_inputs, self.device = gm, example_inputs, device
        # this compile's symbols' hints and kernel ranges, read by the scheduler, the
        # kernel generators and the wrapper
        self.ctx = CompileContext() if ctx is None else ctx
        self.channels_last_convs = layout.convs_prefer_channels_last(gm, device)
        # a training forward's outputs only its backward reads: stored in the layout they
        # are computed in (config.saved_values_own_layout), recorded for the backward
        self.saved_only, self.saved_layouts = layout.saved_only(gm)
        # FX node -> why it runs as aten: its kernel failed in an earlier build
        self.aten_nodes = aten_nodes or {}
        self.fallbacks: list[Fallback] = []
        self.devices: dict = {}          # wrapper name -> device, of tensors not on `device`
        self.off_device = False          # the wrapper runs ops or reads memory off `device`
        self._host: dict = {}            # (name, offset) -> what kernels read for that element
        self.items: list = []            # Computed and Extern, in program order
        self.inputs: list[str] = []      # wrapper names of the graph inputs
        self.generators: list[str] = []  # ... of those that are torch.Generators
        self.constants: dict = {}        # wrapper name -> tensor
        self.outputs: list = []          # Buffers, numbers, None
        self.early_outputs: dict = {}    # FX node -> its output Buffer, stored where computed
        self.wrapper_reads: set = set()  # Computed names that externs or outputs use
        self.computed_names: dict = {}
        self.relaid: set = set()         # extern results in another layout than eager's
        self.env: dict = {}              # FX node -> its value (for lowerings that look further up)
        self.fallback_ops: list[str] = []
        # symbolic sizes: (symbol, Python source of its value in the wrapper), the first
        # input that gives each (their hints: `ctx.hints`)
        self.symbol_sources: dict = {}
        # sizes the data decides: symbol -> (extern name, path, dim), bound after that call
        self.late_symbols: dict = {}
        self._written_inputs = None        # [(placeholder, its new value's fake)]: _written_input
        self._count = 0

    @property
    def hints(self) -> dict:
        """The ShapeEnv's values of the graph's shape symbols (empty: static shapes)."""
        return self.ctx.hints

    def name(self, prefix="buf") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def run(self):
        env, writes = self.env, []
        placeholders = iter(self.example_inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = self.placeholder(node, next(placeholders))
            elif node.op == "get_attr":
                env[node] = self.constant(getattr(self.gm, node.target))
            elif node.op == "call_function" and not node.users and is_write(node.target):
                writes.append(node)
            elif node.op == "call_function":
                env[node] = self.call(node, env)
            elif node.op == "output":
                vals = torch.fx.node.map_arg(node.args[0], lambda n: n.meta.get("val"))
                outs = torch.fx.node.map_arg(node.args[0], lambda n: self.early_outputs.get(n, env[n]))
                nodes = node.args[0]
                self.outputs = [self.output(v, val, x) if isinstance(v, IRNode) else v
                                for v, val, x in zip(outs, vals, nodes)]
                self._record_saved_layouts(nodes)
                # the graph's writes to its inputs (`copy_`) last: an output computed from an
                # input's old value is computed before the write, however lazily
                for w in writes:
                    env[w] = self.call(w, env)
            else:
                raise Unsupported(f"FX node {node.op}")
        return self

    def size(self, v):
        """A size or an int value as an int or a sympy polynomial of shape symbols and
        derived sizes (a FloorDiv's, a Max's: derived.py)."""
        try:
            e = indexing.sym(v)
        except ValueError as err:
            raise Unsupported(str(err)) from None
        if isinstance(v, torch.SymInt) and not isinstance(e, int):
            self._hint(v.node.shape_env, e)
        return e

    def _hint(self, env, e):
        """The hints of e's symbols: the ShapeEnv's values, or for a size the data
        decides `_unbacked_hint`."""
        if env is not None:
            self.ctx.derived.env = env   # (derived sizes' hints and ranges: derived.py)
        values = getattr(env, "backed_var_to_val", None)
        values = env.var_to_val if values is None else values
        for s in e.free_symbols:
            if s not in self.hints:
                self.hints[s] = int(values[s]) if s in values else _unbacked_hint(env, s)

    def stride_size(self, v):
        """A stride as `size` gives it, `Max(1, n)` read as `n`: torch's contiguous strides
        over a size the data decides (16*Max(1, u0)) keep the max for u0 = 0, where the
        tensor is empty and no stride is used; otherwise n >= 1."""
        if not (isinstance(v, torch.SymInt) and v.node.expr.has(sympy.Max, TorchMax)):
            return self.size(v)
        e = v.node.expr.replace(lambda a: isinstance(a, (sympy.Max, TorchMax)) and len(a.args) == 2 and 1 in a.args,
                                lambda a: a.args[0] if a.args[1] == 1 else a.args[1])
        e = self.size(e)
        if not isinstance(e, int):
            self._hint(v.node.shape_env, e)
        return e

    def bind_late(self, value, source) -> bool:
        """A size the data decides (an unbacked symbol), which the wrapper reads from
        `source` once the aten call that makes it has run: (extern name, index path into
        its result, dim or None for a number it returns).  False where it is no bare
        symbol, or one bound already."""
        if not isinstance(value, torch.SymInt):
            return False
        e = self.size(value)
        if isinstance(e, int) or not e.is_Symbol or e in self.symbol_sources or e in self.late_symbols or \
                isinstance(e, DerivedSize):   # (the wrapper computes it from the inputs' sizes)
            return False
        self.late_symbols[e] = source
        return True

    def bind(self, value, source, stride=False):
        """Where the wrapper finds a symbol: a size (or int input) that is just it, or a
        positive multiple of it."""
        if isinstance(value, torch.SymInt):
            e = self.stride_size(value) if stride else self.size(value)
            # (a derived size too: a backward whose inputs give only (s0 + 2)//3, never
            # s0, reads it as it is rather than computing it)
            if not isinstance(e, int) and e.is_Symbol and e not in self.symbol_sources:
                self.symbol_sources[e] = source
            elif not stride and not isinstance(e, int) and e.is_Mul and len(e.args) == 2 and \
                    e.args[0].is_Integer and int(e.args[0]) > 0 and e.args[1].is_Symbol and \
                    e.args[1] not in self.symbol_sources:
                # a multiple of one (a backward's flat tangent of 2*s0 elements): the
                # symbol is the size divided, exactly
                self.symbol_sources[e.args[1]] = f"({source} // {int(e.args[0])})"

    def placeholder(self, node, example):
        self.inputs.append(node.name)
        if isinstance(example, (int, torch.SymInt)) and not isinstance(example, bool):
            self.bind(example, node.name)
            return self.size(example)
        if isinstance(example, torch.SymBool):
            # a condition on sizes the forward computed (its runtime asserts, asserted again
            # in a backward): the wrapper passes the call's own bool
            return GraphObject(node.name, example)
        if isinstance(example, torch.Generator):
            # (AOTAutograd's graph-safe RNG state: the calls that draw from it take it)
            self.generators.append(node.name)
            return GraphObject(node.name, example)
        if not isinstance(example, torch.Tensor):
            raise Unsupported(f"non-tensor graph input {example!r}")
        for i, n in enumerate(example.shape):
            self.bind(n, f"{node.name}.shape[{i}]")
        for i, n in enumerate(example.stride()):
            self.bind(n, f"{node.name}.stride({i})", stride=True)
        shape = tuple(self.size(n) for n in example.shape)
        stride = tuple(self.stride_size(n) for n in example.stride())
        device = self._note_device(node.name, example)
        return Buffer(node.name, shape, stride, example.dtype, device)

    def constant(self, tensor):
        name = self.name("const")
        self.constants[name] = tensor
        device = self._note_device(name, tensor)
        return Buffer(name, tensor.shape, tensor.stride(), tensor.dtype, device)

    def call(self, node, env):
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        val = node.meta.get("val")
        if node.target is operator.getitem:
            value = args[0][args[1]]
            if isinstance(value, Pointwise) and value.realized is None and \
                    any(u.op == "output" for u in node.users):
                # (a returned piece of a multi-output op, a pooling's values: stored here as
                # any output is below, so that the views of it the graph returns beside it
                # are views of that memory)
                self.early_outputs[node] = self.output(value, val, node)
            return value
        if node.target is aten._assert_scalar.default and isinstance(args[0], (SizeCondition, GraphObject)):
            # a runtime assert on sizes the data decides (u0 <= 64 after a nonzero of 64
            # elements, a torch._check of the program): checked by the wrapper
            self.items.append(Extern(self.name(), node.target, args, kwargs, None))
            return None
        if isinstance(val, torch.SymBool) and self.hints and \
                all(isinstance(a, (int, sympy.Basic)) for a in args) and \
                val.node.expr.free_symbols <= set(self.hints):
            return SizeCondition(val.node.expr)
        if isinstance(val, torch.SymInt) and isinstance(node.target, torch._ops.OpOverload) and \
                node.target not in _SIZE_READS:
            # a number the data decides (`item()`: _local_scalar_dense): the wrapper calls the
            # op and binds its symbol to the result
            return self.extern(node, args, kwargs, "a number read from data")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            # arithmetic on sizes (sym_size, mul of sizes): its value as an expression
            if not isinstance(val, torch.SymInt):
                raise Unsupported(f"a {type(val).__name__} value")
            return self.size(val)
        reason = self.aten_nodes.get(node)
        value = None
        if reason is None:
            value, reason = self._lower(node, args, kwargs)
        if value is None:
            if node.target is aten.convolution.default and self._bias_apart(args):
                return self._conv_then_bias(node, args, kwargs, reason)
            return self.extern(node, args, kwargs, reason)
        if isinstance(value, Pointwise) and kwargs.get("memory_format") is not None:
            self._asked_layout(value, val)
        if isinstance(value, Pointwise) and value.reads >= REALIZE_READS and \
                sum(logsumexp.reads_all(node, u) for u in node.users) > 1:
            narrow = _upcast_source(node, args, value)
            if narrow is not None:
                # an exact upcast (bf16 -> fp32) of a value: that value stored, in half the
                # bytes, each user casting it again (BatchNorm's backward upcasts the
                # gradient its three kernels read)
                self.realize(narrow, wrapper=False)
                value.reads = 1
            else:
                self.realize(value, wrapper=False)
        if isinstance(value, Pointwise) and value.realized is None and \
                any(u.op == "output" for u in node.users):
            # a graph output is stored anyway: stored here, where its inputs may die, not
            # at the output node (a backward's gradients cast to their parameters' dtype
            # all at its end held every gradient in both dtypes at once)
            self.early_outputs[node] = self.output(value, val, node)
        return value

    def output(self, value, val, node=None) -> Buffer:
        """A graph output's Buffer, with eager's strides where this graph computes it: a
        caller may rely on them (`is_contiguous(memory_format=...)`).  A value only the
        backward reads (`saved_only`) keeps the layout it is computed in."""
        if node in self.saved_only and not self.hints:
            # (channels-last where a convolution of this graph reads it so)
            cl = _cl_strides(value) if self.channels_last_convs and \
                any(u.target in _CONVS for u in node.users) else None
            return self.realize(value, stride=cl)
        stride = self.output_stride(value, val)
        if self.hints and isinstance(val, torch.Tensor):
            written = self._written_input(val)
            if written is not None:
                return self._input_view(value, val, *written)
        b = self.realize(value, stride=stride)
        if stride is None or self._same_layout(b.shape, b.stride, stride) or \
                (b.name not in self.computed_names and b.name not in self.relaid):
            return b
        # computed here in another layout (an extern read it first), or a convolution
        # run channels-last for speed: a copy in eager's (Inductor's keep_output_stride)
        return self.copy_in(b, stride)

    def _record_saved_layouts(self, nodes):
        """Tell the backward the strides each value saved for it was stored with (static
        sizes only: a symbolic backward is built for its traced strides)."""
        if self.saved_layouts is None or self.hints:
            return
        for x, b in zip(nodes, self.outputs):
            if x in self.saved_only and isinstance(b, Buffer) and \
                    layout._static(b.shape) and layout._static(b.stride):
                self.saved_layouts[x.name] = (tuple(int(n) for n in b.shape), tuple(int(n) for n in b.stride))

    def output_stride(self, value, val):
        """The strides an output `value` (fake value `val`) is stored with: eager's where
        they are dense, else None (its dominant input's layout or row-major)."""
        stride = None
        if isinstance(val, torch.Tensor) and not self.hints and tuple(val.shape) == tuple(value.shape):
            stride = layout.static_strides(val)
            if stride is not None and not layout.dense(value.shape, stride):
                stride = None
        elif isinstance(val, torch.Tensor) and self.hints and config.symbolic_output_strides:
            # (the shapes compared as expressions there)
            stride = self._traced_dense_strides(value.shape, val)
        return stride

    def _same_layout(self, shape, a, b) -> bool:
        """layout.same over sizes and strides that may be symbolic: equal strides wherever
        the size is not 1 (as expressions: their difference expands to 0)."""
        if not self.hints:
            return layout.same(shape, a, b)
        return all(not _differ(x, y) for n, x, y in zip(shape, a, b) if n != 1)

    def traced_strides(self, shape, val) -> tuple | None:
        """`val`'s traced strides where they lay `shape` out densely (row-major too), as
        expressions; else None."""
        if not isinstance(val, torch.Tensor):
            return None
        stride = self._traced_dense_strides(shape, val)
        if stride is not None:
            return stride
        try:
            traced = tuple(self.stride_size(s) for s in val.stride())
            sizes = tuple(self.size(n) for n in val.shape)
        except (Unsupported, TypeError, ValueError, KeyError):
            return None
        rows = contiguous_strides(shape)
        if len(sizes) != len(shape) or any(_differ(a, b) for a, b in zip(sizes, shape)) or \
                not self._same_layout(shape, traced, rows):
            return None
        return rows

    def _traced_dense_strides(self, shape, val) -> tuple | None:
        """A symbolic output's traced strides (its fake value's, as expressions of shape
        symbols and derived sizes) where they lay `shape` out densely in some order of its
        dimensions, shown for every value of the symbols (each stride is the product of the
        sizes nested inside it, as expressions); else None (then stored as its dominant
        input's layout or row-major).  The order is guessed from the strides' hints and
        then proved: a channels-last pooling, an op over a transposed input, keep eager's
        layout at every size (config.symbolic_output_strides)."""
        try:
            stride = tuple(self.stride_size(s) for s in val.stride())
            sizes = tuple(self.size(n) for n in val.shape)
            if len(sizes) != len(shape) or any(_differ(a, b) for a, b in zip(sizes, shape)):
                return None
            dims = [i for i, n in enumerate(shape) if n != 1]
            order = sorted(dims, key=lambda i: (-indexing.hint(stride[i]), i))
            step = 1
            for i in reversed(order):
                if _differ(stride[i], step):
                    return None
                step = step * shape[i]
        except (Unsupported, TypeError, ValueError, KeyError):
            return None
        return stride if order != dims else None

    def _written_input(self, val):
        """(placeholder node, its new value's fake tensor) where `val` is a view of a value
        the graph writes into that graph input (`copy_(input, new)`: a slice written in
        place and returned), else None."""
        writes = self._written_inputs
        if writes is None:   # (once a graph: a backward has hundreds of outputs)
            writes = self._written_inputs = [
                (n.args[0], n.args[1].meta.get("val")) for n in reversed(self.gm.graph.nodes)
                if n.op == "call_function" and n.target is aten.copy_.default and len(n.args) > 1 and
                isinstance(n.args[1], torch.fx.Node) and getattr(n.args[0], "op", None) == "placeholder"]
        for placeholder, new in writes:
            if isinstance(new, torch.Tensor) and torch._C._is_alias_of(val, new):
                return placeholder, new
        return None

    def _input_view(self, value, val, placeholder, new) -> Buffer:
        """An output that is a view of a value written into a graph input: AOTAutograd may
        make the caller's view from the input with the strides and offset of the tensor
        returned (where it cannot replay the view: a symbolic slice start), so the Buffer
        returned must have those of the traced view.  The view as computed where it has
        them; else that view of the input's own memory, which holds the new value once
        the graph's writes ran (the call returns after them), where the new value has the
        input's traced layout; else (a dtype view, another layout) the graph is
        unsupported rather than return a view of other elements (h65's
        `x[-(n // 2)::2].add_(1)` returned came back as other rows of x)."""
        if isinstance(value, Buffer) and self._traced_layout(value, val):
            return value
        base, inp = self.env.get(placeholder), placeholder.meta.get("val")
        try:
            ok = isinstance(base, Buffer) and isinstance(inp, torch.Tensor) and \
                val.dtype == new.dtype == inp.dtype == base.dtype and new.dim() == inp.dim() and \
                self._traced_layout(Buffer(base.name, base.shape, base.stride, base.dtype, base.device,
                                           offset=self.size(new.storage_offset())), new)
            if ok:
                return Buffer(base.name, tuple(self.size(n) for n in val.shape),
                              tuple(self.stride_size(s) for s in val.stride()), base.dtype, base.device,
                              offset=base.offset + self.size(val.storage_offset() - new.storage_offset()),
                              is_view=True)
        except (Unsupported, TypeError, ValueError):
            pass
        raise Unsupported("an output that is a view of an input, in another layout than traced")

    def _traced_layout(self, b: Buffer, val) -> bool:
        """`b` has the shape, offset and (where the size is not 1) strides of the fake
        tensor `val`, as expressions."""
        try:
            return len(b.shape) == val.dim() and not _differ(self.size(val.storage_offset()), b.offset) and \
                not any(_differ(self.size(n), m) for n, m in zip(val.shape, b.shape)) and \
                all(not _differ(self.size(n), 1) or not _differ(self.stride_size(s), t)
                    for n, s, t in zip(val.shape, val.stride(), b.stride))
        except (Unsupported, TypeError, ValueError):
            return False

    def copy_in(self, b: Buffer, stride) -> Buffer:
        """A copy of `b` stored with `stride` (one kernel)."""
        return self.realize(Pointwise(b.shape, b.dtype, lambda k, idx: b.load(k, idx), 1), stride=stride)

    def _asked_layout(self, value, val):
        """A copy to a memory format (`contiguous()`, `.to(memory_format=...)`) is stored
        in it: the code after it may view it as that layout."""
        stride = layout.static_strides(val) if isinstance(val, torch.Tensor) and not self.hints else None
        if stride is not None and tuple(val.shape) == value.shape and layout.dense(value.shape, stride):
            value.stride = stride

    def _lower(self, node, args, kwargs):
        """(IR value, None), or (None, why the node stays an aten call: None when it has no
        lowering).  Kernels run on the graph's device: a value on another device is not
        theirs to compute, and what they read from another device is moved or read once."""
        lower = LOWERINGS.get(node.target)
        if lower is None:
            return None, None
        if node.target is aten.lift_fresh_copy.default and isinstance(args[0], Buffer) and \
                args[0].name in self.constants and not reaches_output(node):
            # nothing writes it (the graph is functional) nor returns it: the constant itself,
            # so that kernels on another device read the copy moved there once
            return args[0], None
        out = device_of(node.meta.get("val"))
        foreign = out is not None and out != self.device and not self._made_for_kernels(node, args, kwargs)
        if foreign and not is_view(node.target):
            return None, f"its result is on {out} (the kernels run on {self.device})"
        mark, moved = len(self.items), None
        if not foreign:
            args, kwargs, moved = self._on_device(args, kwargs)
            if isinstance(moved, str):
                return None, moved
        try:
            value = lower(self, node, *args, **kwargs)
        except Unsupported as e:
            value, reason = None, str(e)
        except (TypeError, ValueError) as e:
            # a lowering that compares symbolic sizes: the op stays aten
            if not self.hints:
                e.frametrace_node = node
                raise
            value, reason = None, f"symbolic sizes ({e})"
        except Exception as e:
            e.frametrace_node = node
            raise
        if foreign and not all(isinstance(v, Buffer) for v in ir_values(value)):
            value, reason = None, f"its result is on {out} (the kernels run on {self.device})"
        if value is None:
            self._forget(moved)
            return None, reason
        trace(value, node, self.items[mark:])
        return value, None

    def computed(self, node, stride=None) -> Computed:
        c = Computed(self.name(), node, self.device, len(self.items), stride)
        self.items.append(c)
        self.computed_names[c.name] = c
        return c

    def realize(self, value, wrapper=True, stride=None) -> Buffer:
        """A Buffer holding `value`; `wrapper`: the wrapper itself uses it (an extern's
        argument, an output), so a Computed must be stored.  A pointwise value is stored
        with `stride`, or else in the layout of its dominant input (layout.preferred)."""
        if isinstance(value, Buffer):
            # a view of a computed value (as_strided gives one): the wrapper needs it stored
            if wrapper and value.name in self.computed_names:
                self.wrapper_reads.add(value.name)
            return value
        if isinstance(value, Pointwise) and value.realized is None and value.alias is not None \
                and self._views_stored(*value.alias):
            base, view_fn = value.alias
            b = self.view_buffer(self.realize(base, wrapper), view_fn)
            if b is not None:
                return b
        if isinstance(value, Pointwise):
            if value.realized is None:
                if stride is None:
                    stride = value.stride or layout.preferred(value)
                value.realized = self.computed(value, stride)
            value = value.realized
        if isinstance(value, Computed):
            if wrapper:
                self.wrapper_reads.add(value.name)
            return value.buffer
        raise Unsupported(f"cannot realize {value!r}")

    def _views_stored(self, base, view_fn) -> bool:
        """Whether `view_fn` of `base` stored is a view (not a copy), for a lazy `base`
        in the layout it would be stored in: else storing it costs a kernel for nothing."""
        while isinstance(base, Pointwise) and base.realized is None and base.alias is not None:
            base, inner = base.alias
            view_fn = (lambda f, g: lambda t: f(g(t)))(view_fn, inner)
        if not isinstance(base, Pointwise) or base.realized is not None:
            return True
        stride = base.stride or layout.preferred(base) or contiguous_strides(base.shape)
        # (view_buffer answers None for a symbolic layout: no meta tensor made twice)
        return self.view_buffer(Buffer("", base.shape, stride, base.dtype, self.device), view_fn) is not None

    def view_buffer(self, base: Buffer, view_fn):
        """The Buffer a view op gives on `base`'s memory, or None if it would copy."""
        meta = base.meta()
        if meta is None:  # symbolic: an index map instead
            return None
        try:
            out = view_fn(meta)
        except (RuntimeError, ValueError):  # not expressible as strides of this memory
            return None
        if not torch._C._is_alias_of(out, meta):
            return None
        return Buffer(base.name, out.shape, out.stride(), out.dtype, base.device,
                      offset=out.storage_offset(), is_view=True)

    def symbolic_view(self, base: Buffer, node, src=None):
        """The Buffer a view op gives on a symbolic `base`'s memory, or None (then an index
        map): the view's fake value's layout, where `base` has its fake input's layout
        (`config.symbolic_views`; views of graph inputs take it either way: a returned one
        that was a copy came back wrong, AOTAutograd making the view again from the input
        with the copy's strides).  No guard is added: tracing computed those strides."""
        if src is None:     # (else the value `base` holds, that `node` views through others)
            src = node.args[0] if getattr(node, "args", None) else None
        vin = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        vout = node.meta.get("val")
        if not (isinstance(vin, torch.Tensor) and isinstance(vout, torch.Tensor)) or \
                not (config.symbolic_views or base.name in self.inputs) or \
                vin.dtype != base.dtype or vout.dtype != base.dtype or not torch._C._is_alias_of(vout, vin):
            return None
        try:
            shape = tuple(self.size(n) for n in vin.shape)
            if len(shape) != len(base.shape) or any(_differ(a, b) for a, b in zip(shape, base.shape)):
                return None
            if any(n != 1 and _differ(self.stride_size(s), b) for n, s, b in zip(shape, vin.stride(), base.stride)):
                return None
            offset = base.offset + self.size(vout.storage_offset() - vin.storage_offset())
            return Buffer(base.name, tuple(self.size(n) for n in vout.shape),
                          tuple(self.stride_size(s) for s in vout.stride()), base.dtype, base.device,
                          offset=offset, is_view=True)
        except (Unsupported, TypeError, ValueError):
            return None

    def extern(self, node, args, kwargs, reason=None):
        """Run `node` as an aten call in the wrapper; its tensor results become Buffers.
        `reason`: why a kernel does not run it (None: it has no lowering)."""
        self.fallback_ops.append(str(node.target))
        self._fallback(node, args, reason)

        def arg(a):
            if isinstance(a, IRNode):
                return self.realize(a)
            if isinstance(a, (list, tuple)):
                return type(a)(arg(x) for x in a)
            return a
        relaid = node.target in _CONVS and self.channels_last_convs
        if relaid:
            args = self._conv_operands_channels_last(node.target, args)
        args, kwargs = arg(args), {k: arg(v) for k, v in kwargs.items()}
        args, exact = self._eager_rejected_layouts(node, args)
        op = self._in_place_twin(node, args)
        name = self.name()
        val = node.meta.get("val")
        if val is None:
            val = _val_from_getitems(node)
        layouts = self._meta_outputs(node, args, kwargs)
        if val is None:
            # (a higher-order op AOTAutograd left without a value and no getitem reads:
            # run_with_rng_state, a checkpointed region's random draw in the backward)
            val = layouts if layouts is not None else self._fake_result(node)

        binds = []

        def out(v, layout, path, at=()):
            if isinstance(v, torch.Tensor):
                binds.extend(n for i, n in enumerate(v.shape) if self.bind_late(n, (name, at, i)))
                shape = tuple(self.size(n) for n in v.shape)
                if isinstance(layout, torch.Tensor) and _same_shape(layout.shape, v.shape):
                    stride = layout.stride()
                else:
                    stride = tuple(self.stride_size(n) for n in v.stride())
                self._note_device(name + path, v.device)
                return Buffer(name + path, shape, stride, v.dtype, v.device)
            if isinstance(v, (list, tuple)):
                ls = layout if isinstance(layout, (list, tuple)) and len(layout) == len(v) else [None] * len(v)
                return [out(x, lx, f"{path}_{i}", at + (i,)) for i, (x, lx) in enumerate(zip(v, ls))]
            if isinstance(v, torch.SymInt):
                binds.extend([v] if self.bind_late(v, (name, at, None)) else [])
                return self.size(v)
            if v is None or type(v) in (int, float, bool):
                return v  # a number the op returns is this one (its value does not vary)
            raise Unsupported(f"{node.target} returns {type(v).__name__}")
        outputs = out(val, layouts, "")
        if relaid:   # (its results have the layout we chose, not eager's: see output())
            self.relaid.update(b.name for b in _buffers(outputs))
        ext = Extern(name, op, args, kwargs, outputs, node.target, exact)
        ext.binds = {self.size(n): self.late_symbols[self.size(n)] for n in binds}
        self.items.append(ext)
        return outputs

    def _eager_rejected_layouts(self, node, args):
        """An attention op's operands whose layout in eager the kernel rejects (a
        channels-last query) with eager's layout, and their positions: the wrapper
        aligns the others, which would make the call succeed where eager's raises."""
        op, first = wrapped_op(node.target, node.args)  # (an attention op with dropout:
        # under a checkpoint, AOTAutograd runs it in a saved RNG state)
        if getattr(op, "overloadpacket", None) not in layout.ATTENTION_OPS:
            return args, frozenset()
        args, exact = list(args), set()
        for i, (a, src) in enumerate(zip(args, node.args)):
            if i < first:
                continue
            val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
            if not isinstance(a, Buffer) or not isinstance(val, torch.Tensor) or a.symbolic \
                    or not layout._static(val.shape) or not layout._static(val.stride()):
                continue
            stride = tuple(int(s) for s in val.stride())
            if layout.aligned_strides(val.shape, stride):
                continue
            if a.stride != stride:
                if not layout.dense(a.shape, stride):
                    continue  # (an expanded layout: not one a kernel of ours stores)
                args[i] = self.copy_in(a, stride)
            exact.add(i)
        return tuple(args), frozenset(exact)

    def _in_place_twin(self, node, args):
        """The op to call for `node`: its in-place twin when its first operand is a buffer
        this graph computed, read by nothing else (the embedding gradient's
        `index_put(zeros, ..., accumulate=True)`: without this, a copy of the zeros the
        size of the embedding table, in time and in peak memory).  Nor by this op as
        another operand (`y.index_add(0, idx, y)`: its one FX user, which aten's in-place
        op refuses, as it overlaps what it writes)."""
        twin = _IN_PLACE_TWINS.get(node.target)
        if twin is None or not args or not node.args:
            return node.target
        first, source = args[0], node.args[0]
        if isinstance(first, Buffer) and not first.is_view and first.name in self.computed_names \
                and isinstance(source, torch.fx.Node) and len(source.users) == 1:
            operands = []
            torch.fx.node.map_arg((node.args, node.kwargs), operands.append)
            if sum(a is source for a in operands) == 1:
                return twin
        return node.target

    def _bias_apart(self, args) -> bool:
        """Whether a convolution's bias is better added by the kernel that reads its
        output: cuDNN adds it in a pass of its own over the output (a slow broadcast over
        a channels-last one), which the epilogue kernel does for free."""
        x, w, bias = args[0], args[1], args[2]
        return isinstance(bias, IRNode) and isinstance(x, IRNode) and isinstance(w, IRNode) \
            and len(x.shape) == len(w.shape) >= 3 and len(bias.shape) == 1 \
            and getattr(bias, "device", self.device) == self.device

    def _conv_then_bias(self, node, args, kwargs, reason):
        conv = self.extern(node, tuple(args[:2]) + (None,) + tuple(args[3:]), kwargs, reason)
        bias, dtype = args[2], conv.dtype
        cdt = compute_dtype(dtype)

        def fn(k, idx):  # channels are dim 1, also of a transposed convolution's output
            c = k.cast(conv.load(k, idx), dtype, cdt)
            return k.op(f"{c} + {k.cast(bias.load(k, [idx[1]]), bias.dtype, cdt)}")
        return Pointwise(conv.shape, dtype, fn, 2)

    def _conv_operands_channels_last(self, target, args) -> tuple:
        """A convolution's (or its backward's) operands channels-last: the activation and
        the gradient as `_channels_last` makes them; the weight where this graph computes
        it (an autocast copy, stored so at no cost), else as it is (cuDNN transposes a
        parameter as cheaply as a copy would)."""
        args = list(args)
        acts, weight = ((0,), 1) if target is aten.convolution.default else ((0, 1), 2)
        for i in acts:
            args[i] = self._channels_last(args[i])
        args[weight] = self._channels_last(args[weight], copy=False)
        return tuple(args)

    def _channels_last(self, a, copy=True):
        """A conv's operand stored channels-last: a value computed here is stored so,
        anything else (a graph input, a value stored otherwise) copied once (`copy`)."""
        cl = _cl_strides(a)
        if cl is None:
            return a
        b = self.realize(a, stride=cl)   # (a value realized before keeps its layout)
        return b if not copy or layout.same(b.shape, b.stride, cl) else self.copy_in(b, cl)

    def _fallback(self, node, args, reason):
        """Record why `node` runs as aten, unless it is meant to (see `by_design`)."""
        out = device_of(node.meta.get("val"))
        if out is not None and out != self.device:
            self.off_device = True
        src = args[0].device if args and isinstance(args[0], Buffer) else self.device
        if not by_design(node, reason, src, out):
            self.fallbacks.append(Fallback(node.name, str(node.target),
                                           reason or f"no lowering for {node.target}"))

    def _meta_outputs(self, node, args, kwargs):
        """The op's outputs' layouts for *our* inputs' layouts, which may differ from
        eager's.  Fake tensors on the graph's device, not meta ones: some layouts depend
        on the device's kernel (cuDNN's convolution returns channels-last for
        channels-last inputs, a meta convolution a contiguous tensor), and a layout that
        is not what the op returns costs a copy (`ensure_layout`) after every call."""
        found = []
        mode = self._fake_mode()

        def meta(a):
            if isinstance(a, Buffer):
                found.append(a)
                if a.symbolic:
                    raise Unsupported("symbolic")
                span = 1 + a.offset + sum((n - 1) * s for n, s in zip(a.shape, a.stride) if n)
                base = torch.empty_strided((span,), (1,), dtype=a.dtype, device=a.device)
                return base.as_strided(a.shape, a.stride, a.offset)
            if isinstance(a, (list, tuple)):
                return type(a)(meta(x) for x in a)
            if isinstance(a, GraphObject):
                return a.example
            return a
        if mode is None:
            return None
        try:
            with mode:
                margs, mkwargs = meta(args), {k: meta(v) for k, v in kwargs.items()}
                if not found or "device" in kwargs:
                    return None
                return node.target(*margs, **mkwargs)
        except Exception:
            return None

    def _fake_result(self, node):
        """What `node` returns, run on its arguments' fake values (None if it cannot)."""
        mode = self._fake_mode()
        if mode is None:
            return None
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        try:
            with mode:
                return node.target(*args, **kwargs)
        except Exception:
            return None

    def _fake_mode(self):
        active = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        try:
            return active or detect_fake_mode(self.example_inputs) or FakeTensorMode()
        except Exception:
            return None


def _differ(a, b) -> bool:
    """Two sizes or strides (ints or sympy polynomials) that are not the same expression."""
    if a == b:
        return False
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) != 0


# dtype -> the wider ones that hold each of its values exactly
_EXACT_UPCASTS = {torch.bfloat16: (torch.float32, torch.float64), torch.float16: (torch.float32, torch.float64),
                  torch.float32: (torch.float64,)}


def _upcast_source(node, args, value):
    """The lazy pointwise value that `node` only casts to a wider float dtype (each value
    the same number), where storing it rather than the cast is the same at fewer bytes
    (`config.store_before_upcast`); else None."""
    if not config.store_before_upcast or not args or not isinstance(args[0], Pointwise) or \
            args[0].realized is not None or tuple(args[0].shape) != tuple(value.shape):
        return None
    if node.target is prims.convert_element_type.default:
        pass
    elif node.target is aten._to_copy.default and set(node.kwargs) <= {"dtype", "layout", "device"} and \
            node.kwargs.get("device") in (None, getattr(node.args[0].meta.get("val"), "device", None)):
        pass
    else:
        return None
    return args[0] if value.dtype in _EXACT_UPCASTS.get(args[0].dtype, ()) else None


def is_write(op) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is not None and schema.is_mutable


def _val_from_getitems(node):
    """The results of an op whose node carries no value (AOTAutograd leaves higher-order
    ops such as run_and_save_rng_state without one), from the getitems that read them."""
    items = {u.args[1]: u.meta.get("val") for u in node.users
             if u.target is operator.getitem and isinstance(u.args[1], int)}
    if not items or len(items) != len(node.users):
        return None
    return tuple(items.get(i) for i in range(max(items) + 1))


def _cl_strides(a) -> tuple | None:
    """Channels-last strides for a 4-d IR value of static sizes, else None."""
    if not isinstance(a, IRNode) or len(a.shape) != 4 or not layout._static(a.shape):
        return None
    return layout.strides_in_order(a.shape, (0, 2, 3, 1))


def _buffers(outputs):
    """The Buffers in an extern's outputs (one, or a nest of lists)."""
    if isinstance(outputs, Buffer):
        yield outputs
    elif isinstance(outputs, (list, tuple)):
        for o in outputs:
            yield from _buffers(o)


def _same_shape(a, b) -> bool:
    """Provably equal shapes, asking the ShapeEnv nothing (a meta run's fresh unbacked
    size u12 against the graph's u0 is not known equal: no guard, just False)."""
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def _unbacked_hint(env, s) -> int:
    """A size hint for a symbol the data decides (no example value): the backend's
    `unbacked_size_hint`, within the range the ShapeEnv knows for it (a nonzero of 2 x 32
    elements has at most 64 rows); raises Unsupported when such sizes are off."""
    if not config.unbacked_sizes or not str(s).startswith("u"):
        raise Unsupported(f"no size hint for {s}")
    r = env.var_to_range.get(s)
    hint = config.unbacked_size_hint
    if r is not None and r.upper.is_Integer:   # (torch's int_oo is no Integer, though "finite")
        hint = min(hint, int(r.upper))
    if r is not None and r.lower.is_Integer:
        hint = max(hint, int(r.lower))
    return max(hint, 1)


class SizeCondition:
    """A condition on sizes (`u0 <= 64`) that a runtime assert checks: printed as Python
    over the wrapper's size variables."""
    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    def pycode(self) -> str:
        return PythonPrinter().doprint(self.expr)
