"""`config.symbolic_views` attacked further (see test_triton_symbolic_views.py, whose
`run` and `both` these reuse): each program runs against eager over several sizes with
fresh inputs, with the switch on and off.  Regressions found while attacking the path
come first, then the strongest of the attack programs that passed, kept as guards."""
import copy

import pytest
import torch
import torch.nn.functional as F

import frametrace
from frametrace.testing import CompileCounter

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402

from test_triton_symbolic_views import both, run  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _frames(fn, make, sizes=(6, 17, 33, 40)):
    """How many graphs `fn` compiles over `sizes` (values checked against eager): 2 when
    the second size's graph, with symbolic sizes, serves every size after it."""
    frametrace.reset()
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter)(fn)
    for n in sizes:
        args = make(n)
        want, got = fn(*copy.deepcopy(args)), compiled(*copy.deepcopy(args))
        for a, b in zip(want, got):
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
            torch.testing.assert_close(b, a)
    return counter.frame_count


def test_select_at_a_positive_index_of_a_symbolic_dim(monkeypatch):
    """x.select(0, 2) with a symbolic first dim: the lowering took `2 % s0` (a sympy Mod,
    no number) for the index, raised TypeError, and the frame fell back to static sizes,
    a compile per size.  A non-negative index is the index."""
    def f(x):
        return x.select(0, 2) * 1, x.t()[3] + x[:, 1], x[2] @ x.t()
    assert _frames(f, lambda n: (torch.randn(n, 4),)) == 2
    both(f, lambda n: (torch.randn(n, 4),), monkeypatch)


def test_views_of_a_dtype_view_of_an_input_returned():
    """Views of `x.view(torch.int32)` (an extern) returned: each aliases the input, and
    AOTAutograd, with symbolic sizes, regenerated it from the output's `_base` and
    `_view_func`, replayed in the input's dtype: float32 came back where eager has int32
    (the switch on made the flatten a view of the extern's result, and the output kept
    that view's record).  A slice then flatten, and a dtype view of a view of the input,
    came back with the values of another layout with the switch on or off."""
    def f(x):
        return x.view(torch.int32).flatten(1), x.view(torch.int32)[:, 1:].flatten(1), \
            x[:, 1:].flatten(1).view(torch.int32), x.view(torch.int32).transpose(0, 2)
    run(f, lambda n: (torch.randn(n, 3, 4),))
    compiled = frametrace.optimize(backend="triton")(f)
    for n in (9, 21):
        x = torch.randn(n, 3, 4)
        outs = compiled(x)
        x.mul_(-2)   # (a write to the input shows through each output, as in eager)
        for a, b in zip(outs, f(x)):
            assert a.dtype == b.dtype and a.stride() == b.stride()
            torch.testing.assert_close(a, b)


# -- attack programs that passed, kept as guards ---------------------------------------------
W8 = torch.randn(8, 8)


def test_inputs_whose_offset_and_strides_vary_with_the_size(monkeypatch):
    """Inputs that are views of a larger tensor: the storage offset and the row stride
    change with n (symbols of their own), transposed, read by matmuls and returned."""
    def offset_t(n):
        return (torch.randn(4 * n, 8)[n:2 * n + 2].t(),)

    def f(x):
        return x.t()[1:], x @ x.t(), x[1:].reshape(-1)[5:], x.unbind(0)[3] * 1, x[:, 2:].t().reshape(-1, 8) @ W8
    both(f, offset_t, monkeypatch)   # (views of inputs: taken with the switch off too)

    def g(x):
        return x.t()[1:], x.t() @ x, x.unsqueeze(1).expand(-1, 2, -1).transpose(0, 1), x[2:].view(-1, 4, 2)[:, 1] @ W8[:2]
    both(g, lambda n: (torch.randn(n, n + 9)[:, :8],), monkeypatch)   # (views of inputs: taken with the switch off too)


