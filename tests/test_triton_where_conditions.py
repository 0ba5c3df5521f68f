"""backend="triton": no generated kernel gives Triton's `tl.where` a non-boolean condition
(issue 31: Triton warns "tl.where with a non-boolean condition is deprecated and will
error out in a future triton release").  Triton's interpreter runs the same semantic
checks as its compiler, so the warning shows here when a kernel's condition is an int or
a float.  Each graph is compared with CPython (differential.check), runs as kernels (no
eager fallback), and its kernels hold `tl.where`; dropout, whose numbers are not eager's,
is checked by what it keeps."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import frametrace

from differential import check

pytest.importorskip("triton")
from frametrace.backends.triton import backend  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

NON_BOOLEAN = "non-boolean condition"


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_GEN).to(dtype)


_GEN = torch.Generator().manual_seed(0)

CASES = {
    "where": (lambda x, y: torch.where(x > 0, x, y * 2), lambda: (_r(8, 33), _r(8, 33))),
    "where_of_a_mask_input": (lambda x, m: torch.where(m, x, 0.0).sum(-1),
                              lambda: (_r(8, 33), _r(8, 33) > 0.5)),
    "masked_mean": (lambda x, m: (x * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True),
                    lambda: (_r(4, 7, 16), (_r(4, 7) > -0.5).float())),
    "masked_softmax": (lambda x, m: x.masked_fill(m, float("-inf")).softmax(-1),
                       lambda: (_r(4, 37), _r(4, 37) > 1.0)),
    "log_softmax": (lambda x: F.log_softmax(x, -1), lambda: (_r(16, 100),)),
    "index_ops": (lambda x, i, j: x[i] * 2 + x.index_select(0, j) + x.gather(1, j[:, None].expand(3, 8)),
                  lambda: (_r(10, 8), torch.tensor([1, -1, 3]), torch.tensor([0, 9, 4]))),
    "embedding": (lambda w, i: F.embedding(i, w), lambda: (_r(10, 8), torch.randint(0, 10, (3, 5)))),
    "max_pool": (lambda x: F.max_pool2d(x, 3, 2, 1), lambda: (_r(2, 3, 9, 9),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (32,), w, b), lambda: (_r(6, 32), _r(32), _r(32))),
    "group_norm_silu": (lambda x, w, b: F.silu(F.group_norm(x, 4, w, b)),
                        lambda: (_r(2, 8, 5, 5), _r(8), _r(8))),
    "arg_and_max": (lambda x: (x.argmax(-1), x.max(-1).values, x.amin(0)), lambda: (_r(6, 50),)),
    "relu_clamp_maximum": (lambda x: F.relu(x).clamp(0, 1) + torch.maximum(x, x * 2),
                           lambda: (_r(6, 50),)),
    "boolean_reductions": (lambda x: (((x > 0) & (x < 1)).float().sum(-1), (x > 0).any(-1), (x > 9).all(-1)),
                           lambda: (_r(6, 50),)),
    "cat_pad": (lambda x: F.pad(torch.cat([x, x * 2], 1), (1, 2)), lambda: (_r(6, 5),)),
    "l2_normalize": (lambda x: F.normalize(x, dim=-1), lambda: (_r(6, 50),)),
    "kl_of_log_softmaxes": (lambda a, b: F.kl_div(F.log_softmax(a, -1), F.log_softmax(b, -1),
                                                  log_target=True, reduction="batchmean"),
                            lambda: (_r(6, 50), _r(6, 50))),
    "cross_entropy_ignore_index": (lambda x, t: F.cross_entropy(x, t, ignore_index=1),
                                   lambda: (_r(8, 10), torch.randint(0, 10, (8,), generator=_GEN))),
    "activations": (lambda x: F.hardswish(x) + F.gelu(x) + F.elu(x) + torch.sign(x) + torch.trunc(x),
                    lambda: (_r(6, 50),)),
    "integer_division": (lambda a, b: (a // b, a % b), lambda: (torch.randint(-9, 9, (6, 5)),
                                                                torch.randint(1, 4, (6, 5)))),
    "cumsum": (lambda x: x.cumsum(-1), lambda: (_r(6, 50),)),
    "bf16_softmax_norm": (lambda x, w: F.layer_norm(x.softmax(-1), (64,), w),
                          lambda: (_r(4, 64, dtype=torch.bfloat16), _r(64, dtype=torch.bfloat16))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_generated_where_conditions_are_boolean(name):
    fn, make = CASES[name]
    args = make()
    bf16 = any(a.dtype == torch.bfloat16 for a in args)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check(fn, [args], backend="triton", rtol=2e-2 if bf16 else 1e-5, atol=2e-2 if bf16 else 1e-5)
    assert not [w for w in seen if NON_BOOLEAN in str(w.message)]
    assert backend.COMPILED and all(m.kernels for m in backend.COMPILED)


def test_dropout_where_conditions_are_boolean():
    x = _r(16, 100) + 3.0       # (no zeros of its own)
    g = frametrace.optimize(lambda x: F.dropout(x, 0.3, training=True) + x, backend="triton")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = g(x)
    assert not [w for w in seen if NON_BOOLEAN in str(w.message)]
    assert backend.COMPILED and all(m.kernels for m in backend.COMPILED)
    kept = out != x
    torch.testing.assert_close(out[kept], x[kept] / 0.7 + x[kept])
    assert 0.5 < kept.float().mean() < 0.9


def test_a_non_boolean_condition_would_be_seen():
    """The warning this file looks for is what Triton's interpreter gives an int condition
    (so that the tests above cannot pass by a warning never raised)."""
    import triton
    import triton.language as tl

    @triton.jit
    def k(x, y, N: tl.constexpr):
        i = tl.arange(0, N)
        v = tl.load(x + i)
        tl.store(y + i, tl.where((v > 0).to(tl.int32), v, 0.0))
    x, y = torch.randn(16), torch.empty(16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k[(1,)](x, y, 16)
    assert [w for w in seen if NON_BOOLEAN in str(w.message)]
