"""backend="triton": graphs with torch.Generator inputs, as AOTAutograd's graph-safe RNG
functionalization makes them (CUDA, torch >= 2.11): a checkpointed region's random op
(frametrace's Philox key draw, an attention op with dropout) is recomputed in the
backward, and each such op gets a Generator input in the forward and one in the backward
(started in the same state) and runs as
`graphsafe_run_with_rng_state(op, *args, rng_state=generator)`.  The generators pass
through the wrapper to those calls; the rest of the graph is kernels.

AOTAutograd emits these graphs for CUDA only (CPU generators have no graph-safe state,
and its rewrite wants a device index), so the graphs here are built as it builds them:
an aten graph traced with make_fx, then each random op swapped for the higher-order op
with a Generator placeholder (`graphsafe`, as partitioners.apply_graphsafe_rng_
functionalization does, leaving the new node without a value).  The op's CUDA
implementation points the default generator at the given one around the op; on CPU the
fixture `cpu_graphsafe` runs it with the same semantics through get_state/set_state
(the op draws the given generator's stream and advances it; the default generator is
left as it was).  Each compiled graph is compared with the same graph run by FX with
generators in the same state: values, the generators' states after, several calls."""
import pytest
import torch
from torch._C import DispatchKey
from torch.fx.experimental.proxy_tensor import make_fx

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config, result_cache, rng  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

HOP = torch._prims.rng_prims.graphsafe_run_with_rng_state
CPU = torch.device("cpu")


def _run_in_state(op, *args, rng_state=None, **kwargs):
    """graphsafe_run_with_rng_state's semantics for a CPU generator: `op` draws from
    `rng_state`'s stream and advances it; the default generator keeps its own state."""
    default = torch.default_generator
    saved = default.get_state()
    default.set_state(rng_state.get_state())
    try:
        out = op(*args, **kwargs)
        rng_state.set_state(default.get_state())
    finally:
        default.set_state(saved)
    return out


@pytest.fixture(autouse=True)
def cpu_graphsafe():
    kernels = dict(HOP.py_kernels)
    original = kernels[DispatchKey.BackendSelect]

    def backend_select(op, *args, rng_state=None, **kwargs):
        if isinstance(rng_state, torch.Generator) and rng_state.device.type == "cpu":
            return _run_in_state(op, *args, rng_state=rng_state, **kwargs)
        return original(op, *args, rng_state=rng_state, **kwargs)
    HOP.py_kernels[DispatchKey.BackendSelect] = backend_select
    HOP.py_kernels[DispatchKey.CPU] = _run_in_state
    HOP._dispatch_cache.clear()
    try:
        yield
    finally:
        HOP.py_kernels.clear()
        HOP.py_kernels.update(kernels)
        HOP._dispatch_cache.clear()


def graphsafe(gm, prefix="fwd_rng_state"):
    """`gm` with each random op (tagged nondeterministic_seeded) run in the state of a
    Generator input of its own, added after the other inputs, as AOTAutograd does."""
    g = gm.graph
    last = [n for n in g.nodes if n.op == "placeholder"][-1]
    draws = [n for n in g.nodes if n.op == "call_function" and
             torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    assert draws
    for i, node in enumerate(draws):
        with g.inserting_after(last):
            last = g.placeholder(f"{prefix}_{i}")
        last.meta["val"] = torch.default_generator.clone_state()
        with g.inserting_after(node):
            new = g.create_node("call_function", HOP, (node.target, *node.args),
                                {**node.kwargs, "rng_state": last})
        node.replace_all_uses_with(new)
        g.erase_node(node)
    g.lint()
    gm.recompile()
    return gm


def traced(fn, *args, prefix="fwd_rng_state"):
    return graphsafe(make_fx(fn, tracing_mode="fake")(*args), prefix)


def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def dropped_softmax(x):
    """A checkpointed dropout after a softmax, as the triton backend's decompositions
    give it: one Philox key drawn per call, the mask computed from it in a kernel."""
    seed = rng.SEED(device=CPU)
    keep = rng.RAND(seed, 0, list(x.shape), False, torch.float32) >= 0.25
    return (softmax(x) * keep * (1 / 0.75),)


def generators(n, seed):
    """A compiled run's generators and an eager run's, all in the same state."""
    gens = [torch.Generator().manual_seed(seed + i) for i in range(n)]
    return gens, [g.clone_state() for g in gens]


def assert_same(got, want, msg=""):
    """The same numbers drawn (the same elements dropped: exactly), the same values (to
    rounding: kernels and aten reduce in other orders)."""
    assert got.dtype == want.dtype and got.shape == want.shape, msg
    assert torch.equal(got == 0, want == 0), msg
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=msg)


