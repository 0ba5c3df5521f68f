"""Which forward values a training graph's backward gets saved, and which it recomputes.

AOTAutograd traces one joint graph (forward and backward); the partition decides where the
forward values the backward reads come from.  Saving one costs its bytes: written by the
forward (unless the forward writes it anyway), held until the backward, read back.
Recomputing a pointwise one costs nothing extra when the backward's kernel that reads it
fuses the recomputation, as our code generator does.  So, as AOTAutograd's
min_cut_rematerialization_partition does, we cut the joint graph at the cheapest set of
values from which everything the backward needs can be recomputed with cheap ops: a
minimum s-t cut, each value's capacity its bytes.  The policy is ours: what may be
recomputed (`RECOMPUTABLE_OPS` and pointwise ops), and what the backward must not
recompute because it stores it anyway (a matmul's operand).

Graphs we do not partition ourselves (activation checkpointing's tags, no networkx, an
error) go to AOTAutograd's own partitioners."""
from __future__ import annotations

import logging
import math
import operator
import os

import torch
import torch.fx as fx
from torch._functorch import partitioners as p
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import is_sym_node

from . import config, layout
from .fallback import BY_DESIGN
from .lowering import LOWERINGS
from .ops import _pair as _pool_pair

aten = torch.ops.aten
prims = torch.ops.prims
log = logging.getLogger("frametrace")

# Ops (OpOverloads or OpOverloadPackets) that the backward may recompute from saved values
# besides pointwise ones (`torch.Tag.pointwise`): views, conversions, constants.  Other
# modules add theirs (a random op that recomputes its numbers from a seed and an offset).
RECOMPUTABLE_OPS: set = {
    aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.permute, aten.t,
    aten.transpose, aten.unsqueeze, aten.squeeze, prims.squeeze, aten.alias, aten.detach,
    aten.slice, aten.select, aten.split, aten.split_with_sizes, aten.unbind, aten.as_strided,
    aten.clone, aten._to_copy, prims.convert_element_type, aten.lift_fresh_copy,
    aten.full, aten.full_like, aten.zeros, aten.ones, aten.zeros_like, aten.ones_like,
    aten.scalar_tensor, aten.arange, prims.iota, aten.where, aten.clamp, aten.clamp_min,
    aten.clamp_max, aten.cat, aten.constant_pad_nd, aten.fill,
}
# ... whose results cost nothing to hold: the backward never saves them, it saves their base
VIEWS = {aten.view, aten._unsafe_view, aten.expand, aten.permute, aten.t, aten.transpose,
         aten.unsqueeze, aten.squeeze, prims.squeeze, aten.alias, aten.detach, aten.slice,
         aten.select, aten.as_strided}


def _packet(target):
    return getattr(target, "overloadpacket", target)


def _in(target, ops) -> bool:
    return target in ops or _packet(target) in ops


def recomputable(node) -> bool:
    """Whether the backward may compute `node` again from its inputs: cheap, and the same
    numbers each time (a random op is not, unless its module registered it)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    if _in(node.target, RECOMPUTABLE_OPS):
        return True
    tags = getattr(node.target, "tags", ())
    return torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags


def _fuses(node) -> bool:
    """Whether our code generator computes `node` inside a kernel (so a value it reads
    need not be stored): a lowered op that is not an aten call by design."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:  # one result of a tuple: as the op is
        return not isinstance(node.args[0], fx.Node) or _fuses(node.args[0])
    name = getattr(getattr(node.target, "_schema", None), "name", None)
    return node.target in LOWERINGS and name not in BY_DESIGN


def _nbytes(node) -> float:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        n = val.numel()
        if not isinstance(n, int):
            # symbolic: its hint (int() of a SymInt guards on its value: the whole graph
            # would be specialized to this call's sizes, and recompiled for each later one)
            n = int(getattr(getattr(n, "node", None), "hint", None) or 4096)
        return n * val.dtype.itemsize
    if isinstance(val, (torch.SymInt, int)):
        return 1
    return math.inf  # tuples of results, opaque objects: saved through their getitems


