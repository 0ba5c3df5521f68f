"""Multi-tensor updates (an optimizer step): `_foreach_*` ops, the graph's writes to its
inputs, and combo kernels.

A traced optimizer step reaches the backend as functional `_foreach_*` ops over lists of
tensors and a `copy_` of each result back into its graph input (parameters, state, step
counters).  Here:
- each `_foreach_*` op is decomposed into its per-tensor aten ops, whose lowerings fuse
  each tensor's whole chain lazily (`decompositions`);
- a `copy_` into a whole graph input is a kernel store straight into the input's memory
  (an `InputWrite`), not a temporary and an aten copy (`_input_write`);
- the realized nodes are reordered so that each tensor's chain is one kernel and every
  read of an input's old value runs before the store that overwrites it (`groups`);
- independent pointwise kernels that follow one another are launched as one combo
  kernel: the grid spans all of them, and each program finds its sub-kernel from its
  program id (`combine`), so that the update of hundreds of tensors is a few launches.
"""
from __future__ import annotations

import hashlib
import heapq
import re

import torch

from . import config, indexing, layout
from .autotune import Config, next_pow2
from .ir import Buffer, Computed, Extern, Pointwise, Unsupported
from .kernel_source import Kernel, KernelCodegen, KernelGroup, NotFusable, space_of
from .lowering_base import LOWERINGS, bcast, reads_of

aten = torch.ops.aten

# -- decompositions -----------------------------------------------------------------------------
_UNARY = ("sqrt", "rsqrt", "neg", "reciprocal", "exp", "expm1", "log", "log1p", "log2", "log10",
          "abs", "sign", "sigmoid", "tanh", "sin", "cos", "tan", "floor", "ceil", "trunc",
          "round", "frac", "erf", "erfc", "zero")
_BINARY = ("add", "sub", "mul", "div", "pow", "clamp_min", "clamp_max", "maximum", "minimum",
           "copy")


def _element(name, overload):
    """The per-tensor op of `_foreach_<name>.<overload>`."""
    if name in ("maximum", "minimum") and overload in ("Scalar", "ScalarList"):
        return aten.clamp_min if name == "maximum" else aten.clamp_max  # (a number operand)
    return getattr(aten, name)


def _per_tensor(op, element):
    """`op` as a list of `element` calls: list arguments are taken element by element,
    anything else (a number, a scalar tensor, `alpha=`) is passed to each call."""
    lists = [i for i, a in enumerate(op._schema.arguments)
             if not a.kwarg_only and isinstance(a.type, torch.ListType)]

    def decomposed(*args, **kwargs):
        n = len(args[lists[0]])
        return [element(*[a[i] if j in lists else a for j, a in enumerate(args)], **kwargs)
                for i in range(n)]
    return decomposed


def _pointwise3(combine):
    """addcmul/addcdiv: self + value * combine(t1, t2), `value` a number, one of a list, or
    one element of a tensor of them (eager reads those as numbers too)."""
    def scalar(self, t1, t2, value=1):
        return [aten.add(s, aten.mul(combine(a, b), value)) for s, a, b in zip(self, t1, t2)]

    def scalars(self, t1, t2, values):
        return [aten.add(s, aten.mul(combine(a, b), values[i]))
                for i, (s, a, b) in enumerate(zip(self, t1, t2))]
    return scalar, scalars


def decompositions() -> dict:
    """{`_foreach_*` overload: its per-tensor decomposition}, functional overloads only
    (AOTAutograd functionalizes the in-place ones first)."""
    table = {}
    for name in _UNARY + _BINARY + ("lerp",):
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if overload.endswith("out") or op._schema.is_mutable:
                continue
            table[op] = _per_tensor(op, _element(name, overload))
    for name, combine in (("addcmul", aten.mul), ("addcdiv", aten.div)):
        scalar, scalars = _pointwise3(combine)
        packet = getattr(aten, f"_foreach_{name}")
        table[packet.Scalar] = scalar
        table[packet.ScalarList] = table[packet.Tensor] = scalars
    return table


