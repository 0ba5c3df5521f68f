"""Mixtures of experts: top-k routing, a gather per expert, the experts' MLPs and an
`index_add_` combine.  With `config.capture_dynamic_output_shape_ops` the per-expert
token counts (`torch.where` of the routing mask) are unbacked sizes, so a loop over the
experts is one graph whatever the routing sends where, an expert receiving no token
included.  Transformers' own Mixtral is checked with each of its experts
implementations (`grouped_mm`, its default, `batched_mm`, and the `eager` loop over the
experts that were hit).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import frametrace
from conftest import no_unbacked_guards
from differential import check, check_grads

BACKENDS = ["eager", "aot_eager"]
HIDDEN, FFN, EXPERTS, TOP_K = 16, 32, 4, 2


class Expert(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False), \
            nn.Linear(h, f, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """Mixtral's sparse MoE block as transformers 4.x wrote it (and many models still do):
    a loop over every expert, `torch.where` of its routing mask, `index_add_`."""

    def __init__(self, h=HIDDEN, f=FFN, experts=EXPERTS, top_k=TOP_K):
        super().__init__()
        self.num_experts, self.top_k = experts, top_k
        self.gate = nn.Linear(h, experts, bias=False)
        self.experts = nn.ModuleList(Expert(h, f) for _ in range(experts))

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = torch.zeros((batch * seq, hidden), dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[expert_idx])
            current = hidden_states[None, top_x].reshape(-1, hidden)
            current = self.experts[expert_idx](current) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, current.to(hidden_states.dtype))
        return final.reshape(batch, seq, hidden), router_logits


def routed_block(seed=0):
    """A block whose router scores expert e by feature e of the token, so that inputs
    choose the routing: each call below sends other counts to each expert."""
    torch.manual_seed(seed)
    block = SparseMoeBlock().eval()
    with torch.no_grad():
        block.gate.weight.zero_()
        block.gate.weight[:, :EXPERTS] = torch.eye(EXPERTS) * 4
    return block


def routings(batch=2, seq=6):
    """Inputs: random routing, one expert receiving no token, every token to experts 0
    and 1 (two experts idle), and random again."""
    out = []
    for starve in (None, EXPERTS - 1, "two", None):
        x = torch.randn(batch, seq, HIDDEN)
        if starve == "two":
            x[..., :EXPERTS] = torch.tensor([3.0, 2.0] + [-3.0] * (EXPERTS - 2))
        elif starve is not None:
            x[..., starve] = -10.0
        out.append(x)
    return out


def counts(block, x):
    """Tokens per expert for input x (the test's own check that routing varies)."""
    with torch.no_grad():
        _, sel = torch.topk(block.gate(x.view(-1, HIDDEN)), TOP_K, dim=-1)
    return torch.bincount(sel.flatten(), minlength=EXPERTS).tolist()


def test_the_routings_vary_and_starve_experts():
    block = routed_block()
    seen = [counts(block, x) for x in routings()]
    assert any(0 in c for c in seen) and len({tuple(c) for c in seen}) == len(seen), seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_over_experts_is_one_graph(capture_shapes, backend):
    block = routed_block()
    with torch.no_grad():
        r = check(block, routings(), backend=backend, fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


def test_loop_over_experts_with_gradients(capture_shapes):
    # the input's gradient runs back through every expert's gather and index_add_
    block = routed_block()

    def f(x):
        out, logits = block(x)
        return out.square().mean() + logits.mean()

    inputs = [x.requires_grad_() for x in routings()]
    check_grads(f, inputs, backend="aot_eager", fullgraph=True, graphs=1, compiles=1, atol=1e-5)


def test_without_capture_each_expert_is_a_break():
    block = routed_block()
    with torch.no_grad():
        r = check(block, routings())
    assert r.breaks >= EXPERTS, r


def test_index_add_of_a_data_dependent_count_asserts_nothing_about_it(capture_shapes):
    # the check that an in-place op keeps its operand's shape (graph.py) used to ask
    # torch.broadcast_shapes((32, 4), (u0,)), which recorded u0 == 4 as a runtime assert:
    # the graph then failed on any other count and the frame ran in CPython
    def f(mask, h, out):
        pos, tok = torch.where(mask)
        out.index_add_(0, tok, h[tok] * (pos[:, None] + 1))
        return out

    inputs = [(torch.rand(2, 8) > p, torch.randn(8, 4), torch.zeros(8, 4)) for p in (0.5, 0.9, 1.0, 0.2)]
    r = check(f, inputs, fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)
    assert "== 4" not in r.counter.graphs[0].code and "Eq(" not in r.counter.graphs[0].code


# -- the triton backend: sizes the data decides in kernels --------------------------------

def _triton_graphs_ran_as_kernels(before):
    from frametrace.backends.triton import backend
    assert backend.STATS["eager_graphs"] == before, "a graph ran eagerly instead of as kernels"


def test_loop_over_experts_on_triton(capture_shapes, triton_interpreter):
    # each expert's token count is an unbacked size the wrapper reads from its nonzero;
    # the kernels around the experts' matmuls take it as an argument, and skip their
    # launch when an expert gets no token
    pytest.importorskip("triton")
    from triton_harness import triton_check
    from frametrace.backends.triton import backend
    before = backend.STATS["eager_graphs"]
    block = routed_block()
    with torch.no_grad():
        mod = triton_check(block, calls=[(x,) for x in routings()], atol=1e-5)
    _triton_graphs_ran_as_kernels(before)
    assert mod.symbolic and mod.kernels, mod.source
    for e in range(EXPERTS):
        assert f"u{e} = " in mod.source, mod.source   # (bound after its nonzero)
    # the gathers of each expert's tokens and routing weights are kernels' loads; the
    # matmuls, nonzero and the index_add_ (index_put) stay aten calls
    assert "aten.index.Tensor" not in mod.externs, mod.externs
    # (the 2 x 12 mask's nonzero bound, asserted by the wrapper: config.python_size_asserts)
    assert "if not (u0 <= 24): raise RuntimeError(" in mod.source, mod.source


def test_loop_over_experts_backward_on_triton(capture_shapes, triton_interpreter):
    # the backward gets the token counts and the forward's runtime asserts on them
    # (SymBool inputs) and compiles to kernels too
    pytest.importorskip("triton")
    from triton_harness import triton_check_grads
    from frametrace.backends.triton import backend
    before = backend.STATS["eager_graphs"]
    block = routed_block()
    triton_check_grads(block, calls=[(x.requires_grad_(),) for x in routings()], atol=1e-5)
    _triton_graphs_ran_as_kernels(before)
    assert [m.kind for m in backend.COMPILED][-2:] == ["forward", "backward"], backend.COMPILED
    assert backend.COMPILED[-1].kernels


def test_item_and_checks_on_triton(capture_shapes, triton_interpreter):
    # a number item() reads is bound from the call that reads it; torch._check facts
    # about it are checked by the wrapper
    pytest.importorskip("triton")
    from triton_harness import triton_check
    frametrace.config.capture_scalar_outputs = True

    def f(x, n):
        k = n.item()
        torch._check(k <= x.shape[0])
        torch._check(k >= 0)
        return x[:k] * 2, torch.ones(k, 3) * x.sum()

    x = torch.randn(10)
    triton_check(f, calls=[(x, torch.tensor(n)) for n in (3, 0, 10)])


# -- transformers' Mixtral ------------------------------------------------------------------

def mixtral(impl, layers=2):
    transformers = pytest.importorskip("transformers")
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    if impl == "loop":
        ALL_EXPERTS_FUNCTIONS.register("loop", loop_experts_forward)
    cfg = transformers.MixtralConfig(
        vocab_size=64, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K, max_position_embeddings=64)
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    model = transformers.MixtralModel(cfg).eval()
    assert model.config._experts_implementation == impl
    return model


def loop_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers 4.x's loop over every expert, on the 3-D expert weights of 5.x
    (benchmarks/moe.py registers the same as experts_implementation="loop")."""
    final = torch.zeros_like(hidden_states)
    expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
    for e in range(self.num_experts):
        pos, tok = torch.where(expert_mask[e])
        gate, up = F.linear(hidden_states[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
        current = F.linear(self.act_fn(gate) * up, self.down_proj[e]) * top_k_weights[tok, pos, None]
        final.index_add_(0, tok, current.to(final.dtype))
    return final


def token_batches(n=4):
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 64, (2, 6), generator=gen) for _ in range(n)]


@pytest.mark.parametrize("impl", ["grouped_mm", "batched_mm", "loop"])
def test_mixtral_is_one_graph(capture_shapes, impl):
    model = mixtral(impl)

    def f(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state

    with torch.no_grad():
        r = check(f, token_batches(), fullgraph=True, graphs=1, compiles=1, atol=1e-5)
    no_unbacked_guards(r)


def test_mixtral_eager_experts_loop_breaks_only_at_its_data_dependent_loop(capture_shapes):
    # transformers 5's "eager" experts iterate over nonzero() of the routing mask: a trip
    # count read from data, so the loop runs in CPython (as under torch.compile); the
    # rest of each layer is compiled, once for every routing
    model = mixtral("eager", layers=1)

    def f(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state

    with torch.no_grad():
        one = check(f, token_batches(1), atol=1e-5).compiles
        frametrace.reset()
        r = check(f, token_batches(), atol=1e-5)
    reasons = {rec.reason for rec in r.records if rec.outcome in ("break", "fallback")}
    assert all("u0" in why or "tuple_iterator" in why for why in reasons), reasons
    assert r.compiles == one, r   # (no recompile for another routing)


@pytest.mark.parametrize("impl", ["loop", "grouped_mm"])
def test_mixtral_on_triton(capture_shapes, triton_interpreter, impl):
    # the whole model (attention, norms, router, experts) as one graph of kernels
    pytest.importorskip("triton")
    from triton_harness import triton_check
    from frametrace.backends.triton import backend
    before = backend.STATS["eager_graphs"]
    model = mixtral(impl, layers=1)

    def f(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state

    with torch.no_grad():
        triton_check(f, calls=[(ids,) for ids in token_batches(3)], atol=1e-5)
    _triton_graphs_ran_as_kernels(before)
