"""Ops whose output sizes depend on the data (``nonzero``, ``masked_select``, ``x[mask]``,
``unique``, ``repeat_interleave`` with tensor repeats) with
``config.capture_dynamic_output_shape_ops``: their sizes are unbacked symbols, so one
graph serves every mask density; later ops, shape arithmetic, gradients, returning the
tensors and passing them across graph breaks work.  With the flag off they are graph
breaks.
"""
import pytest
import torch

import frametrace
from conftest import no_unbacked_guards, opaque
from differential import check

BACKENDS = ["eager", "aot_eager"]


def densities(n=10, shape=(10,)):
    """Inputs whose positive fraction goes from none to all."""
    out = []
    for p in (0.5, 0.0, 1.0, 0.2, 0.8):
        x = torch.randn(*shape).abs() + 0.1
        x[torch.rand(*shape) >= p] *= -1
        out.append(x)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_boolean_mask_indexing_in_one_graph(capture_shapes, backend):
    def f(x):
        y = x[x > 0]
        return y * 2, y.sum(), y.shape[0] * 3 + 1

    r = check(f, densities(), backend=backend, fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonzero_and_masked_select(capture_shapes, backend):
    def f(x):
        idx = (x > 0).nonzero()
        picked = torch.masked_select(x, x > 0)
        return idx, picked.cumsum(0), x[idx.squeeze(1)].sum() + idx.size(0)

    r = check(f, densities(), backend=backend, fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unique_and_its_inverse(capture_shapes, backend):
    def f(x):
        u, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
        return u * 2, inverse, counts, u.numel()

    inputs = [torch.randint(0, k, (12,)) for k in (3, 1, 12, 5)]
    r = check(f, inputs, backend=backend, fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeat_interleave_with_tensor_repeats(capture_shapes, backend):
    def f(x, reps):
        y = torch.repeat_interleave(x, reps, dim=0)
        return y + 1, y.shape[0]

    x = torch.randn(4, 3)
    inputs = [(x, torch.tensor(r)) for r in ([1, 0, 2, 3], [0, 0, 0, 0], [5, 1, 1, 1])]
    check(f, inputs, backend=backend, fullgraph=True, graphs=1, compiles=1)


def test_gradients_through_ops_after_a_boolean_mask():
    cfg = frametrace.config
    saved = cfg.capture_dynamic_output_shape_ops
    cfg.capture_dynamic_output_shape_ops = True
    try:
        def f(x, w):
            y = x[x > 0]
            return (y.sin() * y).sum() * w + (x * w).sum()

        cnt = frametrace.testing.CompileCounter(inner="aot_eager")
        g = frametrace.optimize(backend=cnt, fullgraph=True)(f)
        for x in densities():
            w = torch.tensor(1.5, requires_grad=True)
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            wa, wb = w.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
            f(xa, wa).backward()
            g(xb, wb).backward()
            torch.testing.assert_close(xb.grad, xa.grad)
            torch.testing.assert_close(wb.grad, wa.grad)
        assert cnt.frame_count == 1
    finally:
        cfg.capture_dynamic_output_shape_ops = saved


def test_masked_tensor_crosses_a_graph_break(capture_shapes):
    def f(x):
        y = x[x > 0]
        n = y.shape[0]
        opaque(n)
        return y * n, n + 1

    r = check(f, densities(), breaks=1)
    # the mask's graph once; after the break y's size is a plain input size (static
    # first, symbolic once it has changed)
    assert r.compiles <= 4, r
    no_unbacked_guards(r)


def test_branch_on_a_data_dependent_size_is_a_graph_break(capture_shapes):
    def f(x):
        y = x[x > 0]
        if y.shape[0] > 3:
            return y.sum()
        return y.mean()

    r = check(f, densities(), breaks=1)
    no_unbacked_guards(r)
    with pytest.raises(frametrace.Unsupported):
        frametrace.optimize(backend="eager", fullgraph=True)(f)(torch.randn(6))


def test_without_the_flag_data_dependent_shapes_break():
    assert frametrace.config.capture_dynamic_output_shape_ops is False

    def f(x):
        y = x * 2
        idx = y.nonzero()
        return idx + 1

    r = check(f, densities())
    assert r.breaks >= 1, r


def test_triton_backend_compiles_data_dependent_sizes(capture_shapes, monkeypatch):
    # the sizes are read by the wrapper from the nonzero / masked_select calls; kernels
    # take them as arguments (reductions, a softmax and a gather over them), and empty
    # results (an all-negative input) launch nothing
    pytest.importorskip("triton")
    from frametrace.backends.triton import backend
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")   # an internal error would raise
    before = backend.STATS["eager_graphs"]

    def f(x):
        y = x[x > 0]
        idx = (x > 0).nonzero()
        picked = torch.masked_select(x, x > 0)
        return ((y * 2).exp().sum() + x.sum(), y.shape[0], picked.cumsum(0), picked.mean(),
                torch.softmax(picked, 0), x[idx.squeeze(1)].sum() + idx.size(0))

    check(f, densities(), backend="triton", fullgraph=True, graphs=1, compiles=1)
    assert backend.STATS["eager_graphs"] == before, "the graph ran eagerly"
    assert backend.COMPILED[-1].kernels