# -- writes to graph inputs ---------------------------------------------------------------------
class InputWrite(Computed):
    """A `copy_` of a value into a graph input: a kernel stores it straight into the
    input's memory (its name is the input's).  Reads of the input anywhere in the graph
    mean its old value, so they all run before this store (see `groups`)."""
    __slots__ = ()
    in_place = True


def in_place(kernel) -> bool:
    """Whether a kernel stores into a graph input (running it twice is not running it once)."""
    known = getattr(kernel, "writes_inputs", None)     # (a kernel restored from the result cache)
    if known is not None:
        return known
    return any(isinstance(c, InputWrite) for c in kernel.stores)


def _input_write(L, node, dst, src, non_blocking=False):
    if not (isinstance(dst, Buffer) and dst.name in L.inputs and not dst.is_view):
        raise Unsupported("a copy into a value that is not a whole graph input")
    if dst.device != L.device or dst.symbolic or not layout.dense(dst.shape, dst.stride):
        raise Unsupported("a copy into an input on another device, or not dense")
    written = L.__dict__.setdefault("_input_writes", set())
    if dst.name in written:
        raise Unsupported(f"a second copy into {dst.name}")
    if not hasattr(src, "shape") or len(src.shape) > len(dst.shape):
        raise Unsupported("a copy from a value that does not broadcast to the input")
    dtype = dst.dtype

    def fn(k, idx):
        return k.cast(src.load(k, bcast(idx, src.shape)), src.dtype, dtype) \
            if hasattr(src, "load") else k.literal(src, dtype)
    value = Pointwise(dst.shape, dtype, fn, reads_of(src))
    w = InputWrite(dst.name, value, L.device, len(L.items), dst.stride)
    L.items.append(w)
    L.wrapper_reads.add(w.name)  # stored: the write is the point
    written.add(dst.name)
    return dst


def _copy(L, node, dst, src, non_blocking=False):
    """`aten.copy` (functional): `src` broadcast to `dst`'s shape in `dst`'s dtype."""
    if not hasattr(src, "load") or len(src.shape) > len(dst.shape):
        raise Unsupported("a copy from a value that does not broadcast")

    def fn(k, idx):
        return k.cast(src.load(k, bcast(idx, src.shape)), src.dtype, dst.dtype)
    return Pointwise(dst.shape, dst.dtype, fn, reads_of(src))


LOWERINGS[aten.copy_.default] = _input_write
LOWERINGS[aten.copy.default] = _copy


# -- order: each tensor's chain in one kernel, old values read before they are overwritten ------
def _names(x, out):
    if isinstance(x, Buffer):
        out.add(x.name)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _names(v, out)
    elif isinstance(x, dict):
        _names(list(x.values()), out)
    return out


