"""backend="triton": log-sum-exp reductions and the losses built on them (cross_entropy,
log_softmax + nll_loss, logsumexp), run through Triton's interpreter on the CPU and
compared with eager, plus what was compiled: the per-row loss is one kernel that reads
the logits once (rows longer than a block in one online pass), the mean over rows one
more kernel."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config, last_compiled  # noqa: E402
from conftest import short_loops  # noqa: E402
from triton_harness import triton_check  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero")


@pytest.fixture(autouse=True)
def _interpret(triton_interpreter, monkeypatch):
    frametrace.reset()   # block-size settings differ between tests: compile afresh


@pytest.fixture(params=["persistent", "looped"])
def rows(request, monkeypatch):
    """Rows of 50 in one block, or looped over blocks of 16 (the online form)."""
    if request.param == "looped":
        short_loops(monkeypatch)
    return request.param


def compiled_run(fn, *args, kernels=None, atol=1e-5, rtol=1e-5):
    """fn compiled with the triton backend matches eager (in float32); returns the CompiledModule."""
    return triton_check(fn, *args, kernels=kernels, atol=atol, rtol=rtol, half_as_float=True)


def loading(mod, i=0):
    """The kernels that read graph input `i`."""
    name = mod.wrapper.lowered.inputs[i]
    return [k for k in mod.kernels if name in k.args]


def assert_rows_read_once(mod, rows, loops=1):
    """The logits (input 0) are read by one kernel; looped rows in one online pass (then
    `loops` - 1 passes that write a full-size output)."""
    (k,) = loading(mod)
    # (a loop over rows of a symbolic length is a `while` under Triton 3.6's interpreter)
    passes = k.source.count("for roffset") + k.source.count("while roffset")
    if rows == "looped":
        assert "_expsum" in k.source and passes == loops, k.source
    else:
        assert passes == 0 and "_expsum" not in k.source, k.source


def logits(dtype=torch.float32, n=8, v=50):
    return (torch.randn(n, v) * 3).to(dtype)


def targets(n=8, v=50, ignore=-100):
    t = torch.randint(0, v, (n,))
    t[1] = t[n - 2] = ignore
    return t


BF16 = dict(atol=2e-2, rtol=2e-2)


# -- cross_entropy: one kernel per row, one for the mean ---------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction,kernels", [("mean", 2), ("sum", 2), ("none", 1)])
def test_cross_entropy_reads_logits_once(rows, reduction, kernels, dtype):
    tol = BF16 if dtype == torch.bfloat16 else {}
    mod = compiled_run(lambda x, t: F.cross_entropy(x, t, reduction=reduction),
                       logits(dtype), targets(), kernels=kernels, **tol)
    assert_rows_read_once(mod, rows)
    assert not mod.fallback_ops


def test_cross_entropy_ignore_index(rows):
    mod = compiled_run(lambda x, t: F.cross_entropy(x, t, ignore_index=3),
                       logits(), targets(ignore=3), kernels=2)
    assert_rows_read_once(mod, rows)


def test_cross_entropy_all_targets_ignored_is_nan():
    t = torch.full((8,), -100)
    compiled_run(lambda x, t: F.cross_entropy(x, t), logits(), t, kernels=2)


def test_cross_entropy_class_weights(rows):
    w = torch.rand(50) + 0.5
    mod = compiled_run(lambda x, t, w: F.cross_entropy(x, t, weight=w), logits(), targets(), w,
                       kernels=2)
    assert_rows_read_once(mod, rows)


def online(mod, rows):
    """Looped rows: the max and the sum of the logits' rows are one online pass."""
    (k,) = loading(mod)
    assert ("_expsum" in k.source) == (rows == "looped"), k.source


def test_cross_entropy_label_smoothing_stores_no_log_softmax(rows):
    # The smoothing term sums log_softmax over the row: a second pass (and kernel), but
    # log_softmax is not stored for it and the gather
    mod = compiled_run(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), logits(), targets())
    assert any("_expsum" in k.source for k in mod.kernels) == (rows == "looped"), mod.source
    assert "(8, 50)" not in mod.source


def test_cross_entropy_over_a_middle_dim():
    # (batch, classes, positions): the classes are a strided row
    x, t = torch.randn(2, 50, 3), torch.randint(0, 50, (2, 3))
    compiled_run(lambda x, t: F.cross_entropy(x, t), x, t)


def test_nll_of_log_softmax(rows):
    mod = compiled_run(lambda x, t: F.nll_loss(F.log_softmax(x, -1), t), logits(), targets(),
                       kernels=2)
    assert_rows_read_once(mod, rows)