def _is_tangent(node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


def _is_primal(node) -> bool:
    return node.op == "placeholder" and "primals" in str(node.target)


def _closure(starts, step) -> set:
    seen, todo = set(), list(starts)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(step(n))
    return seen


def choose_saved(joint: fx.GraphModule, num_fwd_outputs: int, static_inputs=()) -> list:
    """The forward values the backward gets: a minimum cut of the joint graph.
    `static_inputs`: the indices of the primal inputs that live on anyway (parameters)."""
    import networkx as nx  # (lazy: an optional dependency; partition() checks for it)
    nodes = list(joint.graph.nodes)
    primals = [n for n in nodes if _is_primal(n)]
    free = {primals[i] for i in static_inputs or () if i < len(primals)}
    outputs = fx.node.map_arg(nodes[-1].args[0], lambda n: n)
    fw_outs = [o for o in outputs[:num_fwd_outputs] if isinstance(o, fx.Node)]
    bw_outs = [o for o in outputs[num_fwd_outputs:] if isinstance(o, fx.Node)]
    inputs = lambda n: n.all_input_nodes  # noqa: E731
    fw_nodes = _closure(fw_outs, inputs)
    # what only the backward can compute: the tangents and all that reads them
    bw_only = _closure([n for n in nodes if _is_tangent(n)], lambda n: n.users)
    needed = _closure(bw_outs, inputs)
    g = nx.DiGraph()
    g.add_node("source"), g.add_node("sink")
    for n in nodes:
        if n.op == "output" or n not in needed and n not in fw_nodes:
            continue
        if n in bw_only:
            g.add_edge(n.name + "_in", "sink", capacity=math.inf)
            continue
        if n.op == "placeholder" or (n in fw_nodes and not _in(n.target, VIEWS) and (
                not recomputable(n) or _stored_by_backward(n, fw_nodes))):
            # computed by the forward: an input, or what the backward must not recompute
            g.add_edge("source", n.name + "_in", capacity=math.inf)
        if n in bw_outs:  # a gradient that does not depend on the tangents (a zero)
            g.add_edge(n.name + "_out", "sink", capacity=math.inf)
        if _in(n.target, VIEWS):
            cost = math.inf
        elif n in free:
            cost = 0
        else:
            cost = _nbytes(n)
            # a value the forward does not store itself costs a write more (a matmul's
            # result, an input or a matmul's operand are stored anyway)
            if not (n.op == "placeholder" or not _fuses(n) or
                    any(not _fuses(u) for u in n.users if u in fw_nodes)):
                cost *= 2
        g.add_edge(n.name + "_in", n.name + "_out", capacity=cost)
        for u in n.users:
            g.add_edge(n.name + "_out", u.name + "_in", capacity=math.inf)
    _, (reach, _) = nx.minimum_cut(g, "source", "sink")
    by_name = {n.name: n for n in nodes}
    return [by_name[v[:-3]] for v in reach if v.endswith("_in") and v[:-3] + "_out" not in reach
            and v[:-3] in by_name]


def merge_duplicates(graph: fx.Graph) -> int:
    """Common subexpressions of the joint graph made one node; returns how many went.
    Autocast casts a tensor once per op that reads it (q, k and v projections of one
    normalized input: three `_to_copy`s), and each copy the backward needs would be
    computed, saved and read back on its own.  Only deterministic functional aten ops
    merge, within the stretch between two ops that mutate, and not a value an output
    is or an op writes (or views): two outputs computed alike are still two tensors.
    Higher-order ops count as writing what they read."""
    nodes = list(graph.nodes)
    out = nodes[-1]
    # kept apart: outputs, what an op writes (two equal values written are two tensors),
    # and the values those are views of
    todo = list(out.all_input_nodes) if out.op == "output" else []
    for n in nodes:
        if n.op == "call_function" and n.target is not operator.getitem and (
                not isinstance(n.target, torch._ops.OpOverload) or n.target._schema.is_mutable):
            todo.extend(n.all_input_nodes)
    apart = set()
    while todo:
        n = todo.pop()
        if n not in apart:
            apart.add(n)
            if n.op == "call_function" and _in(n.target, VIEWS) and n.args and isinstance(n.args[0], fx.Node):
                todo.append(n.args[0])
    seen, merged = {}, 0
    for n in nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if not isinstance(n.target, torch._ops.OpOverload) or n.target._schema.is_mutable or \
                torch.Tag.nondeterministic_seeded in n.target.tags:   # (or a higher-order op)
            seen.clear()              # (reads after a write are not the reads before it)
            continue
        if n in apart or _in(n.target, _UNINITIALIZED):
            continue
        try:
            key = (n.target, _hashable(n.args), _hashable(n.kwargs))
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, n)
        if first is not n:
            n.replace_all_uses_with(first)
            graph.erase_node(n)
            merged += 1
    return merged


_UNINITIALIZED = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
                  aten.new_empty_strided}


