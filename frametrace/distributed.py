"""Graphs compiled under DistributedDataParallel: split at gradient-bucket boundaries.

DDP all-reduces gradients in buckets, each launched by the reducer when the last
gradient of its bucket is accumulated.  A backend that compiles the backward as one
function (AOTAutograd: aot_eager, triton) hands every gradient over at its end, so no
all-reduce could start before the whole backward is done.  Cut into pieces whose
parameters fill about one bucket each, the graph's backward runs piece by piece, and
each piece's gradients reach the reducer while the earlier layers' backward still runs.
torch.compile's DDPOptimizer (torch/_dynamo/backends/distributed.py) decides the cuts the
same way: parameters are counted walking the graph backwards (the order of their
gradients), a piece closes when its bytes reach the bucket cap (the first piece at DDP's
first-bucket cap).

    ddp = DDP(model, bucket_cap_mb=25)
    step = frametrace.optimize(ddp, backend="aot_eager")   # one piece per bucket
    frametrace.config.ddp_split_graphs = False             # one graph, no overlap
"""
from __future__ import annotations

import logging

import torch
from torch import fx

from . import config
from .backend_registry import backend_name

# (the graph log: FRAMETRACE_LOGS=graph shows where a graph was cut)
log = logging.getLogger("frametrace.graph")

# Bytes of DDP's first bucket when torch.distributed does not say (its default, 1 MiB).
_FIRST_BUCKET_BYTES = 1024 * 1024


def _ddp_class():
    return getattr(torch.nn.parallel, "DistributedDataParallel", None)


def is_ddp(module) -> bool:
    """Whether `module` is a DistributedDataParallel wrapper (its forward's bookkeeping,
    the reducer's, runs in CPython; the wrapped module is what compiles)."""
    cls = _ddp_class()
    return cls is not None and isinstance(module, cls)


def is_fsdp_managed(module) -> bool:
    """Whether `module` was given to FSDP2's `fully_shard`: its forward hooks all-gather
    and reshard its parameters (collectives, and autograd hooks on its inputs and
    outputs), so they run in CPython around its compiled forward."""
    if not torch.distributed.is_available():
        return False
    fsdp_module = getattr(torch.distributed.fsdp, "FSDPModule", None) \
        if hasattr(torch.distributed, "fsdp") else None
    return fsdp_module is not None and isinstance(module, fsdp_module)


def active_ddp():
    """The DDP module whose forward is running its wrapped module now, or None."""
    cls = _ddp_class()
    return cls._get_active_ddp_module() if cls is not None else None


def bucket_caps(ddp) -> list[int]:
    """Bytes of `ddp`'s buckets as its reducer rebuilds them after the first step, in the
    order their gradients are ready (the last stands for all that follow): a list
    given as bucket_cap_mb_list, else a first bucket (1 MiB with the default
    bucket_cap_mb, else bucket_cap_mb's) and bucket_cap_mb's after it."""
    config_ = getattr(ddp, "_bucket_config", None)        # torch >= 2.10
    if config_ is not None:
        if config_.per_bucket_bytes_caps:
            return [int(c) for c in config_.per_bucket_bytes_caps]
        return [int(config_.first_bucket_bytes_cap), int(config_.bucket_bytes_cap)]
    cap = int(ddp.bucket_bytes_cap)
    first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", _FIRST_BUCKET_BYTES) \
        if getattr(ddp, "bucket_bytes_cap_default", False) else cap
    return [min(first, cap), cap]


def _is_split_param(value) -> bool:
    # Buffers get no gradient; a parameter DDP was told to ignore is not reduced.
    return isinstance(value, torch.nn.Parameter) and value.requires_grad and \
        not getattr(value, "_ddp_ignored", False)


def bucket_partition(gm: fx.GraphModule, example_inputs, caps: list[int]):
    """{node: piece index} for `gm`'s compute nodes, pieces in graph order, cut so that
    the parameters first used in each piece (counted from the end: their gradients'
    order) fill about one bucket; None where there would be one piece."""
    params = {node: value.numel() * value.element_size()
              for node, value in zip((n for n in gm.graph.nodes if n.op == "placeholder"),
                                     example_inputs) if _is_split_param(value)}
    buckets = [[]]              # from the last piece back
    size = 0
    counted = set()
    inside = set()
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        full = size >= caps[min(len(buckets), len(caps)) - 1]
        # A piece closes only where its values flow on (a cut must pass something: a
        # piece whose nodes feed only each other would compute nothing anyone reads).
        if full and any(u not in inside for n in buckets[0] for u in n.users):
            buckets.insert(0, [])
            size = 0
            inside = set()
        for arg in node.all_input_nodes:
            if arg in params and arg not in counted:
                counted.add(arg)
                size += params[arg]
        buckets[0].append(node)
        inside.add(node)
    if len(buckets) > 1 and size == 0:
        # No parameter in the first piece: it joins the next (nothing to overlap).
        buckets[1].extend(buckets.pop(0))
    if len(buckets) == 1:
        return None
    return {node: i for i, nodes in enumerate(buckets) for node in nodes}