def test_loss_picked_by_advanced_indexing(rows):
    # (the row comes from an arange: an indirect row index, so the pick is made in the
    # mean's kernel, which reads one logit a row)
    def f(x, t):
        return -F.log_softmax(x, -1)[torch.arange(x.shape[0]), t].mean()
    mod = compiled_run(f, logits(), torch.randint(0, 50, (8,)), kernels=2)
    assert any("_expsum" in k.source for k in mod.kernels) == (rows == "looped"), mod.source


def test_cross_entropy_symbolic_sizes():
    f = frametrace.optimize(backend="triton", dynamic=True)(lambda x, t: F.cross_entropy(x, t))
    for n, v in ((8, 50), (6, 70), (5, 33)):
        x, t = logits(n=n, v=v), targets(n=n, v=v)
        torch.testing.assert_close(f(x, t), F.cross_entropy(x, t))
    mod = last_compiled()
    assert mod.symbolic and len(mod.kernels) == 2, mod.source
    assert_rows_read_once(mod, "looped")   # (rows of a symbolic length are looped)


def test_cross_entropy_gradients_match_eager(rows):
    x, t = logits(), targets()
    xc = x.clone().requires_grad_()
    xe = x.clone().requires_grad_()
    f = frametrace.optimize(backend="triton")(lambda x, t: F.cross_entropy(x, t))
    loss = f(xc, t)
    loss.backward()
    F.cross_entropy(xe, t).backward()
    torch.testing.assert_close(loss, F.cross_entropy(x, t))
    torch.testing.assert_close(xc.grad, xe.grad)
    # the forward (the backward recomputes log_softmax from the rows' statistics)
    online(next(m for m in backend.COMPILED if m.kind == "forward"), rows)


# -- logsumexp, softmax, log_softmax ---------------------------------------------------------
def special_rows():
    """Rows with -inf (a causal mask's), all -inf, +inf, two +inf, NaN."""
    inf = float("inf")
    x = torch.randn(7, 50) * 3
    x[0, :10] = -inf
    x[1] = -inf
    x[2, 7] = inf
    x[3, 3] = float("nan")
    x[4, 5] = x[4, 9] = inf
    x[5, 40:] = -inf
    x[6, 20:30] = -inf
    return x


LSE_FORMS = {
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "logsumexp_keepdim": lambda x: torch.logsumexp(x, 1, keepdim=True),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "amax_spelling": lambda x: (x - x.amax(-1, keepdim=True)).exp().sum(-1).log(),
    "max_spelling": lambda x: (x - x.max(-1, keepdim=True).values).exp().sum(-1, keepdim=True),
}


@pytest.mark.parametrize("name", sorted(LSE_FORMS))
def test_log_sum_exp_forms_read_rows_once(rows, name):
    x = torch.cat([torch.randn(5, 50) * 4, special_rows()])
    mod = compiled_run(LSE_FORMS[name], x, kernels=1, atol=1e-5, rtol=1e-4)
    assert_rows_read_once(mod, rows, loops=2 if "softmax" in name else 1)


def test_logsumexp_bf16(rows):
    mod = compiled_run(lambda x: torch.logsumexp(x, -1), logits(torch.bfloat16), kernels=1, **BF16)
    assert_rows_read_once(mod, rows)


def test_looped_log_softmax_reads_rows_twice_not_three_times(monkeypatch):
    short_loops(monkeypatch)
    mod = compiled_run(lambda x: F.log_softmax(x, -1), torch.randn(4, 50), kernels=1)
    # the online max-and-sum, then the output
    assert mod.kernels[0].source.count("for roffset") == 2, mod.kernels[0].source


def test_persistent_softmax_is_two_reductions_in_registers():
    mod = compiled_run(lambda x: torch.softmax(x, -1), torch.randn(16, 100), kernels=1)
    src = mod.kernels[0].source
    assert src.count("tl.reduce(") == 2 and "_expsum" not in src and src.count("tl.load(") == 1, src


def test_softmax_over_a_long_row_of_one():
    # xnumel 1: the whole tensor is one looped row
    compiled_run(lambda x: torch.softmax(x, 0), torch.randn(config.persistent_rblock_max + 100),
                 kernels=1, atol=1e-6, rtol=1e-4)


def test_sum_exp_without_a_max_shift_is_a_plain_sum(rows):
    mod = compiled_run(lambda x: (x - x.mean(-1, keepdim=True)).exp().sum(-1), torch.randn(8, 50),
                       kernels=1)
    assert "_expsum" not in mod.kernels[0].source
