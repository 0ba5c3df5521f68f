"""Values a training graph's forward computes once: what the backward gets saved is the
buffer the forward computed anyway (not a second copy in another layout), and the same
value written several times in the joint graph (autocast casts an input once per op that
reads it) is computed and saved once.  Gradients are compared with eager's."""
import operator
import re

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, partition  # noqa: E402
from triton_harness import triton_check_grads  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
aten = torch.ops.aten
BF16 = dict(atol=3e-2, rtol=3e-2)


def run(fn, *shapes, tol=BF16):
    """fn compiled (triton), forward and backward, against eager on 3 input draws;
    returns the forward and backward CompiledModules."""
    backend.COMPILED.clear()
    calls = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        # (small: bf16 rounding)
        calls.append([(torch.randn(*s, generator=g) * 0.3).requires_grad_() for s in shapes])
    triton_check_grads(fn, calls=calls, **tol)
    kinds = {m.kind: m for m in backend.COMPILED}
    assert len(backend.COMPILED) == 2 and set(kinds) == {"forward", "backward"}
    return kinds["forward"], kinds["backward"]


def test_weight_cast_read_transposed_and_saved_is_stored_once():
    # the matmul reads cast(w).t(); the backward's input gradient reads cast(w) saved
    fw, _ = run(lambda x, w: F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16)).float().sin(),
                (8, 16), (32, 16))
    assert fw.source.count("dtype=torch.bfloat16") == 2, fw.source   # x and w cast, once each


def test_casts_of_one_input_for_several_matmuls_are_one_value():
    def f(h, wq, wk, wv):
        x = h * 2           # (a pointwise value: its bf16 copy is what the matmuls read)
        q = x.to(torch.bfloat16) @ wq.to(torch.bfloat16).t()
        k = x.to(torch.bfloat16) @ wk.to(torch.bfloat16).t()
        v = x.to(torch.bfloat16) @ wv.to(torch.bfloat16).t()
        return (q * k + v).float()
    # (bf16 products: eager rounds q * k before adding v, a kernel once at the end)
    fw, _ = run(f, (8, 16), (16, 16), (16, 16), (16, 16), tol=dict(atol=8e-2, rtol=5e-2))
    stores = fw.source.count("dtype=torch.bfloat16")
    # x's bf16 copy and three weight copies, each stored once
    assert stores == 4, fw.source


def graph_of(build):
    g = fx.Graph()
    x = g.placeholder("primals_1")
    out = build(g, x)
    g.output(out)
    for n in g.nodes:      # (the output check reads values' storages)
        if n.op != "output":
            n.meta["val"] = torch.empty(2)
    return g


def targets(g):
    return [n.target for n in g.nodes if n.op == "call_function"]


def test_merge_duplicates_keeps_random_ops_mutations_and_outputs_apart():
    def build(g, x):
        a = g.call_function(aten.sin.default, (x,))
        b = g.call_function(aten.sin.default, (x,))            # merges into a
        r1 = g.call_function(aten.rand_like.default, (x,))
        r2 = g.call_function(aten.rand_like.default, (x,))     # random: stays
        c = g.call_function(aten.add.Tensor, (a, b))
        g.call_function(aten.copy_.default, (x, c))            # a write: later reads differ
        d = g.call_function(aten.sin.default, (x,))            # after the write: stays
        e = g.call_function(aten.cos.default, (x,))
        f = g.call_function(aten.cos.default, (x,))            # an output: stays apart
        return (c, r1, r2, d, e, f)
    g = graph_of(build)
    assert partition.merge_duplicates(g) == 1
    assert targets(g).count(aten.sin.default) == 2
    assert targets(g).count(aten.rand_like.default) == 2
    assert targets(g).count(aten.cos.default) == 2
    add = next(n for n in g.nodes if n.target is aten.add.Tensor)
    assert add.args[0] is add.args[1]


