"""backend="triton": random ops (dropout, rand, randn, bernoulli, uniform_, normal_) as
Philox numbers generated inside the fused kernels, seeded once per call from torch's
generator; run through Triton's interpreter on the CPU.  Random values cannot be compared
with eager's, so the tests check reproducibility, distributions, the numbers against the
op's eager implementation (bit for bit, which a backward that recomputes a mask relies
on), and what was compiled."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from differential import check  # noqa: E402
from frametrace.backends.triton import last_compiled, rng  # noqa: E402
from frametrace.backends.triton.partition import RECOMPUTABLE_OPS  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

RANDOM_ATEN = ("rand", "randn", "bernoulli", "dropout", "uniform", "normal")


def compiled(fn, **kwargs):
    return frametrace.optimize(backend="triton", fullgraph=True, **kwargs)(fn)


def assert_in_kernels(mod, kernels, helper="_philox_uniform"):
    """`kernels` launches, the numbers drawn inside them, no aten random op called."""
    assert len(mod.kernels) == kernels, mod.source
    assert any(f"{helper}(" in k.source for k in mod.kernels), mod.unique_kernels
    externs = [str(op) for op in mod.extern_ops]
    assert externs == ["frametrace.philox_seed.default"], externs
    assert not any(name in str(op) for op in externs for name in RANDOM_ATEN if "philox" not in str(op))
    assert not mod.fallbacks, mod.fallbacks


def seed_after(s):
    """The seed a graph's first random op gets after torch.manual_seed(s): the first draw
    from the generator (what frametrace::philox_seed does)."""
    torch.manual_seed(s)
    return torch.ops.frametrace.philox_seed(device=torch.device("cpu"))


# -- reproducibility ---------------------------------------------------------------------------
def test_seeded_dropout_is_reproducible_and_calls_differ():
    f = compiled(lambda x: F.dropout(x * 2 + 1, 0.5) * 3)
    x = torch.randn(16, 40)
    torch.manual_seed(0)
    a = f(x)
    b = f(x)
    torch.manual_seed(0)
    again = f(x)
    assert torch.equal(a, again)
    assert not torch.equal(a, b)
    assert_in_kernels(last_compiled(), 1)


def test_manual_seed_between_calls():
    f = compiled(lambda x: F.dropout(x, 0.3) + torch.randn_like(x))
    x = torch.ones(32, 32)
    outs = {}
    for s in (1, 2, 1, 3, 2):
        torch.manual_seed(s)
        outs.setdefault(s, []).append(f(x))
    assert torch.equal(outs[1][0], outs[1][1]) and torch.equal(outs[2][0], outs[2][1])
    assert not torch.equal(outs[1][0], outs[2][0]) and not torch.equal(outs[2][0], outs[3][0])
    assert_in_kernels(last_compiled(), 1, "_philox_normal")


def test_the_call_advances_the_generator():
    """Eager code after a compiled call does not replay numbers it would have drawn."""
    f = compiled(lambda x: torch.rand_like(x) + x)
    x = torch.zeros(8, 8)
    torch.manual_seed(0)
    fresh = torch.rand(8, 8)
    torch.manual_seed(0)
    f(x)
    after = torch.rand(8, 8)
    assert not torch.equal(fresh, after)
    torch.manual_seed(0)
    f(x)
    assert torch.equal(torch.rand(8, 8), after)  # (and reproducibly so)


def test_kernel_numbers_are_the_eager_ops_bit_for_bit():
    """A kernel and the op's eager implementation (what a backward that recomputes a mask
    runs while it is eager) give the same numbers: the same seed and counters, whatever
    the kernel (flat, a reduction's, tiled) and its block sizes."""
    rand = torch.ops.frametrace.philox_rand

    def f(y):
        return torch.rand(48, 80), torch.randn(48, 80), (y + torch.rand_like(y)).sum(-1)
    y = torch.randn(16, 300)
    torch.manual_seed(7)
    u, n, s = compiled(f)(y)
    seed = seed_after(7)
    assert torch.equal(u, rand(seed, 0, [48, 80], False, torch.float32))
    assert torch.equal(n, rand(seed, 48 * 80, [48, 80], True, torch.float32))
    torch.testing.assert_close(s, (y + rand(seed, 2 * 48 * 80, [16, 300], False, torch.float32)).sum(-1))
    assert any("tl.reduce" in k.source and "_philox_uniform(" in k.source for k in last_compiled().kernels)

    x, z = torch.randn(128, 64), torch.randn(64, 128)
    torch.manual_seed(8)
    t = compiled(lambda x, z: x.t() + z * torch.rand(64, 128))(x, z)
    torch.testing.assert_close(t, x.t() + z * rand(seed_after(8), 0, [64, 128], False, torch.float32))
    mod = last_compiled()
    assert len(mod.kernels) == 1 and mod.kernels[0].name.startswith("triton_tile_"), mod.unique_kernels


def test_counters_past_int32_use_64_bit_offsets():
    """A graph whose random ops take more than 2**31 counters: the later ones are int64
    (the op's eager implementation gives the same numbers)."""
    seed = torch.tensor(123456789)
    offset = 2 ** 32 - 5  # the range crosses into the counter's high word
    mod_numbers = compiled(lambda s: torch.ops.frametrace.philox_rand(s, offset, [4, 8], False, torch.float32) * 1)(seed)
    assert torch.equal(mod_numbers, torch.ops.frametrace.philox_rand(seed, offset, [4, 8], False, torch.float32))
    assert ">> 32" in last_compiled().kernels[0].source


# -- distributions -------------------------------------------------------------------------------
def test_dropout_statistics():
    p = 0.3
    x = torch.ones(256, 512)
    y = compiled(lambda x: F.dropout(x, p))(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    assert_in_kernels(last_compiled(), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rand_and_randn_distributions(dtype):
    def f(x):
        return torch.rand_like(x), torch.randn_like(x), torch.rand(128, 256, dtype=dtype), \
            torch.randn(128, 256, dtype=dtype)
    outs = compiled(f)(torch.empty(128, 256, dtype=dtype))
    for i, o in enumerate(outs):
        assert o.dtype == dtype and o.shape == (128, 256)
        o = o.double()
        if i % 2 == 0:
            assert 0 <= o.min() and o.max() < 1
            assert abs(o.mean() - 0.5) < 0.01 and abs(o.var() - 1 / 12) < 0.005
        else:
            assert abs(o.mean()) < 0.02 and abs(o.var() - 1) < 0.03
    assert not torch.equal(outs[0], outs[2])  # other counters
    assert_in_kernels(last_compiled(), 1, "_philox_normal")


def test_bernoulli_uniform_normal():
    def f(x, probs):
        return (torch.bernoulli(x, 0.25), torch.bernoulli(probs), torch.empty_like(x).uniform_(2, 3),
                torch.empty_like(x).normal_(5, 2))
    probs = torch.full((128, 256), 0.8)
    b1, b2, u, n = compiled(f)(torch.empty(128, 256), probs)
    assert set(b1.unique().tolist()) <= {0.0, 1.0} and abs(b1.mean() - 0.25) < 0.01
    assert abs(b2.mean() - 0.8) < 0.01
    assert 2 <= u.min() and u.max() < 3 and abs(u.mean() - 2.5) < 0.01
    assert abs(n.mean() - 5) < 0.05 and abs(n.std() - 2) < 0.05
    mod = last_compiled()
    assert [str(op) for op in mod.extern_ops] == ["frametrace.philox_seed.default"], mod.source


def test_normal_with_a_mean_tensor_and_of_a_size():
    def f(mean):
        return torch.normal(mean, 0.5), torch.normal(3.0, 2.0, (128, 256)), torch.normal(1.0, 0.0, (4, 4))
    mean = torch.full((128, 256), -4.0)
    a, b, c = compiled(f)(mean)
    assert abs(a.mean() + 4) < 0.01 and abs(a.std() - 0.5) < 0.01
    assert abs(b.mean() - 3) < 0.03 and abs(b.std() - 2) < 0.03
    assert torch.equal(c, torch.ones(4, 4))
    assert [str(op) for op in last_compiled().extern_ops] == ["frametrace.philox_seed.default"]


@pytest.mark.parametrize("name", ["bernoulli_p", "uniform_empty_range", "normal_negative_std", "dropout_p"])
def test_what_eager_rejects_still_raises(name):
    """Arguments aten rejects leave the op aten's, so that the compiled call raises too."""
    fns = {"bernoulli_p": lambda x: torch.bernoulli(x, 1.5),
           "uniform_empty_range": lambda x: torch.empty_like(x).uniform_(3, 2),
           "normal_negative_std": lambda x: torch.empty_like(x).normal_(0, -1),
           "dropout_p": lambda x: torch.ops.aten.native_dropout(x, 1.5, True)[0]}
    with pytest.raises(RuntimeError):
        fns[name](torch.ones(4))
    with pytest.raises(RuntimeError):
        compiled(fns[name])(torch.ones(4))


# -- fusion -------------------------------------------------------------------------------------
def test_dropout_fuses_into_its_neighbouring_pointwise_kernel():
    f = compiled(lambda x, y, z: F.dropout(torch.relu(x + y), 0.2) * z)
    x, y, z = torch.randn(64, 96), torch.randn(96), torch.randn(64, 96)
    out = f(x, y, z)
    ref = torch.relu(x + y) * z / 0.8
    kept = out != 0
    torch.testing.assert_close(out[kept], ref[kept])
    assert_in_kernels(last_compiled(), 1)
    assert "aten" not in last_compiled().unique_kernels[0]


def test_dropout_fuses_into_a_reduction():
    f = compiled(lambda x: F.dropout(x, 0.5).sum(-1))
    x = torch.randn(8, 300)
    torch.manual_seed(3)
    got = f(x)
    mask = torch.ops.frametrace.philox_rand(seed_after(3), 0, [8, 300], False, torch.float32) >= 0.5
    torch.testing.assert_close(got, (x * mask * 2).sum(-1))
    assert_in_kernels(last_compiled(), 1)


def test_channel_dropout_drops_whole_channels_in_one_kernel():
    x = torch.rand(8, 16, 5, 5) + 1
    y = compiled(lambda x: F.dropout2d(x * 1, 0.5))(x)
    planes = (y == 0).flatten(2)
    assert torch.equal(planes.all(-1), planes.any(-1))  # a channel is dropped whole or kept
    kept = ~planes.any(-1)
    assert 0.25 < kept.float().mean() < 0.75
    torch.testing.assert_close(y[kept], x[kept] * 2)
    assert_in_kernels(last_compiled(), 1)


def test_dropout_after_a_softmax_stays_in_its_kernel():
    """The seed is drawn before the first kernel: drawn where the dropout was traced, it
    would end the softmax's kernel before the dropout (attention probabilities' dropout)."""
    f = compiled(lambda x: F.dropout(torch.softmax(x * 0.5, -1), 0.1))
    x = torch.randn(64, 200)
    torch.manual_seed(4)
    got = f(x)
    mask = torch.ops.frametrace.philox_rand(seed_after(4), 0, [64, 200], False, torch.float32) >= 0.1
    torch.testing.assert_close(got, torch.softmax(x * 0.5, -1) * mask / 0.9)
    assert_in_kernels(last_compiled(), 1)
    assert last_compiled().source.index("aten_") < last_compiled().source.index("kernel")


# -- training: the backward's mask is the forward's ---------------------------------------------------
def test_dropout_backward_uses_the_forward_mask():
    p = 0.4
    f = compiled(lambda x: F.dropout(x * 2, p))
    x = torch.randn(32, 64, requires_grad=True)
    y = f(x)
    g = torch.randn(32, 64)
    y.backward(g)
    mask = (y != 0).float()  # (x has no zeros)
    torch.testing.assert_close(x.grad, mask * (2 / (1 - p)) * g)
    assert abs(mask.mean() - (1 - p)) < 0.05
    assert_in_kernels(backend_forward(), 1)


def test_recomputed_mask_equals_the_forward_mask():
    """What a backward that recomputes the mask from the saved seed computes (the random op
    is recomputable; its eager implementation runs while the backward is eager) is the
    mask the forward kernel applied."""
    assert torch.ops.frametrace.philox_rand.default in RECOMPUTABLE_OPS
    assert torch.ops.frametrace.philox_seed.default not in RECOMPUTABLE_OPS  # (a draw: saved)
    x = torch.randn(24, 50)
    torch.manual_seed(11)
    y = compiled(lambda x: F.dropout(x, 0.5))(x)
    recomputed = torch.ops.frametrace.philox_rand(seed_after(11), 0, [24, 50], False, torch.float32) >= 0.5
    assert torch.equal(y != 0, recomputed)


def test_backward_recomputes_the_mask_from_the_saved_seed():
    """The backend's partitioner has the forward save the seed, not the mask; the
    backward recomputes the mask (in its kernel) and it is the one the forward applied."""
    p = 0.4
    f = compiled(lambda x: F.dropout(x * 2, p))
    x = torch.randn(32, 64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = f(x)
    assert [(t.dtype, t.shape) for t in saved] == [(torch.int64, ())], saved
    g = torch.randn(32, 64)
    y.backward(g)
    torch.testing.assert_close(x.grad, (y != 0) * (2 / (1 - p)) * g)
    assert_in_kernels(backend_forward(), 1)


# -- activation checkpointing over random ops ---------------------------------------------------
class CheckpointedNoise(torch.nn.Module):
    """Two checkpointed regions that draw random numbers (dropout; a rand_like factor), as
    HF layers call checkpoint (non-reentrant); it returns what each region computed, so
    that the test can read the numbers the forward drew off its outputs."""

    def __init__(self, preserve=True):
        super().__init__()
        self.lin = torch.nn.Linear(12, 12)
        self.preserve = preserve

    def dropped(self, x):
        return F.dropout(self.lin(x).relu(), 0.4) * 3

    def noisy(self, h):
        return h * torch.rand_like(h) + 1

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        h = checkpoint(self.dropped, x, use_reentrant=False, preserve_rng_state=self.preserve)
        return h, checkpoint(self.noisy, h, use_reentrant=False, preserve_rng_state=self.preserve)


def _reference_grads(model, x, h, out, g):
    """The gradients of (x, lin's weight and bias) for the numbers the forward drew:
    the dropout mask read off h (a zero of relu has no gradient either way) and the
    rand_like factor off (out - 1) / h, the regions replayed eagerly with them."""
    h, out = h.detach(), out.detach()
    keep = (h != 0).float()
    noise = torch.where(h != 0, (out - 1) / h, torch.zeros_like(h))
    x = x.detach().clone().requires_grad_(True)
    w, b = (p.detach().clone().requires_grad_(True) for p in (model.lin.weight, model.lin.bias))
    h2 = F.linear(x, w, b).relu() * keep / 0.6 * 3
    torch.autograd.backward([h2 * noise + 1], [g])
    return x.grad, w.grad, b.grad


@pytest.mark.parametrize("preserve", [True, False])
def test_checkpoint_over_random_ops_recomputes_the_forward_numbers(preserve):
    # The regions compile in the frame's graph (no break); the backward recomputes them
    # from the saved Philox key (run_with_rng_state around philox_seed), so that every
    # gradient is the one of the mask and the noise the forward drew, over several
    # training steps whose numbers differ.  preserve_rng_state=False recomputes the
    # forward's numbers too, as under torch.compile (eager would draw others).
    torch.manual_seed(0)
    model = CheckpointedNoise(preserve)
    counter = frametrace.testing.CompileCounter(inner="triton")
    f = frametrace.optimize(model, backend=counter, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    masks = []
    for step in range(4):
        x = torch.randn(10, 12, requires_grad=True)
        h, out = f(x)
        g = torch.randn_like(out)
        want = _reference_grads(model, x, h, out, g)
        out.backward(g)
        for got, exp, name in zip((x.grad, model.lin.weight.grad, model.lin.bias.grad), want, "xwb"):
            torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5, msg=f"step {step}: {name}")
        opt.step()
        opt.zero_grad()
        masks.append(h != 0)
    assert counter.frame_count == 1, counter.frame_count
    assert not torch.equal(masks[0], masks[1]), "each call draws new numbers"
    from frametrace.backends.triton import backend
    bw = next(m for m in reversed(backend.COMPILED) if "tangents" in m.source)
    assert any("_philox_" in k.source for k in bw.kernels), "the backward recomputes in its kernels"


def test_checkpoint_over_dropout_saves_a_key_not_a_mask():
    # What the checkpoint is for: the forward keeps no activation-sized tensor of the
    # region (neither mask nor dropped values), only the random state and the inputs.
    from torch.utils.checkpoint import checkpoint
    lin = torch.nn.Linear(64, 64)
    f = frametrace.optimize(lambda x: checkpoint(lambda t: F.dropout(lin(t).relu(), 0.5) * 2, x,
                                                 use_reentrant=False).sum(), backend="triton")
    x = torch.randn(32, 64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = f(x)
    assert not [t for t in saved if t.shape == (32, 64) and t is not x], [(t.dtype, t.shape) for t in saved]
    loss.backward()
    assert x.grad is not None and lin.weight.grad is not None


def backend_forward():
    """The CompiledModule of the latest forward graph (a compiled backward may follow it)."""
    from frametrace.backends.triton import backend
    return next(m for m in reversed(backend.COMPILED) if "tangents" not in m.source)


def test_dynamic_shapes_draw_in_symbolic_kernels():
    f = frametrace.optimize(backend="triton", dynamic=True)(lambda x: F.dropout(x, 0.5) + torch.rand_like(x))
    for n in (10, 17):
        torch.manual_seed(n)
        out = f(torch.ones(n, 7))
        seed = seed_after(n)
        rand = torch.ops.frametrace.philox_rand
        want = (rand(seed, 0, [n, 7], False, torch.float32) >= 0.5) * 2.0 + rand(seed, n * 7, [n, 7], False, torch.float32)
        assert torch.equal(out, want)
        assert last_compiled().symbolic
    assert_in_kernels(last_compiled(), 1)


# -- the other backends keep torch's random ops ----------------------------------------------------
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_other_backends_keep_torchs_numbers(backend):
    def f(x):
        return F.dropout(x, 0.5) * 2 + torch.rand_like(x) + torch.bernoulli(x.sigmoid())
    r = check(f, [torch.randn(8, 8), torch.randn(5, 3)], backend=backend)
    assert r.graphs >= 1 and r.breaks == 0


# -- the generator's code --------------------------------------------------------------------------
@pytest.mark.parametrize("words4", [True, False])
def test_eager_cuda_kernel_matches_the_torch_implementation(monkeypatch, words4):
    """The Triton kernel the op runs eagerly on CUDA (run here in the interpreter) gives the
    numbers of the CPU implementation (with config.philox_four_words on and off)."""
    from frametrace.backends.triton import config
    from frametrace.backends.triton.wrapper import load_kernel
    monkeypatch.setattr(config, "philox_four_words", words4)
    kernel = load_kernel("_philox_fill", rng._FILL)
    seed = torch.tensor(2 ** 61 + 12345)
    for normal in (False, True):
        for offset in (0, 2 ** 32 - 100, 2 ** 34 + 3):
            out = torch.empty(300)
            kernel[(3,)](seed, out, offset, 300, NORMAL=normal, WORDS4=words4, XBLOCK=128)
            assert torch.equal(out, rng._fill_torch(int(seed), offset, 300, normal, torch.device("cpu")))


def test_kernel_helpers_are_tritons_tl_rand_and_tl_randn():
    """The kernels' copy of Philox is Triton's tl.rand / tl.randn (compared in a process
    where the interpreter can call Triton's own jit functions: TRITON_INTERPRET set before
    Triton is imported)."""
    code = """if True:
        import torch, triton, triton.language as tl
        from frametrace.backends.triton import rng
        from frametrace.backends.triton.wrapper import load_kernel
        src = rng.HELPERS + '''@triton.jit
def chk(seed_ptr, out_ptr, offset, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    x = i.to(tl.int64) + offset
    seed = tl.load(seed_ptr)
    lo, hi = x.to(tl.uint32), (x >> 32).to(tl.uint32)
    tl.store(out_ptr + i, tl.rand(seed, x) - _philox_uniform(seed, lo, hi))
    tl.store(out_ptr + 512 + i, tl.randn(seed, x) - _philox_normal(seed, lo, hi))
'''
        for s, off in ((5, 0), (2 ** 62 - 1, 2 ** 31 - 7), (99, 2 ** 40)):
            out = torch.full((1024,), 1.0)
            load_kernel("chk", src)[(2,)](torch.tensor(s), out, off, XBLOCK=256)
            assert torch.all(out == 0), (s, off, out.abs().max())
        print("same")
    """
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "same" in r.stdout, r.stderr[-3000:]


def test_checkpoint_random_on_cuda_has_a_switch(monkeypatch):
    # What the backend says of a region by the devices of its tensors: CPU (checked
    # above, kernels in Triton's interpreter) and CUDA (checked on the H200) compile the
    # region; the switch off sends a CUDA region to CPython.
    from frametrace.backends import triton as backend
    from frametrace.backends.triton import config
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    says = backend.triton_backend.__frametrace_recomputes_random_ops__
    assert says({cpu}) and says({cuda}) and says({cpu, cuda})
    monkeypatch.setattr(config, "checkpoint_random_on_cuda", False)
    assert says({cpu}) and not says({cuda}) and not says({cpu, cuda})
    assert backend.configured({}).__frametrace_recomputes_random_ops__ is says
