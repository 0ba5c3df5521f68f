"""Tensor-level features on CUDA, through every backend including our Triton code
generator: numbers read from data, data-dependent shapes, torch.cond, vmap/grad, a user
autograd.Function, checkpoint, NumPy over a tensor moved to the CPU.  Each graph the
Triton backend cannot lower must fall back (never fault), and every value must match
eager.  Skipped without a GPU (CI has none; run on the GPU machine)."""
import numpy as np
import pytest
import torch

import frametrace
from differential import check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
BACKENDS = ["eager", "aot_eager", "triton"]


@pytest.fixture
def capture():
    cfg = frametrace.config
    saved = cfg.capture_scalar_outputs, cfg.capture_dynamic_output_shape_ops
    cfg.capture_scalar_outputs = cfg.capture_dynamic_output_shape_ops = True
    yield
    cfg.capture_scalar_outputs, cfg.capture_dynamic_output_shape_ops = saved


def cuda(*shape):
    return torch.randn(*shape, device="cuda")


class _Clip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x.abs() < 2)           # not the true derivative: must be this one


@pytest.mark.parametrize("backend", BACKENDS)
def test_numbers_and_shapes_from_data_on_cuda(backend, capture):
    def f(x, n):
        k = n.item()
        torch._check_is_size(k)
        kept = x[x > 0]
        return x[:k].sum() + kept.sum(), kept.shape[0] * 2, torch.nonzero(x > 1).float().mean()
    check(f, [(cuda(64), torch.tensor(5)), (cuda(64), torch.tensor(9)), (cuda(64), torch.tensor(1))],
          backend=backend, fullgraph=True, graphs=1, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_vmap_grad_on_cuda(backend):
    w = cuda(8, 4)

    def f(x):
        y = torch.cond(x.sum() > 0, lambda t: (t @ w).relu(), lambda t: (t @ w).tanh(), (x,))
        per = torch.func.vmap(torch.func.grad(lambda r: (r @ w).sin().sum()))(x)
        return y * 2, per
    check(f, [cuda(3, 8), -cuda(3, 8).abs(), cuda(3, 8).abs()], backend=backend, fullgraph=True,
          graphs=1, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "triton"])
def test_autograd_function_and_checkpoint_gradients_on_cuda(backend):
    from torch.utils.checkpoint import checkpoint
    w = cuda(16, 16).requires_grad_()

    def block(t):
        return torch.nn.functional.gelu(t @ w) @ w.t()

    def f(x):
        h = checkpoint(block, x, use_reentrant=False)
        out = _Clip.apply(h * 3).sum()
        out.backward()
        return out.detach()

    for _ in range(2):
        x1 = cuda(4, 16).requires_grad_()
        x2 = x1.detach().clone().requires_grad_()
        w.grad = None
        want = f(x1)
        gw_want = w.grad.clone()
        w.grad = None
        cc = frametrace.testing.CompileCounter(inner=backend)
        got = frametrace.optimize(cc)(f)(x2)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        assert torch.allclose(x2.grad, x1.grad, rtol=1e-4, atol=1e-4)
        assert torch.allclose(w.grad, gw_want, rtol=1e-4, atol=1e-4)
        assert cc.frame_count >= 1


def test_numpy_postprocessing_of_a_cuda_result():
    lin = torch.nn.Linear(16, 5).cuda()

    def f(x):
        logits = lin(x).detach().cpu().numpy()
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        return p.argmax(axis=1), np.round(p.max(axis=1), 3)
    check(f, [cuda(6, 16), cuda(6, 16)], fullgraph=True, graphs=1, rtol=1e-4, atol=1e-4)