def test_merge_duplicates_keeps_written_values_and_empty_tensors_apart():
    def build(g, x):
        a = g.call_function(aten.mul.Tensor, (x, 2))
        b = g.call_function(aten.mul.Tensor, (x, 2))       # written below: stays
        g.call_function(aten.add_.Tensor, (b, 1))
        e1 = g.call_function(aten.empty.memory_format, ([2],))
        e2 = g.call_function(aten.empty.memory_format, ([2],))
        return (g.call_function(aten.sub.Tensor, (a, b)), e1, e2)
    g = graph_of(build)
    assert partition.merge_duplicates(g) == 0


def test_merge_duplicates_merges_multi_output_ops_read_through_getitems():
    def build(g, x):
        a = g.call_function(aten.var_mean.correction, (x,), {"correction": 0})
        b = g.call_function(aten.var_mean.correction, (x,), {"correction": 0})
        a0 = g.call_function(operator.getitem, (a, 0))
        b0 = g.call_function(operator.getitem, (b, 0))
        return (g.call_function(aten.add.Tensor, (a0, b0)),)
    g = graph_of(build)
    assert partition.merge_duplicates(g) == 1
    assert targets(g).count(aten.var_mean.correction) == 1


def test_sink_recomputation_moves_forward_values_to_their_first_use():
    # A backward graph in the split's order: both layers' recomputations first.
    g = fx.Graph()
    a1, a2, t = g.placeholder("addmm_1"), g.placeholder("addmm_2"), g.placeholder("tangents_1")
    r1 = g.call_function(aten.relu.default, (a1,))
    r2 = g.call_function(aten.relu.default, (a2,))
    g2 = g.call_function(aten.mul.Tensor, (t, r2))
    g1 = g.call_function(aten.mul.Tensor, (g2, r1))
    g.output((g1, g2))
    assert partition.sink_recomputation(g) > 0
    assert [n for n in g.nodes if n.op == "call_function"] == [r2, g2, r1, g1]
    assert partition.sink_recomputation(g) == 0          # (already in place)


def test_sink_recomputation_keeps_random_ops_in_order():
    g = fx.Graph()
    a, t = g.placeholder("addmm_1"), g.placeholder("tangents_1")
    r1 = g.call_function(aten.rand_like.default, (a,))
    r2 = g.call_function(aten.rand_like.default, (a,))
    e = g.call_function(aten.exp.default, (a,))
    u2 = g.call_function(aten.mul.Tensor, (t, r2))
    u1 = g.call_function(aten.mul.Tensor, (u2, r1))
    g.output((u1, e))
    partition.sink_recomputation(g)
    order = [n for n in g.nodes if n.op == "call_function"]
    assert order.index(r1) < order.index(r2)


def test_sink_recomputation_leaves_a_graph_with_a_write_alone():
    # relu(a) read before a's in-place write must not move past it
    g = fx.Graph()
    a, t = g.placeholder("addmm_1"), g.placeholder("tangents_1")
    r = g.call_function(aten.relu.default, (a,))
    w = g.call_function(aten.mul_.Tensor, (a, t))
    u = g.call_function(aten.mul.Tensor, (t, r))
    g.output((u, w))
    before = list(g.nodes)
    assert partition.sink_recomputation(g) == 0
    assert list(g.nodes) == before


def test_mlp_layers_recompute_their_activations_in_their_own_backward_kernels():
    # Under autocast the backward recomputes each layer's GELU from its saved fc output;
    # the recomputation fuses into that layer's gradient kernel.  Computed up front in
    # forward order, every layer's activations would be stored at the backward's start
    # and held until its layer (GPT-2: 288 MiB at the peak).
    torch.manual_seed(0)
    fcs = [torch.nn.Linear(32, 128) for _ in range(3)]
    projs = [torch.nn.Linear(128, 32) for _ in range(3)]

    def mlp(x):
        with torch.autocast("cpu", torch.bfloat16):
            for fc, proj in zip(fcs, projs):
                x = x + proj(F.gelu(fc(x), approximate="tanh"))
        return x.float()
    _, bw = run(mlp, (4, 8, 32), tol=dict(atol=6e-2, rtol=6e-2))
    saved_fc = re.compile(r"\baddmm(_\d+)?\b")
    launches = [line for line in bw.source.splitlines() if re.match(r"\s+kernel\d+\(", line)]
    for line in launches:
        assert len(set(m.group(0) for m in saved_fc.finditer(line))) <= 1, bw.source
