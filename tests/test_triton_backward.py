"""backend="triton" in training: the backward graph runs as generated kernels too (Triton's
interpreter on the CPU), its gradients match eager's for every lowered op's backward, the
joint graph's partition recomputes cheap forward values instead of saving them, and a few
steps of training leave the same parameters as eager."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, partition  # noqa: E402
from frametrace.backends.triton.decompositions import decompositions  # noqa: E402
from triton_harness import triton_check_vjp  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

BF16 = dict(atol=3e-2, rtol=3e-2)
F32 = dict(atol=1e-4, rtol=1e-4)


def modules(kind):
    return [m for m in backend.COMPILED if m.kind == kind]


def backward_run(fn, *args, tangent=None, tol=F32, max_aten=None, fallbacks=()):
    """fn compiled with the triton backend, forward and backward, matches eager: values and
    gradients (in float32).  The backward is a compiled graph whose kernels run it: it has
    kernels, only `fallbacks` ops run as aten calls a kernel could have run, and at most
    `max_aten` aten calls in all.  Returns the backward's CompiledModule."""
    n = 1
    with torch.no_grad():
        probe = fn(*args)
        n = len(probe) if isinstance(probe, tuple) else 1
    gen = torch.Generator().manual_seed(1)
    weights = {}

    def tangent_of(i):
        def make(o):
            if i not in weights:
                weights[i] = torch.randn(o.shape, generator=gen).to(o.dtype) if tangent is None else tangent(o)
            return weights[i]
        return make
    tangents = [tangent_of(i) for i in range(n)]
    backend.COMPILED.clear()
    eager_graphs = backend.STATS["eager_graphs"]
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    triton_check_vjp(lambda *a: fn(*a), *leaves, tangents=tangents, half_as_float=True, **tol)
    assert backend.STATS["eager_graphs"] == eager_graphs, "a graph ran eagerly"
    (bw,) = modules("backward")
    assert len(modules("forward")) == 1
    assert bw.kernels, bw.source
    assert sorted({f.op for f in bw.fallbacks}) == sorted(fallbacks), bw.fallbacks
    if max_aten is not None:
        assert len(bw.externs) <= max_aten, bw.source
    return bw


def positive(*shape):
    return torch.rand(*shape) + 0.5


# -- every lowered op's backward, float32 and bf16 ----------------------------------------
UNARY = {
    "exp": torch.exp, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "abs": torch.abs, "neg": torch.neg,
    "square": torch.square, "pow3": lambda x: x ** 3, "expm1": torch.expm1,
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "leaky_relu": F.leaky_relu, "softplus": F.softplus, "hardtanh": F.hardtanh,
    "clamp": lambda x: x.clamp(-0.5, 0.7), "x_sigmoid_chain": lambda x: x * torch.sigmoid(x) * torch.sigmoid(x * 2),
}
UNARY_POSITIVE = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
                  "reciprocal": torch.reciprocal, "pow_half": lambda x: x ** 2.5, "log1p": torch.log1p}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(UNARY) + sorted(UNARY_POSITIVE))
def test_unary_backward(name, dtype):
    fn = UNARY.get(name) or UNARY_POSITIVE[name]
    x = (positive(4, 6) if name in UNARY_POSITIVE else torch.randn(4, 6)).to(dtype)
    backward_run(fn, x, tol=F32 if dtype == torch.float32 else BF16, max_aten=0)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": torch.maximum, "minimum": torch.minimum, "add_alpha": lambda a, b: torch.add(a, b, alpha=3),
    "pow": lambda a, b: (a.abs() + 0.5) ** b, "atan2": torch.atan2,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_backward_broadcast(name, dtype):
    """The broadcast operand's gradient is a sum over the outer axis (a column sum)."""
    a, b = torch.randn(5, 6).to(dtype), torch.randn(6).to(dtype)
    backward_run(BINARY[name], a, b, tol=F32 if dtype == torch.float32 else BF16, max_aten=0)


