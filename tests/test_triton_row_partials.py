"""backend="triton": row partials (row_partials.py, config.row_partials).  A reduction
over rows and more whose summand reads a row reduction's per-row values (the KL
divergence of two log_softmaxes, batchmean: issue 31's kernel class) reduces each row in
the kernel that computes the row statistics (a further loop over a looped row), then the
rows' partials in a small kernel; compared with eager through Triton's interpreter, with
what was compiled: which kernels read the inputs, how many passes, what is stored."""
import re

import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import config  # noqa: E402
from conftest import short_loops  # noqa: E402
from triton_harness import triton_check, triton_check_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero",
                                        "ignore:reduction. .mean. divides",
                                        "ignore:overflow encountered")


@pytest.fixture(autouse=True)
def _interpret(triton_interpreter):
    frametrace.reset()   # settings differ between tests: compile afresh


@pytest.fixture(params=["persistent", "looped"])
def rows(request, monkeypatch):
    """Rows in one block, or looped over blocks of 16."""
    if request.param == "looped":
        short_loops(monkeypatch)
    return request.param


def switched(monkeypatch, on):
    assert hasattr(config, "row_partials")
    monkeypatch.setattr(config, "row_partials", on)


def _r(*shape, dtype=torch.float32, scale=3.0):
    return (torch.randn(*shape) * scale).to(dtype)


def kl(reduction):
    return lambda a, b: F.kl_div(F.log_softmax(a, -1), F.log_softmax(b, -1), log_target=True,
                                 reduction=reduction)


def reading(mod, i):
    """The kernels that load graph input `i`."""
    name = mod.wrapper.lowered.inputs[i]
    return [k for k in mod.kernels if name in k.args]


def passes(k) -> int:
    return k.source.count("for roffset") + k.source.count("while roffset")


def allocations(mod):
    return [tuple(int(n) for n in re.findall(r"\d+", m)) for m in
            re.findall(r"empty_strided\(\(([^)]*)\)", mod.source)]


def assert_fused(mod, rows, n, loops, inputs=(0, 1)):
    """Each input is read by one kernel, the row kernel, with no flat `// n` index; looped,
    in `loops` passes over the row, per-row expressions (a log) outside the loops; then one
    small kernel (the partials' sum); nothing but `n`-row partials stored between them."""
    (k,) = {id(k): k for i in inputs for k in reading(mod, i)}.values()
    assert f"// {n}" not in k.source, k.source
    if rows == "looped" and n > 16:   # (16: short_loops' block, a row that fits it)
        assert passes(k) == loops, k.source
        assert not re.search(r"^ {8}.*tl\.log\(", k.source, re.M), k.source
    else:
        assert passes(k) == 0, k.source
    assert len(mod.kernels) == 2, mod.source


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean"])
@pytest.mark.parametrize("on", [True, False])
def test_kl_per_row(monkeypatch, rows, on, reduction):
    switched(monkeypatch, on)
    mod = triton_check(kl(reduction), _r(6, 37), _r(6, 37), atol=1e-5, rtol=1e-4)
    if on:
        assert_fused(mod, rows, 37, loops=3)
        assert (6,) in allocations(mod) and (6, 1) not in allocations(mod), mod.source
    else:   # the flat reduction reads both inputs again, each element's statistics by `// 37`
        assert len(reading(mod, 0)) == 2 and len(reading(mod, 1)) == 2, mod.source
        assert any("// 37" in k.source for k in mod.kernels), mod.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kl_odd_rows_and_dtypes(rows, dtype):
    for shape in ((5, 41), (1, 23), (7, 16), (3, 33)):
        frametrace.reset()   # (else the second shape compiles with symbolic sizes)
        a, b = _r(*shape, dtype=dtype), _r(*shape, dtype=dtype)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        mod = triton_check(kl("batchmean"), a, b, atol=tol, rtol=tol, half_as_float=True)
        if shape[0] > 1:
            assert_fused(mod, rows, shape[1], loops=3)


def test_kl_specials(rows):
    a, b = _r(5, 33), _r(5, 33)
    a[1, 3] = float("-inf")      # a zero probability of the input: KL is inf
    b[2, 5] = float("nan")
    triton_check(kl("batchmean"), a, b)
    a, b = _r(5, 33), _r(5, 33)
    a[0, 7] = float("inf")       # an infinite logit: its row's log_softmax is NaN
    b[3] = float("-inf")         # a -inf row: NaN
    triton_check(kl("sum"), a, b)
    a, b = _r(4, 33), _r(4, 33)
    a[2] = float("-inf")
    b[2] = float("-inf")
    triton_check(kl("mean"), a, b)
    frametrace.reset()   # (else a shape met second compiles with symbolic sizes)
    a, b = _r(4, 33), _r(4, 33)
    b[1, :5] = float("-inf")     # zero target probabilities: terms of 0
    mod = triton_check(kl("batchmean"), a, b)
    assert_fused(mod, rows, 33, loops=3)


