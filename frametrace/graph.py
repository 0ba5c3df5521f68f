"""The FX graph of one traced frame: inputs with their sources, nodes computed over
FakeTensors, and the hand-off to a backend."""
from __future__ import annotations

import contextlib
import functools
import logging
import operator
import threading
import time
import warnings

import torch
import torch.fx as fx
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensor)
from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode,
                                                   compute_unbacked_bindings, free_unbacked_symbols,
                                                   statically_known_true)
from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

from .backend_registry import backend_name
from .exc import BackendCompilerFailed
from .source import root_local
from .shapes import (ShapePolicy, overlaps_itself, meta_like, new_fake_mode, static_geometry, symbolic_fake,
                     symbolic_float, symbolic_int)
from .variables.base import unsupported
from .variables.constant import ConstVar, is_constant_value
from .variables.containers import DictVar, ListVar, NamedTupleVar, SizeVar, TupleVar, structseq_fields
from .variables.symbolic import (SYM_TYPES, SliceVar, SymNodeVar, is_symbolic, mark_data,
                                 float_number_op, wrap_sym)
from . import config, replayed_views
from .variables import tensor_facts, tensor_layout, wrapper_subclasses
from .variables.tensor import TensorVar
from .variables.numpy import keep_tensor_apart
from .variables.fx_values import fx_can_name, to_fake, to_node_arg
from .variables.objects import ObjectVar, entry_state_readers
from .variables.builder import ObjectVars


# Sparse tensors have no storage and no FakeTensor rules for most ops: a graph break
# (torch.compile does not trace them either); the code runs in CPython around it.
SPARSE_LAYOUTS = frozenset({torch.sparse_coo, torch.sparse_csr, torch.sparse_csc,
                            torch.sparse_bsr, torch.sparse_bsc})
SPARSE_REASON = "a sparse tensor (sparse layouts are not traced)"


class GraphInput:
    __slots__ = ("source", "node", "value")

    def __init__(self, source, node, value):
        self.source = source
        self.node = node
        # The real tensor (or, for a symbolic int, its SymInt), dropped after compiling.
        self.value = value


class _QuietFailedOps(logging.Filter):
    """An op that fails on FakeTensors while frametrace traces is a graph break: the op
    runs in CPython, which raises the user's error at the user's line.  torch's ERROR
    record of the failed meta kernel (a traceback into torch) is not for the user."""
    active = threading.local()

    def filter(self, record):
        return not (getattr(self.active, "on", False) and
                    str(record.msg).startswith("failed while attempting to run meta"))


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietFailedOps())


class LocatedGraph(fx.Graph):
    """An FX graph whose nodes remember the user's lines they came from: while a frame
    is traced, `tracer` is its innermost tracer, and each node gets that call stack as
    its `stack_trace` (FX prints it as ``# File: path:line in fn, code: ...``, as in
    torch.compile's graph logs)."""

    def __init__(self):
        super().__init__()
        self.tracer = None
        self._stacks: dict[tuple, str] = {}     # (code id, line) per frame -> the text

    def create_node(self, *args, **kwargs):
        node = super().create_node(*args, **kwargs)
        tx = self.tracer
        if tx is not None and node.op not in ("placeholder", "output"):
            # (many nodes come from one line: its text is made once)
            key = tx.stack_key()
            text = self._stacks.get(key)
            if text is None:
                text = self._stacks[key] = tx.stack_text()
            node.meta["stack_trace"] = text
        return node


_STATE_SWITCHES = (torch._C._set_grad_enabled, torch._C._set_deterministic_algorithms)


