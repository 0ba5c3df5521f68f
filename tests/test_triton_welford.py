"""backend="triton": a variance over rows too long for registers (a looped reduction) reads
each row once (config.welford): each lane keeps Welford's mean, M2 and count beside the
plain sum the mean comes from, and the lanes combine by Chan's formula, instead of a
second loop over the row for the squares about the mean.  Rows loop over blocks of 16
here (conftest.short_loops; 2 for PyTorch's small OpInfo samples), and every result is
compared with eager through Triton's interpreter: var, var_mean, std, std_mean, GroupNorm
(+SiLU), LayerNorm and training BatchNorm, over last, middle, several and all dims, on
transposed, channels-last and expanded inputs, fp32/fp16/bf16, symbolic lengths (rows
shorter than a block: lanes that count nothing), NaN and infinities, values far from
zero, gradients.  The generated code is checked too: one loop fewer with the switch on,
the two-pass code with it off, the same mean bit for bit, rows in registers untouched."""
import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402
from frametrace.testing import CompileCounter  # noqa: E402
from conftest import short_loops  # noqa: E402
from differential import check, check_grads  # noqa: E402
from triton_harness import eager_and_compiled, sample_program, triton_check, triton_check_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero",
                                        "ignore:overflow encountered")

TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
HALVES = [torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _looped(triton_interpreter, monkeypatch):
    frametrace.reset()   # settings differ between tests: compile afresh
    short_loops(monkeypatch)


def switched(monkeypatch, on):
    assert hasattr(config, "welford")
    monkeypatch.setattr(config, "welford", on)


def welford_kernels(mods):
    return [k for m in mods for k in m.kernels if "_welford" in k.source]


def passes(k) -> int:
    return k.source.count("for roffset") + k.source.count("while roffset")


def _r(*shape, dtype=torch.float32, scale=1.0, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).to(dtype)


def checked(fn, make, dtype=torch.float32, calls=3, **tol):
    """fn against eager on `calls` fresh inputs make(seed, dtype) (scaled and shifted
    differently each call); one of its kernels is a Welford one."""
    tol = tol or {"atol": TOL[dtype], "rtol": TOL[dtype]}
    mod = triton_check(fn, calls=[make(seed, dtype) for seed in range(calls)], half_as_float=True, **tol)
    assert welford_kernels([mod]), mod.source
    return mod


def _scaled(*shape):
    """Inputs of `shape`, their scale and offset varying with the call."""
    return lambda seed, dtype: (_r(*shape, dtype=dtype, scale=(1.0, 3.0, 0.5)[seed % 3],
                                   offset=(0.0, -2.0, 5.0)[seed % 3], seed=seed),)


def _channels_last(seed, dtype):
    return (_r(2, 3, 9, 8, dtype=dtype, seed=seed).contiguous(memory_format=torch.channels_last),)


def _transposed(seed, dtype):
    return (_r(70, 5, dtype=dtype, seed=seed).t(),)


def _expanded(seed, dtype):
    return (_r(4, 1, dtype=dtype, seed=seed).expand(4, 30),)


def _with_factor(seed, dtype):
    return _r(6, 40, dtype=dtype, seed=seed), _r(40, dtype=dtype, seed=seed + 10)


CASES = {
    "var_rows": (lambda x: x.var(-1), _scaled(6, 40)),
    "var_keepdim_middle": (lambda x: x.var(1, keepdim=True), _scaled(4, 67, 3)),
    "var_mean_correction0": (lambda x: torch.var_mean(x, -1, correction=0), _scaled(5, 50)),
    "var_mean_dims_keepdim": (lambda x: torch.var_mean(x, (1, 2), keepdim=True), _scaled(3, 9, 8, 2)),
    "var_dim0": (lambda x: x.var(0), _scaled(70, 6)),
    "var_dims_0_2": (lambda x: x.var((0, 2)), _scaled(5, 3, 9)),
    "var_all": (lambda x: x.var(), _scaled(7, 9)),
    "var_correction2": (lambda x: x.var(-1, correction=2), _scaled(6, 33)),
    "var_correction_half": (lambda x: torch.var_mean(x, -1, correction=0.5), _scaled(6, 33)),
    "std_rows": (lambda x: x.std(-1, correction=0), _scaled(6, 40)),
    "std_mean": (lambda x: torch.std_mean(x, 1), _scaled(4, 33)),
    "var_transposed": (lambda x: x.var(-1), _transposed),
    "var_channels_last": (lambda x: torch.var_mean(x, (2, 3)), _channels_last),
    "var_expanded": (lambda x: x.var(-1), _expanded),
    "var_of_expression": (lambda x, w: torch.var_mean(torch.tanh(x) * w + 1, -1), _with_factor),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_variances_match_eager(name):
    fn, make = CASES[name]
    checked(fn, make)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", ["var_rows", "var_mean_correction0", "var_dim0", "std_mean"])
def test_half_variances(name, dtype):
    fn, make = CASES[name]
    checked(fn, make, dtype)


# -- norms ------------------------------------------------------------------------------------
def _norm_inputs(shape, channels):
    def make(seed, dtype):
        return (_r(*shape, dtype=dtype, scale=(1.0, 3.0)[seed % 2], offset=(0.0, 4.0)[seed % 2], seed=seed),
                _r(channels, dtype=dtype, seed=seed + 20), _r(channels, dtype=dtype, seed=seed + 30))
    return make


NORMS = {
    "group_norm_silu": (lambda x, w, b: F.silu(F.group_norm(x, 3, w, b)), _norm_inputs((2, 6, 5, 7), 6)),
    "group_norm_3d": (lambda x, w, b: F.group_norm(x, 2, w, b, eps=1e-3), _norm_inputs((3, 4, 11), 4)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (40,), w, b), _norm_inputs((6, 40), 40)),
    "layer_norm_two_dims": (lambda x, w, b: F.layer_norm(x, (5, 8), w.view(5, 8), b.view(5, 8)),
                            _norm_inputs((3, 5, 8), 40)),
}


@pytest.mark.parametrize("dtype", [torch.float32] + HALVES)
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norms(name, dtype):
    fn, make = NORMS[name]
    mod = checked(fn, make, dtype, calls=2)
    assert not mod.externs, mod.source


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_group_norm_input_layouts(layout):
    def make(seed, dtype):
        x = _r(2, 6, 5, 7, seed=seed)
        x = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else \
            _r(2, 6, 7, 5, seed=seed).transpose(-1, -2)
        return x, _r(6, seed=seed + 1), _r(6, seed=seed + 2)
    checked(NORMS["group_norm_silu"][0], make, calls=2)


# -- the code: one loop fewer, the switch, the mean ------------------------------------------------
@pytest.mark.parametrize("name", ["group_norm_silu", "layer_norm"])
def test_one_loop_fewer_and_the_switch_restores_two_passes(monkeypatch, name):
    """Statistics and output in one kernel: two loops over each row (statistics, output)
    with the switch on, three off (the sum, the squares about the mean, the output)."""
    fn, make = NORMS[name]
    sources = {}
    for on in (True, False):
        switched(monkeypatch, on)
        frametrace.reset()
        mod = triton_check(fn, *make(0, torch.float32), atol=1e-4, rtol=1e-4)
        (k,) = [k for k in mod.kernels if k.group.reduction]
        assert ("_welford" in k.source) == on, k.source
        assert passes(k) == (2 if on else 3), k.source
        sources[on] = k.source
    assert sources[True] != sources[False]


def accumulators(k) -> int:
    return k.source.count("= tl.full([XBLOCK, RBLOCK], 0,")


def test_the_mean_is_the_two_pass_one_bit_for_bit(monkeypatch):
    """With welford_mean off, var_mean's mean comes from the same sum either way (a fourth
    accumulator beside Welford's three); only the variance differs."""
    monkeypatch.setattr(config, "welford_mean", False)
    x = _r(5, 61, offset=3.0)
    means, variances = [], []
    for on in (True, False):
        switched(monkeypatch, on)
        frametrace.reset()
        var, mean = frametrace.optimize(backend="triton")(lambda x: torch.var_mean(x, -1))(x)
        (k,) = backend.COMPILED[-1].kernels
        assert passes(k) == (1 if on else 2), k.source
        if on:
            assert accumulators(k) == 4, k.source
        means.append(mean)
        variances.append(var)
    assert torch.equal(means[0], means[1])
    torch.testing.assert_close(variances[0], variances[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32] + HALVES)
def test_welford_mean_is_the_mean_to_rounding(monkeypatch, dtype):
    """config.welford_mean: var_mean's mean is Welford's (three accumulators, no sum), equal
    to the plain sum's within rounding, over several calls with rows of other offsets and
    lengths (a symbolic length: lanes that count nothing), and the switch off gives the
    four-accumulator kernel of the same values."""
    fn = lambda x: torch.var_mean(x, -1)  # noqa: E731
    got = {}
    for on in (True, False):
        monkeypatch.setattr(config, "welford_mean", on)
        frametrace.reset()
        backend.COMPILED.clear()
        compiled = frametrace.optimize(backend="triton", dynamic=True)(fn)
        for seed, (rows, n, offset) in enumerate([(5, 61, 3.0), (3, 40, -7.0), (4, 9, 1e3)]):
            x = _r(rows, n, offset=offset, seed=seed, dtype=dtype)
            var, mean = compiled(x.clone())
            ref_var, ref_mean = fn(x)
            torch.testing.assert_close(mean, ref_mean, atol=TOL[dtype] * abs(offset), rtol=TOL[dtype])
            torch.testing.assert_close(var, ref_var, atol=TOL[dtype], rtol=TOL[dtype])
            got[on, seed] = mean
        ks = welford_kernels(backend.COMPILED)
        assert ks and all(accumulators(k) == (3 if on else 4) for k in ks), [k.source for k in ks]
    for seed in range(3):
        torch.testing.assert_close(got[True, seed], got[False, seed], atol=0, rtol=1e-5 if dtype == torch.float32 else 1e-2)


def test_welford_mean_leaves_a_separate_mean_alone(monkeypatch):
    """A user's own x.mean() beside x.var() is a plain sum, whatever welford_mean says: an
    infinity in its row gives inf, as eager, not Welford's NaN."""
    monkeypatch.setattr(config, "welford_mean", True)
    x = _specials(0, torch.float32)[0]
    check(lambda x: (x.mean(-1), x.var(-1)), [(x,), (x.flip(0),)], backend="triton")


def test_rows_in_registers_keep_two_passes(monkeypatch):
    """A row that fits a block: the same persistent kernel with the switch on or off."""
    sources = []
    for on in (True, False):
        switched(monkeypatch, on)
        frametrace.reset()
        mod = triton_check(lambda x, w, b: (torch.var_mean(x, -1), F.layer_norm(x, (12,), w, b)),
                           _r(6, 12), _r(12), _r(12), atol=1e-5, rtol=1e-5)
        assert all(k.name.startswith("triton_per_") for k in mod.kernels if k.group.reduction), mod.source
        sources.append([k.source for k in mod.kernels])
    assert sources[0] == sources[1]
    assert not any("_welford" in s for s in sources[0])


# -- numerics -------------------------------------------------------------------------------------
def _specials(seed, dtype):
    """Rows of 40 (a masked last block of 8): NaN, +inf, -inf, both infinities, all inf,
    NaN or inf as the first element (the lanes' shift), inf in the masked block, and
    ordinary rows."""
    x = _r(10, 40, seed=seed, scale=2.0)
    nan, inf = float("nan"), float("inf")
    x[0, 17] = nan
    x[1, 5] = inf
    x[2, 39] = -inf
    x[3, 3], x[3, 30] = inf, -inf
    x[4] = inf
    x[5, 0] = nan
    x[6, 0] = inf
    x[7, 34] = inf
    return (x.to(dtype),)


@pytest.mark.parametrize("dtype", [torch.float32] + HALVES)
@pytest.mark.parametrize("name", ["var", "var_mean", "std", "var_dim0"])
def test_nan_and_infinities_propagate_as_in_eager(name, dtype):
    """The variance (NaN wherever a row has a NaN or an infinity).  var_mean's mean is
    the sum's, as torch.mean's (inf for a row of finite values and +inf); eager's var_mean
    gives its Welford mean there (NaN, or inf when the inf came last in its lanes), which
    is compared on NaN rows only."""
    fn = {"var": lambda x: x.var(-1), "std": lambda x: x.std(-1), "var_dim0": lambda x: x.t().contiguous().var(0),
          "var_mean": lambda x: (torch.var_mean(x, -1, correction=0)[0], torch.var_mean(x[[0, 5, 8, 9]], -1)[1])}[name]
    checked(fn, _specials, dtype, calls=2)


@pytest.mark.parametrize("welford_mean", [True, False])
def test_the_mean_of_infinities(monkeypatch, welford_mean):
    """var_mean's mean over a row holding an infinity: the sum's (inf, as torch.mean) with
    welford_mean off; NaN with it on (eager's own Welford var_mean gives NaN there too,
    or inf where the infinity came last in its lanes).  Finite rows agree either way; the
    variance is NaN on every row with a NaN or an infinity."""
    monkeypatch.setattr(config, "welford_mean", welford_mean)
    x = _specials(0, torch.float32)[0]
    var, mean = frametrace.optimize(backend="triton")(lambda x: torch.var_mean(x, -1))(x)
    assert welford_kernels(backend.COMPILED[-1:])
    torch.testing.assert_close(var, x.var(-1), equal_nan=True)
    special = ~x.isfinite().all(-1)
    if welford_mean:
        assert mean[special].isnan().all(), mean
        torch.testing.assert_close(mean[~special], x.mean(-1)[~special])
    else:
        torch.testing.assert_close(mean, x.mean(-1), equal_nan=True)


def test_group_norm_nan_and_infinities():
    def make(seed, dtype):
        x = _r(2, 6, 5, 7, seed=seed)
        x[0, 1, 2, 3] = float("nan")
        x[1, 4, 0, 0] = float("inf")
        return x, _r(6, seed=seed + 1), _r(6, seed=seed + 2)
    checked(NORMS["group_norm_silu"][0], make, calls=2)


# (offset, noise) of values far from zero in each dtype: the noise a few ulps of the offset
# at least, so that the variance is of distinct values
FAR = {torch.float32: (1e4, 0.1), torch.float16: (1e3, 1.0), torch.bfloat16: (1e4, 100.0)}


@pytest.mark.parametrize("dtype", [torch.float32] + HALVES)
def test_values_far_from_zero(dtype):
    """1e4 + small noise: the variance to fp32 rounding of the result (a sum of squares
    less the squared mean would have lost every digit; the two-pass form is 3.4e-4 off
    for fp32's 1e4 + 0.1 noise).  The variance of half inputs is also taken in fp32."""
    offset, noise = FAR[dtype]

    def make(seed, _, shape=(8, 300)):
        return (_r(*shape, dtype=dtype, scale=noise, offset=offset, seed=seed),)
    checked(lambda x: torch.var_mean(x.float(), -1), make, atol=0, rtol=2e-5)
    checked(lambda x: (x.float().var(0), x.float().std(0, keepdim=True)),    # (outer: columns)
            lambda seed, _: make(seed, _, (300, 8)), atol=0, rtol=2e-5)
    half = {"atol": 0, "rtol": 2e-2} if dtype != torch.float32 else {"atol": 0, "rtol": 2e-5}
    checked(lambda x: torch.var_mean(x, -1), make, **half)


# -- symbolic lengths -----------------------------------------------------------------------------
SYMBOLIC = {
    "var_mean": (lambda x: torch.var_mean(x, -1), lambda n, s: (_r(3, n, seed=s, offset=2.0),)),
    "var_correction0_keepdim": (lambda x: x.var(1, correction=0, keepdim=True),
                                lambda n, s: (_r(2, n, 3, seed=s),)),
    "std_far": (lambda x: x.std(-1), lambda n, s: (_r(3, n, seed=s, scale=0.1, offset=1e4),)),
    "group_norm_silu": (lambda x, w, b: F.silu(F.group_norm(x, 3, w, b)),
                        lambda n, s: (_r(2, 6, n, seed=s), _r(6, seed=s + 1), _r(6, seed=s + 2))),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                   lambda n, s: (_r(4, n, seed=s), _r(n, seed=s + 1), _r(n, seed=s + 2))),
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC))
def test_symbolic_lengths(name):
    """Lengths shorter than a block (lanes that count nothing), across blocks, masked last
    blocks: one graph for all of them, with symbolic sizes and a Welford kernel."""
    fn, make = SYMBOLIC[name]
    backend.COMPILED.clear()
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter, dynamic=True)(fn)
    for n in (5, 17, 33, 7, 40, 64, 100):
        eager_and_compiled(fn, compiled, make(n, n), f"{name} at n={n}", atol=1e-4, rtol=1e-4)
    assert counter.frame_count == 1, counter.frame_count
    assert len(backend.COMPILED) == 1 and backend.COMPILED[0].symbolic
    assert welford_kernels(backend.COMPILED), backend.COMPILED[0].source