def test_kl_layouts(rows):
    """Transposed and expanded inputs (rows strided in memory) give eager's numbers."""
    triton_check(kl("batchmean"), _r(37, 6).t(), _r(1, 37).expand(6, 37), atol=1e-5, rtol=1e-4)
    triton_check(kl("sum"), _r(37, 6).t(), _r(37, 6).t(), atol=1e-5, rtol=1e-4)
    triton_check(kl("batchmean"), _r(6, 74)[:, ::2], _r(6, 37), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("on", [True, False])
def test_kl_gradients(monkeypatch, rows, on):
    switched(monkeypatch, on)
    for reduction in ("batchmean", "sum"):
        triton_check_grads(kl(reduction), _r(5, 37).requires_grad_(), _r(5, 37).requires_grad_(),
                           atol=1e-5, rtol=1e-4)
    a = _r(4, 37, dtype=torch.bfloat16).requires_grad_()
    b = _r(4, 37, dtype=torch.bfloat16).requires_grad_()
    triton_check_grads(kl("batchmean"), a, b, atol=3e-2, rtol=3e-2, half_as_float=True)


def test_other_row_statistics(rows):
    """Not only log_softmax: a centred sum of squares (a row mean), a max of a row minus
    its max, a sum over the leading dims kept, 3-D inputs whose rows are the last dim."""
    def centred(x):
        return ((x - x.mean(-1, keepdim=True)) ** 2).sum()
    mod = triton_check(centred, _r(6, 37), atol=1e-4, rtol=1e-4)
    assert_fused(mod, rows, 37, loops=2, inputs=(0,))

    def spread(x):
        return (x.amax(-1, keepdim=True) - x).amax()
    mod = triton_check(spread, _r(6, 37))
    assert_fused(mod, rows, 37, loops=2, inputs=(0,))

    def per_batch(x):   # an outer-dims reduction: over rows (dim 1) and the row (dim 2)
        return (x - x.logsumexp(-1, keepdim=True)).exp().mul(x).sum((1, 2), keepdim=True)
    mod = triton_check(per_batch, _r(2, 3, 37), atol=1e-4, rtol=1e-4)
    assert (2, 3) in allocations(mod) or (6,) in allocations(mod), mod.source

    def whole(x):
        return F.log_softmax(x, -1).mean()
    triton_check(whole, _r(2, 3, 37), atol=1e-4, rtol=1e-4)


def test_plain_full_sum_unchanged(rows):
    """A full sum that reads no row statistics stays one flat reduction (one kernel)."""
    mod = triton_check(lambda x: x.exp().sum(), _r(6, 37, scale=1.0), atol=1e-4, rtol=1e-4)
    assert len(mod.kernels) == 1, mod.source


def test_column_statistics_of_a_square_not_row_partials(rows):
    """A square matrix's column max has as many values as it has rows, but is no row
    statistic: the full sum reading it stays one flat reduction after the column kernel
    (2 kernels; reduced per row, its partials joined nothing: 3)."""
    mod = triton_check(lambda x: (x - x.amax(0, keepdim=True)).sum(), _r(8, 8), atol=1e-4, rtol=1e-4,
                       kernels=2)
    assert (8,) not in allocations(mod), mod.source
    mod = triton_check(lambda x: (x.t() - x.amax(0, keepdim=True).t()).amin(), _r(8, 8))
    assert_fused(mod, rows, 8, loops=2, inputs=(0,))   # (the transposed rows: row statistics)


def test_kl_long_rows_default_blocks():
    """Rows longer than config.persistent_rblock_max with the default block sizes (an odd
    length: the last block masked): the row kernel loops three times, then the partials."""
    n = config.persistent_rblock_max + 27
    a, b = _r(2, n, dtype=torch.bfloat16), _r(2, n, dtype=torch.bfloat16)
    mod = triton_check(kl("batchmean"), a, b, atol=2e-2, rtol=2e-2, half_as_float=True)
    assert_fused(mod, "looped", n, loops=3)


def test_kl_few_rows_split_max(monkeypatch):
    """Few long rows (the CPU's 64 x 32000 case, scaled down): each row max is split into
    chunks (splits.py) and the log-sum-exp recomputes it online, so the row kernel reads
    the split max; the batchmean sum still joins the row kernel (4 kernels: the chunks'
    maxes, their max, the rows, the partials)."""
    from frametrace.backends.triton import autotune
    short_loops(monkeypatch)
    monkeypatch.setattr(autotune, "SPLIT_MIN_WORK", 1)
    monkeypatch.setattr(autotune, "SPLIT_MIN_CHUNK", {False: 16, True: 16})
    mod = triton_check(kl("batchmean"), _r(4, 200), _r(4, 200), atol=1e-5, rtol=1e-4)
    assert len(mod.kernels) == 4, mod.source
    (row,) = [k for k in reading(mod, 0) if "// 200" not in k.source and passes(k) == 3]
    assert all("// 200" not in k.source for k in mod.kernels), mod.source
    assert len(reading(mod, 0)) == len(reading(mod, 1)) == 2, mod.source