def split_compile(backend, gm: fx.GraphModule, example_inputs, caps: list[int]):
    """`backend` compiles each bucket's piece of `gm` on its own; returns the callable
    running the pieces in order (or the backend's callable for `gm` whole where the
    parameters fill one bucket)."""
    # A graph holding subgraphs (cond, checkpoint bodies) stays whole: split_module
    # would move their get_attr reads between pieces.
    whole = any(n.op == "get_attr" for n in gm.graph.nodes)
    partition = None if whole else bucket_partition(gm, example_inputs, caps)
    if partition is None:
        return backend(gm, example_inputs)
    reads = _bind_symbols(gm)
    split = fx.passes.split_module.split_module(gm, None, lambda node: partition[node],
                                                keep_original_order=True)
    # Each piece's example inputs: the frame's inputs where it reads them, else the
    # FakeTensors (or symbolic numbers) the trace recorded for the values it is passed.
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    known = {n.name: v for n, v in zip(inputs, example_inputs)}
    known.update((n.name, n.meta["example_value"]) for n in inputs[len(example_inputs):])
    env = {}
    for node in split.graph.nodes:
        if node.op == "placeholder":
            env[node] = known[node.target]
        elif node.op == "call_module":
            piece = getattr(split, node.target)
            args = [env[a] for a in node.args]
            outputs, single = _tuple_outputs(piece)
            setattr(split, node.target, _Piece(backend(piece, args), single))
            env[node] = outputs[0] if single else outputs
        elif node.op == "call_function":       # getitem of a piece's outputs
            source, index = node.args
            env[node] = env[source][index]
    split.recompile()
    log.info("DDP split graph %s into %d pieces at bucket boundaries (bucket caps %s bytes)",
             type(gm).__name__, max(partition.values()) + 1, caps)
    return _with_symbols(split, reads)


def _bind_symbols(gm: fx.GraphModule) -> list:
    """Placeholders for the symbolic sizes and strides of the graph's tensor inputs,
    added after its own: a later piece that gets a tensor of symbolic size must be
    passed the size as well, and split_module passes a symbol only where some
    placeholder or node is it (torch.compile's graphs have such placeholders, ours read
    sizes off the tensors).  Returns (input index, reads a stride, dim) for each."""
    bound, reads = set(), []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        value = node.meta.get("example_value")
        if isinstance(value, (torch.SymInt, torch.SymFloat)):
            bound.add(value.node.expr)
    last = placeholders[-1] if placeholders else None
    for index, node in enumerate(placeholders):
        value = node.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            continue
        for is_stride, values in ((False, value.shape), (True, value.stride())):
            for dim, v in enumerate(values):
                if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol and \
                        v.node.expr not in bound:
                    bound.add(v.node.expr)
                    with gm.graph.inserting_after(last):
                        last = gm.graph.placeholder(f"{node.name}_{'stride' if is_stride else 'size'}_{dim}")
                    last.meta["example_value"] = v
                    reads.append((index, is_stride, dim))
    return reads


def _with_symbols(split, reads):
    """`split` called with the frame's inputs, then the sizes `_bind_symbols` added."""
    if not reads:
        return split.forward

    def run(*args):
        return split(*args, *[args[i].stride(d) if is_stride else args[i].size(d)
                              for i, is_stride, d in reads])
    return run


class _Piece(torch.nn.Module):
    """A compiled piece as the split module's submodule.  Backends compile graphs that
    return tuples; a piece with one output returns it alone to the split module."""

    def __init__(self, compiled, single: bool):
        super().__init__()
        self.compiled = compiled
        self.single = single

    def forward(self, *args):
        out = self.compiled(*args)
        return out[0] if self.single else out


def _tuple_outputs(piece: fx.GraphModule):
    """(the values `piece` returns, as the trace recorded them (split_module copies each
    node's meta), whether it returned one value alone), its output made a tuple."""
    out = next(n for n in piece.graph.nodes if n.op == "output")
    single = not isinstance(out.args[0], (tuple, list))
    if single:
        out.args = ((out.args[0],),)
        piece.recompile()
    return tuple(a.meta.get("example_value") for a in out.args[0]), single


def split_backend(backend):
    """`backend`, splitting graphs compiled while a DDP module runs its wrapped module,
    or `backend` itself where nothing is to split (switch off, no DDP running, or a
    backend that runs the graph's ops one by one: their gradients reach the reducer as
    the backward computes them)."""
    if not config.ddp_split_graphs:
        return backend
    ddp = active_ddp()
    if ddp is None:
        return backend

    def compile_in_pieces(gm, example_inputs):
        if not torch.is_grad_enabled():
            return backend(gm, example_inputs)      # (no backward: nothing to overlap)
        runs_as_traced = getattr(backend, "__frametrace_runs_ops_as_traced__", False)
        if callable(runs_as_traced):
            runs_as_traced = runs_as_traced(example_inputs)
        if runs_as_traced:
            return backend(gm, example_inputs)
        return split_compile(backend, gm, example_inputs, bucket_caps(ddp))

    # (Not __frametrace_defers_input_mutations__: a later piece that raises comes after
    # the earlier pieces' writes to the inputs.)
    for name in ("__frametrace_runs_ops_as_traced__", "__frametrace_recomputes_random_ops__",
                 "__frametrace_backend__"):
        if hasattr(backend, name):
            setattr(compile_in_pieces, name, getattr(backend, name))
    compile_in_pieces.__name__ = getattr(backend, "__name__", type(backend).__name__)
    compile_in_pieces.__frametrace_name__ = backend_name(backend)
    compile_in_pieces.__wrapped__ = backend
    return compile_in_pieces
