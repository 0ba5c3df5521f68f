"""`config.symbolic_views`: a view of a buffer with symbolic sizes is that buffer's memory
with the strides of the graph's fake value, where the buffer has its fake input's layout.
Written to break it: inputs that are transposed, sliced, expanded, channels-last or
offset; slices with symbolic bounds and steps; splits of a symbolic dim; views of views;
views an aten call reads (a matmul, attention) or the graph returns (aliasing with the
inputs and with each other, as eager has it); writes through a view of an input; dtype
views; size-1 dims.  Each program runs against eager over several sizes with fresh inputs
(values, NaN positions, inputs after the call, which outputs share memory with what), with
the switch on and off, and what was compiled is checked: the symbolic graph ran as
kernels, and the switch on leaves no more kernels than off (fewer where a copy went away).
"""
import copy

import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402
from frametrace.backends.triton import wrapper as triton_wrapper  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

SIZES = (6, 17, 33, 6, 40)


def _storage(t):
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


def _sharing(outs, args):
    """For each output: which inputs and earlier outputs share its memory (eager's aliasing
    is part of what a program sees: a write through one shows in the other)."""
    ptrs = [_storage(a) for a in args]
    seen, found = [], []
    for o in outs:
        p = _storage(o)
        found.append((tuple(i for i, q in enumerate(ptrs) if p is not None and q == p),
                       tuple(i for i, q in enumerate(seen) if p is not None and q == p)))
        seen.append(p)
    return found


def run(fn, make, sizes=SIZES, atol=1e-5, rtol=1e-5, strict=True):
    """fn compiled (triton; the second size makes n symbolic) against eager over `sizes`; returns the kernels of the
    symbolic graphs compiled.  `strict`: also strides and which outputs share memory with
    what (without symbolic views, a returned view of an intermediate is a copy)."""
    frametrace.reset()
    backend.COMPILED.clear()
    before = backend.STATS["eager_graphs"]
    compiled = frametrace.optimize(backend="triton")(fn)   # (automatic dynamic: n alone symbolic)
    for n in sizes:
        torch.manual_seed(n)
        args = make(n)
        want_args, got_args = copy.deepcopy(args), copy.deepcopy(args)
        want, got = fn(*want_args), compiled(*got_args)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(want + tuple(want_args), got + tuple(got_args)):
            assert (a.shape, a.dtype) == (b.shape, b.dtype), (n, a.shape, b.shape, a.dtype, b.dtype)
            # (the strides a program can tell apart: those of dims longer than 1)
            assert not strict or [s for s, k in zip(a.stride(), a.shape) if k > 1] == \
                [s for s, k in zip(b.stride(), b.shape) if k > 1], (n, a.stride(), b.stride())
            torch.testing.assert_close(b, a, atol=atol, rtol=rtol, equal_nan=True)
        assert not strict or _sharing(got, got_args) == _sharing(want, want_args), n
    assert backend.STATS["eager_graphs"] == before, "a graph ran eagerly instead of as kernels"
    symbolic = [m for m in backend.COMPILED if m.symbolic]
    assert symbolic, "no graph with symbolic sizes"
    return sum(len(m.kernels) for m in symbolic)


def both(fn, make, monkeypatch, fewer=False, **kw):
    """`run` with the switch on, then off: the same values, and no more kernels on (fewer
    where `fewer`: a copy the views remove), nor more copies of an extern's result made
    because it came back with other strides than the lowering predicted."""
    copies = triton_wrapper.LAYOUT_COPIES[0]
    on = run(fn, make, **kw)
    on_copies = triton_wrapper.LAYOUT_COPIES[0] - copies
    monkeypatch.setattr(config, "symbolic_views", False)
    off = run(fn, make, strict=False, **kw)
    off_copies = triton_wrapper.LAYOUT_COPIES[0] - copies - on_copies
    monkeypatch.setattr(config, "symbolic_views", True)
    assert on <= off, (on, off)
    if fewer:
        assert on < off, (on, off)
    assert on_copies <= off_copies, (on_copies, off_copies)
    return on, off


def _heads(t, b, h):
    return t.view(b, t.shape[1], h, -1).transpose(1, 2)


def test_attention_qkv_split_views(monkeypatch):
    """BERT's pattern: one projection split into q, k, v, each viewed as heads and
    transposed for attention, its output transposed back and flattened."""
    w = torch.randn(48, 3 * 48)

    def f(x, mask):
        q, k, v = (x @ w).split(48, -1)
        o = F.scaled_dot_product_attention(_heads(q, 2, 4), _heads(k, 2, 4), _heads(v, 2, 4), attn_mask=mask)
        return o.transpose(1, 2).reshape(2, x.shape[1], 48)
    both(f, lambda n: (torch.randn(2, n, 48), torch.rand(2, 1, n, n) > 0.3), monkeypatch, fewer=True)


def test_input_reshaped_for_a_matmul(monkeypatch):
    """A contiguous input flattened for a matmul: a view, not a copy kernel."""
    w = torch.randn(16, 8)
    both(lambda x: (x.reshape(-1, 16) @ w).view(3, -1, 8), lambda n: (torch.randn(3, n, 16),), monkeypatch,
         fewer=True)


