"""Outputs of graphs with symbolic sizes keep eager's layout (`config.symbolic_output_strides`):
a channels-last max pooling over symbolic heights and widths, pointwise ops over
transposed, permuted, offset, expanded and channels-last inputs, size-1 dims.  The output
is stored with its traced strides (expressions of shape symbols and derived sizes) where
they are proved dense; before, such outputs came back row-major (a caller's
`is_contiguous(memory_format=torch.channels_last)` changed with the size).

Also what the h65 merge brought up around graph inputs written in place: a returned view
of a value written into an input (`x[-(n // 2)::2].add_(1)`, `x.view(-1)[2:]` after writes)
is that view of the input's own memory with the traced strides and offset (AOTAutograd
may rebuild the caller's view from them), and a kernel's member first read under a
branch's mask (a slice_scatter of a slice_scatter) is computed for every lane.

Differential: each program compiled against eager over several sizes on fresh copies of
the inputs (NaN/inf in them): values, dtypes, shapes, strides of dims longer than 1,
the inputs after the call, which outputs share memory with which inputs, and the
outputs' storage offsets.  What was compiled: no graph ran eagerly as a whole, a graph
with symbolic sizes ran, and there is no compile per size."""
import copy

import pytest
import torch
import torch.nn.functional as F

import frametrace
from triton_harness import PARITY_GRAPHS
from frametrace.testing import CompileCounter

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

SIZES = (6, 9, 17, 33, 6, 12)


def _specials(x):
    flat = x.view(-1) if x.is_contiguous() else x.reshape(-1)
    n = flat.numel()
    if x.dtype.is_floating_point and n > 3:
        flat[n // 3] = float("nan")
        flat[(2 * n) // 3] = float("inf")
    return x


def _cl(n, c=3):
    return _specials(torch.randn(2, c, n, n + 1)).contiguous(memory_format=torch.channels_last)


def _storage(t):
    return t.untyped_storage().data_ptr()


def _sharing(outs, args):
    """For each output: the inputs and the earlier outputs that share its memory."""
    ptrs = [_storage(a) for a in args]
    outs = list(outs)
    return [(tuple(i for i, p in enumerate(ptrs) if _storage(o) == p),
             tuple(j for j in range(i) if _storage(outs[j]) == _storage(o))) for i, o in enumerate(outs)]




def run(fn, make, sizes=SIZES, strides=True, tol=1e-5, offsets=False, sharing=True):
    """fn compiled with backend="triton" against eager on make(n) for each n; returns the
    symbolic modules.  `strides`: the outputs' strides (of dims longer than 1) are eager's.
    `offsets`: so are their storage offsets (views of inputs).  `sharing`: which outputs
    share memory with which inputs and earlier outputs is eager's."""
    frametrace.reset()
    backend.COMPILED.clear()
    before = backend.STATS["eager_graphs"]
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter)(fn)
    for n in sizes:
        torch.manual_seed(n)
        args = make(n)
        want_args, got_args = copy.deepcopy(args), copy.deepcopy(args)
        want, got = fn(*want_args), compiled(*got_args)
        want = want if isinstance(want, (tuple, list)) else (want,)
        got = got if isinstance(got, (tuple, list)) else (got,)
        assert len(want) == len(got)
        for a, b in zip(list(want) + list(want_args), list(got) + list(got_args)):
            assert (a.shape, a.dtype) == (b.shape, b.dtype), (n, a.shape, b.shape, a.dtype, b.dtype)
            if strides:
                assert [s for s, k in zip(a.stride(), a.shape) if k > 1] == \
                    [s for s, k in zip(b.stride(), b.shape) if k > 1], (n, a.stride(), b.stride())
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, equal_nan=True)
        assert not sharing or _sharing(got, got_args) == _sharing(want, want_args), n
        if offsets:
            assert [t.storage_offset() for t in got] == [t.storage_offset() for t in want], n
    assert backend.STATS["eager_graphs"] == before, "a graph ran eagerly instead of as kernels"
    symbolic = [m for m in backend.COMPILED if m.symbolic]
    assert 1 <= len(symbolic) <= 1 + PARITY_GRAPHS, "no graph with symbolic sizes, or one per size"
    assert counter.frame_count <= 2 + PARITY_GRAPHS, counter.frame_count   # (static first, then symbolic)
    return symbolic