REDUCTIONS = {
    "sum": lambda x: x.sum(-1), "sum_dim0": lambda x: x.sum(0), "sum_all": lambda x: x.sum(),
    "mean": lambda x: x.mean(-1, keepdim=True), "mean_dims": lambda x: x.mean((0, 2)),
    "amax": lambda x: x.amax(-1), "amin_dim0": lambda x: x.amin(0), "var": lambda x: x.var(-1),
    "var_dim0": lambda x: x.var(0, correction=0), "std": lambda x: x.std(1),
    "logsumexp": lambda x: torch.logsumexp(x, -1), "max_dim": lambda x: x.max(-1).values,
    "norm": lambda x: x.norm(dim=-1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_backward(name, dtype):
    x = torch.randn(3, 5, 8).to(dtype)
    # (after a pointwise op: the gradient of a sum alone is a view of the tangent, no kernel)
    backward_run(lambda x: REDUCTIONS[name](x.sin()), x, tol=F32 if dtype == torch.float32 else BF16, max_aten=0)


def rms_norm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


NORMS = {
    "softmax": lambda x, w, b: torch.softmax(x * w, -1),
    "log_softmax": lambda x, w, b: F.log_softmax(x + b, -1),
    "softmax_dim0": lambda x, w, b: torch.softmax(x, 0) * w,
    "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
    "layer_norm_no_affine": lambda x, w, b: F.layer_norm(x, (x.shape[-1],)) * 2,
    "rms_norm": lambda x, w, b: rms_norm(x, w),
    "F_rms_norm": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_and_softmax_backward(name, dtype):
    x, w, b = torch.randn(2, 3, 16).to(dtype), torch.randn(16).to(dtype), torch.randn(16).to(dtype)
    backward_run(NORMS[name], x, w, b, tol=F32 if dtype == torch.float32 else BF16, max_aten=0)


SHAPES = {
    "permute": lambda x, y: x.permute(2, 0, 1) * y.t().unsqueeze(1),
    "transpose": lambda x, y: x.transpose(0, 1).reshape(4, -1).sin(),
    "view": lambda x, y: x.view(6, 4) * y.reshape(-1)[:4],
    "expand": lambda x, y: y.unsqueeze(0).expand(3, 4, 2) * x,
    "cat_slice": lambda x, y: torch.cat([x[:, :, 1:], x * 2], 2)[:, 1:, ::2].exp(),
    "select": lambda x, y: x[:, 1] * x[:, 2] + x.select(1, 0),
    "split": lambda x, y: torch.stack(x.split(2, 1)[0].unbind(0), -1).sum(-1),
    "where": lambda x, y: torch.where(x > 0, x * 3, y.t().unsqueeze(0).expand(3, 2, 4).transpose(1, 2)),
    "masked_fill": lambda x, y: x.masked_fill(x < 0.2, -2.0).tanh(),
    "pad": lambda x, y: F.pad(x, (1, 2)).cos(),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_view_and_index_backward(name, dtype):
    x, y = torch.randn(3, 4, 2).to(dtype), torch.randn(4, 2).to(dtype)
    backward_run(SHAPES[name], x, y, tol=F32 if dtype == torch.float32 else BF16, max_aten=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_and_matmul_backward_keep_matmuls_in_aten(dtype):
    x, w, b, v = (torch.randn(2, 5, 8), torch.randn(6, 8), torch.randn(6), torch.randn(2, 6, 3))

    def f(x, w, b, v):
        return torch.relu(F.linear(x, w, b)) @ v
    bw = backward_run(f, *(t.to(dtype) for t in (x, w, b, v)), tol=F32 if dtype == torch.float32 else BF16)
    ops = {str(op) for op in bw.extern_ops}
    assert ops <= {"aten.mm.default", "aten.bmm.default"}, ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_backward(dtype):
    """The weight's gradient is a scatter-add (index_put with accumulate): an aten call by
    design, not a fallback."""
    w, idx = torch.randn(10, 8).to(dtype), torch.tensor([[1, 3, 3], [0, 9, 3]])
    bw = backward_run(lambda w, idx: F.embedding(idx, w).tanh() * 2, w, idx,
                      tol=F32 if dtype == torch.float32 else BF16, max_aten=1)
    assert {str(op) for op in bw.extern_ops} == {"aten.index_put.default"}
    # (written into its zero-filled buffer: no copy of it)
    assert [str(e.op) for e in bw.wrapper.schedule if hasattr(e, "graph_op")] == ["aten.index_put_.default"]


@pytest.mark.parametrize("reread", [False, True])
def test_scatter_into_a_buffer_of_the_graph_writes_it_in_place_unless_read_again(reread):
    """A functional scatter whose first operand the graph computed runs in place when
    nothing else reads that operand; read again, it is copied as the op says."""
    def f(x, idx, v):
        z = x * 2
        out = torch.index_put(z, [idx], v, accumulate=True).sin()
        return (out, z + 1) if reread else out
    backend.COMPILED.clear()
    compiled = frametrace.optimize(backend="triton", fullgraph=True)(f)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x, v = torch.randn(6, 4, generator=g), torch.randn(5, 4, generator=g)
        idx = torch.randint(0, 6, (5,), generator=g)
        args = (x, idx, v)
        want = f(*[a.clone() for a in args])
        got = compiled(*[a.clone() for a in args])
        torch.testing.assert_close(got, want)
    (mod,) = backend.COMPILED
    ops = [str(e.op) for e in mod.wrapper.schedule if hasattr(e, "graph_op")]
    assert ops == ["aten.index_put.default" if reread else "aten.index_put_.default"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_backward_is_kernels(dtype):
    x, y = torch.randn(6, 10).to(dtype), torch.tensor([1, 0, 9, 3, 3, 7])
    backward_run(lambda x, y: F.cross_entropy(x, y), x, y, tol=F32 if dtype == torch.float32 else BF16,
                 max_aten=0)
    backward_run(lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1, reduction="sum"), x, y,
                 tol=F32 if dtype == torch.float32 else BF16, max_aten=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_backward_scatter_adds_in_aten(dtype):
    """(its zero-filled base: a constant stored in bf16)"""
    x, y = torch.randn(3, 4, 2).to(dtype), torch.randn(4, 2).to(dtype)
    bw = backward_run(lambda x, y: x[:, torch.tensor([3, 0, 3])].sin() * y[0], x, y, max_aten=1,
                      tol=F32 if dtype == torch.float32 else BF16)
    assert [str(op) for op in bw.extern_ops] == ["aten.index_put.default"]


def test_gather_backward_scatter_adds_in_aten():
    x, idx = torch.randn(4, 6), torch.tensor([[0, 5], [1, 1], [2, 0], [5, 5]])
    bw = backward_run(lambda x, i: torch.gather(x.sin(), 1, i) * 2, x, idx, max_aten=1)
    assert [str(op) for op in bw.extern_ops] in ([], ["aten.scatter_add.default"]), bw.extern_ops


def test_mse_and_nll_losses_backward():
    x, t, y = torch.randn(6, 10), torch.randn(6, 10), torch.tensor([1, 0, 9, 3, 3, 7])
    backward_run(lambda x, t: F.mse_loss(x, t), x, t, max_aten=0)
    backward_run(lambda x, y: F.nll_loss(F.log_softmax(x, -1), y, ignore_index=3), x, y, max_aten=0)


def test_non_contiguous_tangents():
    """The backward reads the gradient of an output in the strides autograd gives it."""
    x = torch.randn(6, 4)
    bw = backward_run(lambda x: (x * 2).sin(), x, tangent=lambda o: torch.randn(o.shape[::-1]).t())
    assert bw.kernels


def test_gradients_have_eager_strides():
    """A parameter's .grad has the strides eager gives it (a channels-last or transposed
    weight's gradient too)."""
    w = torch.randn(6, 8).t()   # a transposed weight: its gradient is transposed too
    x = torch.randn(5, 8)

    def f(x, w):
        return (x @ w).tanh() + w.sum(0)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    frametrace.optimize(backend="triton", fullgraph=True)(f)(*leaves).sum().backward()
    want = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    f(*want).sum().backward()
    for g, e in zip(leaves, want):
        torch.testing.assert_close(g.grad, e.grad, **F32)
        assert g.grad.stride() == e.grad.stride()


def test_backward_built_again_for_saved_values_in_other_strides():
    """A backward whose inputs come in other strides than traced (a saved value the
    forward stored otherwise) is built again for the strides it reads, not misread."""
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda x, g: [(x.sin() * g).cos()])(torch.randn(4, 6), torch.randn(4, 6))
    backend.COMPILED.clear()
    run = backend.compile_backward(gm, [torch.randn(4, 6), torch.randn(4, 6)])
    x, g = torch.randn(6, 4).t(), torch.randn(4, 6)
    (out,) = run([x, g])
    torch.testing.assert_close(out, (x.sin() * g).cos(), **F32)
    (mod,) = backend.COMPILED
    assert mod.kind == "backward" and mod.wrapper.lowered.example_inputs[0].stride() == (1, 4)


def test_mutated_input_in_a_training_graph():
    def f(x, w, buf):
        buf.add_(1)
        return (x * w * buf).tanh().sum(-1)
    x, w, buf = torch.randn(3, 4), torch.randn(4, requires_grad=True), torch.zeros(4)
    w2, buf2 = w.detach().clone().requires_grad_(), buf.clone()
    for _ in range(2):
        frametrace.optimize(backend="triton", fullgraph=True)(f)(x, w, buf).sum().backward()
        f(x, w2, buf2).sum().backward()
        torch.testing.assert_close(buf, buf2)
        torch.testing.assert_close(w.grad, w2.grad, **F32)
    assert modules("backward")[-1].kernels


def test_training_graphs_are_not_replayed_as_cuda_graphs(monkeypatch):
    """A training graph's outputs are activations held until the backward: a replay would
    copy them out and pin a second set; inference graphs may still be replayed."""
    monkeypatch.setattr(backend.CompiledModule, "graphable", property(lambda self: True))
    lin = nn.Linear(4, 4)
    f = frametrace.optimize(backend="triton")(lambda x: torch.tanh(lin(x)).sum())
    f(torch.randn(2, 4)).backward()
    with torch.no_grad():
        f(torch.randn(2, 4))
    runners = {m.kind: m.runner is not None for m in backend.COMPILED}
    assert runners == {"forward": False, "backward": False, "inference": True}, runners


# -- the partition -------------------------------------------------------------------------
def saved(fw_module, num_fwd_outputs=1):
    out = next(n for n in fw_module.graph.nodes if n.op == "output").args[0]
    return out[num_fwd_outputs:]


def test_partition_recomputes_pointwise_chains():
    """x * sigmoid(x) chains: the backward recomputes them from the input, where the
    default partition saves every intermediate."""
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import default_partition

    def f(x):
        y = x * torch.sigmoid(x)
        y = y * torch.sigmoid(y)
        return (y * torch.sigmoid(y)).cos()
    got = {}

    def capture(name):
        def fw(gm, ex):
            got[name] = gm
            return gm.forward
        return fw
    for name, fn in (("ours", partition.partition), ("default", default_partition)):
        x = torch.randn(16, requires_grad=True)
        aot_function(f, capture(name), lambda gm, ex: gm.forward, partition_fn=fn, decompositions=decompositions())(x).sum().backward()
    ours, default = saved(got["ours"]), saved(got["default"])
    assert len(ours) == 1 and len(default) >= 4, (ours, default)
    assert ours[0].op == "placeholder"   # the input itself


def test_partition_saves_matmul_operands_and_reductions():
    """What the backward would store anyway (a matmul's operand) and reductions are saved,
    not recomputed."""
    got = {}
    from torch._functorch.aot_autograd import aot_function

    def f(x, w):
        h = torch.relu(x * 2) @ w
        return torch.softmax(h, -1)

    def fw(gm, ex):
        got["fw"] = gm
        return gm.forward

    def bw(gm, ex):
        got["bw"] = gm
        return gm.forward
    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    aot_function(f, fw, bw, partition_fn=partition.partition, decompositions=decompositions())(x, w).sum().backward()
    recomputed = {n.target for n in got["bw"].graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.mm.default in recomputed  # (the gradients' own)
    fw_ops = {n.target for n in got["fw"].graph.nodes}
    bw_relu = [n for n in got["bw"].graph.nodes if n.target is torch.ops.aten.relu.default]
    assert not bw_relu and torch.ops.aten.relu.default in fw_ops


def test_partition_saves_matmul_results_not_activation_derivatives():
    """Linear, gelu, linear: the backward gets the first matmul's result (stored anyway)
    and recomputes gelu's derivative from it, rather than the forward storing that too."""
    from torch._functorch.aot_autograd import aot_function
    got = {}

    def f(x, w1, w2):
        return (F.gelu(x @ w1) @ w2).sum()

    def fw(gm, ex):
        got["fw"] = gm
        return gm.forward
    args = [torch.randn(8, 4), torch.randn(4, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)]
    aot_function(f, fw, lambda gm, ex: gm.forward, partition_fn=partition.partition,
                 decompositions=decompositions())(*args).backward()
    for n in saved(got["fw"]):
        # each saved value is an input, or one the forward's result needs (so stored anyway)
        assert n.op == "placeholder" or any(u.op != "output" for u in n.users), n


def test_registered_ops_are_recomputed(monkeypatch):
    """An op another module adds to RECOMPUTABLE_OPS is recomputed in the backward: here
    the backward then needs only the input, not a value the forward never stores."""
    from torch._functorch.aot_autograd import aot_function
    got = {}

    def f(x):
        return torch.cumsum(x, 0).sin().sum()

    def fw(gm, ex):
        got["fw"] = gm
        return gm.forward
    for extra in (False, True):
        if extra:
            monkeypatch.setattr(partition, "RECOMPUTABLE_OPS", partition.RECOMPUTABLE_OPS | {torch.ops.aten.cumsum})
        x = torch.randn(8, requires_grad=True)
        aot_function(f, fw, lambda gm, ex: gm.forward, partition_fn=partition.partition,
                     decompositions=decompositions())(x).backward()
        kept = [n.op for n in saved(got["fw"])]
        assert (kept == ["placeholder"]) == extra, kept


# -- graphs of a step ----------------------------------------------------------------------
def test_no_grad_inference_compiles_a_forward_only_graph():
    lin = nn.Linear(8, 8)
    f = frametrace.optimize(backend="triton")(lambda x: torch.relu(lin(x)).sum(-1))
    x = torch.randn(3, 8)
    with torch.no_grad():
        out = f(x)
    torch.testing.assert_close(out, torch.relu(lin(x)).sum(-1).detach(), **F32)
    assert [m.kind for m in backend.COMPILED] == ["inference"]
    out = f(x)  # with grad: a training graph (a recompile on grad mode)
    out.sum().backward()
    assert [m.kind for m in backend.COMPILED] == ["inference", "forward", "backward"]


class MLP(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(d, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x, y):
        h = F.gelu(self.l1(x))
        h = F.silu(self.l2(h)) + h
        return F.cross_entropy(self.l3(h), y)


class Block(nn.Module):
    """A pre-norm transformer block (RMS norm, causal attention, SwiGLU) with an
    embedding and a tied head."""
    def __init__(self, vocab=24, d=16, heads=2, sdpa=False):
        super().__init__()
        self.sdpa = sdpa
        self.emb = nn.Embedding(vocab, d)
        self.n1, self.n2 = nn.Parameter(torch.ones(d)), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)
        self.up, self.gate, self.down = nn.Linear(d, 32), nn.Linear(d, 32), nn.Linear(32, d)
        self.heads = heads

    def forward(self, idx, y):
        x = self.emb(idx)
        b, t, d = x.shape
        q, k, v = self.qkv(rms_norm(x, self.n1)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / (d // self.heads) ** 0.5
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            a = torch.softmax(s, -1) @ v
        a = a.transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        h = self.n2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        logits = x @ self.emb.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))


def train(model, batches, compiled):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = frametrace.optimize(backend="triton")(model) if compiled else model
    losses = []
    for args in batches:
        opt.zero_grad(set_to_none=True)
        loss = step(*args)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("make, data", [
    (MLP, lambda: (torch.randn(6, 16), torch.randint(0, 4, (6,)))),
    (Block, lambda: (torch.randint(0, 24, (2, 5)), torch.randint(0, 24, (2, 5)))),
    (lambda: Block(sdpa=True), lambda: (torch.randint(0, 24, (2, 5)), torch.randint(0, 24, (2, 5)))),
], ids=["mlp", "transformer_block", "transformer_block_sdpa"])
def test_three_training_steps_match_eager(make, data):
    torch.manual_seed(0)
    model = make()
    copy = make()
    copy.load_state_dict(model.state_dict())
    batches = [data() for _ in range(3)]
    got = train(model, batches, compiled=True)
    want = train(copy, batches, compiled=False)
    torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(model.named_parameters(), copy.parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-4, msg=name)
    kinds = [m.kind for m in backend.COMPILED]
    assert kinds == ["forward", "backward"], kinds   # one graph, compiled once, for 3 steps
    bw = modules("backward")[0]
    assert bw.kernels and not bw.fallbacks, bw.fallbacks
    assert all(str(op).split(".")[1] in ("mm", "bmm", "index_put", "_scaled_dot_product_flash_attention_for_cpu_backward")
               for op in bw.extern_ops), bw.extern_ops


def test_backward_frees_saved_values_and_gradients_when_dead():
    """The backward wrapper deletes each saved value and intermediate buffer after its last
    use: the memory of activations goes back during the backward, as in eager."""
    import re
    train(Block(), [(torch.randint(0, 24, (2, 5)), torch.randint(0, 24, (2, 5)))], compiled=True)
    bw = modules("backward")[0]
    lines = bw.source.splitlines()
    deleted = {n for line in lines if line.strip().startswith("del ") for n in re.findall(r"\w+", line)[1:]}
    returned = set(re.findall(r"\w+", lines[-1]))
    allocated = {m.group(1) for m in map(re.compile(r"    (buf\d+) = ").match, lines) if m}
    inputs = set(bw.wrapper.lowered.inputs)
    assert inputs - returned <= deleted and allocated - returned <= deleted, bw.source


def test_checkpointed_hf_llama_layers_compile_and_match_eager():
    """HF's gradient checkpointing: AOTAutograd saves the RNG state around the recomputed
    region (run_and_save_rng_state, a node without a value of its own); the graph still
    compiles to kernels, and the loss and every gradient match eager's."""
    import copy
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=100)
    model = transformers.LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable()
    model.train()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 100, (2, 8))
    eager_graphs = backend.STATS["eager_graphs"]
    got = frametrace.optimize(backend="triton", fullgraph=True)(model)(input_ids=ids, labels=ids).loss
    got.backward()
    want = ref(input_ids=ids, labels=ids).loss
    want.backward()
    torch.testing.assert_close(got, want, **F32)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **F32, msg=name)
    assert backend.STATS["eager_graphs"] == eager_graphs, "a graph ran eagerly"
    assert modules("forward") and modules("backward")


def test_backward_built_again_does_not_keep_its_first_inputs():
    """The backward built again for its inputs' strides builds from stand-ins of them:
    the module lives as long as the graph, and a module built from the first call's
    saved activations kept them all alive after that call (a training step's worth of
    memory, for good)."""
    import gc
    import weakref
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda x, g: [(x.sin() * g).cos()])(torch.randn(4, 6), torch.randn(4, 6))
    backend.COMPILED.clear()
    run = backend.compile_backward(gm, [torch.randn(4, 6), torch.randn(4, 6)])
    x, g = torch.randn(6, 4).t(), torch.randn(4, 6)
    want = (x.sin() * g).cos()
    refs = [weakref.ref(x), weakref.ref(g)]
    (out,) = run([x, g])
    del x, g
    gc.collect()
    assert [r() for r in refs] == [None, None]
    torch.testing.assert_close(out, want, **F32)
    (mod,) = backend.COMPILED
    assert mod.wrapper.lowered.example_inputs[0].stride() == (1, 4)
    x2, g2 = torch.randn(6, 4).t(), torch.randn(4, 6)      # (and it runs again, right)
    torch.testing.assert_close(run([x2, g2])[0], (x2.sin() * g2).cos(), **F32)
