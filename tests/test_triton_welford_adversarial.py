"""backend="triton": adversarial programs for the looped variance (config.welford: Welford's
one pass; config.welford_mean: var_mean's mean from Welford's running mean) and for
config.eviction_hints, each against eager through Triton's interpreter on fresh inputs
over several calls, rows looped in blocks of 16 (conftest.short_loops).  Every program
that should loop is checked to have made a Welford kernel, so a graph run eagerly cannot
pass."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402
from conftest import short_loops  # noqa: E402
from differential import check  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero",
                                        "ignore:overflow encountered")


@pytest.fixture(autouse=True)
def _looped(triton_interpreter, monkeypatch):
    frametrace.reset()
    short_loops(monkeypatch)


@pytest.fixture(params=[False, True], ids=["no_hints", "hints"])
def hints(request, monkeypatch):
    monkeypatch.setattr(config, "eviction_hints", request.param)
    return request.param


def welford_kernels(mods):
    return [k for m in mods for k in m.kernels if "_welford" in k.source]


def _r(*shape, dtype=torch.float32, scale=1.0, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).to(dtype)


# -- integer and bool inputs ----------------------------------------------------------------------
@pytest.mark.parametrize("fn", [lambda x: torch.std(x, -1, correction=0) + 1, lambda x: x.var(),
                                lambda x: torch.var(x, 1, keepdim=True)], ids=["std", "var_all", "var_keepdim"])
def test_integer_and_bool_variances_raise_as_eager(fn):
    """aten.var of an integer or bool tensor passes the meta function but not eager's
    kernel ("std and var only support floating point and complex dtypes"): it stays an aten
    call that raises, where a kernel computed a variance of 0s and 1s.  The same program
    of floats is a Welford kernel."""
    ints = torch.randint(-3, 4, (4, 40))
    check(fn, [(ints > 0,), (ints,), (ints.to(torch.int32),)], backend="triton")
    assert any("var" in str(e) for e in backend.COMPILED[-1].externs), backend.COMPILED[-1].source
    backend.COMPILED.clear()
    check(fn, [(_r(4, 40),)], backend="triton")
    assert welford_kernels(backend.COMPILED), backend.COMPILED[-1].source


# -- half-precision inputs: the sums behind a mean and a variance ---------------------------------
HALF_SUMS = {
    # the var_mean's sum and M2 stored for the scan's kernel (M2 of spread 10 over 1000: 1e5)
    "var_mean_then_scan": (lambda x: [t.float().cumsum(0) for t in torch.var_mean(x, -1)], (4, 1000), 1e3, True),
    "var_then_scan": (lambda x: x.var(-1).float().cumsum(0), (4, 1000), 1e3, True),
    # a user's mean: its sum, not the mean, is what the scan's kernel reads
    "mean_then_scan": (lambda x: x.mean(-1).float().cumsum(0), (4, 1000), 1e3, False),
    # rows in registers (two passes), values about 3e4
    "persistent_var_mean": (lambda x: [t.float().cumsum(0) for t in torch.var_mean(x, -1)], (4, 12), 3e4, False),
}


@pytest.mark.parametrize("name", sorted(HALF_SUMS))
def test_half_inputs_sum_in_float32(name, hints):
    """fp16 values far from zero (spread 10): the row's sum (1e6) and centred sum of
    squares (1e5) pass fp16's 65504, and eager keeps both in float32.  The lowering made
    them Computed values of the input's dtype, so a sum stored for another kernel (a
    scan of the means) was inf.  (The tolerance: the mean's fp16 rounding, which the
    compiled `.float()` of it skips.)"""
    fn, shape, offset, welford = HALF_SUMS[name]
    calls = [(_r(*shape, dtype=torch.float16, scale=10.0, offset=offset * (1 + s) / 2, seed=s),) for s in range(2)]
    backend.COMPILED.clear()
    check(fn, calls, backend="triton", rtol=2e-3, atol=0)
    assert not welford or welford_kernels(backend.COMPILED), backend.COMPILED[-1].source
    assert not backend.COMPILED[-1].externs, backend.COMPILED[-1].source