def _hashable(a):
    if isinstance(a, (list, tuple)):
        return (type(a).__name__,) + tuple(_hashable(x) for x in a)
    if isinstance(a, dict):
        return ("dict",) + tuple(sorted((k, _hashable(v)) for k, v in a.items()))
    if isinstance(a, float) and a != a:
        raise TypeError("nan")       # (nan != nan: never the same key)
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("symbolic")
    return (type(a).__name__, a)


def pool_offsets(graph: fx.Graph) -> int:
    """Max pooling's indices that only its backward reads, kept as each max's offset in
    its window (int8) instead of its flat index into the input (int64); returns how many
    poolings changed.  The forward computes the offset from the index, the backward the
    index again from the offset and the output's position (pointwise, with iotas), so the
    partition saves one byte an output element where it saved eight (Inductor's
    low-memory max pooling does the same: a ResNet-50's stem pooling at batch 64 saves
    12.8M indices, 103 MB as int64, 13 MB as int8).  `config.pool_offsets` turns it off."""
    if not config.pool_offsets:
        return 0
    changed = 0
    for n in list(graph.nodes):
        if n.target is not aten.max_pool2d_with_indices.default:
            continue
        idx = [u for u in n.users if u.target is operator.getitem and u.args[1] == 1]
        x, idx_val = n.args[0].meta.get("val"), idx[0].meta.get("val") if len(idx) == 1 else None
        if idx_val is None or not isinstance(x, torch.Tensor) or x.dim() not in (3, 4) or \
                any(u.target is not aten.max_pool2d_with_indices_backward.default for u in idx[0].users):
            continue
        args = list(n.args) + [None] * (6 - len(n.args))
        (kh, kw), (dh, dw) = _pool_pair(args[1], None), _pool_pair(args[4], 1)
        (sh, sw), (ph, pw) = _pool_pair(args[2], [kh, kw]), _pool_pair(args[3], 0)
        sizes = (*x.shape[-2:], *idx_val.shape[-2:])
        if not all(isinstance(s, int) for s in sizes):
            # (symbolic sizes: int() of a SymInt does not raise, it specializes the size,
            # and a max pooling under autograd then compiled once per height and width)
            continue
        H, W, OH, OW = sizes
        if kh * kw > 127:
            continue
        idx = idx[0]
        make = _Maker(graph, idx, idx_val)
        hs = make(aten.view.default, make(prims.iota.default, OH, start=-ph, step=sh, dtype=torch.int64,
                                          device=idx_val.device, requires_grad=False), [OH, 1])
        ws = make(prims.iota.default, OW, start=-pw, step=sw, dtype=torch.int64, device=idx_val.device,
                  requires_grad=False)
        ih = make(aten.div.Tensor_mode, idx, W, rounding_mode="floor")
        iw = make(aten.sub.Tensor, idx, make(aten.mul.Tensor, ih, W))
        row = make(aten.div.Tensor_mode, make(aten.sub.Tensor, ih, hs), dh, rounding_mode="floor")
        col = make(aten.div.Tensor_mode, make(aten.sub.Tensor, iw, ws), dw, rounding_mode="floor")
        off = make(prims.convert_element_type.default, make(aten.add.Tensor, make(aten.mul.Tensor, row, kw), col),
                   torch.int8)
        # the backward's: the index from the offset
        o = make(prims.convert_element_type.default, off, torch.int64)
        r = make(aten.div.Tensor_mode, o, kw, rounding_mode="floor")
        c = make(aten.sub.Tensor, o, make(aten.mul.Tensor, r, kw))
        h = make(aten.add.Tensor, hs, make(aten.mul.Tensor, r, dh))
        w = make(aten.add.Tensor, ws, make(aten.mul.Tensor, c, dw))
        again = make(aten.add.Tensor, make(aten.mul.Tensor, h, W), w)
        for u in list(idx.users):
            if u.target is aten.max_pool2d_with_indices_backward.default:
                u.replace_input_with(idx, again)
        changed += 1
    return changed


class _Maker:
    """Inserts call_function nodes one after another from `after` on, each with its fake
    value in meta["val"]."""

    def __init__(self, graph, after, example):
        self.graph, self.last, self.mode = graph, after, detect_fake_mode([example])

    def __call__(self, target, *args, **kwargs):
        with self.graph.inserting_after(self.last):
            node = self.last = self.graph.call_function(target, args, kwargs)
        vals, kw = fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
        with self.mode:
            node.meta["val"] = target(*vals, **kw)
        return node


