"""backend="triton" gives eager's answer where eager's semantics are sharp: max/min/amax/
amin/argmax/argmin propagate NaN (persistent, looped and split reductions; elementwise
maximum/minimum/clamp too); an index out of range (index_select, embedding, gather,
scatter, x[idx], with static or symbolic sizes) raises as eager does instead of reading
other memory, while negative indices wrap where eager accepts them; an integer division
by zero raises on the CPU.  Each test compares with CPython through `check` (several
calls, fresh inputs) and asserts that the kernels were generated and hold what answers
(the reduction, the `tl.device_assert`), so that an eager fallback cannot pass."""
import pytest
import torch
import torch.nn.functional as F

from conftest import short_loops
from differential import check

pytest.importorskip("triton")
from frametrace.backends.triton import autotune, backend, config  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def reruns(caplog):
    """How many times a compiled graph raised and its frame ran in CPython: only the
    calls where eager raises may (a check that fired on valid data would pass for right,
    its frame rerun in CPython)."""
    import logging
    caplog.set_level(logging.INFO, logger="frametrace")
    return lambda: sum("the frame runs in CPython" in r.getMessage() for r in caplog.records)

NAN, INF = float("nan"), float("inf")


def sources():
    return "\n".join(k.source for m in backend.COMPILED for k in m.kernels)


def assert_kernels(*texts, absent=()):
    """Every graph went through kernels (none ran eagerly), which contain `texts`."""
    assert backend.COMPILED, "no graph went through the triton backend"
    src = sources()
    for m in backend.COMPILED:
        assert m.kernels, m.source
    for t in texts:
        assert t in src, f"{t!r} not in the kernels:\n{src}"
    for t in absent:
        assert t not in src, f"{t!r} in the kernels:\n{src}"