# -- gradients ------------------------------------------------------------------------------------
GRADS = {
    "var": (lambda x: x.var(-1), _scaled(6, 40)),
    "std_mean": (lambda x: torch.std_mean(x, 0), _scaled(70, 5)),
    "layer_norm": NORMS["layer_norm"],
    "group_norm_silu": NORMS["group_norm_silu"],
}


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradients(name):
    fn, make = GRADS[name]
    backend.COMPILED.clear()
    calls = [tuple(t.requires_grad_() for t in make(seed, torch.float32)) for seed in range(2)]
    triton_check_grads(fn, calls=calls, atol=1e-4, rtol=1e-4)
    assert welford_kernels(backend.COMPILED), [m.source for m in backend.COMPILED]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_batch_norm(dtype):
    """Per-channel statistics over 4x5x5 (looped, not split): outputs, running statistics
    and the gradients of input, weight and bias as eager's."""
    torch.manual_seed(0)
    m = torch.nn.BatchNorm2d(3).to(dtype)
    with torch.no_grad():
        m.weight.uniform_(0.5, 2.0)
        m.bias.uniform_(-1.0, 1.0)
    ref = torch.nn.BatchNorm2d(3).to(dtype)
    ref.load_state_dict(m.state_dict())
    compiled = frametrace.optimize(backend="triton", fullgraph=True)(m)
    tol = {"atol": TOL[dtype], "rtol": TOL[dtype]}
    backend.COMPILED.clear()
    for seed in range(2):
        x = _r(4, 3, 5, 5, dtype=dtype, scale=2.0, offset=1.0, seed=seed)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = compiled(xa), ref(xb)
        w = torch.arange(got.numel(), dtype=dtype).view(got.shape).cos()
        (got * w).sum().backward()
        (want * w).sum().backward()
        torch.testing.assert_close(got.float(), want.float(), **tol)
        for a, b in [(xa.grad, xb.grad), (m.weight.grad, ref.weight.grad), (m.bias.grad, ref.bias.grad),
                     (m.running_mean, ref.running_mean), (m.running_var, ref.running_var)]:
            torch.testing.assert_close(a.float(), b.float(), **tol)
    assert welford_kernels(backend.COMPILED), [mod.source for mod in backend.COMPILED]
    assert all("batch_norm" not in str(e) for mod in backend.COMPILED for e in mod.externs)


