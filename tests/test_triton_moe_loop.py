"""A mixture-of-experts loop under backend="triton" (transformers 4's Mixtral block: a
nonzero per expert, a gather, two matmuls, an index_add), and the three things that make it
cheap: kernels that differ only in which size they take share one source
(`config.canonical_symbols`), runtime asserts on sizes the data decides are Python
comparisons (`config.python_size_asserts`), and the nonzeros whose masks are known before
the first of them run as one nonzero of the masks stacked, each taking its part: one wait for
the GPU (`config.batch_nonzero`).  Each is checked against eager on fresh inputs over
calls whose routing changes (empty experts, one expert taking every token, NaN), with the
switch on and off, and on the wrapper it generates; and each is attacked where a batched
count could go stale: a mask written between two nonzeros, a mask computed from the first
nonzero's result, an input the graph mutates."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config as tconfig  # noqa: E402
from differential import check  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
E = 4


@pytest.fixture(autouse=True)
def _capture(monkeypatch):
    monkeypatch.setattr(frametrace.config, "capture_dynamic_output_shape_ops", True)


def moe(h, idx, w1, w2, wts):
    final = torch.zeros_like(h)
    mask = F.one_hot(idx, num_classes=E).permute(2, 1, 0)
    for e in range(E):
        pos, tok = torch.where(mask[e])
        cur = h[tok]
        cur = F.linear(F.silu(F.linear(cur, w1[e])), w2[e]) * wts[tok, pos, None]
        final.index_add_(0, tok, cur.to(final.dtype))
    return final


def _routings(n, g):
    """Routings over calls: random, every token to expert 0 (others empty), none to 3."""
    rand = torch.randint(0, E, (n, 2), generator=g)
    one = torch.zeros(n, 2, dtype=torch.int64)
    one[:, 1] = 1
    no3 = torch.randint(0, E - 1, (n, 2), generator=g)
    return [rand, one, no3, torch.randint(0, E, (n, 2), generator=g)]


def _calls(dtype=torch.float32, nan=False):
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(E, 32, 16, generator=g, dtype=dtype) / 4
    w2 = torch.randn(E, 16, 32, generator=g, dtype=dtype) / 4
    calls = []
    for idx in _routings(24, g):
        h = torch.randn(24, 16, generator=g, dtype=dtype)
        if nan:
            h[3, 2] = float("nan")
        calls.append((h, idx, w1, w2, torch.rand(24, 2, generator=g, dtype=dtype)))
    return calls


def _last():
    return backend.COMPILED[-1]


@pytest.mark.parametrize("switch", ["canonical_symbols", "python_size_asserts", "batch_nonzero", None])
def test_moe_loop_matches_eager_with_each_switch_off(monkeypatch, switch):
    if switch is not None:
        monkeypatch.setattr(tconfig, switch, False)
    backend.COMPILED.clear()
    report = check(moe, _calls(), backend="triton", breaks=0, fallbacks=0, rtol=1e-4, atol=1e-4)
    assert report.graphs == 1, report    # (routings change the token counts: no recompile)
    src = _last().source
    names = [k.name for k in _last().kernels]
    if switch == "canonical_symbols":
        assert len(set(names)) == len(names), names
    else:
        # each expert's gather, SiLU and scaling kernels: one source for all experts
        assert len(set(names)) < len(names) - 2 * (E - 1), names
    if switch == "python_size_asserts":
        assert "Runtime assertion" in src and "raise RuntimeError" not in src
    else:
        assert "raise RuntimeError(" in src, src
    assert ("nonzeros(" in src) == (switch != "batch_nonzero"), src
    if switch != "batch_nonzero":
        assert src.count("nonzeros(") == 1 and src.count("= nonzeros0[") == E


def test_moe_loop_half_and_nan():
    # (bf16: eager rounds after each op, the kernels keep fp32 between fused ones)
    check(moe, _calls(torch.bfloat16, nan=True), backend="triton", breaks=0, fallbacks=0,
          rtol=3e-2, atol=6e-2)


def mask_written_between(x):
    m = x > 0
    a = m[0].nonzero()
    m[1].copy_(x[2] > 1)     # (the second mask, written after the first nonzero)
    b = m[1].nonzero()
    return a * 2, b + 1


def mask_from_first_result(x):
    a = (x[0] > 0).nonzero()
    y = x[1].clone()
    y[a[:, 0]] = -1.0        # (the second mask depends on the first nonzero's result)
    b = (y > 0).nonzero()
    return a, b


def input_mutated_between(x, flag):
    a = flag.nonzero()
    flag.logical_not_()      # (an input written in place between the two nonzeros)
    b = flag.nonzero()
    return a.sum() + x.sum(), b * 3


def written_in_place_between(x, idx):
    a = (x[0] > 0).nonzero()
    y = torch.zeros(x.shape[1])
    y.index_add_(0, idx, x[1, :4])   # (aten's in-place index_add_ on a fresh buffer, after the first nonzero)
    b = y.nonzero()
    return a, b


def independent(x, y):
    # (two bool masks of one shape batch; a float one, and a mask of another shape, do not)
    return (x > 0).nonzero(), torch.where(y < 0), (x * y).nonzero(), (y[0] > 1).nonzero(), \
        (x[:, :3] != 0).nonzero()


# (a mask written after the first nonzero is, in the functional graph, a value of its own,
# computed before the batch's count: batched, with eager's values; an input written in
# place likewise; a value an aten op writes in place after the first nonzero is not)
@pytest.mark.parametrize("fn, batched", [(mask_written_between, True), (mask_from_first_result, False),
                                         (input_mutated_between, True), (written_in_place_between, False),
                                         (independent, True)])
def test_batched_counts_never_go_stale(fn, batched):
    g = torch.Generator().manual_seed(1)
    calls = []
    for n in (7, 7, 9, 9):
        x = torch.randn(3, n, generator=g)
        if fn is input_mutated_between:
            calls.append((x, torch.rand(n, generator=g) > 0.5))
        elif fn is written_in_place_between:
            calls.append((x, torch.randint(0, n, (4,), generator=g)))
        elif fn is independent:
            x[0, 0] = float("nan")    # (NaN is nonzero to both counts and nonzero)
            calls.append((x, torch.randn(3, n, generator=g)))
        else:
            calls.append((x,))
    backend.COMPILED.clear()
    check(fn, calls, backend="triton", breaks=0, rtol=1e-6, atol=1e-6)
    srcs = [m.source for m in backend.COMPILED]
    assert any("nonzeros(" in s for s in srcs) == batched, srcs


def checked(x):
    n = x.nonzero().shape[0]
    torch._check(n < 6)
    return x * n


def test_python_size_assert_raises_as_eager():
    # (the program's own torch._check on a size the data decides: RuntimeError on the call
    # where it fails, in eager and compiled)
    g = torch.Generator().manual_seed(2)
    calls = [(torch.tensor([0.0, 1.0, 0.0, 2.0]),), (torch.ones(8),), (torch.randn(3, generator=g),)]
    check(checked, calls, backend="triton")