def same_state(a, b):
    return all(torch.equal(x.get_state(), y.get_state()) for x, y in zip(a, b))


def assert_kernels(mod, before):
    """The graph ran as kernels (no eager run of the graph), the random op as its
    wrapper's call with the generator, and no op fell back to aten."""
    assert backend.STATS["eager_graphs"] == before, "the graph ran eagerly"
    assert mod.kernels, mod.source
    assert HOP in mod.extern_ops, mod.extern_ops
    assert not mod.fallbacks, mod.fallbacks


def run_against_fx(gm, args, steps, seed):
    """Compiles `gm` (a forward graph taking `args` and one generator) with the triton
    backend, checks that it runs as kernels (assert_kernels), then calls it `steps` times
    against the same graph run by FX, with generators started from `seed`: each result,
    and the generators' states after each call."""
    before = backend.STATS["eager_graphs"]
    f = backend.compile_training_forward(gm, [*args, torch.default_generator.clone_state()])
    assert_kernels(backend.COMPILED[-1], before)
    gens, ref = generators(1, seed)
    for step in range(steps):
        got, want = f([*args, *gens]), gm(*args, *ref)
        for a, b in zip(got, want):
            assert_same(a, b, step)
        assert same_state(gens, ref), step


def test_key_drawn_in_a_generators_state_feeds_the_kernels():
    x = torch.randn(16, 40)
    gm = traced(dropped_softmax, x)
    before = backend.STATS["eager_graphs"]
    f = backend.compile_training_forward(gm, [x, torch.default_generator.clone_state()])
    mod = backend.COMPILED[-1]
    assert_kernels(mod, before)
    assert len(mod.kernels) <= 2, mod.source     # (the softmax's reductions, the mask fused)
    assert mod.extern_ops == [HOP], mod.extern_ops
    lines = mod.source.splitlines()
    call = next(i for i, line in enumerate(lines) if "rng_state=fwd_rng_state_0" in line)
    assert call == 3, mod.source  # the draw first (hoisted): it splits no kernel
    default = torch.default_generator.get_state()
    gens, ref = generators(1, 7)
    outs = []
    for step in range(3):
        got, = f([x, *gens])
        want, = gm(x, *ref)
        assert_same(got, want, step)
        assert same_state(gens, ref), step
        outs.append(got)
    assert not torch.equal(outs[0], outs[1]), "each call draws new numbers"
    assert torch.equal(torch.default_generator.get_state(), default), "the default generator is not drawn"
    # the generator is the call's own: another one in the first's state draws the same
    other = torch.Generator().manual_seed(7)
    assert torch.equal(f([x, other])[0], outs[0])


def test_wrapped_aten_random_op_with_several_results():
    # An op that stays an aten call (attention with dropout on CUDA; native_dropout
    # here), its results read through getitems around kernels of their own.
    def fn(x, w):
        h = (x * w).relu()
        out, mask = torch.ops.aten.native_dropout.default(h, 0.3, True)
        return out.exp() + mask.float(), mask
    x, w = torch.randn(12, 20), torch.randn(20)
    run_against_fx(traced(fn, x, w), (x, w), steps=3, seed=3)


def test_backward_recomputes_what_the_forward_drew():
    # The forward and the backward each get a generator, started in the same state and
    # advanced once per call (AOTAutograd's runtime keeps them in step): the backward's
    # recomputed mask is the forward's, call after call.
    p = 0.4
    scale = 1 / (1 - p)

    def forward(x, w):
        seed = rng.SEED(device=CPU)
        keep = rng.RAND(seed, 0, list(x.shape), False, torch.float32) >= p
        return (x * w).tanh() * keep * scale, x, w

    def backward(x, w, tangent):
        seed = rng.SEED(device=CPU)
        keep = rng.RAND(seed, 0, list(x.shape), False, torch.float32) >= p
        t = (x * w).tanh()
        g = tangent * keep * scale * (1 - t * t)
        return g * w, (g * x).sum(0)

    x, w = torch.randn(8, 24), torch.randn(24)
    tangent = torch.randn(8, 24)
    fw = traced(forward, x, w)
    bw = traced(backward, x, w, tangent, prefix="bwd_rng_state")
    before = backend.STATS["eager_graphs"]
    f = backend.compile_training_forward(fw, [x, w, torch.default_generator.clone_state()])
    assert_kernels(backend.COMPILED[-1], before)
    b = backend.compile_backward(bw, [x, w, tangent, torch.default_generator.clone_state()])
    assert_kernels(backend.COMPILED[-1], before)
    seeds = torch.Generator().manual_seed(11)
    fgen, bgen = seeds.clone_state(), seeds.clone_state()
    (fref, bref) = seeds.clone_state(), seeds.clone_state()
    masks = []
    for step in range(3):
        x = torch.randn(8, 24)
        out, sx, sw = f([x, w, fgen])
        gx, gw = b([sx, sw, tangent, bgen])
        keep = out != 0
        t = (x * w).tanh()
        g = tangent * keep * scale * (1 - t * t)
        torch.testing.assert_close(gx, g * w, msg=f"step {step}")
        torch.testing.assert_close(gw, (g * x).sum(0), msg=f"step {step}")
        # against the graphs run by FX with generators in the same states
        want_out = fw(x, w, fref)[0]
        want_gx, want_gw = bw(x, w, tangent, bref)
        assert_same(out, want_out, step)
        torch.testing.assert_close(gx, want_gx)
        torch.testing.assert_close(gw, want_gw)
        assert same_state([fgen, bgen], [fref, bref])
        assert torch.equal(fgen.get_state(), bgen.get_state()), "forward and backward in step"
        masks.append(keep)
    assert not torch.equal(masks[0], masks[1])