# -- PyTorch's OpInfo samples ----------------------------------------------------------------------
OPINFO = ["var", "var_mean", "std", "std_mean", "nn.functional.group_norm", "nn.functional.layer_norm",
          "nn.functional.batch_norm"]


def _sample_program(op, s):
    """(fn of the sample's tensors, those tensors): its other arguments are constants."""
    leaves, spec = pytree.tree_flatten((s.input, s.args, s.kwargs))
    at = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    return sample_program(op, leaves, spec, at), [leaves[i] for i in at]


@pytest.mark.parametrize("name", OPINFO)
def test_opinfo_samples(monkeypatch, name):
    """Every OpInfo sample (and variant: unbiased, without_cudnn) of the op but those
    with empty tensors, with rows over 2 elements looped in blocks of 2, out of place and
    with gradients, against eager."""
    from torch.testing._internal.common_methods_invocations import op_db
    short_loops(monkeypatch, rblock=2)
    looped = 0
    for op in [o for o in op_db if o.name == name]:
        for grad in (False, True):
            for s in op.sample_inputs("cpu", torch.float32, requires_grad=grad):
                fn, tensors = _sample_program(op, s)
                if any(t.numel() == 0 for t in tensors):
                    continue   # (empty tensors: the whole graph runs eagerly, which strict mode refuses)
                frametrace.reset()
                backend.COMPILED.clear()
                (check_grads if grad else check)(fn, [tuple(tensors)], backend="triton", rtol=1e-4, atol=1e-4)
                looped += len(welford_kernels(backend.COMPILED))
    assert looped, name