_W = torch.randn(3, generator=torch.Generator().manual_seed(1))

# name: (fn, inputs for size n)
LAYOUTS = {
    "max_pool_channels_last": (lambda x: F.max_pool2d(x, 3, 2, padding=1), lambda n: (_cl(n, 4),)),
    "max_pool_channels_last_epilogue": (lambda x: F.max_pool2d(x.relu(), 2) * 2 + 1, lambda n: (_cl(n),)),
    "channels_last_pointwise": (lambda x: (x.sin() * _W[:, None, None], x + 1), lambda n: (_cl(n),)),
    "transposed": (lambda x: x.t() * 2 + 1, lambda n: (_specials(torch.randn(n, 5)),)),
    "transposed_input": (lambda x: x.exp(), lambda n: (_specials(torch.randn(5, n)).t(),)),
    "permuted_3d": (lambda x: x.permute(2, 0, 1).cos(), lambda n: (_specials(torch.randn(n, 3, 4)),)),
    "offset_view_transposed": (lambda x: x[1:].t() * 3, lambda n: (_specials(torch.randn(n, 4)),)),
    "size_one_dims": (lambda x: x.permute(2, 1, 0) - 1, lambda n: (_specials(torch.randn(n, 1, 5)),)),
    "expanded_input": (lambda x: x.expand(3, -1, -1) * 2, lambda n: (_specials(torch.randn(1, n, 4)),)),
    "expanded_transposed": (lambda x: x.t() + x.new_ones(()),
                            lambda n: (_specials(torch.randn(n, 1)).expand(n, 4),)),
}


# returned views of a returned value: eager's share its memory
RETURNED_VIEWS = {
    "transposed_value": (lambda x: (lambda y: (y, y.t(), y[1:]))(x.t() * 2), lambda n: (_specials(torch.randn(n, 5)),)),
    "plain_value": (lambda x: (lambda y: (y, y.t(), y[1:]))(x * 2), lambda n: (_specials(torch.randn(n, 5)),)),
    "channels_last_pool": (lambda x: (lambda y: (y, y.permute(0, 2, 3, 1), y[:, 1]))(F.max_pool2d(x, 2) + 1),
                           lambda n: (_cl(n),)),
    "unbind": (lambda x: (lambda y: (y,) + y.unbind(0))(x.t().sin()), lambda n: (_specials(torch.randn(n, 3)),)),
}


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("views", [True, False])
@pytest.mark.parametrize("name", list(RETURNED_VIEWS))
def test_returned_views_of_a_returned_value(monkeypatch, name, on, views):
    """With both switches on each view shares the value's memory with eager's strides (a
    view of the stored value, no copy kernel); otherwise the views are copies, with the
    same values (a slice's strides are no dense layout a copy could take)."""
    monkeypatch.setattr(config, "symbolic_output_strides", on)
    monkeypatch.setattr(config, "symbolic_views", views)
    fn, make = RETURNED_VIEWS[name]
    symbolic = run(fn, make, strides=on and views, sharing=on and views)
    if on and views:
        assert len(symbolic[0].kernels) == 1, symbolic[0].source


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("views", [True, False])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_symbolic_outputs_take_eager_layout(monkeypatch, name, on, views):
    """On: each output's strides are eager's at every size; off: the same values (the
    strides may differ).  config.symbolic_views on and off (views of the inputs are
    taken either way; of computed values only with it)."""
    monkeypatch.setattr(config, "symbolic_output_strides", on)
    monkeypatch.setattr(config, "symbolic_views", views)
    fn, make = LAYOUTS[name]
    run(fn, make, strides=on)