def test_overlapping_and_odd_layouts_returned(monkeypatch):
    """as_strided inputs whose rows overlap, permuted 5-d inputs with size-1 dims and two
    symbolic sizes: views returned and read by kernels and matmuls.  (The switch on alone:
    off, a returned view of an input with an offset or gaps is a copy, and AOTAutograd
    makes the view again from the input with the copy's strides and offset: wrong values.)"""
    def overlap(n):
        return (torch.randn(n + 8).as_strided((n, 8), (1, 1)),)
    run(lambda x: (x.t(), x[1:], x.unsqueeze(1), x @ W8), overlap)

    def f(x):
        return x.squeeze(0).reshape(5, -1)[1:] @ torch.ones(x.shape[2] * 6), x.transpose(2, 4)[0, :, 1:], \
            x.flatten(0, 1).unsqueeze(-1).movedim(-1, 0)
    run(f, lambda n: (torch.randn(n, 3, 5, 1, 2).permute(3, 2, 0, 4, 1),))

    def g(x):
        return x.transpose(0, 1).reshape(x.shape[1], -1) @ torch.ones(x.shape[0] * 4), x.permute(2, 1, 0)[1:, 2:], \
            x.view(-1, 4)[x.shape[1]:].t()
    run(g, lambda n: (torch.randn(n, n // 2 + 3, 4),))


def test_splits_narrows_and_chunks_of_extern_outputs(monkeypatch):
    """split_with_sizes of the symbolic dim, narrow/unflatten/permute/chunk chains of a
    matmul's output, stack then unbind: pieces with offsets, read and returned."""
    def f(x):
        a, b, c = x.split_with_sizes([2, 3, x.shape[0] - 5], 0)
        return c.t(), b @ c.t(), (a + 1).t(), c[1:].view(-1)
    run(f, lambda n: (torch.randn(n, 4),))   # (off: wrong values, see above)

    def g(x):
        y = x @ W8
        p = y.narrow(0, 1, y.shape[0] - 2).unflatten(1, (4, 2))
        q = p.permute(2, 0, 1)[1].t()
        return q, q @ p[:, :, 0], p.chunk(2, 1)[1].reshape(-1, 2) * 1
    both(g, lambda n: (torch.randn(n, 8),), monkeypatch)

    def h(x):
        y = torch.stack([x, x * 2], 1) @ W8
        return y.unbind(1) + (y.unbind(2)[3],)
    both(h, lambda n: (torch.randn(n, 8),), monkeypatch)


def test_attention_views_with_masks(monkeypatch):
    """q, k, v as permuted views (k of a flipped input), an expanded boolean mask, the
    output permuted back and returned with views of it."""
    def f(x, m):
        q = x.view(x.shape[0], x.shape[1], 2, 4).permute(0, 2, 1, 3)
        k = x.flip(1).view(x.shape[0], x.shape[1], 2, 4).permute(0, 2, 1, 3)
        o = F.scaled_dot_product_attention(q, k, q, attn_mask=m[:, None, :, :].expand(-1, 2, -1, -1))
        return o.permute(2, 0, 1, 3).reshape(x.shape[1], -1), o.transpose(-1, -2)[..., 1:], o[:, 1]
    both(f, lambda n: (torch.randn(3, n, 8), torch.rand(3, n, n) > 0.2), monkeypatch, fewer=True, atol=1e-4, rtol=1e-4)


def test_writes_through_views_and_aliases_after_the_call(monkeypatch):
    """Writes through slices and transposes of inputs and into views (copy_), reads after
    them; outputs aliasing the inputs, which the caller then writes: each shows it."""
    def f(x):
        x[1:].mul_(2)
        x.t()[1:].mul_(3)
        return x.t() @ x, x[0], x.view(-1)[2:]
    both(f, lambda n: (torch.randn(n, 8),), monkeypatch)

    def g(x, y):
        x[:, 1:].copy_(y[:, :-1].t().t())
        return x.t() @ y, x.view(-1)
    both(g, lambda n: (torch.randn(n, 4), torch.randn(n, 4)), monkeypatch)

    def h(x, y):
        return (x.t(), x[1:].view(-1), y.permute(1, 0, 2)[1], x.expand(2, -1, -1)) + y.unbind(2)
    both(h, lambda n: (torch.randn(n, 4), torch.randn(n, 3, 2)), monkeypatch)   # (views of inputs: taken with the switch off too)
    compiled = frametrace.optimize(backend="triton")(h)
    for n in (9, 21):
        x, y = torch.randn(n, 4), torch.randn(n, 3, 2)
        outs = compiled(x, y)
        x.add_(1.5)
        y.mul_(-2)
        for a, b in zip(outs, h(x, y)):
            torch.testing.assert_close(a, b)


def test_data_dependent_rows_then_views(monkeypatch):
    """Rows a mask picks (a size the data decides) through a matmul, split, transposed
    and expanded; nonzero's indices transposed and flattened."""
    monkeypatch.setattr(frametrace.config, "capture_dynamic_output_shape_ops", True)

    def f(x, w):
        y = x[x.sum(1) > 0] @ w
        a, b = y.split([3, 5], 1)
        return a.t() @ b, b[:, 1:].unsqueeze(0).expand(2, -1, -1)
    both(f, lambda n: (torch.randn(n, 8), torch.randn(8, 8)), monkeypatch)

    def g(x):
        i = torch.nonzero(x > 0.5)
        return i.t()[0], i.t().view(-1) * 2, i.unbind(1)[1]
    run(g, lambda n: (torch.randn(n, 3),))   # (off: a graph runs eagerly)


def test_complex_and_bool_views(monkeypatch):
    """view_as_real/view_as_complex and bool inputs viewed, returned and computed with."""
    def f(x, b):
        r = torch.view_as_real(x)
        return r.transpose(0, 1)[1:], torch.view_as_complex(r.contiguous()).t(), b.t()[1:], \
            b.view(-1).logical_not(), b.unsqueeze(0).expand(2, -1, -1)
    both(f, lambda n: (torch.randn(n, 3, dtype=torch.complex64), torch.rand(n, 3) > 0.5), monkeypatch)


def _grads(fn, make, sizes=(6, 17, 33)):
    """fn compiled (triton) against eager with gradients: outputs and each leaf's grad of
    a weighted sum of the outputs, over `sizes`; the symbolic graphs ran as kernels."""
    frametrace.reset()
    backend.COMPILED.clear()
    before = backend.STATS["eager_graphs"]
    compiled = frametrace.optimize(backend="triton")(fn)
    for n in sizes:
        torch.manual_seed(n)
        args = make(n)
        results = []
        for f in (fn, compiled):
            leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
            outs = f(*leaves)
            sum((o * torch.arange(o.numel()).reshape(o.shape).sin()).sum() for o in outs).backward()
            results.append((outs, [a.grad for a in leaves]))
        (want, wg), (got, gg) = results
        for a, b in zip(want + tuple(wg), got + tuple(gg)):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    assert backend.STATS["eager_graphs"] == before
    assert any(m.symbolic for m in backend.COMPILED)


@pytest.mark.parametrize("symbolic_views", (True, False))
def test_backward_through_views(monkeypatch, symbolic_views):
    """Training: views of inputs and of a matmul's and attention's outputs, returned (the
    extern's output with them), gradients through each."""
    monkeypatch.setattr(config, "symbolic_views", symbolic_views)

    def f(x, w):
        y = x @ w
        return y.t()[1:], y.view(-1, 2)[:, 1], y, x.t()[2:] * 2

    _grads(f, lambda n: (torch.randn(n, 4, requires_grad=True), torch.randn(4, 6, requires_grad=True)))

    def g(x, w):
        q = (x @ w).view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q, q)
        return (o.transpose(1, 2).reshape(x.shape[0], x.shape[1], 8),)
    _grads(g, lambda n: (torch.randn(2, n, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)))


# -- wrong answers found here, each kept as a test of its fix ----------------------------
def test_switch_off_returned_offset_view_of_an_input(monkeypatch):
    """symbolic_views=False still views graph inputs by their fake layout: a returned view
    of an input with an offset, stored as a copy, came back wrong (AOTAutograd made the
    view again from the input with the copy's strides and offset)."""
    monkeypatch.setattr(config, "symbolic_views", False)
    run(lambda x: (x[:, 1:].flatten(2),), lambda n: (torch.randn(2, 3, n, 5),), strict=False)
    run(lambda x: (x.permute(2, 1, 0)[1:, 2:],), lambda n: (torch.randn(4, 5, n),), strict=False)


def test_float64_view_of_a_float32_input_flattened():
    """AOTAutograd (torch.compile's too) made the output again with as_strided in the
    input's elements, (n,) instead of (2n,), once n was symbolic: it is replayed on the
    input after the graph (replayed_views.py)."""
    run(lambda x: (x.view(torch.float64).flatten(),), lambda n: (torch.randn(n, 4),))
    run(lambda x: (x.view(torch.int32).flatten()[:6], x * 2), lambda n: (torch.randn(n, 4),))
