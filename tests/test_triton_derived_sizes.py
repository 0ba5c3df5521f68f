"""backend="triton" with symbolic sizes that are no polynomial of shape symbols: a slice
with a step (`(s0 - 1)//2 + 1`), a view's -1 (`s0//2`), pooling and strided convolutions
(`(s0 + 2*p - k)//s + 1`), unfold, uneven chunks, a negative start (`Max(0, s0 - 3)`).
Each such size is a derived size (derived.py, `config.derived_sizes`): the wrapper
computes it from the inputs' sizes once per call, kernels take it as an int argument.

Differential: each program compiled against eager over sizes that cross power-of-two
buckets, fresh inputs each call: values (NaN/inf positions), dtypes, shapes, strides of
dims longer than 1, inputs after the call, exceptions of the same type.  And what was
compiled: the graph with symbolic sizes ran as kernels (no graph eagerly as a whole, a
symbolic module with kernels and derived sizes), with no compile per size; with the
switch off the same graph runs with aot_eager (the switch is what makes it compile)."""

import pytest
import torch
import torch.nn.functional as F

import frametrace
from triton_harness import PARITY_GRAPHS, TORCH_BEFORE_2_13, compare_leaves, eager_and_compiled
from frametrace.testing import CompileCounter

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

SIZES = (5, 16, 17, 33, 6, 64, 9, 5)

_W7 = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))
_W4 = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
_CW1 = torch.randn(4, 3, 3, generator=torch.Generator().manual_seed(3))
_CW2 = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(4))


def _rows(n, *shape, dtype=torch.float32):
    x = torch.randn(n, *shape).to(dtype)
    # NaN and inf at positions that move with n
    flat = x.view(-1)
    flat[n % flat.numel()] = float("nan")
    flat[(3 * n + 1) % flat.numel()] = float("inf")
    return x


def _finite(n, *shape, dtype=torch.float32):
    return torch.randn(n, *shape).to(dtype)


