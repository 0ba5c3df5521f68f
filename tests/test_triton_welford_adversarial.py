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
from differential import check, check_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero",
                                        "ignore:overflow encountered", "ignore:.*degrees of freedom is <= 0")


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


# -- programs that passed the attack: kept as regressions ---------------------------------------
def _specials(seed, shape=(8, 40)):
    """Infinities and NaN as a row's first element, last element (in the masked last block
    of 8), and inside."""
    x = _r(*shape, seed=seed, scale=(1.0, 3.0)[seed % 2], offset=(0.0, -5.0)[seed % 2])
    rows, n = x.view(-1, shape[-1]), shape[-1]
    rows[0, 0] = rows[1, n - 1] = float("inf")
    rows[2, 33 % n] = float("-inf")
    rows[3, 0] = rows[4, n - 1] = float("nan")
    return x


def _plain(*shape, **kw):
    return lambda s: (_r(*shape, seed=s, **kw),)


PROGRAMS = {
    # the user's mean beside var_mean's / a norm's: a plain sum (inf on a row with +inf)
    "mean_beside_var_mean": (lambda x: (x.mean(-1), torch.var_mean(x, -1)[0], x.sum(-1)),
                             lambda s: (_specials(s),)),
    "mean_beside_layer_norm": (lambda x: (F.layer_norm(x, (40,)), x.mean(-1, keepdim=True)),
                               lambda s: (_specials(s),)),
    "mean_beside_group_norm": (lambda x: (F.group_norm(x, 2), x.view(2, 2, -1).mean(-1)),
                               lambda s: (_specials(s, (2, 4, 5, 8)),)),
    "mean_beside_var_mean_dims": (lambda x: (x.mean((0, 2)), torch.var_mean(x, (0, 2))[0]),
                                  lambda s: (_specials(s, (3, 5, 17)).transpose(0, 1).contiguous().transpose(0, 1),)),
    # var_mean's mean returned and used again
    "var_mean_mean_reused": (lambda x: (lambda v, m: (v, m, (x - m[:, None]) * v[:, None]))(*torch.var_mean(x, -1)),
                             _plain(5, 40, offset=3.0)),
    "std_mean_keepdim_dims_1_3": (lambda x: torch.std_mean(x, (1, 3), keepdim=True, correction=0), _plain(3, 9, 2, 5)),
    "var_mean_far_negative": (lambda x: torch.var_mean(x, -1), _plain(4, 100, offset=-1e6, scale=10.0)),
    "var_mean_sliced_offset": (lambda x: torch.var_mean(x[1:, 3:], -1), _plain(6, 44)),
    "var_mean_strided_input": (lambda x: torch.var_mean(x[:, 1::2], (0, 1)), _plain(6, 90)),
    "var_mean_channels_last": (lambda x: torch.var_mean(x, 1), lambda s: (
        _r(2, 40, 3, 3, seed=s).contiguous(memory_format=torch.channels_last),)),
    "var_mean_expanded_rows": (lambda x: torch.var_mean(x, -1), lambda s: (_r(1, 40, seed=s).expand(4, 40),)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs(name, hints):
    fn, make = PROGRAMS[name]
    backend.COMPILED.clear()
    check(fn, [make(s) for s in range(2)], backend="triton", rtol=1e-4, atol=1e-4)
    assert welford_kernels(backend.COMPILED), backend.COMPILED[-1].source


@pytest.mark.parametrize("fn", [lambda x: torch.var_mean(x, -1, correction=2), lambda x: torch.std_mean(x, -1),
                                lambda x: (x.mean(-1), F.layer_norm(x, (x.shape[-1],)))],
                         ids=["var_mean_correction2", "std_mean", "mean_and_layer_norm"])
def test_symbolic_lengths_down_to_one(fn, hints):
    """A symbolic graph for rows of 40, 17, 2, 5 and 33 (a masked last block holding a
    NaN; an infinity would give var_mean's mean the accepted NaN), and a row of 1
    (correction 1 or 2: a denominator of 0 or less, inf/NaN as eager; a graph of its own,
    the size 1 being specialized)."""
    backend.COMPILED.clear()
    calls = []
    for s, n in enumerate((40, 17, 1, 2, 5, 33)):
        x = _r(3, n, seed=s, offset=2.0)
        x[0, n - 1] = float("nan") if n == 33 else x[0, n - 1]
        calls.append((x,))
    check(fn, calls, backend="triton", rtol=1e-4, atol=1e-4, compiled=lambda counter: frametrace.optimize(
        backend=counter, dynamic=True)(fn))
    assert len(backend.COMPILED) <= 2 and any(m.symbolic for m in backend.COMPILED)
    assert welford_kernels(m for m in backend.COMPILED if m.symbolic), backend.COMPILED[0].source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_norm_gradients(dtype, hints):
    """GroupNorm (channels last) and LayerNorm (values far from zero): outputs and the
    gradients of input, weight and bias (the backward reads the saved mean and rstd).
    (fp16's spacing at 50 is 3% of the rows' spread: its rows stay about 0.)"""
    tol = 1e-3 if dtype == torch.float32 else 3e-2

    def fn(x, w, b, y):
        return F.group_norm(x, 2, w, b), F.layer_norm(y, (40,), None, None)
    calls = [tuple(t.requires_grad_() for t in (
        _r(2, 4, 5, 7, seed=s, dtype=dtype).contiguous(memory_format=torch.channels_last),
        _r(4, seed=s + 1, dtype=dtype), _r(4, seed=s + 2, dtype=dtype),
        _r(6, 40, seed=s + 3, dtype=dtype, offset=50.0 if dtype == torch.float32 else 0.0))) for s in range(2)]
    backend.COMPILED.clear()
    check_grads(fn, calls, backend="triton", rtol=tol, atol=tol)
    assert welford_kernels(backend.COMPILED), [m.source for m in backend.COMPILED]