class OutputGraph:
    """Collects the graph while tracing; `compile` hands it to the backend."""

    # Whether the backend may re-trace the graph through functionalization (AOTAutograd:
    # aot_eager, triton), which turns a reshape into a view or a copy by the fake's
    # strides, where the eager backend runs the kernel, which decides by the real ones.
    # convert.py sets it from the backend.
    functionalizes = True

    def unspecialized(self, source) -> bool:
        """Whether `source` reads from a module computed at a graph break (see
        unspecialized_roots)."""
        return bool(self.unspecialized_roots) and config.trace_modules_from_breaks and \
            root_local(source) in self.unspecialized_roots

    def __init__(self, guards, policy: ShapePolicy | None = None):
        self.graph = LocatedGraph()
        self.guards = guards
        self.policy = policy or ShapePolicy(None, False)
        self.fake_mode = new_fake_mode()
        self.shape_env = self.fake_mode.shape_env
        self.inputs: list[GraphInput] = []
        self._input_by_id: dict[int, GraphInput] = {}
        self._sizes: dict[tuple, SymNodeVar] = {}   # (tensor node, dim) -> its size
        # id(FakeTensor) -> (fake, node): the last in-place op on that tensor, after which
        # its sizes are read (t_, unsqueeze_ ... change them).
        self._last_inplace: dict[int, tuple] = {}
        self._input_fakes: dict[int, object] = {}   # id(fake) -> fake, of graph inputs
        # id(real object) -> (object, Var): one Var per list, dict, module or user object.
        self.object_vars: dict[int, tuple] = ObjectVars()
        # Locals of a resume frame holding what was computed at a break: the nn.Modules
        # reached from them (often new objects on every call: copy.deepcopy(model)) are
        # guarded by type and what is read of them, not identity
        # (config.trace_modules_from_breaks).
        self.unspecialized_roots: set[str] = set()
        # id() of each traced object asked for it: (object, its key), kept alive (builtins.IdVar)
        self.id_keys: dict[int, tuple] = {}
        # id(ContextVar) -> traced value set during the trace (reset before it ends).
        self.context_vars: dict[int, object] = {}
        # Real context managers entered while tracing (autocast), closed if it aborts.
        self.open_contexts: list = []
        # What the global-state readers answered before the first of them was entered.
        self.entry_state: dict | None = None
        self._last_placeholder = None
        self.has_unbacked = False       # some node reads a number from a tensor's data
        # Grad-mode switches not scoped by a `with` (set_grad_enabled called as a
        # function): an exception out of the graph leaves those in effect, as CPython does.
        self.unscoped_grad: set = set()
        self.outer_grad = None          # see variables/builder.py (GradModeRestore)
        # (mode, warn_only) of the last torch.use_deterministic_algorithms the trace
        # made: the graph's node for it may not survive the backend, so the transformed
        # code sets it again where the frame leaves the graph (a break, the return).
        self.deterministic: tuple | None = None
        # Storages of min()/max() results of tensors (variables/builtins.py): new
        # tensors standing for one of the items, which a write would tell apart.
        self.picked_storages: dict = {}     # its storage -> its items' storages
        # Calls of lru_cache functions on tensors made in the frame (variables/functions.py):
        # their key -> result, and the ids of those tensors' FakeTensors.
        self.cache_results: dict = {}
        self.fresh_cache_keys: set = set()
        # A dict from outside keyed by tensors was read (variables/subclasses.py): its
        # lookups compared tensor inputs by identity, so they must stay distinct.
        self.tensor_keyed_reads = False
        self.tensor_input_sources: list = []    # every tensor input's, pruned ones too
        # Array inputs with their sources, kept apart from every other input in memory
        # (variables/numpy.py); frame-wide, so a subgraph's reads share it.
        self.numpy_inputs: list = []
        self.subgraph_counts: dict[str, int] = {}   # see install_subgraph
        # Graphs of higher-order ops' bodies (subgraph.py), held by the GraphModule.
        self.submodules: dict[str, torch.nn.Module] = {}

    # The graph a higher-order op's body is traced in is nested in another (subgraph.py).
    parent: OutputGraph | None = None

    @property
    def frame(self) -> OutputGraph:
        """The frame's own graph.  A body traced into a subgraph records into its own,
        but what concerns the frame as a whole is kept here."""
        out = self
        while out.parent is not None:
            out = out.parent
        return out

    def entering_context(self):
        """Called before a context is entered for real: a state reader called inside it
        answers for the context, so the guard must name what it answered at frame entry."""
        frame = self.frame
        if frame.entry_state is None:

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # (some readers are deprecated aliases)
                frame.entry_state = {fn: fn() for fn in entry_state_readers()}

    def close_contexts(self):
        while self.open_contexts:
            self.open_contexts.pop().__exit__(None, None, None)

    # -- inputs --
    @staticmethod
    def _check_traceable(value) -> bool:
        """Refuses an input the trace cannot take; returns whether it is a (traceable)
        tensor subclass."""
        if value.layout in SPARSE_LAYOUTS or \
                (value.is_leaf and value._grad is not None and value._grad.layout in SPARSE_LAYOUTS):
            unsupported(SPARSE_REASON)      # (a FakeTensor carries its .grad along)
        subclass = type(value) not in (torch.Tensor, torch.nn.Parameter)
        if subclass and not wrapper_subclasses.is_traceable(value):
            unsupported(f"tensor subclass {type(value).__name__}")
        tensor_facts.check_input_layout(value)
        return subclass

    def add_input(self, value: torch.Tensor, source, guarded: bool = True) -> TensorVar:
        """`guarded=False`: an input the transformed code makes itself (its facts follow
        from guarded ones)."""
        # The entry left to CPython for an input the trace cannot take is for inputs of
        # its kind only: a dense one after a sparse one still compiles.
        refusals = tensor_facts.guarding_input_kind(self.guards, source, value) \
            if guarded and source is not None else contextlib.nullcontext()
        with refusals:
            subclass = self._check_traceable(value)
        known = self._input_by_id.get(id(value))
        if known is not None:
            if known.source != source:
                self.guards.same_object(source, known.source)
            return TensorVar(known.node, known.node.meta["example_value"], source)
        dims = [] if subclass else self.policy.dynamic_dims(source, value)
        if dims:
            fake = symbolic_fake(self.fake_mode, value, source, dims)
        else:
            fake = self.fake_mode.from_tensor(value, static_shapes=True)
        if guarded:
            self.guards.tensor(source, value, fake)
            if subclass:
                wrapper_subclasses.guard_inner(self.guards, source, value, fake)
            if self.numpy_inputs:
                keep_tensor_apart(self, value, source)
        node = self._placeholder(source, fake)
        inp = GraphInput(source, node, value)
        self.tensor_input_sources.append(source)
        self._input_fakes[id(fake)] = fake
        self.inputs.append(inp)
        self._input_by_id[id(value)] = inp
        return TensorVar(node, fake, source)

    def input_of(self, var: TensorVar) -> GraphInput | None:
        """The graph input `var` is, if it is one."""
        return next((i for i in self.inputs if i.node is var.node), None)

    def add_number_input(self, value, source, data: bool = False) -> SymNodeVar:
        """A Python int or float that is a symbolic input of the graph: an argument that
        has changed between calls, or (``data=True``) a number computed in CPython at a
        graph break, which the trace never pins to the value seen (see `mark_data`).
        A number read again through the same source (`cfg.n` twice) is the same input."""
        for inp in self.inputs:
            if inp.source == source and not isinstance(inp.value, torch.Tensor):
                return SymNodeVar(inp.node, inp.value, source)
        if type(value) is float:
            sym = symbolic_float(self.fake_mode, value, source)
        else:
            sym = symbolic_int(self.fake_mode, value, source, any_value=data)
        if data:
            mark_data(sym)
            self.policy.used = True         # a failed compile retries with it opaque
        self.guards.symbolic_number(source, sym, type(value))
        node = self._placeholder(source, sym)
        self.inputs.append(GraphInput(source, node, sym))
        return SymNodeVar(node, sym, source)

    def new_placeholder(self, name, example):
        """A placeholder after the last one (inputs come first, in the order made),
        even when ops were recorded before it was needed."""
        if self._last_placeholder is not None:
            ctx = self.graph.inserting_after(self._last_placeholder)
        else:
            first = next(iter(self.graph.nodes), None)
            ctx = self.graph.inserting_before(first)
        with ctx:
            node = self.graph.placeholder(name)
        self._last_placeholder = node
        node.meta["example_value"] = node.meta["val"] = example
        return node

    def _placeholder(self, source, example):
        node = self.new_placeholder(_node_name(source.name()), example)
        node.meta["source"] = source.name()
        return node

    def size_of(self, tensor: TensorVar) -> SizeVar:
        """``tensor.shape``: constants for static sizes, symbolic sizes read at run time
        by one ``sym_size`` node per dimension."""
        items = []
        last = self._last_inplace.get(id(tensor.example))
        anchor = last[1] if last is not None and last[0] is tensor.example else tensor.node
        for i, size in enumerate(tensor.example.shape):
            if not is_symbolic(size):
                items.append(ConstVar(int(size)))
                continue
            var = self._sizes.get((anchor, i))
            if var is None:
                with self.graph.inserting_after(anchor):
                    node = self.graph.call_function(torch.ops.aten.sym_size.int, (anchor, i))
                node.meta["example_value"] = node.meta["val"] = size
                var = self._sizes[(anchor, i)] = SymNodeVar(node, size)
            items.append(var)
        return SizeVar(items)

    def install_subgraph(self, prefix: str, gm: torch.nn.Module) -> fx.Node:
        """Keep `gm` as a submodule of this graph's module; the get_attr node reading it.
        Names count per prefix over the frame's graph and those nested in it (cond_true_0,
        cond_false_0, wrap_body_1 around wrap_body_0), as torch.compile names them."""
        counts = self.frame.subgraph_counts
        number = counts[prefix] = counts.get(prefix, -1) + 1
        name = f"{prefix}_{number}"
        self.submodules[name] = gm
        node = self.graph.get_attr(name)
        return node

    # A vmapped function's graph (variables/functorch.py) sets it: its tensors stand for
    # per-example views of a batch, whose strides the trace cannot know.
    hides_layout = False

    def layout_hidden(self) -> bool:
        """Whether this graph, or one it is nested in, hides tensors' layout."""
        out = self
        while out is not None:
            if out.hides_layout:
                return True
            out = out.parent
        return False

    # -- ops --
    def call(self, kind: str, target, args: tuple, kwargs: dict):
        """Record `target(*args, **kwargs)` (kind 'call_function' or 'call_method'),
        computing its result on FakeTensors.  Results without tensors are constants."""
        done = float_number_op(self, kind, target, args, kwargs)
        if done is not None:
            return done
        node_args = tuple(to_node_arg(a) for a in args)
        node_kwargs = {k: to_node_arg(v) for k, v in kwargs.items()}
        fake_args = tuple(to_fake(a) for a in args)
        fake_kwargs = {k: to_fake(v) for k, v in kwargs.items()}
        what = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
        if what in tensor_facts.UNGUARDED:
            unsupported(f"{what}() reads a fact of a tensor that no guard covers")
        if what in _LAYOUT_READS and self.layout_hidden():
            unsupported(f"Tensor.{what}() in a vmapped function (vmap hides the batch's layout)")
        copies = tensor_layout.copies_by_layout(what, fake_args, fake_kwargs)
        if copies == "identity":
            # contiguous() gives its argument itself where the kernel's layout is the one
            # asked for, else a copy: which object the program holds, the trace cannot
            # tell.  CPython runs it, on the real tensor.
            unsupported(f"Tensor.{what}() of a tensor whose layout the trace cannot know "
                        "(whether it copies depends on the kernel's strides)")
        if what in _LAYOUT_READS and args and isinstance(args[0], TensorVar):
            why = tensor_layout.read_unsure(what, args[0].example, id(args[0].example) in self._input_fakes)
            if why:
                unsupported(f"Tensor.{what}() of a tensor whose layout the trace cannot know: {why}")
        if kind == "call_function" and not fx_can_name(target):
            unsupported(f"{what} cannot be named in an FX graph")
        self._check_input_metadata_kept(kind, what, target, args, kwargs, fake_args, fake_kwargs)
        before = _tensor_states(args, kwargs)
        quiet = _QuietFailedOps.active
        was_quiet, quiet.on = getattr(quiet, "on", False), True
        self.fake_mode.overlapping_write = None
        try:
            with self.fake_mode, self._dispatcher(), self._scalars_consumed(what, fake_args, fake_kwargs):
                if kind == "call_method":
                    out = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    out = target(*fake_args, **fake_kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException,
                GuardOnDataDependentSymNode) as e:
            self._drop_unbound_symbols()
            hint = "set frametrace.config.capture_dynamic_output_shape_ops = True to keep it in " \
                "the graph" if isinstance(e, DynamicOutputShapeException) else None
            unsupported(f"{what}() has a data-dependent result ({type(e).__name__})", hint=hint)
        except Exception as e:
            self._drop_unbound_symbols()
            unsupported(f"{what}() failed while tracing: {type(e).__name__}: {e}")
        finally:
            quiet.on = was_quiet
        if self.fake_mode.overlapping_write is not None:
            # A write, through any argument an aten op's schema marks written (batch
            # norm's running stats), into a tensor whose elements share memory: eager
            # may accept it where functionalization's copy back raises (AOTAutograd),
            # so CPython runs the op, on the caller's tensors, at a break.
            self.fake_mode.overlapping_write = None
            unsupported(f"{what}() writes in place to a tensor whose elements share memory")
        if before and any(fake._version != version and tensor_layout.memory_unsure(fake)
                          for fake, version, _ in before):
            unsupported(f"{what}() writes in place to a tensor that may or may not share "
                        "memory with another (a reshape of a layout the trace cannot know)")
        if copies == "memory":
            # reshape() views where the kernel's layout allows it, else copies: where
            # writes through either tensor go, the trace cannot tell.  Run by the eager
            # backend the kernel decides, and until one of them is written it does not
            # matter; AOTAutograd would decide it from the fake (a view the real strides
            # refuse), so there CPython runs it.
            if self.functionalizes:
                unsupported(f"Tensor.{what}() of a tensor whose layout the trace cannot know "
                            "(whether it copies depends on the kernel's strides)")
            tensor_layout.mark_memory_unsure(fake_args[0], out)
        out = _dropout_gives_input(target, fake_args, fake_kwargs, out)
        if not _contains(out, (torch.Tensor, *SYM_TYPES)):
            self._drop_unbound_symbols()        # nothing to bind them to
        if out is None and _keeps_none_result(kind, target, args, kwargs):
            # setitem, _foreach_*_, _fused_adamw_ ...: a mutation whose result is None
            # stays in the graph (the fused optimizers write only through tensor lists).
            self.graph.create_node(kind, target, node_args, node_kwargs)
            return ConstVar(None)
        if not _contains(out, (torch.Tensor, *SYM_TYPES)):
            if is_constant_value(out) or (isinstance(out, (tuple, list)) and all(map(is_constant_value, out))):
                return ConstVar(out) if not isinstance(out, list) else ListVar([ConstVar(o) for o in out])
            unsupported(f"{what}() returned {type(out).__name__}, which is not a tensor")
        same = self._same_tensor_arg(out, args, kwargs)
        if same is None and isinstance(out, FakeTensor) and not self.layout_hidden():
            out = self._kernel_view_geometry(kind, target, out, fake_args, fake_kwargs)
        if same is not None and _changed_nothing(kind, target, what, kwargs, before):
            if not config.eliminate_noop_ops:
                node = self.graph.create_node(kind, target, node_args, node_kwargs)
                node.meta["example_value"] = node.meta["val"] = out
                return TensorVar(node, out)     # (the same tensor: the same fake)
            # The op gave its argument back and wrote nothing (contiguous() of a
            # contiguous tensor, to() its own dtype, dropout in eval): no node, which
            # every call of the graph would run for nothing.
            return same
        if same is None:
            if tensor_layout.result_unsure(what, fake_args, fake_kwargs, out):
                tensor_layout.mark_unsure(out)
            else:
                tensor_layout.mark_new_empty(out, fake_args, fake_kwargs)
        node = self.graph.create_node(kind, target, node_args, node_kwargs)
        self._bind_unbacked(node, out)
        if same is not None:
            # The op returned its argument itself (add_, float() of a float tensor,
            # contiguous() of a contiguous one ...): the same tensor, so the same Var.
            node.meta["example_value"] = node.meta["val"] = out
            self._last_inplace[id(out)] = (out, node)
            return same
        return self._wrap_result(node, out)

    def _kernel_view_geometry(self, kind, target, out, fake_args, fake_kwargs):
        """`out`, a view of a tensor argument, with the strides and storage offset the
        real kernels give it.  FakeTensorMode computes aten.view (so reshape, flatten,
        unflatten, view_as) with torch._refs._reshape_view_helper, which keeps or
        derives the strides of size-1 dimensions (and of empty tensors) differently
        from the C++ kernels' computeStride; `.stride()` and everything computed from
        it would then differ from CPython.  Only those dimensions can differ, so with
        static sizes and a size <= 1 the op runs again on meta tensors of the same
        geometry outside the fake mode (the C++ meta kernels stride as CPU and CUDA
        do), and a different answer replaces `out` by an as_strided view of it."""
        shape = out.shape
        if not any(type(n) is int and n <= 1 for n in shape) or not _torch_op(kind, target):
            return out
        try:
            if not any(isinstance(a, torch.Tensor) and torch._C._is_alias_of(out, a)
                       for a in _flat_args(fake_args, fake_kwargs)):
                return out
            geometry = static_geometry(out)
            if geometry is None:
                return out
            memo: dict = {}
            # (no mode of the user's sees the replay, and its warnings were given once)
            with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                meta_args = _meta_twin(fake_args, memo)
                meta_kwargs = _meta_twin(fake_kwargs, memo)
                got = getattr(meta_args[0], target)(*meta_args[1:], **meta_kwargs) \
                    if kind == "call_method" else target(*meta_args, **meta_kwargs)
            if not isinstance(got, torch.Tensor) or got.device.type != "meta" or \
                    got.shape != shape or not any(torch._C._is_alias_of(got, m) for m in memo.values()):
                return out
            real = (tuple(got.stride()), got.storage_offset())
            if real == geometry[1:]:
                return out
            with self.fake_mode, self._dispatcher():
                fixed = out.as_strided(shape, real[0], real[1])
        except Exception:       # _NoTwin, or the replay failed: the fake's answer stands
            return out
        return fixed

    def _bind_unbacked(self, node, out):
        """Note on `node` which new unbacked symbols (``item()``, ``nonzero()``'s size)
        its result holds, and where: backends that trace the graph again (AOTAutograd)
        and the runtime-assert pass find each symbol's defining node by it."""
        if self.shape_env.pending_fresh_unbacked_symbols:
            bindings = compute_unbacked_bindings(self.shape_env, out)
            if bindings:
                node.meta["unbacked_bindings"] = bindings
                self.has_unbacked = True
                # (the frame's graph too: its compile runs the assert pass over the
                # bodies of cond, map ... where such a symbol is bound)
                self.frame.has_unbacked = True

    def _scalars_consumed(self, what, fake_args, fake_kwargs):
        """Around the fake call of an op that reads a 0-d tensor argument as a Python
        number only to compute with it (`_foreach_pow(xs, t)`, `add(x, y, alpha=t)`):
        its fake kernel's `item()` makes an unbacked symbol that no output holds, which
        nothing needs to bind (the graph's op reads the number itself at run time)."""
        if what not in _CONSUME_SCALARS or not any(
                isinstance(a, torch.Tensor) and a.dim() == 0 for a in _flat_args(fake_args, fake_kwargs)):
            return contextlib.nullcontext()
        return self.shape_env.ignore_fresh_unbacked_symbols()

    def _drop_unbound_symbols(self):
        # An op that failed may have made unbacked symbols no node will bind.
        self.shape_env.pending_fresh_unbacked_symbols.clear()

    @staticmethod
    def _same_tensor_arg(out, args, kwargs):
        if not isinstance(out, torch.Tensor):
            return None
        for a in (*args, *kwargs.values()):
            if isinstance(a, TensorVar) and a.example is out:
                return a
        return None

    def _check_input_metadata_kept(self, kind, what, target, args, kwargs, fake_args, fake_kwargs):
        """In-place changes of an input's sizes or strides, and of any tensor's
        requires_grad, are not kept by every backend, and in-place writes to overlapping
        memory raise only in eager: they are graph breaks (the op then runs in CPython,
        on the caller's tensor)."""
        first = args[0] if args else None
        if isinstance(first, TensorVar) and id(first.example) in self._input_fakes and \
                _is_inplace_view(target):
            unsupported(f"{what}() changes the sizes or strides of an input tensor")
        if isinstance(first, TensorVar) and what == "requires_grad_":
            # AOTAutograd drops it even on a tensor made in the graph.
            flag = fake_kwargs.get("requires_grad", fake_args[1] if len(fake_args) > 1 else True)
            if bool(flag) != first.example.requires_grad:
                unsupported("requires_grad_() changes a tensor's requires_grad")
        elif fake_kwargs.get("requires_grad") is True:
            # A new leaf that needs grad: AOTAutograd returns it detached from autograd.
            unsupported(f"{what}(requires_grad=True) makes a leaf tensor in the graph")
        if "out" in kwargs and self._out_resizes_input(target, kwargs["out"], fake_args, fake_kwargs):
            unsupported(f"{what}(out=...) may resize an input tensor")
        why = _list_write_not_functionalizable(kind, target, args, kwargs)
        if why:
            # A fused optimizer kernel: AOTAutograd (aot_eager, triton) would fail to
            # compile the graph (torch.compile does not trace these on CPU either);
            # CPython runs it at a break, on every backend.
            unsupported(f"{what}() {why}")
        if self.functionalizes and isinstance(first, TensorVar) and _inplace_has_no_functional_twin(what):
            # AOTAutograd finds an in-place op's functional form by its schema; where the
            # arguments differ (aten::polygamma_(self, n), aten::polygamma(n, self)) it
            # refuses the graph.  CPython runs the op at a break.
            unsupported(f"{what}() has no functional form with its arguments (AOTAutograd "
                        "cannot functionalize it)")
        if isinstance(first, TensorVar) and what.endswith("_") and not what.endswith("__") and \
                "out" not in kwargs and what not in _RESIZING and not _is_inplace_view(target) and \
                self._inplace_changes_shape(what, target, fake_args, fake_kwargs):
            unsupported(f"{what}() would change the shape of the tensor it writes in place: "
                        "eager raises")
        written = written_arg(kind, target, args, kwargs)
        for t in written.items if isinstance(written, (TupleVar, ListVar)) else [written]:
            if isinstance(t, TensorVar) and _has_internal_overlap(t.example):
                # Eager raises at run time, FakeTensors do not (and functionalized graphs
                # would write without raising): CPython runs the op, after the side
                # effects before it were replayed.
                unsupported(f"{what}() writes in place to a tensor whose elements share memory")

    def _inplace_changes_shape(self, what, target, fake_args, fake_kwargs) -> bool:
        """Whether in-place op `what` would give its first argument another shape,
        which eager refuses ("output with shape [10, 1, 5] doesn't match the broadcast
        shape [10, 10, 5]") where the meta kernels of ``ne_``, ``clamp_max_``, ``gcd_``
        ... resize the fake as an ``out=`` (and the fake mode's cache of that op then
        answers without resizing).  The other tensor arguments broadcasting into it
        settles it for the common case; otherwise the out-of-place twin's result shape
        does."""
        self_fake = fake_args[0]
        others = [t for t in _flat_args(fake_args[1:], fake_kwargs) if isinstance(t, torch.Tensor)]
        if all(_broadcasts_into(t.shape, self_fake.shape) for t in others):
            return False
        twin = getattr(torch.Tensor, what[:-1], None)
        if twin is None or not callable(twin):
            return False
        try:
            with self.fake_mode, self._dispatcher(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = twin(*fake_args, **fake_kwargs)
        except Exception:
            return False
        finally:
            self._drop_unbound_symbols()        # a dry run: its result binds nothing
        return isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(self_fake.shape)

    def _out_resizes_input(self, target, out, fake_args, fake_kwargs) -> bool:
        """Whether ``out=`` names an input whose shape differs from the result's (the op
        would resize the caller's tensor)."""
        outs = out.items if isinstance(out, (TupleVar, ListVar)) else [out]
        if not any(isinstance(o, TensorVar) and id(o.example) in self._input_fakes for o in outs):
            return False
        if not callable(target):
            return True
        rest = {k: v for k, v in fake_kwargs.items() if k != "out"}
        try:
            with self.fake_mode, self._dispatcher():
                got = target(*fake_args, **rest)
        except Exception:
            return True
        finally:
            self._drop_unbound_symbols()        # a dry run: its result binds nothing
        got = got if isinstance(got, (tuple, list)) else [got]
        return [tuple(getattr(g, "shape", ())) for g in got] != \
            [tuple(o.example.shape) if isinstance(o, TensorVar) else None for o in outs]

    def _wrap_result(self, node, out):
        if isinstance(out, torch.Tensor):
            if out.layout in SPARSE_LAYOUTS:
                unsupported(SPARSE_REASON)
            node.meta["example_value"] = node.meta["val"] = out
            return TensorVar(node, out)
        if isinstance(out, SYM_TYPES):
            return wrap_sym(node, out)
        if isinstance(out, (tuple, list)):
            node.meta["example_value"] = out
            items = []
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    if o.layout in SPARSE_LAYOUTS:
                        unsupported(SPARSE_REASON)
                    item = self.graph.create_node("call_function", operator.getitem, (node, i))
                    item.meta["example_value"] = item.meta["val"] = o
                    items.append(TensorVar(item, o))
                elif isinstance(o, SYM_TYPES):
                    items.append(wrap_sym(self.graph.create_node(
                        "call_function", operator.getitem, (node, i)), o))
                elif is_constant_value(o):
                    items.append(ConstVar(o))
                else:
                    unsupported(f"graph op returned {type(o).__name__} inside a sequence")
            if isinstance(out, torch.Size):
                return SizeVar(items)
            fields = getattr(type(out), "_fields", None) or structseq_fields(type(out))
            if fields:
                # Its own class (torch.return_types.max...): isinstance and the result
                # the caller gets are the op's, not a plain tuple.
                return NamedTupleVar(items, fields, cls=type(out))
            return (TupleVar if isinstance(out, tuple) else ListVar)(items)
        unsupported(f"graph op returned {type(out).__name__}")

    def _dispatcher(self):
        # With symbolic sizes, composite ops (pad, ...) must run their Python
        # decompositions, which keep sizes symbolic; their C++ kernels would read plain
        # sizes and specialize every symbol they touch.
        return enable_python_dispatcher() if self.shape_env.var_to_range else contextlib.nullcontext()

    # -- compiling --
    def op_count(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op in ("call_function", "call_method", "call_module"))

    def computes(self) -> bool:
        """Whether the graph does anything but switch grad mode or deterministic
        algorithms (which the transformed code sets itself where it matters: at a
        break, and at a return that keeps it)."""
        return any(n.op in ("call_function", "call_method", "call_module") and
                   n.target not in _STATE_SWITCHES for n in self.graph.nodes)

    def prune_unused(self, keep=()):
        """Drop size reads and size arithmetic nobody used (shape checks done in
        Python), then inputs nothing reads; `keep` are the nodes the frame needs."""
        keep = set(keep)
        for node in reversed(list(self.graph.nodes)):
            if not node.users and node not in keep and node.op == "call_function" and \
                    isinstance(node.meta.get("example_value"), SYM_TYPES):
                self.graph.erase_node(node)
        for inp in list(self.inputs):
            if not inp.node.users and inp.node not in keep:
                self.graph.erase_node(inp.node)
                self.inputs.remove(inp)

    def compile(self, backend, output_nodes: list, name: str):
        """Finish the graph with `output_nodes` and compile it; returns
        (GraphModule, compiled callable, seconds spent in the backend)."""
        self.graph.output(tuple(output_nodes))
        self.graph.lint()
        root = torch.nn.Module()
        for sub_name, sub in self.submodules.items():
            root.add_module(sub_name, sub)
        gm = fx.GraphModule(root, self.graph, class_name=name)
        if self.has_unbacked:
            # Bodies first, as torch.compile does: their torch._check calls become
            # aten._assert_scalar nodes, which AOTAutograd keeps (it would trace a
            # torch._check into its own ShapeEnv and check it nowhere).
            graphs = [m for m in gm.modules() if isinstance(m, fx.GraphModule)]
            messages = _check_messages(graphs)
            for sub in graphs[:0:-1]:
                insert_runtime_asserts(sub, self.shape_env, name, messages)
            insert_runtime_asserts(gm, self.shape_env, name, messages)
        gm.meta["frametrace_sources"] = [i.source.name() for i in self.inputs]
        gm.meta["frametrace_input_sources"] = [i.source for i in self.inputs]
        gm.meta["frametrace_functionalizes"] = self.functionalizes   # (what the trace assumed)
        example_inputs = [i.value for i in self.inputs]
        t0 = time.perf_counter()
        # Backends that fakeify (AOTAutograd) find our FakeTensorMode here, so they
        # reuse its symbols instead of specializing on the example sizes.
        context = TracingContext(self.fake_mode)
        with tracing(context):
            try:
                compiled = replayed_views.compile_graph(backend, gm, example_inputs)
            except Exception as e:
                raise BackendCompilerFailed(backend_name(backend), name, e) from e
            finally:
                # (weak references on the real inputs: swap_tensors refuses those)
                context.tensor_to_context.clear()
        seconds = time.perf_counter() - t0
        for i in self.inputs:
            i.value = None
        if not callable(compiled):
            raise TypeError(f"backend {backend!r} returned {compiled!r}, which is not callable")
        return gm, compiled, seconds


def insert_runtime_asserts(gm, shape_env, name, messages=None):
    """What the trace assumed about numbers read from data (``torch._check`` facts, a
    size being >= 0, a view's divisibility) is checked when the graph runs: no guard
    can check it before.  (A fact about input sizes alone is a guard instead.)
    `messages`: what each fact's ``torch._check`` says when it fails (_check_messages)."""
    for node in gm.graph.nodes:
        message = node.meta.get("check_message")
        if node.target is torch._check and len(node.args) == 1 and message is not None:
            # The pass turns it into an aten._assert_scalar of a message of its own: the
            # one torch._check raises keeps a failing graph's error CPython's.
            node.args = (node.args[0], message)
    with enable_python_dispatcher(), _unbacked_unreplaced(shape_env):
        insert_deferred_runtime_asserts(gm, shape_env, name)
    for node in gm.graph.nodes:
        if node.target is torch._check and node.op == "call_function":
            # A check the pass kept as a Python call (torch 2.11, where it cannot find
            # the node binding the symbol: the second branch of a cond) would be traced
            # by AOTAutograd into its own ShapeEnv and checked nowhere.
            cond = node.args[0] if node.args else node.kwargs.get("cond")
            message = node.args[1] if len(node.args) > 1 else node.meta.get("check_message")
            node.target = torch.ops.aten._assert_scalar.default
            node.args, node.kwargs = (cond, message or f"{_PASS_MESSAGE}{cond}"), {}
        # torch 2.11's pass asserts a check's fact where its symbols are bound, before
        # the check, under "Runtime assertion failed for expression <expr> on node ...",
        # and drops the check as redundant: the first to fail must say what CPython's
        # torch._check says.
        if node.target is torch.ops.aten._assert_scalar.default and len(node.args) == 2 \
                and isinstance(node.args[1], str) and node.args[1].startswith(_PASS_MESSAGE):
            expr = node.args[1][len(_PASS_MESSAGE):].rsplit(" on node ", 1)[0]
            if messages and expr in messages:
                node.args = (node.args[0], messages[expr])
    gm.recompile()


_PASS_MESSAGE = "Runtime assertion failed for expression "


def _check_messages(graphs) -> dict:
    """str(fact) -> the message of the ``torch._check`` that added it, over `graphs`
    (a frame's graph and its bodies share one ShapeEnv)."""
    out = {}
    for g in graphs:
        for node in g.graph.nodes:
            message = node.meta.get("check_message")
            if node.target is torch._check and message is not None:
                for expr in node.meta.get("check_exprs", ()):
                    out.setdefault(str(expr), message)
    return out


@contextlib.contextmanager
def _unbacked_unreplaced(shape_env):
    """The ShapeEnv without its replacements of data-read symbols, while the assert
    pass runs.  `torch._check(u0 == a + b)` makes u0 stand for `a + b`; the pass then
    hash-conses the `.item()` node that defines u0 with the graph's own `a + b` node
    (both "are" a + b), and the assert becomes `item == item`: checked by nothing.
    Without the replacement each node keeps its own symbol and the check compares
    the value read with the sizes."""
    saved = {s: r for s, r in shape_env.replacements.items()
             if free_unbacked_symbols(s) or free_unbacked_symbols(r)}

    def changed():
        # SymNode.expr and ShapeEnv.replace cache on these counters
        if hasattr(shape_env, "_replacements_version_counter"):    # (torch >= 2.12)
            shape_env._replacements_version_counter += 1
        if hasattr(shape_env, "_update_version_counter"):
            shape_env._version_counter += 1
            shape_env._update_version_counter()

    for s in saved:
        del shape_env.replacements[s]
    if saved:
        changed()
    try:
        yield
    finally:
        if saved:
            shape_env.replacements.update(saved)
            changed()


# Tensor methods whose answer depends on memory layout.
# Ops whose Scalar arguments may be 0-d tensors, read as numbers for the arithmetic
# only, never for a size of the result (torch.compile keeps the same list):
# `_scalars_consumed`.  Their in-place forms (a trailing `_`) too.
_CONSUME_SCALARS = frozenset(
    name + tail for name in (
        "add", "sub", "addmm", "addmv", "addr", "addbmm", "baddbmm", "addcmul", "addcdiv",
        "_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div", "_foreach_clamp_max",
        "_foreach_clamp_min", "_foreach_maximum", "_foreach_minimum", "_foreach_pow",
        "_foreach_lerp", "_foreach_addcmul", "_foreach_addcdiv")
    for tail in ("", "_"))

_LAYOUT_READS = frozenset({"stride", "is_contiguous", "is_non_overlapping_and_dense"})


# operator's in-place forms (`x += y`); `invert`, `index`, `is_` start with "i" too
_INPLACE_OPERATORS = frozenset(
    f"i{n}" for n in ("add", "and", "concat", "floordiv", "lshift", "mod", "mul", "matmul", "or",
                      "pow", "rshift", "sub", "truediv", "xor"))


def written_arg(kind: str, target, args, kwargs):
    """What an op writes in place: its ``out=`` tensor(s), its first argument (``x.add_``,
    ``x += y``, ``x[i] = v``), or None."""
    if "out" in kwargs:
        return kwargs["out"]
    if kind == "call_method":
        writes = target.endswith("_") and not target.startswith("__")
    else:
        name = getattr(target, "__name__", "")
        writes = target is operator.setitem or (name.endswith("_") and not name.endswith("__")) or \
            (getattr(target, "__module__", None) == "_operator" and name in _INPLACE_OPERATORS)
    return args[0] if writes and args else None


def _has_internal_overlap(t) -> bool:
    """Whether some elements of `t` share memory (an expanded view): eager refuses to
    write such a tensor in place."""
    return overlaps_itself(t)


def _is_inplace_view(target) -> bool:
    """Whether `target` (a Tensor method name, a torch function or an aten op) changes
    its first argument's sizes or strides in place (aten's inplace_view tag)."""
    if isinstance(target, torch._ops.OpOverload):
        return torch.Tag.inplace_view in target.tags
    if isinstance(target, torch._ops.OpOverloadPacket):
        packet = target
    else:
        name = target if isinstance(target, str) else getattr(target, "__name__", "")
        return name.endswith("_") and _inplace_view_name(name)
    return _packet_is_inplace_view(packet)


@functools.lru_cache(maxsize=None)
def _inplace_view_name(name: str) -> bool:
    packet = getattr(torch.ops.aten, name, None)
    return packet is not None and _packet_is_inplace_view(packet)


def _packet_is_inplace_view(packet) -> bool:
    try:
        return any(torch.Tag.inplace_view in getattr(packet, o).tags for o in packet.overloads())
    except Exception:
        return True     # unknown: the safe answer


class _NoTwin(Exception):
    """An argument with no static meta twin (a symbolic size, a tensor subclass)."""


def _torch_op(kind, target) -> bool:
    """A Tensor method or a torch function (not a user's function let into the graph,
    which must not run twice)."""
    if kind == "call_method":
        return isinstance(target, str)
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(target, "__module__", None) or ""
    return module.startswith("torch") or target is operator.getitem or target is getattr


def _flat_args(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, (tuple, list)):
            yield from a
        else:
            yield a


def _meta_twin(v, memo):
    """`v` with each FakeTensor replaced by a meta tensor of its dtype and geometry."""
    if isinstance(v, torch.Tensor):
        twin = memo.get(id(v))
        if twin is None:
            twin = meta_like(v) if type(v) is FakeTensor else None
            if twin is None:
                raise _NoTwin
            memo[id(v)] = twin
        return twin
    if isinstance(v, SYM_TYPES):
        raise _NoTwin
    if type(v) in (tuple, list):
        return type(v)(_meta_twin(x, memo) for x in v)
    if isinstance(v, slice):
        return slice(_meta_twin(v.start, memo), _meta_twin(v.stop, memo), _meta_twin(v.step, memo))
    if isinstance(v, dict):
        return {k: _meta_twin(x, memo) for k, x in v.items()}
    return v


def _contains(out, types) -> bool:
    """`out`, or something in its tuples, lists and dicts, is one of `types`."""
    if isinstance(out, types):
        return True
    if isinstance(out, (tuple, list)):
        return any(_contains(o, types) for o in out)
    if isinstance(out, dict):
        return any(_contains(o, types) for o in out.values())
    return False


@functools.lru_cache(maxsize=None)
def _inplace_has_no_functional_twin(what: str) -> bool:
    """Whether aten's in-place op `what` (``polygamma_``) has a functional op of the
    same name, none of whose overloads takes the arguments of any of its own in the
    same order."""
    if not what.endswith("_") or what.endswith("__"):
        return False
    inplace = getattr(torch.ops.aten, what, None)
    functional = getattr(torch.ops.aten, what[:-1], None)
    if inplace is None or functional is None:
        return False
    try:
        names = {tuple(a.name for a in getattr(functional, o)._schema.arguments if not a.kwarg_only)
                 for o in functional.overloads()}
        return all(tuple(a.name for a in getattr(inplace, o)._schema.arguments if not a.kwarg_only)
                   not in names for o in inplace.overloads())
    except Exception:
        return False


# In-place ops whose point is a new shape for their argument (aten tags none of them
# inplace_view): the rest keep it, or raise in eager.
_RESIZING = frozenset({"resize_", "resize_as_", "set_", "_resize_output_", "resize_as_sparse_"})


def _tensor_states(args, kwargs) -> list | None:
    """(fake tensor, version, requires_grad) of the tensor arguments of an op; None
    where a version cannot be read (an inference tensor has none; then the op is never
    taken for a no-op)."""
    try:
        return [(a.example, a.example._version, a.example.requires_grad)
                for a in (*args, *kwargs.values()) if isinstance(a, TensorVar)]
    except Exception:
        return None


def _schema_writes(kind: str, target) -> bool | None:
    """Whether the aten schema of `target` (an OpOverload or packet, a Tensor method's
    name, a builtin torch function) writes an argument, a tensor of a list argument
    (``Tensor(a!)[]``) included; None where no schema can be read for it."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    if isinstance(target, torch._ops.OpOverloadPacket):
        packet = target
    else:
        if kind == "call_method":
            name = target if isinstance(target, str) else None
        elif type(target).__name__ == "builtin_function_or_method" and \
                (getattr(target, "__module__", None) or "").startswith("torch"):
            name = getattr(target, "__name__", None)
        else:
            name = None     # a Python function: its name need not be the aten op's
        packet = _aten_packet(name) if name else None
        if packet is None:
            return None
    return _packet_writes(packet)


@functools.lru_cache(maxsize=None)
def _aten_packet(name: str):
    try:
        return getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=None)
def _packet_writes(packet) -> bool | None:
    """Whether some overload writes an argument other than a keyword-only one (an
    ``out=`` overload writes only those, and an ``out=`` call is told apart by its
    keyword)."""
    try:
        return any(_writes_positional(getattr(packet, o)) for o in packet.overloads())
    except Exception:
        return None


def _writes_positional(op) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
               for a in op._schema.arguments)


def _list_write_not_functionalizable(kind: str, target, args, kwargs) -> str | None:
    """Why AOTAutograd cannot be trusted to functionalize this op, which writes a list
    of tensors (``Tensor(a!)[]``), or None.  On torch 2.13 the fused optimizer kernels
    (``_fused_adamw_``, ``_fused_sgd_`` ...) fail there or compute wrong values: their
    functional forms mostly have no meta kernel, ``_fused_adam`` writes a sliced
    parameter wrongly, and an empty list given for a written one (AdamW without
    amsgrad passes ``max_exp_avg_sqs=[]``) asserts.  The foreach ops are
    functionalized soundly, a custom op by auto_functionalize."""
    try:
        name, params = _written_lists(kind, target)
    except TypeError:           # (unhashable)
        return None
    if not params:
        return None
    # (a method's self is args[0], as the schema's first argument; the overload that
    # writes a list applies only where a list is given there: aten::sort.Tensor sorts a
    # TorchScript list, torch.sort(x) a tensor)
    written = False
    for i, arg_name, kwarg_only in params:
        v = args[i] if i < len(args) and not kwarg_only else kwargs.get(arg_name)
        if not isinstance(v, (TupleVar, ListVar)):
            continue
        written = True
        if isinstance(v, (TupleVar, ListVar)) and not v.items:
            return "is given an empty list for a list it writes"
    if written and name.startswith("aten::") and not name.startswith("aten::_foreach_"):
        return "writes a list of tensors (a fused kernel AOTAutograd does not functionalize soundly)"
    return None


@functools.lru_cache(maxsize=None)
def _written_lists(kind: str, target) -> tuple:
    """(the op's qualified name, (position, name, keyword-only) of each list of tensors
    some overload of it writes); ("", ()) where it writes none or has no schema."""
    if not _schema_writes(kind, target) and not (
            isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable):
        return "", ()
    if isinstance(target, torch._ops.OpOverload):
        packet, overloads = target.overloadpacket, [target]
    else:
        packet = target if isinstance(target, torch._ops.OpOverloadPacket) else \
            _aten_packet(target if isinstance(target, str) else target.__name__)
        overloads = [getattr(packet, o) for o in packet.overloads()]
    found = {}
    for op in overloads:
        params = op._schema.arguments[1:] if kind == "call_method" else op._schema.arguments
        for i, a in enumerate(params):
            if a.alias_info is not None and a.alias_info.is_write and isinstance(a.type, torch.ListType):
                found[(i, a.name, a.kwarg_only)] = None
    return packet._qualified_op_name, tuple(found)


def _keeps_none_result(kind: str, target, args, kwargs) -> bool:
    """An op that returned None is there for an effect: it stays in the graph when it
    takes a tensor (directly or in a list, tuple or dict: the foreach and fused
    optimizer kernels take lists) or its schema writes or cannot be read."""
    return any(isinstance(a, TensorVar) for a in _var_items((*args, *kwargs.values()))) or \
        _schema_writes(kind, target) is not False


def _var_items(vs):
    for v in vs:
        if isinstance(v, (TupleVar, ListVar)):
            yield from _var_items(v.items)
        elif isinstance(v, DictVar):
            yield from _var_items(v.items.values())
        else:
            yield v


def _dropout_gives_input(target, fake_args, fake_kwargs, out):
    """aten.dropout's kernel gives back its input itself, the same tensor, when p is 0
    or not training; its Python decomposition, which the fake mode runs once sizes are
    symbolic (dynamic=True turns on the Python dispatcher), returns a clone.  The trace
    then took `dropout(x, 0.0)` for a new tensor (`y is x` False, an in-place op on y
    not seen in x) and AOTAutograd compiled the clone: the kernel's answer is taken."""
    names = next((n for fn, n in _DROPOUTS if fn is target), None)
    if names is not None:
        bound = dict(zip(names, fake_args))
        bound.update((k, v) for k, v in fake_kwargs.items() if k in names)
        x, p, train = bound.get(names[0]), bound.get(names[1], 0.5), bound.get(names[2], True)
        if isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor) and out is not x and \
                (type(p) in (int, float) or isinstance(p, torch.SymFloat)) and \
                type(train) is bool and (not train or bool(p == 0)) and \
                not bound.get("inplace", False):
            return x
    return out