# name: (fn, inputs for size n, tolerance)
PROGRAMS = {
    "matmul_step2_step3": (lambda x: ((x @ _W7)[1::2] @ _W7, x[::3].sin()), lambda n: (_finite(n, 7),), 1e-4),
    "step3_offset": (lambda x: x[1::3].exp() + 1, lambda n: (_rows(n, 5),), 1e-4),
    "negative_start": (lambda x: (x[-3:] * 2, x[-5::2] + 1), lambda n: (_rows(n, 3),), 1e-4),
    "half_rows": (lambda x: x[: x.shape[0] // 2].cos(), lambda n: (_rows(n, 3),), 1e-4),
    "half_rows_from": (lambda x: x[x.shape[0] // 2:] * 3, lambda n: (_rows(n, 3),), 1e-4),
    "half_rows_from_end": (lambda x: x[-(x.shape[0] // 2):] * 3 + x[-(x.shape[0] // 2)::2].sum(0),
                           lambda n: (_rows(n, 3),), 1e-4),
    "view_minus_one": (lambda x: (x @ _W4).view(2, -1, 4).sum(1), lambda n: (_finite(2 * n, 4),), 1e-4),
    "reshape_product": (lambda x: (x[::2] * 2).reshape(-1).view(-1, 7).amax(1), lambda n: (_rows(n, 7),), 1e-4),
    "max_pool2d": (lambda x: F.max_pool2d(x.relu(), 3, 2, 1) + 1, lambda n: (_rows(2, 3, n, n + 1),), 1e-4),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, 2).sin(), lambda n: (_rows(2, 3, n),), 1e-4),
    "avg_pool2d": (lambda x: F.avg_pool2d(x * 2, 2, 2) - 1, lambda n: (_rows(2, 3, n, 6),), 1e-4),
    "conv1d_stride": (lambda x: F.conv1d(x, _CW1, stride=2).relu() * 2, lambda n: (_finite(2, 3, n),), 1e-4),
    "conv2d_stride_cnn": (lambda x: F.max_pool2d(F.conv2d(x, _CW2, stride=2, padding=1).relu(), 2).sum((2, 3)),
                          lambda n: (_finite(2, 3, n + 4, n + 6),), 1e-4),
    "unfold": (lambda x: x.unfold(0, 3, 2).sum(-1), lambda n: (_rows(n, 4),), 1e-4),
    "chunk_uneven": (lambda x: [c * 2 for c in x.chunk(3)], lambda n: (_rows(n, 2),), 1e-4),
    "bf16_step2": (lambda x: (x[::2].float().softmax(-1) * 3).to(torch.bfloat16),
                   lambda n: (_finite(n, 8, dtype=torch.bfloat16),), 2e-2),
    "int_step2": (lambda x: x[1::2] * 3 // 2, lambda n: (torch.randint(-50, 50, (n, 3)),), 0),
    "transposed_step": (lambda x: x.t()[:, ::2].sum(0) + 1, lambda n: (_rows(n, 4),), 1e-4),
}


# programs with an op that has no lowering (avg pooling, unfold): an aten call between kernels
_ATEN_BY_DESIGN = {"avg_pool1d", "avg_pool2d", "unfold"}




def sweep(fn, make, sizes=SIZES, tol=1e-4, backward=False, max_frames=2, eager_graphs=0):
    """fn compiled (triton) against eager on make(n)'s inputs for each n; returns the
    counter and the symbolic modules compiled.  `eager_graphs`: how many graphs may run
    eagerly as a whole (a static graph of empty tensors does)."""
    backend.COMPILED.clear()
    before = backend.STATS["eager_graphs"]
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter)(fn)
    symbolic = []
    for n in sizes:
        torch.manual_seed(n)
        eager_and_compiled(fn, compiled, make(n), f"at n={n}", tol, tol, backward, strides=True)
        symbolic += [m for m in backend.COMPILED if m.symbolic and m not in symbolic]
    assert backend.STATS["eager_graphs"] - before <= eager_graphs, "a graph ran eagerly instead of as kernels"
    assert counter.frame_count <= max_frames + PARITY_GRAPHS, counter.frame_count
    return counter, symbolic


def _derived(mod) -> dict:
    return mod.wrapper.lowered.ctx.derived.sources


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_derived_sizes_across_buckets(name):
    fn, make, tol = PROGRAMS[name]
    fallbacks = backend.STATS["fallback_nodes"]
    counter, symbolic = sweep(fn, make, tol=tol)
    assert symbolic, "no graph with symbolic sizes went through the triton backend"
    if name not in _ATEN_BY_DESIGN:     # (the slices, views, max pooling: kernels)
        assert backend.STATS["fallback_nodes"] == fallbacks, [m.fallbacks for m in symbolic]
    assert any(_derived(m) for m in symbolic), "no derived size in the symbolic graph"
    # the elementwise work is kernels: the conv and avg pooling are aten calls (no
    # lowering), the rest of each graph kernels
    assert all(m.kernels for m in symbolic), [m.source for m in symbolic]
    for m in symbolic:
        # each derived size a kernel takes is computed before the launches, in the
        # general wrapper and in the template of the per-size fast wrappers (GPU) alike
        taken = {n for k in m.kernels for n in k.symbols if n.startswith("ds")}
        for text in (m.source, m.wrapper.fast_template):
            head = text.split("args.clear()")[0]
            assert all(f"    {n} = " in head for n in taken), (taken, text)


def test_derived_sizes_off_runs_aot_eager(monkeypatch):
    """The switch is what compiles these graphs: off, the symbolic graph runs with
    aot_eager as a whole (the right values, no kernels)."""
    monkeypatch.setattr(config, "derived_sizes", False)
    fn, make, _ = PROGRAMS["matmul_step2_step3"]
    before = backend.STATS["eager_graphs"]
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter)(fn)
    for n in (5, 16, 17):
        x = make(n)
        compare_leaves(fn(*x), compiled(*x), f"off at n={n}", 1e-4, 1e-4, strides=True)
    assert backend.STATS["eager_graphs"] > before


@pytest.mark.parametrize("name", ["matmul_step2_step3", "view_minus_one", "step3_offset", "conv1d_stride",
                                  "chunk_uneven", "negative_start", "avg_pool1d"])
def test_derived_sizes_training(name):
    """Forward and backward through graphs with derived sizes (the gradient of a strided
    slice is a slice_scatter, of a pooling its backward op)."""
    fn, make, tol = PROGRAMS[name]
    one = (lambda x: torch.cat([c.flatten() for c in fn(x)])) if name == "chunk_uneven" else \
        (lambda x: fn(x)[0] * 2 + fn(x)[1].sum()) if name == "matmul_step2_step3" else \
        (lambda x: fn(x)[0].sum(0) + fn(x)[1].sum(0)) if name == "negative_start" else fn
    counter, symbolic = sweep(one, lambda n: tuple(a.float() for a in make(n)), sizes=(5, 16, 17, 33, 6),
                              tol=1e-3, backward=True)
    assert symbolic


def test_empty_and_single_row_slices():
    """A derived size that is 0 or 1 (`x[7::2]` of 7 and 8 rows) is specialized by the
    ShapeEnv (its 0/1 guards): those sizes get static graphs of their own (the empty one
    runs with aot_eager, as any static graph of empty tensors), the right values, and
    the symbolic graph keeps serving the others."""
    def fn(x):
        return x[7::2].sin() + 1, x[7:].sum(0)
    counter, symbolic = sweep(fn, lambda n: (_rows(n, 3),), sizes=(9, 16, 17, 7, 8, 33, 7, 40, 8),
                              max_frames=4, eager_graphs=1)
    assert symbolic and any(_derived(m) for m in symbolic)


def test_view_that_cannot_be_raises_as_eager():
    """A view whose -1 does not divide raises eager's error type at the sizes it fails
    for, and the other sizes still compute."""
    def fn(x):
        return (x * 2).view(-1, 3).sum(1)
    sweep(fn, lambda n: (_rows(n, 4),), sizes=(6, 12, 18, 7, 24), max_frames=4)


def test_derived_source_semantics():
    """The Python source of each function mirrors its SymPy semantics, negatives too."""
    import sympy
    from torch.utils._sympy import functions as TF

    from frametrace.backends.triton.derived import NAMESPACE, pysource
    a, b = sympy.symbols("a b", integer=True)
    cases = [TF.FloorDiv(a, b), TF.PythonMod(a, b), TF.Max(a, b - 3), TF.Min(a, 2 * b),
             TF.CeilToInt(TF.IntTrueDiv(a, b)), TF.FloorToInt(TF.IntTrueDiv(a, b)),
             TF.ModularIndexing(a, 1, b)]
    for e in cases:
        src = pysource(e)
        for va in (-7, -1, 0, 3, 10):
            for vb in (1, 2, 3, 5):
                if isinstance(e, TF.ModularIndexing) and va < 0:
                    continue    # (defined for non-negative indices)
                want = e.xreplace({a: sympy.Integer(va), b: sympy.Integer(vb)})
                assert eval(src, dict(NAMESPACE), {"a": va, "b": vb}) == int(want), (e, va, vb)


@pytest.mark.xfail(TORCH_BEFORE_2_13, strict=True, reason="torch 2.11 gives a slice of a size the data "
                   "decides a fresh unbacked size that no aten call binds: the graph runs with aot_eager")
def test_derived_from_a_size_the_data_decides(monkeypatch):
    """`x[x > 0][::2]`: (u0 + 1)//2 over the number of positives u0, computed right after
    the aten call that binds u0 (0 positives: an empty result, no launch)."""
    monkeypatch.setattr(frametrace.config, "capture_dynamic_output_shape_ops", True)

    def fn(x):
        return x[x > 0][::2] * 2 + 1, (x[x > 0][1::3] * 3).sum()

    def make(n):
        x = torch.randn(n, 3)
        if n == 6:
            x = -x.abs()        # (no positives)
        return (x,)
    counter, symbolic = sweep(fn, make, sizes=(5, 16, 17, 6, 33, 64, 6))
    assert any(m.wrapper.lowered.ctx.derived.late for m in symbolic)


def test_returned_view_of_an_input_written_in_place():
    """`x[-(n // 2)::2].add_(1)` returned: AOTAutograd makes the caller's view of x from
    the strides and offset of the tensor the graph returns (it cannot replay a view with
    a symbolic start).  The graph stored that slice (an index map over a slice_scatter
    from a symbolic start), so it returned a view of other rows of x (a silently wrong
    answer, found by this test); now the graph returns that view of x's own memory, with
    the traced strides and offset, and runs as kernels: values, strides, offsets and x as
    eager's."""
    def fn(x):
        return x[-(x.shape[0] // 2)::2].add_(1), x[-5::3].mul_(2)

    def offsets(x):
        return [t.storage_offset() for t in fn(x)]
    counter, symbolic = sweep(fn, lambda n: (_rows(n, 3),))
    assert symbolic
    compiled = frametrace.optimize(backend="triton")(fn)
    for n in (7, 18):
        x = _rows(n, 3)
        got = compiled(x.clone())
        assert [t.storage_offset() for t in got] == offsets(x.clone())
    # (x[::2] returned after mul_: AOTAutograd replays that view itself)
    counter, symbolic = sweep(lambda x: x[::2].mul_(2), lambda n: (_rows(n, 3),))
    assert symbolic


def test_slice_scatter_from_a_symbolic_start():
    """A slice written in place from a symbolic start, odd and even (Max(0, n - n//2),
    n - 5) and not returned: a slice_scatter kernel."""
    def fn(x):
        x[-(x.shape[0] // 2)::2].add_(1)
        x[-5::3].mul_(2)
        return x.sum(0)
    fallbacks = backend.STATS["fallback_nodes"]
    counter, symbolic = sweep(fn, lambda n: (_rows(n, 3),))
    assert symbolic and backend.STATS["fallback_nodes"] == fallbacks


def conv_input_weight(x, w):
    return F.conv2d(x.relu(), w, stride=2).sin() + 1


def test_strided_conv_of_an_input_weight_compiles_to_kernels():
    """F.conv2d(x, w, stride=2) with `w` an input, both dynamic: the output size (H - k)//2
    + 1 has a part, (H - k)//2, whose ranges alone may be negative; the ShapeEnv's guard
    from the op's own check (an output row at least) proves it is not (derived.
    _known_nonnegative), so the graph compiles to kernels instead of running with
    aot_eager as a whole.  Kernel sizes 2 and 3, heights that make the last window fit or
    not, NaN and inf in the input; a kernel larger than the input raises as in eager."""
    g = torch.Generator().manual_seed(5)
    before = backend.STATS["eager_graphs"]
    backend.COMPILED.clear()
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter, dynamic=True)(conv_input_weight)
    for n, k in ((9, 3), (12, 3), (15, 2), (8, 2), (33, 3)):
        x = _rows(1, 3, n, n + 1)
        w = torch.randn(4, 3, k, k, generator=g)
        eager_and_compiled(conv_input_weight, compiled, (x, w), f"n={n} k={k}", 1e-4, 1e-4, strides=True)
    assert backend.STATS["eager_graphs"] == before
    symbolic = [m for m in backend.COMPILED if m.symbolic]
    assert symbolic and all(m.kernels for m in symbolic), [m.source for m in backend.COMPILED]
    assert any(_derived(m) for m in symbolic)
    assert counter.frame_count <= 2, counter.frame_count
    # (a kernel wider than the input: eager's error, from the compiled frame too)
    x, w = _rows(1, 3, 2, 2), torch.randn(4, 3, 3, 3, generator=g)
    eager_and_compiled(conv_input_weight, compiled, (x, w), "kernel wider than the input", 1e-4, 1e-4)