def test_channels_last_pool_output_is_channels_last_at_every_size(monkeypatch):
    """What a caller asks of the output: is_contiguous(memory_format=channels_last), and
    the kernel stores it so (no copy kernel after it); off, row-major."""
    pool = lambda x: F.max_pool2d(x, 3, 2, padding=1)   # noqa: E731
    for on in (True, False):
        monkeypatch.setattr(config, "symbolic_output_strides", on)
        symbolic = run(pool, lambda n: (_cl(n, 4),), strides=on)
        mod = symbolic[0]
        assert len(mod.kernels) == 1, mod.source
        compiled = frametrace.optimize(backend="triton")(pool)
        for n in (7, 20):
            out = compiled(_cl(n, 4))
            assert out.is_contiguous(memory_format=torch.channels_last) == on, (n, out.stride())


def test_derived_sizes_off_pool_still_matches_eager(monkeypatch):
    """config.derived_sizes off: the pooling's output sizes are no polynomials, so the
    graph runs with aot_eager (eager's layout), with the layout switch either way."""
    monkeypatch.setattr(config, "derived_sizes", False)
    pool = lambda x: F.max_pool2d(x, 3, 2, padding=1)   # noqa: E731
    compiled = frametrace.optimize(backend="triton")(pool)
    for n in SIZES:
        x = _cl(n, 4)
        got, want = compiled(x.clone()), pool(x.clone())
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, equal_nan=True)


# -- views of values written into inputs ------------------------------------------------
def _rows(n, k=3):
    return (_specials(torch.randn(n, k)),)


WRITTEN = {
    # h65's example: AOTAutograd cannot replay a view with a symbolic start; it rebuilds it
    # from the returned tensor's strides and offset
    "symbolic_start_step2": lambda x: (x[-(x.shape[0] // 2)::2].add_(1), x[-5::3].mul_(2)),
    "step2": lambda x: x[::2].mul_(2),
    "offset_slice": lambda x: x[1:].mul_(2),
    "flat_view_after_writes": lambda x: (x[1:].mul_(2), x.t()[1:].mul_(3), x.view(-1)[2:])[2:],
    "select_after_write": lambda x: (x[1:].mul_(x[0]), x[1])[1],
}


@pytest.mark.parametrize("views", [True, False])
@pytest.mark.parametrize("name", list(WRITTEN))
def test_returned_views_of_inputs_written_in_place(monkeypatch, name, views):
    """Each returned view shares x's memory, with eager's strides and storage offset, and
    x holds eager's values after the call; the graph with symbolic sizes ran as kernels
    (before, h65 refused it: aot_eager)."""
    monkeypatch.setattr(config, "symbolic_views", views)
    run(WRITTEN[name], lambda n: _rows(n), offsets=True, tol=1e-5)


def test_written_view_with_the_caller_writing_after(monkeypatch):
    """The returned view is live: a write through it after the call shows in x, as in
    eager."""
    fn = WRITTEN["symbolic_start_step2"]
    compiled = frametrace.optimize(backend="triton")(fn)
    for n in (7, 12, 23):
        x = torch.randn(n, 3)
        y = x.clone()
        got, want = compiled(x), fn(y)
        for a, b in zip(got, want):
            a.mul_(-1)
            b.mul_(-1)
        torch.testing.assert_close(x, y)


def test_member_read_under_a_branch_mask_is_computed_for_every_lane():
    """x[1:] and x.t()[1:] written in place: two slice_scatters, the first stored by the
    second's kernel and read as the second's source (under its mask) and as its base (the
    other lanes).  Its value was memoized from the masked read, 0 where the mask was off:
    rows of x and x.t() @ x came back wrong with symbolic sizes (static sizes too, were
    the two fused)."""
    def fn(x):
        x[1:].mul_(2)
        x.t()[1:].mul_(3)
        return x.t() @ x, x[0] + 1
    run(fn, lambda n: (torch.randn(n, 8),), tol=1e-4)
    frametrace.reset()
    compiled = frametrace.optimize(backend="triton", dynamic=False)(fn)
    for n in (6, 11):
        x = torch.randn(n, 8)
        y = x.clone()
        for a, b in zip(compiled(x), fn(y)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(x, y)
