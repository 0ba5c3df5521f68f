"""Walks an aten FX graph and builds IR: lazy pointwise values, realized `Computed` nodes
and `Extern` aten calls, in program order (`items`), plus the graph's outputs."""
from __future__ import annotations

import operator

import torch
import torch.fx

from . import indexing, logsumexp
from .ir import Buffer, Computed, Extern, IRNode, Pointwise, Unsupported
from .ops import LOWERINGS

# A pointwise value used more than once is stored rather than recomputed by each user
# once it inlines this many memory reads (a residual sum, say, read by a norm and by the
# next residual add).
REALIZE_READS = 2


class GraphLowering:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs, device):
        self.gm, self.example_inputs, self.device = gm, example_inputs, device
        self.items: list = []            # Computed and Extern, in program order
        self.inputs: list[str] = []      # wrapper names of the graph inputs
        self.constants: dict = {}        # wrapper name -> tensor
        self.outputs: list = []          # Buffers, numbers, None
        self.wrapper_reads: set = set()  # Computed names that externs or outputs use
        self.computed_names: dict = {}
        self.env: dict = {}              # FX node -> its value (for lowerings that look further up)
        self.fallback_ops: list[str] = []
        # symbolic sizes: (symbol, Python source of its value in the wrapper), the first
        # input that gives each; `hints`: the ShapeEnv's values of the symbols
        self.symbol_sources: dict = {}
        self.hints: dict = {}
        indexing.HINTS.clear()
        self._count = 0

    def name(self, prefix="buf") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def run(self):
        env = self.env
        placeholders = iter(self.example_inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = self.placeholder(node, next(placeholders))
            elif node.op == "get_attr":
                env[node] = self.constant(getattr(self.gm, node.target))
            elif node.op == "call_function":
                env[node] = self.call(node, env)
            elif node.op == "output":
                outs = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
                self.outputs = [self.realize(v) if isinstance(v, IRNode) else v for v in outs]
            else:
                raise Unsupported(f"FX node {node.op}")
        return self

    def size(self, v):
        """A size or an int value as an int or a sympy polynomial of shape symbols."""
        try:
            e = indexing.sym(v)
        except ValueError as err:
            raise Unsupported(str(err)) from None
        if isinstance(v, torch.SymInt) and not isinstance(e, int):
            env = v.node.shape_env
            values = getattr(env, "backed_var_to_val", None)
            values = env.var_to_val if values is None else values
            for s in e.free_symbols:
                if s not in self.hints:
                    if s not in values:
                        raise Unsupported(f"no size hint for {s}")
                    self.hints[s] = int(values[s])
                    indexing.HINTS[s] = self.hints[s]
        return e

    def bind(self, value, source):
        """Where the wrapper finds a symbol: a size (or int input) that is just it."""
        if isinstance(value, torch.SymInt):
            e = self.size(value)
            if not isinstance(e, int) and e.is_Symbol and e not in self.symbol_sources:
                self.symbol_sources[e] = source

    def placeholder(self, node, example):
        self.inputs.append(node.name)
        if isinstance(example, (int, torch.SymInt)) and not isinstance(example, bool):
            self.bind(example, node.name)
            return self.size(example)
        if not isinstance(example, torch.Tensor):
            raise Unsupported(f"non-tensor graph input {example!r}")
        for i, n in enumerate(example.shape):
            self.bind(n, f"{node.name}.shape[{i}]")
        for i, n in enumerate(example.stride()):
            self.bind(n, f"{node.name}.stride({i})")
        shape = tuple(self.size(n) for n in example.shape)
        stride = tuple(self.size(n) for n in example.stride())
        return Buffer(node.name, shape, stride, example.dtype, example.device)

    def constant(self, tensor):
        name = self.name("const")
        self.constants[name] = tensor
        return Buffer(name, tensor.shape, tensor.stride(), tensor.dtype, tensor.device)

    def call(self, node, env):
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        if node.target is operator.getitem:
            return args[0][args[1]]
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            # arithmetic on sizes (sym_size, mul of sizes): its value as an expression
            if not isinstance(val, torch.SymInt):
                raise Unsupported(f"a {type(val).__name__} value")
            return self.size(val)
        lower = LOWERINGS.get(node.target)
        value = None
        if lower is not None:
            try:
                value = lower(self, node, *args, **kwargs)
            except Unsupported:
                value = None
            except (TypeError, ValueError):
                # a lowering that compares symbolic sizes: the op stays aten
                if not self.hints:
                    raise
                value = None
        if value is None:
            return self.extern(node, args, kwargs)
        if isinstance(value, Pointwise) and value.reads >= REALIZE_READS and \
                sum(logsumexp.reads_all(node, u) for u in node.users) > 1:
            self.realize(value, wrapper=False)
        return value

    def computed(self, node) -> Computed:
        c = Computed(self.name(), node, self.device, len(self.items))
        self.items.append(c)
        self.computed_names[c.name] = c
        return c

    def realize(self, value, wrapper=True) -> Buffer:
        """A Buffer holding `value`; `wrapper`: the wrapper itself uses it (an extern's
        argument, an output), so a Computed must be stored."""
        if isinstance(value, Buffer):
            return value
        if isinstance(value, Pointwise) and value.realized is None and value.alias is not None:
            base, view_fn = value.alias
            b = self.view_buffer(self.realize(base, wrapper), view_fn)
            if b is not None:
                return b
        if isinstance(value, Pointwise):
            if value.realized is None:
                value.realized = self.computed(value)
            value = value.realized
        if isinstance(value, Computed):
            if wrapper:
                self.wrapper_reads.add(value.name)
            return value.buffer
        raise Unsupported(f"cannot realize {value!r}")

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

    def extern(self, node, args, kwargs):
        """Run `node` as an aten call in the wrapper; its tensor results become Buffers."""
        self.fallback_ops.append(str(node.target))

        def arg(a):
            if isinstance(a, IRNode):
                return self.realize(a)
            if isinstance(a, (list, tuple)):
                return type(a)(arg(x) for x in a)
            return a
        args, kwargs = arg(args), {k: arg(v) for k, v in kwargs.items()}
        name = self.name()
        val = node.meta.get("val")
        layouts = self._meta_outputs(node, args, kwargs)

        def out(v, layout, path):
            if isinstance(v, torch.Tensor):
                shape = tuple(self.size(n) for n in v.shape)
                if isinstance(layout, torch.Tensor) and tuple(layout.shape) == tuple(v.shape):
                    stride = layout.stride()
                else:
                    stride = tuple(self.size(n) for n in v.stride())
                return Buffer(name + path, shape, stride, v.dtype, self.device)
            if isinstance(v, (list, tuple)):
                ls = layout if isinstance(layout, (list, tuple)) and len(layout) == len(v) else [None] * len(v)
                return [out(x, lx, f"{path}_{i}") for i, (x, lx) in enumerate(zip(v, ls))]
            if isinstance(v, torch.SymInt):
                return self.size(v)
            if v is None or type(v) in (int, float, bool):
                return v  # a number the op returns is this one (its value does not vary)
            raise Unsupported(f"{node.target} returns {type(v).__name__}")
        outputs = out(val, layouts, "")
        self.items.append(Extern(name, node.target, args, kwargs, outputs))
        return outputs

    def _meta_outputs(self, node, args, kwargs):
        """The op's outputs' layouts for *our* inputs' layouts, which may differ from
        eager's (kernels write contiguous buffers)."""
        found = []

        def meta(a):
            if isinstance(a, Buffer):
                found.append(a)
                m = a.meta()
                if m is None:
                    raise Unsupported("symbolic")
                return m
            if isinstance(a, (list, tuple)):
                return type(a)(meta(x) for x in a)
            return a
        try:
            margs, mkwargs = meta(args), {k: meta(v) for k, v in kwargs.items()}
        except Unsupported:
            return None
        if not found or "device" in kwargs:
            return None
        try:
            return node.target(*margs, **mkwargs)
        except Exception:
            return None