def test_generator_states_are_restored_when_a_launch_fails(monkeypatch):
    # A kernel that fails on its first launch has its nodes run as aten in a graph built
    # again, run again with the generator in the state the call started with: the call
    # draws what it would have, once.
    from frametrace.backends.triton import wrapper
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    failed = []
    real = wrapper.launch_static    # (what a Launcher launches through)

    def flaky(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise RuntimeError("a kernel that cannot launch")
        return real(*args, **kwargs)
    monkeypatch.setattr(wrapper, "launch_static", flaky)
    x = torch.randn(16, 40)
    gm = traced(dropped_softmax, x)
    f = backend.compile_training_forward(gm, [x, torch.default_generator.clone_state()])
    gens, ref = generators(1, 5)
    for step in range(2):
        got, = f([x, *gens])
        want, = gm(x, *ref)
        assert_same(got, want, step)
        assert same_state(gens, ref), step
    assert failed and backend.COMPILED[-1].fallbacks, "the failed kernel's nodes ran as aten"


def test_switch_off_runs_such_graphs_eagerly(monkeypatch):
    monkeypatch.setattr(config, "generator_inputs", False)
    x = torch.randn(16, 40)
    gm = traced(dropped_softmax, x)
    before = backend.STATS["eager_graphs"]
    f = backend.compile_training_forward(gm, [x, torch.default_generator.clone_state()])
    assert backend.STATS["eager_graphs"] == before + 1
    gens, ref = generators(1, 2)
    for _ in range(2):
        assert_same(f([x, *gens])[0], gm(x, *ref)[0])
        assert same_state(gens, ref)


@pytest.mark.parametrize("value", [object(), 2.5, "text"], ids=["object", "float", "str"])
def test_other_non_tensor_inputs_are_still_refused(value):
    # Only Generators pass: another non-tensor input sends the graph to its eager run,
    # cleanly (no error, even under FRAMETRACE_TRITON_STRICT=1), with its values.
    g = torch.fx.Graph()
    x, other = g.placeholder("x"), g.placeholder("other")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    g.output((y,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    t = torch.randn(5, 6)
    x.meta["val"], other.meta["val"], y.meta["val"] = t, value, t * t
    before = backend.STATS["eager_graphs"]
    f = backend.compile_forward(gm, [t, value])
    assert backend.STATS["eager_graphs"] == before + 1
    assert torch.equal(f([t, value])[0], t * t)


def test_graphs_with_generators_are_not_cached():
    # AOTAutograd's runtime makes the generators at the first call (aot_cache does not
    # rebuild it); the backend's description of such a module says so, cleanly.
    x = torch.randn(16, 40)
    gm = traced(dropped_softmax, x)
    f = backend.compile_training_forward(gm, [x, torch.default_generator.clone_state()])
    f([x, torch.Generator().manual_seed(0)])
    with pytest.raises(result_cache.NotCacheable, match="Generator"):
        result_cache.describe(backend.COMPILED[-1])


def test_attention_op_in_a_generators_state():
    # SDPA with dropout under a checkpoint on CUDA: the attention op in the
    # generator's state, its operands computed by kernels (CPU's flash attention takes
    # no dropout: p=0 here, the wrapper's handling of the wrapped attention op is what
    # runs).
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    def fn(x, w):
        q = (x * w).transpose(1, 2)
        k = x.transpose(1, 2)
        out, lse = attention(q, k, k, 0.0, False)
        return out.relu() + 1, lse.exp()
    x, w = torch.randn(2, 16, 4, 8), torch.randn(8)
    run_against_fx(traced(fn, x, w), (x, w), steps=2, seed=9)