def test_transposed_input_reshape_copies(monkeypatch):
    """A transposed input reshaped: eager copies (no strides can say it), so must we."""
    w = torch.randn(5, 4)
    both(lambda x: x.reshape(-1, 5) @ w, lambda n: (torch.randn(5, n, 3).transpose(0, 2),), monkeypatch)


def test_channels_last_flatten(monkeypatch):
    """A channels-last image with a symbolic width flattened over its pixels (a copy in
    eager) and permuted (a view)."""
    def f(x):
        return x.flatten(2) @ x.flatten(2).transpose(1, 2), x.permute(0, 2, 3, 1) * 2
    both(f, lambda n: (torch.randn(2, 3, 4, n).contiguous(memory_format=torch.channels_last),), monkeypatch)


def test_symbolic_slices(monkeypatch):
    """Slices with symbolic bounds of an input and of a matmul's output, read by another
    matmul and returned; a column slice (a row stride longer than the row).  (Steps over a
    symbolic dim give sizes like (n - 1)//2, which the lowering does not take yet: such a
    graph runs with aot_eager whatever this switch says.)"""
    w = torch.randn(7, 7)

    def f(x):
        y = x @ w
        a = y[1:y.shape[0] - 1]
        return a @ w, y[:, 2:5], x[2:], y[:, 1:6:2] @ w[:3]
    both(f, lambda n: (torch.randn(n, 7),), monkeypatch)


def test_offset_views_of_views(monkeypatch):
    """Views of views with offsets: a narrow of a split piece, unbind, select, unsqueeze,
    expand, all of a matmul's output, read by matmuls and returned."""
    w = torch.randn(6, 12)

    def f(x):
        y = x @ w                       # (n, 12)
        a, b = y.split(6, 1)
        c = b.narrow(1, 2, 3)           # offset 8 in each row
        rows = y.view(-1, 2, 6).unbind(1)
        return c.t() @ c, rows[1] @ w, y[-1].unsqueeze(0).expand(4, 12) + 0, a.unsqueeze(1).expand(-1, 3, -1)
    both(f, lambda n: (torch.randn(n, 6),), monkeypatch)


def test_returned_views_alias_their_input(monkeypatch):
    """Views of inputs returned: eager returns views (same memory as the input, and as each
    other); a write to the input after the call shows through them."""
    def f(x, y):
        return x.view(-1), x.t(), y[:, 1:].transpose(0, 1), x.unsqueeze(0)
    both(f, lambda n: (torch.randn(n, 4), torch.randn(3, n)), monkeypatch)
    compiled = frametrace.optimize(backend="triton")(f)
    for n in (9, 21):
        x, y = torch.randn(n, 4), torch.randn(3, n)
        outs = compiled(x, y)
        x.add_(1)
        y.mul_(2)
        want = f(x, y)
        for a, b in zip(outs, want):
            torch.testing.assert_close(a, b)


def test_write_through_a_view_of_an_input(monkeypatch):
    """In-place writes to views of inputs (a row slice, a transposed view): the input
    changes as in eager, and what is read after the write sees it."""
    def f(x, y):
        x[1:x.shape[0] - 1].mul_(2)
        y.t()[0].add_(x.sum())
        return x.view(-1) + 1, y[:, :2] @ x[:2]
    both(f, lambda n: (torch.randn(n, 2), torch.randn(n, 3)), monkeypatch)


def test_dtype_view_is_not_taken(monkeypatch):
    """A view as another dtype: other element sizes, never this path's business."""
    def f(x):
        y = x * 2
        return y.view(torch.int32) & 0xFF, x.view(torch.int32)[1:]
    both(f, lambda n: (torch.randn(n, 4),), monkeypatch)


def test_nan_inf_through_views(monkeypatch):
    """NaN and inf carried through views into a matmul and out."""
    w = torch.randn(4, 4)

    def f(x):
        y = (x.reshape(-1, 4) @ w).view(2, -1, 4).transpose(0, 1)
        return y.reshape(-1, 4).amax(-1), y

    def make(n):
        x = torch.randn(2, n, 4)
        x[0, 0, 1], x[1, -1, 2] = float("nan"), float("inf")
        return (x,)
    both(f, make, monkeypatch)


def test_size_one_dims(monkeypatch):
    """Size-1 dims around a symbolic one (their strides address nothing, and eager's may
    be anything): batch 1, squeeze and unsqueeze, a matmul over the view."""
    w = torch.randn(8, 8)

    def f(x):
        y = x.squeeze(0) @ w
        return y.unsqueeze(1).unsqueeze(0).transpose(1, 2) * 1, y.view(1, -1, 1, 8)[:, 1:]
    both(f, lambda n: (torch.randn(1, n, 8),), monkeypatch)


def test_bf16_and_ints(monkeypatch):
    """Other dtypes: bf16 (a matmul in bf16 through views) and int64 views."""
    w = torch.randn(8, 4, dtype=torch.bfloat16)

    def f(x, i):
        return x.view(-1, 8) @ w, i.t()[1:].contiguous() * 3, i.view(-1)[3:]
    both(f, lambda n: (torch.randn(2, n, 8, dtype=torch.bfloat16), torch.randint(-9, 9, (n, 3))),
         monkeypatch, atol=2e-2, rtol=2e-2)