_DROPOUTS = ((torch.nn.functional.dropout, ("input", "p", "training", "inplace")),
             (torch.dropout, ("input", "p", "train")),
             (torch.ops.aten.dropout.default, ("input", "p", "train")))


def _changed_nothing(kind: str, target, what: str, kwargs: dict, before: list | None) -> bool:
    """A torch op left its tensor arguments as they were: not an in-place or `out=` form
    by name or schema, and no version counter or requires_grad flag moved while it ran
    on the fakes (every in-place op, resize_/set_/t_ included, bumps the version).  A
    function of the user's let into the graph, or an op whose schema writes, is never
    taken for a no-op (a custom op's fake may not bump versions)."""
    if kind == "call_function" and not isinstance(target, torch._ops.OpOverload) and \
            (isinstance(target, torch._ops.OpOverloadPacket) or
             not (getattr(target, "__module__", None) or "").startswith("torch")):
        return False
    if _schema_writes(kind, target):
        return False
    inplace = kwargs.get("inplace")
    if before is None or what.endswith("_") or "out" in kwargs or \
            (inplace is not None and not (inplace.is_const() and inplace.as_const() is False)):
        return False
    return all(t._version == v and t.requires_grad == rg for t, v, rg in before)


def _node_name(name: str) -> str:
    clean = "".join(c if c.isalnum() else "_" for c in name).strip("_")
    return ("l_" + clean) if clean else "arg"


def _broadcasts_into(shape, into) -> bool:
    """Whether `shape` provably broadcasts into `into` without changing it, asking the
    ShapeEnv nothing: torch.broadcast_shapes would record its checks as facts (an index of
    data-dependent length u0 beside a (32, 4) tensor became the runtime assert u0 == 4)."""
    if len(shape) > len(into):
        return False
    return all(statically_known_true(a == 1) or statically_known_true(a == b)
               for a, b in zip(reversed(shape), reversed(into)))