def _sizes_read(x, out):
    """The names of the shape symbols in an extern's arguments: in a condition a runtime
    assert checks, a size, a buffer's sizes, strides or offset."""
    if isinstance(x, Buffer):
        for v in (*x.shape, *x.stride, x.offset):
            _sizes_read(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _sizes_read(v, out)
    elif isinstance(x, dict):
        _sizes_read(list(x.values()), out)
    else:
        expr = getattr(x, "expr", x)   # (a lowering.SizeCondition's)
        out.update(s.name for s in getattr(expr, "free_symbols", ()))
    return out


def _fuse_spaces(a, b) -> bool:
    """Whether realized nodes `a` (read) and `b` (reading it) can share a kernel's index
    space, as the scheduler joins them."""
    (ax, ar, ared), (bx, br, bred) = space_of(a), space_of(b)
    if ared and bred:
        return (ax, ar) == (bx, br)
    if ared:
        return b.numel in (ax * ar, ax)
    if bred:
        return a.numel in (bx * br, bx)
    return a.numel == b.numel


def _accesses(lowered, items, singles=None):
    """Per item: (names it reads, names it makes), a kernel's reads as its own generation
    finds them (inlined values included), an extern's from its arguments.  `singles`:
    gets each computed item's group of its kernel alone, its generation kept
    (KernelGroup.generated) for the scheduler while the items' order is unchanged."""
    inputs = set(lowered.inputs)
    # a size derived from one the data decides is known once that one is
    late = {s.name: {u.name for u in us} for s, us in lowered.ctx.derived.late.items()}
    out = []
    for item in items:
        if isinstance(item, Extern):
            # (and the sizes the data decides that it reads or binds: a runtime assert on
            # u1 runs after the nonzero that makes u1)
            reads = _names((item.args, item.kwargs), set()) | _sizes_read((item.args, item.kwargs), set())
            reads |= set().union(*(late.get(n, ()) for n in reads))
            makes = _names(item.outputs, {item.name}) | {s.name for s in item.binds}
            schema = getattr(item.graph_op, "_schema", None)   # (an in-place twin writes only
            # a buffer of the graph that no other item reads: it reads it, as the op does)
            if schema is not None and schema.is_mutable:
                mutated = set()
                for a, arg in zip(schema.arguments, item.args):
                    if a.alias_info is not None and a.alias_info.is_write:
                        _names(arg, mutated)
                if not mutated <= inputs:
                    return None  # a write to a value the graph makes: keep program order
                makes |= mutated
            out.append((reads, makes))
            continue
        x, r, red = space_of(item)
        g = KernelGroup([item], x, r, red)
        cg = KernelCodegen(g, [item])
        try:
            made = (cg, *cg.generate())
        except NotFusable:
            # a write whose value reads the input at other elements (`x.copy_(x.flip(0))`):
            # it stays an aten copy of a value computed before
            e = Unsupported("a write to an input that reads the input at other elements")
            e.frametrace_node = getattr(item.node.fn, "node", None)
            raise e from None
        if singles is not None:
            g.generated = made
            singles[item] = g
        sizes = set(cg.symbols).union(*(late.get(n, ()) for n in cg.symbols))
        out.append(((cg.reads | set(cg.args) | sizes) - ({item.name} - inputs), {item.name}))
    return out


def groups(lowered, group) -> list | None:
    """KernelGroups and Externs in launch order, or None to keep program order (no input
    writes, no `_foreach_*` ops).  `group`: the scheduler's grouping of items in program
    order into kernels (handed in: this module sits below the scheduler).  Items are clustered into chains a kernel can fuse (a node and what it reads
    in the same index space, with the writes of the inputs they read), each cluster
    grouped on its own; clusters go in an order that respects every read: of a value
    made before, and of an input's old value before the write to that input."""
    items = lowered.items
    if not any(isinstance(i, InputWrite) for i in items) and not _has_foreach(lowered.gm):
        return None
    singles = {} if config.reuse_generations else None
    acc = _accesses(lowered, items, singles)
    if acc is None:
        return None
    inputs = set(lowered.inputs)
    maker = {}
    for i, (_, makes) in enumerate(acc):
        for n in makes - inputs:
            maker[n] = i
    # reads through the values read (a kernel may compute a value it reads, reading what
    # that reads; an extern's result is memory)
    deep = []
    for i, (reads, _) in enumerate(acc):
        d = set(reads)
        for n in reads:
            j = maker.get(n)
            if j is not None and j < i and isinstance(items[j], Computed):
                d |= deep[j]
        deep.append(d)
    edges = [set() for _ in items]   # i -> the items that must run after it
    parent = list(range(len(items)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i, j):
        parent[find(i)] = find(j)
    fusible = [isinstance(it, Computed) for it in items]
    for j, (reads, _) in enumerate(acc):
        for n in reads:
            i = maker.get(n)
            if i is not None and i != j:
                edges[i].add(j)
                if fusible[i] and fusible[j] and _fuse_spaces(items[i], items[j]):
                    union(i, j)
    writers = {}
    for i, (_, makes) in enumerate(acc):
        for n in makes & inputs:
            writers[n] = i
    war = []   # (reader of an input's old value, the write to that input)
    for j in range(len(items)):
        for n in deep[j] & writers.keys():
            w = writers[n]
            if w != j:
                war.append((j, w))
                if fusible[j] and fusible[w] and items[j].numel == items[w].numel \
                        and not (items[j].is_reduction or items[j].is_scan):
                    union(j, w)
    # externs with effects beyond their data (random numbers, an op we cannot see into)
    # keep their order
    ordered = [i for i, it in enumerate(items) if isinstance(it, Extern) and _effects(it.graph_op)]
    for a, b in zip(ordered, ordered[1:]):
        edges[a].add(b)
    # a runtime assert runs before every write of an input that follows it in the program
    # (which reads nothing it makes): placed after one, a failing check left the caller's
    # tensor written where eager raises before writing it (torch._check(n != 2) then
    # x.add_(n); and a wrapper that wrote an input raises as it is, not run again in
    # CPython).  (Edges in program order, as all others: no cycle of items; one of
    # clusters falls back to the items' own order below.)
    input_writers = [i for i, (_, makes) in enumerate(acc) if makes & inputs]
    for a, it in enumerate(items):
        if isinstance(it, Extern) and _checks(it.graph_op):
            edges[a].update(w for w in input_writers if w > a)
    # what the scheduler fused in program order stays together: a reduction kernel's
    # members, and pointwise ones that read a tensor in common (siblings that share its
    # loads; not each tensor's chain of a foreach op, which share only scalars)
    position = {id(it): i for i, it in enumerate(items)}
    sizes = _sizes(lowered)
    for g in group(items, singles):   # (before the items are reordered: their singles hold)
        if isinstance(g, Extern):
            continue
        members = [position[id(m)] for m in g.members]
        if g.reduction:
            for m in members[1:]:
                union(members[0], m)
            continue
        seen = {}
        for m in members:
            for n in acc[m][0]:
                if sizes.get(n, 1) > 1:
                    union(seen.setdefault(n, m), m)
    # Within a cluster a write may follow a reader of the old value in either order when
    # both land in one kernel (each lane loads before it stores): checked once grouped.
    # (Two writes that each read the other's old input, at their own elements: SGD's
    # parameter and momentum buffer.)
    inside = [(j, w) for j, w in war if find(j) == find(w)]
    inside_set = set(inside)
    for j, w in war:
        if find(j) != find(w):
            edges[j].add(w)
    clusters = {}
    for i in range(len(items)):
        clusters.setdefault(find(i), []).append(i)
    last = [isinstance(it, InputWrite) for it in items]
    kinds = [isinstance(it, Extern) for it in items]
    runs = _topological(list(clusters.values()), edges, last, kinds)
    if runs is None:
        for j, w in inside:
            edges[j].add(w)
        inside = []
        flat = _topological([[i] for i in range(len(items))], edges, last, kinds)
        if flat is None:
            _cycle(items, edges)
        # one run per stretch of kernels between externs: grouped as one run, the
        # scheduler fuses kernels across an extern that reads none of their results, and
        # an input's write went before the extern that reads its old value (a matmul)
        runs, stretch = [], []
        for i in (i for run in flat for i in run):
            if kinds[i]:
                runs += [stretch, [i]] if stretch else [[i]]
                stretch = []
            else:
                stretch.append(i)
        runs += [stretch] if stretch else []
    for pos, i in enumerate(i for run in runs for i in run):
        if isinstance(items[i], Computed):
            items[i].order = pos  # kernels launched before read it, later ones inline it
    groups = [g for run in runs for g in group([items[i] for i in run])]
    kernel_of = {}
    for k, g in enumerate(groups):
        for m in ([g] if isinstance(g, Extern) else g.members):
            kernel_of[id(m)] = k
    # every read of an input's old value runs before the write: in an earlier kernel or
    # extern, or in the write's own kernel where each lane reads only its own elements.
    # (Reads as each item's own kernel makes them: a value realized before is loaded, not
    # recomputed from the input, so `deep`'s reads through it are no reads here.)
    for j, w in ((j, writers[n]) for j, (reads, _) in enumerate(acc) for n in reads & writers.keys()):
        if w == j:
            continue
        kj, kw = kernel_of[id(items[j])], kernel_of[id(items[w])]
        if kj > kw or kj == kw and not ((j, w) in inside_set or _lanewise(items[j], items[w])):
            e = Unsupported("an input written before a kernel that reads its old value")
            e.frametrace_node = getattr(items[w].node.fn, "node", None)
            raise e
    return groups


def _lanewise(reader, writer) -> bool:
    """Whether a reader of an input's old value may share the writer's kernel: both
    computed over the same elements, no reduction or scan (lanes that load other
    elements than they store)."""
    return isinstance(reader, Computed) and isinstance(writer, Computed) and \
        reader.numel == writer.numel and not (reader.is_reduction or reader.is_scan)


def _sizes(lowered) -> dict:
    """{wrapper name: element count} of the graph's inputs and values."""
    sizes = {n: t.numel() for n, t in zip(lowered.inputs, lowered.example_inputs)
             if isinstance(t, torch.Tensor)}
    for item in lowered.items:
        for b in ([item.buffer] if isinstance(item, Computed) else
                  _buffers(item.outputs, []) if isinstance(item, Extern) else []):
            if indexing.is_static(b.numel):
                sizes[b.name] = int(b.numel)
    return sizes


def _buffers(x, out):
    if isinstance(x, Buffer):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _buffers(v, out)
    return out


def _has_foreach(gm) -> bool:
    """Whether the graph had `_foreach_*` ops (decomposed: their nodes remember them)."""
    return any(getattr(getattr(n.meta.get("original_aten"), "_schema", None), "name", "")
               .startswith("aten::_foreach_") for n in gm.graph.nodes)


def _checks(op) -> bool:
    """Whether an op is a runtime check (aten._assert_scalar, _assert_async, ...): it
    makes nothing, and raises."""
    schema = getattr(op, "_schema", None)
    return schema is not None and "_assert" in schema.name


def _effects(op) -> bool:
    if not isinstance(op, torch._ops.OpOverload):
        return True
    return torch.Tag.nondeterministic_seeded in op.tags or (
        op._schema.is_mutable and op is not aten.copy_.default)


def _topological(clusters, edges, last, kinds):
    """The clusters in an order where every edge runs forward (each cluster's items
    too), or None when there is a cycle.  Clusters go in waves, by their depth in the
    graph of clusters: the independent ones of a wave follow one another, so that they
    launch together (a wave's kernels before its externs, each by program position)."""
    n = len(last)
    of = [0] * n
    for c, members in enumerate(clusters):
        for i in members:
            of[i] = c
    indeg = [0] * len(clusters)
    cedges = [set() for _ in clusters]
    for i in range(n):
        for j in edges[i]:
            if of[i] != of[j] and of[j] not in cedges[of[i]]:
                cedges[of[i]].add(of[j])
                indeg[of[j]] += 1
    depth = [0] * len(clusters)
    todo, left = [c for c in range(len(clusters)) if indeg[c] == 0], list(indeg)
    for c in todo:   # (grows while it is walked: Kahn's order)
        for d in cedges[c]:
            depth[d] = max(depth[d], depth[c] + 1)
            left[d] -= 1
            if left[d] == 0:
                todo.append(d)
    if len(todo) != len(clusters):
        return None

    def key(c):
        return depth[c], kinds[clusters[c][0]], min(clusters[c]), c
    ready = [key(c) for c in range(len(clusters)) if indeg[c] == 0]
    heapq.heapify(ready)
    runs = []
    while ready:
        c = heapq.heappop(ready)[-1]
        inner = _inner_order(clusters[c], edges, last)
        if inner is None:
            return None
        runs.append(inner)
        for d in cedges[c]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(ready, key(d))
    return runs


def _inner_order(members, edges, last):
    mset = set(members)
    indeg = {i: 0 for i in members}
    for i in members:
        for j in edges[i] & mset:
            indeg[j] += 1
    ready = [(last[i], i) for i in members if indeg[i] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(i)
        for j in edges[i] & mset:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, (last[j], j))
    return out if len(out) == len(members) else None


def _cycle(items, edges):
    """Input writes that read each other's old values (a swap): one of them becomes an
    aten copy of a value computed before either write."""
    for i, it in enumerate(items):
        if isinstance(it, InputWrite) and any(isinstance(items[j], InputWrite) for j in edges[i]):
            e = Unsupported("input writes that read each other's old inputs")
            fn = it.node.fn
            e.frametrace_node = getattr(fn, "node", None)
            raise e
    raise Unsupported("no order of the graph's writes to its inputs reads every old value first")


# -- combo kernels ------------------------------------------------------------------------------
# Pointers and numbers one combo kernel takes at most (CUDA caps a launch's argument bytes;
# Inductor's foreach kernels take 250)
MAX_ARGS = 250
# Elements per program and warps (Inductor's foreach kernels: 1024, 8): one config, not
# tuned, since timing a kernel that writes its inputs would apply the update repeatedly
XBLOCK, NUM_WARPS = 1024, 8


class ComboGroup:
    """The kernel groups (pointwise, static sizes) one combo kernel runs: sub-kernel j
    takes `blocks[j]` programs of `xblock` elements.  `xnumel` is the grid's element count,
    so that a Launcher's grid (xnumel / XBLOCK) is the total of blocks."""
    __slots__ = ("subs", "members", "blocks", "xblock", "xnumel", "rnumel", "reduction",
                 "outer", "configs")

    def __init__(self, kernels):
        self.subs = [(k.group, k.stores) for k in kernels]
        self.members = [c for k in kernels for c in k.group.members]
        self.xblock = min(XBLOCK, next_pow2(max(k.group.xnumel for k in kernels)))
        self.blocks = [-(-k.group.xnumel // self.xblock) for k in kernels]
        self.xnumel, self.rnumel, self.reduction, self.outer = sum(self.blocks) * self.xblock, 1, False, None
        self.configs = [Config(self.xblock, 1, NUM_WARPS if self.xblock >= 1024 else 4)]


def _combinable(k) -> bool:
    g = k.group
    return not isinstance(g, ComboGroup) and not g.reduction and k.tile is None and not k.symbols \
        and indexing.is_static(g.xnumel) and k.source.count("@triton.jit") == 1  # (no helpers: Philox)


def _touches(k):
    """(names the kernel reads or writes, names it writes)."""
    writes = {c.name for c in k.stores}
    return set(k.args) | writes, writes


def combine(kernels) -> list:
    """Kernels and Externs in launch order, runs of independent pointwise kernels that
    follow one another launched as combo kernels (at most MAX_ARGS arguments each)."""
    out, run = [], []

    def flush():
        part, used, wrote, nargs = [], set(), set(), 0
        for k in run + [None]:
            if k is not None:
                touched, writes = _touches(k)
                fits = nargs + len(k.args) <= MAX_ARGS
                if fits and not (writes & used) and not (touched & wrote):
                    part.append(k)
                    used |= touched
                    wrote |= writes
                    nargs += len(k.args)
                    continue
            if part:
                out.append(part[0] if len(part) == 1 else combo_kernel(part))
            if k is not None:
                part, nargs = [k], len(k.args)
                used, wrote = _touches(k)
        run.clear()
    passed = 0   # aten calls the pending run has let go first
    for k in kernels:
        if not isinstance(k, Extern) and _combinable(k):
            run.append(k)
            continue
        if isinstance(k, Extern) and run and passed < PASS_EXTERNS and _may_pass(k, run):
            # the run waits for a later kernel to launch with: a gradient's cast after its
            # matmul goes with the next layer's pointwise kernel, not alone (nor, as when
            # graph outputs were stored at the end, with every other cast)
            out.append(k)
            passed += 1
            continue
        flush()
        passed = 0
        out.append(k)
    flush()
    return out


# aten calls a run of pointwise kernels may wait past for a partner: each one it waits
# past keeps its inputs alive a little longer
PASS_EXTERNS = 2


def _may_pass(e, run) -> bool:
    """Whether the extern `e` may run before the kernels of `run`: it writes nothing (an
    aten op known not to mutate) and reads nothing they store."""
    if getattr(getattr(e.op, "_schema", None), "is_mutable", True):
        return False
    reads = e.reads()
    return not any(reads & _touches(k)[1] for k in run)


_LOCAL = re.compile(r"\b(tmp\d+|acc\d+|xindex|xoffset|xmask)\b")
_PARAM = re.compile(r"\b(in_ptr|out_ptr|ks)(\d+)\b")


def combo_kernel(kernels):
    """One launch of `kernels`: program `pid` runs the sub-kernel whose range of block
    numbers holds it, on block `pid - start` of that sub-kernel's elements."""
    group = ComboGroup(kernels)
    args, counts, body, start = {}, {}, [], 0
    wide = group.xnumel >= 2 ** 31
    for j, ((g, stores), blocks) in enumerate(zip(group.subs, group.blocks)):
        cg = KernelCodegen(g, stores)
        cg.has_xmask = True  # (blocks of the shared size overrun a sub-kernel's end)
        cg.generate()
        wide |= cg.wide
        local = {}
        for name, param in cg.args.items():
            if name not in args:
                prefix = _PARAM.match(param).group(1)
                args[name] = f"{prefix}{counts.get(prefix, 0)}"
                counts[prefix] = counts.get(prefix, 0) + 1
            local[param] = args[name]

        def rename(line):
            line = _PARAM.sub(lambda m: local[m.group(0)], line)
            line = _LOCAL.sub(lambda m: f"{m.group(1)}_{j}", line)
            return re.sub(r"\bxnumel\b", str(int(g.xnumel)), line)
        pid = "pid" if start == 0 else f"(pid - {start})"
        # One flat `if` per sub-kernel, not an elif chain: Triton's code generator
        # recurses once per `elif` (a nested If), and a combo of a hundred sub-kernels
        # (an optimizer's tensors) exceeded Python's recursion limit compiling it.
        test = f"pid < {start + blocks}" if start == 0 else f"(pid >= {start}) & (pid < {start + blocks})"
        body += [f"    if {test}:",
                 f"        xoffset_{j} = {pid} * XBLOCK",
                 f"        xindex_{j} = xoffset_{j} + tl.arange(0, XBLOCK)",
                 f"        xmask_{j} = xindex_{j} < {int(g.xnumel)}"]
        body += ["        " + rename(line) for line in cg.outer]
        start += blocks
    params = list(args.values()) + ["XBLOCK: tl.constexpr"]
    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    src = "@triton.jit\ndef KERNEL({}):\n    pid = {}\n{}\n".format(", ".join(params), pid, "\n".join(body))
    name = f"triton_combo_{hashlib.sha256(src.encode()).hexdigest()[:12]}"
    stores = [c for _, st in group.subs for c in st]
    return Kernel(group, stores, name, src.replace("def KERNEL(", f"def {name}(", 1), args)