def _stored_by_backward(node, fw_nodes) -> bool:
    """Whether the backward would store `node` if it recomputed it: an op there that no
    kernel runs (a matmul) reads it, directly or through views.  Recomputing is then a
    kernel of its own rather than free: save it."""
    todo = [node]
    while todo:
        cur = todo.pop()
        for u in cur.users:
            if _in(u.target, VIEWS):
                todo.append(u)  # (the forward's view of it, say, that a matmul reads)
            elif u in fw_nodes or u.op == "output":
                continue
            elif not _fuses(u):
                return True
    return False


def _keeps_order(node) -> bool:
    """A node whose place among the others matters: an effect, a write, a random op (the
    order of draws), or a higher-order op this module does not look into."""
    if node.is_impure():
        return True
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    return not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable or \
        torch.Tag.nondeterministic_seeded in node.target.tags


def _may_write(node) -> bool:
    """A node that may change a tensor in place (or do what a reordering must not pass):
    a mutable op, an effect, a higher-order op or Python function this module does not
    look into.  (A random op only draws numbers.)"""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable:
        return True
    return node.is_impure() and torch.Tag.nondeterministic_seeded not in node.target.tags


def sink_recomputation(graph: fx.Graph) -> int:
    """Moves each node of a backward graph that reads no tangent (a forward value
    recomputed from saved ones) to just before its first user; returns how many nodes
    changed place.

    The split keeps the joint graph's order, where every forward node comes before the
    backward: each layer's recomputed values would be computed at the backward's start
    and held until the backward reaches that layer (GPT-2: twelve layers' MLP
    activations, 288 MiB, alive at the peak).  Nodes that read a tangent, the output,
    unused nodes and those whose order matters (`_keeps_order`) keep their order.  A
    graph with a write in it is left as it is: a value moved past the write would read
    what the write changed."""
    nodes = list(graph.nodes)
    if any(map(_may_write, nodes)):
        return 0
    from_tangents = set()
    for n in nodes:
        if _is_tangent(n) or (n.op != "placeholder" and any(a in from_tangents for a in n.all_input_nodes)):
            from_tangents.add(n)
    placed = {n for n in nodes if n.op == "placeholder"}
    order = []

    def place(root):
        todo = [(root, False)]
        while todo:
            n, inputs_placed = todo.pop()
            if n in placed:
                continue
            if inputs_placed:
                placed.add(n)
                order.append(n)
                continue
            todo.append((n, True))
            todo.extend((a, False) for a in reversed(n.all_input_nodes) if a not in placed)

    for n in nodes:
        if n.op != "placeholder" and (n in from_tangents or n.op == "output" or not n.users or _keeps_order(n)):
            place(n)
    for n in nodes:         # (whatever only an unplaced node reads: nothing, in a valid graph)
        place(n)
    moved = sum(a is not b for a, b in zip(order, (n for n in nodes if n.op != "placeholder")))
    inputs = [n for n in nodes if n.op == "placeholder"]
    if moved and inputs:
        cursor = inputs[-1]
        for n in order:
            cursor.append(n)
            cursor = n
        graph.lint()
    return moved if inputs else 0


def partition(joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs, **kwargs):
    """AOTAutograd's `partition_fn`: (forward module, backward module)."""
    if getattr(p, "has_recomputable_ops", lambda j: False)(joint):
        # torch.utils.checkpoint's tags: AOTAutograd's min-cut honours them
        return p.min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
    try:
        import networkx  # noqa: F401
    except ImportError:
        log.info("triton backend: no networkx; the backward gets what the forward computed")
        return p.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
    try:
        pool_offsets(joint.graph)
        merge_duplicates(joint.graph)
        joint.graph.eliminate_dead_code()
        joint.recompile()
        saved = choose_saved(joint, num_fwd_outputs, kwargs.get("static_lifetime_input_indices"))
        order = {n: i for i, n in enumerate(joint.graph.nodes)}
        saved.sort(key=order.__getitem__)
        syms = [n for n in saved if is_sym_node(n)]
        tensors = [n for n in saved if n not in syms]
        # (AOTAutograd's own split of a joint graph at given values; private, hence the
        # fallback below should another torch name it otherwise)
        fw, bw = p._extract_fwd_bwd_modules(joint, tensors, saved_sym_nodes=syms,
                                            num_fwd_outputs=num_fwd_outputs)
        if sink_recomputation(bw.graph):
            bw.recompile()
        layout.link_saved_layouts(fw, bw, num_fwd_outputs)
        return fw, bw
    except Exception as e:  # (an op in the joint graph this policy does not know)
        if os.environ.get("FRAMETRACE_TRITON_STRICT") == "1":
            raise  # (the tests want to see it)
        log.info("triton backend: own partition failed (%s: %s); AOTAutograd's default",
                 type(e).__name__, e)
        return p.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