def rows(n):
    """Rows of length `n` with NaN first, last, in the middle, everywhere, nowhere, with
    infinities, and with -0.0 beside 0.0."""
    base = torch.arange(n, dtype=torch.float32) - n / 2
    r = [base.clone() for _ in range(8)]
    r[0][0] = NAN
    r[1][-1] = NAN
    r[2][n // 2] = NAN
    r[2][1] = NAN
    r[3][:] = NAN
    r[5][1], r[5][-2] = INF, -INF
    r[6][:] = -INF
    r[7][:] = 0.0
    r[7][::2] = -0.0
    return torch.stack(r)


REDUCTIONS = {
    "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin(1),
    "max_dim": lambda x: tuple(x.max(1)),
    "min_dim": lambda x: tuple(x.min(1)),
    "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(1),
    "max_all": lambda x: x.max(),
    "min_all": lambda x: x.min(),
    "argmax_all": lambda x: x.argmax(),
    "amax_keep_fused": lambda x: (x - x.amax(1, keepdim=True)).exp(),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_max_min_and_their_indices_propagate_nan(name, looped, monkeypatch, reruns):
    if looped:
        short_loops(monkeypatch, rblock=8)
    n = 20 if looped else 6
    fn = REDUCTIONS[name]
    x = rows(n)
    no_nan = torch.nan_to_num(x, nan=1.0)
    check(fn, [no_nan, x, x.flip(1), x[[3, 0, 6, 1]], torch.randn(8, n)], backend="triton",
          graphs=None, max_graphs=3)
    assert_kernels("tl.reduce(")
    assert reruns() == 0


def test_max_of_a_transposed_input_propagates_nan(reruns):
    """An outer reduction (loads contiguous along the kept axis)."""
    x = rows(6).t().contiguous().t()
    check(lambda x: (x.amax(1), x.argmin(1)), [x, x * 2], backend="triton")
    assert_kernels("tl.reduce(")
    assert reruns() == 0


def test_split_max_propagates_nan(monkeypatch, reruns):
    """A long row of few outputs is reduced in two kernels (chunks, then partials): NaN in
    one chunk reaches the result."""
    monkeypatch.setattr(autotune, "SPLIT_MIN_CHUNK", {False: 64, True: 16})
    monkeypatch.setattr(autotune, "SPLIT_MIN_WORK", 1)
    x = torch.randn(4096)
    y = x.clone()
    y[3000] = NAN
    check(lambda x: (x.max(), x.amin()), [x, y], backend="triton")
    assert len([k for m in backend.COMPILED for k in m.kernels if k.group.reduction]) >= 2, \
        "the reduction was not split"
    assert reruns() == 0


def test_integer_max_and_argmax(reruns):
    """The NaN rule (`a != a`) is False for integers: ties and extremes as torch."""
    x = torch.tensor([[3, 7, 7, -2], [-9, -9, 0, 0], [2**62, -(2**62), 5, 2**62]])
    check(lambda x: (x.amax(1), x.argmax(1), x.argmin(1), x.min()), [x, x.flip(1)],
          backend="triton")
    assert_kernels("tl.reduce(")
    assert reruns() == 0


def test_elementwise_maximum_minimum_clamp_propagate_nan(reruns):
    a = torch.tensor([NAN, 1.0, NAN, -INF, -0.0, 0.0, 2.0, INF])
    b = torch.tensor([1.0, NAN, NAN, INF, 0.0, -0.0, -3.0, NAN])
    lo = torch.tensor([0.0, 0.0, NAN, 1.0, 0.0, 0.0, NAN, 0.0])

    def f(a, b, lo):
        return (torch.maximum(a, b), torch.minimum(a, b), a.clamp(-1.0, 1.0), a.clamp(min=lo),
                a.clamp(max=lo), b.clamp(lo, lo + 1), a.clamp(NAN, 1.0))
    check(f, [(a, b, lo), (b, a, lo.flip(0))], backend="triton")
    assert_kernels("tl.where((")
    assert reruns() == 0


# -- indices ----------------------------------------------------------------------------
W = torch.randn(5, 3)


def _index_cases():
    """(name, fn, valid args, invalid args...)."""
    ok1 = torch.tensor([0, 4, 2])
    ok2 = torch.tensor([[0, 4], [3, 3]])
    return [
        ("index_select", lambda w, i: w.index_select(0, i) * 2,
         [ok1], [torch.tensor([0, 5, 1]), torch.tensor([0, -1, 1])]),
        ("index_select_dim1", lambda w, i: w.index_select(1, i) + 1,
         [torch.tensor([2, 0, 2])], [torch.tensor([0, 3, 0]), torch.tensor([-1, 0, 0])]),
        ("embedding_1d", lambda w, i: F.embedding(i, w) * 2,
         [ok1], [torch.tensor([0, 5, 1]), torch.tensor([0, -1, 1])]),
        ("embedding_2d", lambda w, i: F.embedding(i, w) * 2,
         [ok2], [torch.tensor([[0, 5], [1, 1]]), torch.tensor([[0, 1], [-1, 1]])]),
        ("gather", lambda w, i: w.gather(1, i) * 2,
         [torch.tensor([[0], [2], [1], [2], [0]])],
         [torch.tensor([[0], [3], [1], [2], [0]]), torch.tensor([[0], [-1], [1], [2], [0]])]),
        ("index", lambda w, i: w[i] * 2,
         [ok1, torch.tensor([0, -1, -5])], [torch.tensor([0, 5, 1]), torch.tensor([0, -6, 1])]),
        ("index_2d", lambda w, i: w[i, i.clamp(max=2)] * 2,
         [torch.tensor([-1, 4, 0])], [torch.tensor([0, 5, 1]), torch.tensor([-6, 0, 0])]),
        ("scatter", lambda w, i: w.scatter(1, i, -1.0) * 2,
         [torch.tensor([[0], [2], [1], [2], [0]])],
         [torch.tensor([[0], [3], [1], [2], [0]]), torch.tensor([[0], [-1], [1], [2], [0]])]),
    ]


@pytest.mark.parametrize("case", _index_cases(), ids=lambda c: c[0])
def test_an_index_out_of_range_raises_as_in_eager(case, monkeypatch, reruns):
    """Valid calls, then out-of-range ones (past the end, below -size or, where eager takes
    no negative index, -1), then a valid one: each as CPython.  A failed check is the
    program's error, not a kernel failing its first launch: the graph keeps its kernels
    (outside the strict test mode too, where a failing kernel would run its nodes as aten)."""
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    eager_before, nodes_before = backend.STATS["eager_graphs"], backend.STATS["fallback_nodes"]
    name, fn, ok, bad = case
    calls = [(W, i) for i in ok + bad + ok]
    check(fn, calls, backend="triton", graphs=None, max_graphs=2)
    assert_kernels("tl.device_assert(")
    assert backend.STATS["eager_graphs"] == eager_before
    assert backend.STATS["fallback_nodes"] == nodes_before
    assert reruns() == len(bad)


def test_an_index_out_of_range_raises_at_the_first_call(reruns):
    """The first call (which compiles and launches the kernels first) raises eager's error,
    and the compiled graph stays kernels for the next call."""
    fn = lambda w, i: w.index_select(0, i).sin()  # noqa: E731
    check(fn, [(W, torch.tensor([7])), (W, torch.tensor([1]))], backend="triton")
    assert_kernels("tl.device_assert(")
    assert reruns() == 1


def test_indices_checked_against_a_symbolic_size(reruns):
    """With dynamic sizes the bound is the kernel's size argument, not the traced size."""
    def f(w, i):
        return w[i] + 1, w.gather(0, i[:, None].expand(-1, w.shape[1]).clamp(min=0))
    calls = [(torch.randn(5, 3), torch.tensor([4, -5])), (torch.randn(7, 3), torch.tensor([6, -1])),
             (torch.randn(7, 3), torch.tensor([0, 7])), (torch.randn(6, 3), torch.tensor([-7, 0])),
             (torch.randn(4, 3), torch.tensor([5, 0])), (torch.randn(4, 3), torch.tensor([3, 1]))]
    check(f, calls, backend="triton", dynamic=True, graphs=1)
    src = sources()
    assert "tl.device_assert(" in src
    assert any(m.symbolic for m in backend.COMPILED), "the sizes did not become symbolic"
    assert reruns() == 3


def test_an_error_raised_where_the_frame_cannot_run_again_has_eagers_type():
    """A frame that wrote its input before the failing kernel cannot run again in
    CPython: the exception the kernel raises is eager's type."""
    import frametrace

    def f(x, i):
        x.add_(1)
        return x.index_select(0, i)

    f_c = frametrace.optimize(f, backend="triton")
    assert (f_c(W.clone(), torch.tensor([1, 0])) == f(W.clone(), torch.tensor([1, 0]))).all()
    with pytest.raises(IndexError) as want:
        f(W.clone(), torch.tensor([9]))
    with pytest.raises(IndexError) as got:
        f_c(W.clone(), torch.tensor([9]))
    assert "out of range" in str(got.value) and "out of range" in str(want.value)
    assert_kernels("tl.device_assert(")


def test_check_indices_switch(monkeypatch, reruns):
    """`config.check_indices = False`: no checks in the kernels (an index out of range
    then reads whatever memory it names)."""
    monkeypatch.setattr(config, "check_indices", False)
    check(lambda w, i: w[i] * 2, [(W, torch.tensor([0, -1]))], backend="triton")
    assert_kernels("tl.load(", absent=("tl.device_assert(",))
    assert reruns() == 0


# -- integer division by zero ---------------------------------------------------------------
DIVISIONS = {
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": lambda a, b: torch.remainder(a, b) + 1,
    "fmod": lambda a, b: torch.fmod(a, b) * 2,
    "floordiv_scalar": lambda a, b: a // (b.shape[0] - 37) + b,
}


@pytest.mark.parametrize("name", sorted(DIVISIONS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_an_integer_division_by_zero_raises_on_the_cpu(name, dtype, reruns):
    """37 elements: lanes past the end of the last block (whose loads give 0) are not
    checked; a zero divisor first, last or alone raises."""
    a = torch.arange(-18, 19, dtype=dtype)
    b = torch.tensor([(-1) ** i * (i % 5 + 1) for i in range(37)], dtype=dtype)
    calls = [(a, b)]
    for at in (0, 36, 17):
        z = b.clone()
        z[at] = 0
        calls.append((a, z))
    calls.append((a, b.flip(0)))
    check(DIVISIONS[name], calls, backend="triton", graphs=None, max_graphs=2)
    assert_kernels("ZeroDivisionError")
    assert reruns() == (len(calls) if name == "floordiv_scalar" else 3)


def test_float_division_by_zero_does_not_raise(reruns):
    a = torch.tensor([1.0, -1.0, 0.0, NAN, 3.0])
    b = torch.tensor([0.0, 0.0, 0.0, 0.0, -0.0])
    check(lambda a, b: (a / b, a // b, a % b, torch.fmod(a, b)), [(a, b)], backend="triton")
    assert_kernels("tl.store(", absent=("tl.device_assert(",))
    assert reruns() == 0


def test_a_nonzero_literal_divisor_is_not_checked(reruns):
    a = torch.arange(-18, 19)
    check(lambda a: (a // 3, a % -2, torch.fmod(a, 5)), [a, a.flip(0)], backend="triton")
    assert_kernels("tl.store(", absent=("tl.device_assert(",))
    assert reruns() == 0


def test_boolean_constants_make_no_non_boolean_where(reruns):
    """A constant mask (`torch.ones(..., dtype=bool)`) is a Python bool in the kernel:
    Triton's `tl.where` on an int (`1 & mask`) warns that it is deprecated."""
    import warnings
    x = torch.randn(5, 5)

    def f(x):
        ones, zeros = torch.ones(5, 5, dtype=torch.bool), torch.zeros(5, 5, dtype=torch.bool)
        return (torch.where(ones, x, 0.0), x.masked_fill(zeros, 1.0),
                torch.where(ones & (x > 0), x, -x), ones.sum(1), ones.float() * 2, ~zeros,
                (x > 0) | zeros, torch.full((5,), True) ^ (x[0] > 0), ones)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check(f, [x, -x], backend="triton")
    assert not [w for w in seen if "non-boolean" in str(w.message)]
    assert_kernels("tl.where(")
    assert reruns() == 0


def test_ties_of_signed_zeros_keep_the_first_operand_as_eager(reruns):
    """maximum(-0.0, 0.0) is -0.0 in eager (the first operand of a tie), clamp(-0.0,
    min=0.0) too, and amax of [-0.0, 0.0] is -0.0: compared by sign bit, which `check`'s
    allclose does not see."""
    import frametrace
    a = torch.tensor([[-0.0, 0.0], [0.0, -0.0]])

    def f(a):
        return (torch.maximum(a[:, 0], a[:, 1]), torch.minimum(a[:, 0], a[:, 1]),
                a.clamp(min=0.0), a.clamp(max=0.0), a.clamp(-0.0, 0.0), a.amax(1), a.amin(1))
    check(f, [a], backend="triton")
    got, want = frametrace.optimize(f, backend="triton")(a), f(a)
    for g, w in zip(got, want):
        assert torch.equal(torch.signbit(g), torch.signbit(w)), (g, w)
    assert_kernels("tl.reduce(")
    assert reruns() == 0
