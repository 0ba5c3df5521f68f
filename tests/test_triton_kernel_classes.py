"""backend="triton": the kernel classes of issue 31 item 6 (group norm + SiLU, L2
normalisation, KL divergence of log-softmaxes, masked mean pooling, 3x3 max pooling,
dropout added to a residual), compared with eager through Triton's interpreter on the
CPU, with what the generated code does: how many kernels, which values go through
memory.  Each fast path is checked with its config switch off too."""
import re

import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import config, rng  # noqa: E402,F401  (rng: the philox ops)
from conftest import short_loops  # noqa: E402
from triton_harness import triton_check, triton_check_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero",
                                        "ignore:overflow encountered")


@pytest.fixture(autouse=True)
def _interpret(triton_interpreter):
    frametrace.reset()   # settings differ between tests: compile afresh


def switched(monkeypatch, name, on):
    assert hasattr(config, name)
    monkeypatch.setattr(config, name, on)


def externs(mod):
    return [str(e) for e in mod.externs]


def allocations(mod):
    """The shapes the wrapper allocates (each kernel output it keeps in memory)."""
    return [tuple(int(n) for n in re.findall(r"\d+", m)) for m in
            re.findall(r"empty_strided\(\(([^)]*)\)", mod.source)]


def _r(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


# -- group norm -----------------------------------------------------------------------------
def group_norm_silu(groups):
    return lambda x, w, b: F.silu(F.group_norm(x, groups, w, b))


@pytest.mark.parametrize("on", [True, False])
def test_group_norm_silu_one_kernel(monkeypatch, on):
    """Decomposed: the statistics and the normalisation with its SiLU in one kernel (rows
    of a group in registers), no aten call; off: aten's native_group_norm and a kernel."""
    switched(monkeypatch, "decompose_group_norm", on)
    mod = triton_check(group_norm_silu(4), _r(3, 12, 5, 7), _r(12), _r(12), atol=1e-4, rtol=1e-4)
    assert any("native_group_norm" in e for e in externs(mod)) != on, mod.source
    if on:
        assert len(mod.kernels) == 1 and not mod.externs, mod.source


def test_group_norm_looped_groups(monkeypatch):
    """A group longer than a block: the statistics loop (or split), then one pass that
    normalises, scales and applies SiLU: the input read twice, the output written once."""
    short_loops(monkeypatch)
    mod = triton_check(group_norm_silu(3), _r(2, 9, 6, 5), _r(9), _r(9), atol=1e-4, rtol=1e-4)
    assert not mod.externs, mod.source
    full = [s for s in allocations(mod) if len(s) == 4 and s[1:] == (9, 6, 5)]
    assert len(full) == 1, mod.source   # only the output is full size


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_group_norm_half(dtype):
    triton_check(group_norm_silu(8), _r(2, 16, 9, 9, dtype=dtype), _r(16, dtype=dtype), _r(16, dtype=dtype),
                 atol=2e-2, rtol=2e-2, half_as_float=True)


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "expanded"])
def test_group_norm_input_layouts(layout):
    x = _r(2, 6, 5, 7)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = _r(2, 6, 7, 5).transpose(-1, -2)
    else:
        x = _r(1, 6, 5, 7).expand(3, 6, 5, 7)
    triton_check(group_norm_silu(2), x, _r(6), _r(6), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", [(4, 6), (3, 6, 11), (2, 6, 3, 4, 5)])
def test_group_norm_ranks_no_affine(shape):
    triton_check(lambda x: F.group_norm(x, 3, eps=1e-3), _r(*shape), atol=1e-4, rtol=1e-4)


def test_group_norm_nan_inf():
    x = _r(2, 8, 4, 4)
    x[0, 0, 1, 1] = float("nan")
    x[1, 5, 2, 3] = float("inf")
    triton_check(group_norm_silu(4), x, _r(8), _r(8), atol=1e-4, rtol=1e-4)


def test_group_norm_training():
    x, w, b = _r(2, 6, 3, 5).requires_grad_(), _r(6).requires_grad_(), _r(6).requires_grad_()
    triton_check_grads(group_norm_silu(3), x, w, b, atol=1e-4, rtol=1e-4)


# -- L2 normalisation -----------------------------------------------------------------------
@pytest.mark.parametrize("on", [True, False])
def test_normalize_one_kernel(monkeypatch, on):
    """Decomposed: the row's sum of squares and the division in one kernel that reads x
    once; off: aten's linalg_vector_norm and a kernel that reads x again."""
    switched(monkeypatch, "decompose_vector_norm", on)
    mod = triton_check(lambda x: F.normalize(x, dim=-1), _r(7, 33))
    assert any("linalg_vector_norm" in e for e in externs(mod)) != on, mod.source
    if on:
        assert len(mod.kernels) == 1 and not mod.externs, mod.source


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, 0.5, float("inf"), float("-inf"), 0.0])
def test_vector_norm_orders(p):
    triton_check(lambda x: torch.linalg.vector_norm(x, p, dim=-1), _r(5, 19), atol=1e-4, rtol=1e-4)
    triton_check(lambda x: F.normalize(x, p=p if p > 0 else 2.0, dim=0), _r(6, 7), atol=1e-4, rtol=1e-4)


def test_normalize_layouts_and_specials():
    x = _r(9, 6)
    x[2] = 0.0                      # eps clamps the zero row
    x[4, 1] = float("nan")
    x[5, 3] = float("inf")
    triton_check(lambda x: F.normalize(x, dim=-1), x)
    triton_check(lambda x: F.normalize(x, dim=-1), _r(6, 9).t())            # transposed
    triton_check(lambda x: F.normalize(x, dim=-1), _r(1, 9).expand(4, 9))   # expanded
    triton_check(lambda x: torch.norm(x), _r(5, 7), atol=1e-4, rtol=1e-4)   # every dim
    triton_check(lambda x: torch.linalg.vector_norm(x, 2, dim=(0, 2), keepdim=True), _r(3, 4, 5),
                 atol=1e-4, rtol=1e-4)


def test_normalize_looped_and_half(monkeypatch):
    short_loops(monkeypatch)
    triton_check(lambda x: F.normalize(x, dim=-1), _r(5, 70), atol=1e-5, rtol=1e-4)
    triton_check(lambda x: F.normalize(x, dim=-1), _r(5, 70, dtype=torch.bfloat16),
                 atol=1e-2, rtol=1e-2, half_as_float=True)
    triton_check(lambda x: torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64), _r(4, 40),
                 atol=1e-5, rtol=1e-5)


def test_normalize_training():
    triton_check_grads(lambda x: F.normalize(x, dim=-1), _r(4, 13).requires_grad_(), atol=1e-4, rtol=1e-4)


# -- KL divergence of two log-softmaxes -----------------------------------------------------
def kl(a, b):
    return F.kl_div(F.log_softmax(a, -1), F.log_softmax(b, -1), log_target=True, reduction="batchmean")


@pytest.mark.parametrize("looped", [False, True])
@pytest.mark.parametrize("on", [True, False])
def test_kl_of_log_softmaxes_not_stored(monkeypatch, on, looped):
    """The target's log_softmax, read twice by kl_div (exp(t) and t - input), is computed
    again from the row and its two statistics where it is read, not stored (switch on);
    off, it was stored in full and read back.  (Row partials off: with them the kernel
    that reads it is the one that reduces its rows, test_triton_row_partials.py.)"""
    if looped:
        short_loops(monkeypatch)
    switched(monkeypatch, "row_partials", False)
    switched(monkeypatch, "broadcast_reads_cached", on)
    mod = triton_check(kl, _r(6, 50, scale=3), _r(6, 50, scale=3), atol=1e-5, rtol=1e-4)
    full = [s for s in allocations(mod) if s == (6, 50)]
    assert bool(full) != on, mod.source


def test_kl_half_and_specials():
    a, b = _r(5, 37, dtype=torch.bfloat16, scale=3), _r(5, 37, dtype=torch.bfloat16, scale=3)
    triton_check(kl, a, b, atol=2e-2, rtol=2e-2, half_as_float=True)
    a, b = _r(4, 21), _r(4, 21)
    a[1, 3] = float("-inf")      # a zero probability of the input: KL is inf
    b[2, 5] = float("nan")
    triton_check(kl, a, b)
    triton_check(kl, _r(21, 4).t(), _r(1, 21).expand(4, 21))   # transposed, expanded


def test_kl_training():
    triton_check_grads(kl, _r(4, 19).requires_grad_(), _r(4, 19).requires_grad_(), atol=1e-5, rtol=1e-4)


# -- max pooling ----------------------------------------------------------------------------
@pytest.mark.parametrize("on", [True, False])
def test_max_pool_values_alone(monkeypatch, on):
    """Inference reads only the max: no flat index carried through the taps (switch on)."""
    switched(monkeypatch, "pool_max_alone", on)
    mod = triton_check(lambda x: F.max_pool2d(x, 3, 2, padding=1), _r(2, 3, 11, 9), kernels=1)
    (k,) = mod.kernels
    # a tap's flat index is `(row) * W + (col)`
    assert ("* 9 + (" in k.source) != on, k.source


@pytest.mark.parametrize("args", [dict(kernel_size=3, stride=2, padding=1),
                                  dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                  dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), dilation=(2, 1)),
                                  dict(kernel_size=2)])
def test_max_pool_shapes(args):
    triton_check(lambda x: F.max_pool2d(x, **args), _r(2, 3, 10, 7))
    triton_check(lambda x: F.max_pool2d(x, **args), _r(3, 9, 8))   # no batch dim


def test_max_pool_layouts_specials_half():
    pool = lambda x: F.max_pool2d(x, 3, 2, padding=1)   # noqa: E731
    triton_check(pool, _r(2, 4, 9, 9).contiguous(memory_format=torch.channels_last), strides=True)
    triton_check(pool, _r(1, 4, 9, 9).expand(3, 4, 9, 9))
    x = _r(2, 2, 7, 7)
    x[0, 0, 2, 2] = float("nan")
    x[0, 1] = float("-inf")         # a plane of -inf: every window -inf
    x[1, 0, 3, 3] = float("inf")
    triton_check(pool, x)
    triton_check(pool, _r(2, 4, 9, 9, dtype=torch.bfloat16), half_as_float=True)
    triton_check(lambda x: F.max_pool2d(x * 2 + 1, 3, 2, padding=1), _r(2, 3, 8, 8))   # an epilogue before


@pytest.mark.parametrize("on", [True, False])
def test_max_pool_keeps_channels_last_inside(monkeypatch, on):
    """A channels-last pooling read by a convolution is stored channels-last (the layout
    follows its input, layout.preferred), the max-alone body too: its padding taps'
    masked loads take `other=`, which the layout's stand-in for a kernel took as a
    TypeError and gave up (row-major, the pooling's writes strided)."""
    switched(monkeypatch, "pool_max_alone", on)
    x = _r(2, 8, 10, 10).contiguous(memory_format=torch.channels_last)
    w = _r(4, 8, 1, 1).contiguous(memory_format=torch.channels_last)
    mod = triton_check(lambda x, w: F.conv2d(F.max_pool2d(x, 3, 2, padding=1), w), x, w,
                       atol=1e-4, rtol=1e-4, kernels=1)
    assert "empty_strided((2, 8, 5, 5), (200, 1, 40, 8)" in mod.source, mod.source


@pytest.mark.parametrize("on", [True, False])
def test_max_pool_hardware_max(monkeypatch, on):
    """On CUDA the window's max is tl.maximum with NaN propagated (config.pool_hardware_max);
    run here through the interpreter by taking the lowering for CUDA's: NaN and inf windows,
    windows of padding alone, integers, bf16, channels-last, with eager's values."""
    from frametrace.backends.triton import ops
    switched(monkeypatch, "pool_hardware_max", on)
    monkeypatch.setattr(ops, "_on_cuda", lambda L: True)
    pool = lambda x: F.max_pool2d(x, 3, 2, padding=1)   # noqa: E731
    x = _r(2, 3, 9, 9)
    x[0, 0, 2, 2] = float("nan")
    x[0, 0, 4, 4] = float("inf")
    x[0, 1] = float("-inf")
    x[1, 2, :, :3] = float("nan")
    mod = triton_check(pool, x, kernels=1)
    assert ("tl.maximum(" in mod.kernels[0].source) == on, mod.kernels[0].source
    triton_check(pool, _r(2, 4, 9, 9).contiguous(memory_format=torch.channels_last), strides=True)
    triton_check(pool, torch.randint(-50, 50, (2, 3, 8, 8), dtype=torch.int32))
    triton_check(pool, _r(2, 4, 9, 9, dtype=torch.bfloat16), half_as_float=True)
    triton_check(lambda x: F.max_pool2d(x, 2, 1, padding=1), _r(1, 2, 3, 3))


def test_max_pool_with_indices_and_training():
    triton_check(lambda x: F.max_pool2d(x, 3, 2, padding=1, return_indices=True), _r(2, 3, 9, 9))
    triton_check_grads(lambda x: F.max_pool2d(x, 3, 2, padding=1), _r(2, 3, 9, 9).requires_grad_())


# -- mean pooling under a padding mask ------------------------------------------------------
def masked_mean(h, m):
    return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)


@pytest.mark.parametrize("on", [True, False])
def test_masked_mean_two_kernels(monkeypatch, on):
    """The mask's sum runs first and the kernel that sums h * mask divides by it (two
    kernels, the sum not stored); off: the big sum is stored and a third kernel divides."""
    switched(monkeypatch, "hoist_kernels", on)
    m = (torch.rand(3, 7) < 0.7).float()
    m[:, 0] = 1
    mod = triton_check(masked_mean, _r(3, 7, 10), m, kernels=2 if on else 3)
    assert len([s for s in allocations(mod) if s == (3, 10)]) == (1 if on else 2), mod.source


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.bfloat16])
def test_masked_mean_dtypes_layouts(mask_dtype):
    m = torch.rand(4, 9) < 0.6
    m[:, 1] = True
    m[3] = False                    # an all-padding row: 0 / 0
    h = _r(4, 9, 6, dtype=torch.bfloat16 if mask_dtype is torch.bfloat16 else torch.float32)
    h[0, 2, 3] = float("nan")
    h[1, 4, 0] = float("inf")
    tol = dict(atol=2e-2, rtol=2e-2, half_as_float=True) if h.dtype is torch.bfloat16 else {}
    triton_check(masked_mean, h, m.to(mask_dtype), **tol)
    triton_check(masked_mean, _r(6, 9, 4).transpose(0, 2), m[:1].expand(4, 9).to(mask_dtype))


def test_masked_mean_looped_and_training(monkeypatch):
    short_loops(monkeypatch)
    m = (torch.rand(3, 40) < 0.7).float()
    m[:, 0] = 1
    triton_check(masked_mean, _r(3, 40, 5), m, atol=1e-5, rtol=1e-4)
    triton_check_grads(masked_mean, _r(3, 40, 5).requires_grad_(), m, atol=1e-5, rtol=1e-4)


def test_hoisted_kernel_keeps_dependencies():
    """A kernel moved earlier still runs after what it reads: the small reduction reads the
    big one's result here, so nothing moves (and values match)."""
    def fn(h, m):
        big = (h * m[..., None]).sum(1)
        small = (m * big.sum(-1, keepdim=True)).sum(1, keepdim=True)
        return big / small
    triton_check(fn, _r(3, 7, 10), torch.rand(3, 7) + 0.5, atol=1e-5, rtol=1e-4)


# -- random numbers: dropout added to a residual -------------------------------------------
def _seed():
    return torch.tensor(2 ** 40 + 977, dtype=torch.int64)


@pytest.mark.parametrize("normal", [False, True])
@pytest.mark.parametrize("on", [True, False])
def test_philox_numbers_match_the_op(monkeypatch, on, normal):
    """The kernels' numbers are the op's (its eager implementation, which recomputes a
    dropout mask in a backward): in a 1-D kernel of consecutive counters, one Philox call
    per four lanes (`_philox_block`); where lanes are not consecutive (a transposed read
    tiles the kernel, a reduction), one call per lane picking its word (`_philox_at`)."""
    switched(monkeypatch, "philox_four_words", on)
    rand = torch.ops.frametrace.philox_rand
    for offset, shape in ((0, [5, 37]), (8, [3, 4]), (6, [7, 9]), (2 ** 32 + 4, [4, 8])):
        frametrace.reset()   # (static sizes and offset each)
        mod = triton_check(lambda s: rand(s, offset, shape, normal, torch.float32) * 1, _seed(),
                           atol=0, rtol=0)
        src = "".join(k.source for k in mod.kernels)
        consecutive = offset % 4 == 0 and offset < 2 ** 31
        assert ("= _philox_block(" in src) == (on and consecutive), src
    x = _r(9, 5)
    mod = triton_check(lambda s, x: x.t() + rand(s, 4, [5, 9], normal, torch.float32), _seed(), x,
                       atol=1e-6, rtol=1e-6)
    mod = triton_check(lambda s, x: (x + rand(s, 12, [9, 5], normal, torch.float32)).sum(-1), _seed(), x,
                       atol=1e-5, rtol=1e-5)
    assert ("= _philox_at(" in "".join(k.source for k in mod.kernels)) == on


@pytest.mark.parametrize("on", [True, False])
def test_dropout_residual(monkeypatch, on):
    """x + dropout(y): one kernel; the dropped fraction is p, each kept y scaled by
    1 / (1 - p) (the numbers differ from eager's: compared by what they keep)."""
    switched(monkeypatch, "philox_four_words", on)
    from frametrace.backends.triton import last_compiled
    x, y = _r(64, 129), _r(64, 129) + 5.0
    f = frametrace.optimize(backend="triton", fullgraph=True)(lambda x, y: x + F.dropout(y, 0.25, training=True))
    out = f(x, y)
    mod = last_compiled()
    assert len(mod.kernels) == 1, mod.source
    assert ("= _philox_block(" in mod.kernels[0].source) == on
    dropped = out == x
    frac = dropped.float().mean().item()
    assert 0.2 < frac < 0.3, frac
    torch.testing.assert_close(out[~dropped], (x + y / 0.75)[~dropped])
    out2 = f(x, y)
    assert not torch.equal(out, out2)   # a new seed each call
    # bf16, an odd size, a transposed residual
    xb, yb = _r(33, 17, dtype=torch.bfloat16), _r(17, 33, dtype=torch.bfloat16).t()
    g = frametrace.optimize(backend="triton", fullgraph=True)(lambda x, y: x + F.dropout(y, 0.1, training=True))
    ob = g(xb, yb)
    kept = ob != xb
    assert 0.8 < kept.float().mean().item() <= 1.0


def test_dropout_training_mask_recomputed_matches():
    """Training: the backward's mask (recomputed from the saved seed, or saved) is the
    forward's: y's gradient is zero exactly where the output equals x."""
    x, y = _r(16, 40), (_r(16, 40) + 3.0).requires_grad_()
    f = frametrace.optimize(backend="triton")(lambda x, y: x + F.dropout(y, 0.3, training=True))
    out = f(x, y)
    out.sum().backward()
    dropped = out.detach() == x
    assert torch.equal(y.grad == 0, dropped)
    torch.testing.assert_close(y.grad[~dropped], torch.full_like(y.grad[~dropped], 1 / 0.7))


# -- strided loads only: two elements a thread (config.gather_blocks) ---------------------------

def _first_config(k):
    from frametrace.backends.triton.kernel_source import configs_for
    return configs_for(k.group)[0]


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 11, 9), (1, 4, 64, 64), (3, 1, 7, 130)])
def test_pooling_taps_take_gather_blocks(monkeypatch, on, shape):
    """A max pooling reads its taps at stride 2: no load is contiguous along x, so the
    kernel takes 2 elements a thread (512 x 8 warps, capped at the extent) when the switch
    is on; odd extents keep their masks either way (the values match eager)."""
    switched(monkeypatch, "gather_blocks", on)
    mod = triton_check(lambda x: F.max_pool2d(x, 3, 2, padding=1), _r(*shape), kernels=1)
    (k,) = mod.kernels
    assert bool(k.group.gather) is on
    c = _first_config(k)
    n = k.group.xnumel
    assert (c.xblock, c.num_warps) == ((min(512, 1 << (n - 1).bit_length()), 8) if on else
                                       (min(1024, 1 << (n - 1).bit_length()), 4)), c


def test_a_contiguous_load_keeps_the_contiguous_blocks():
    """A strided slice added to a contiguous tensor: one contiguous load, so not a gather;
    a strided slice times a per-row scale (which abstains) is one, and a slice times a
    column vector (contiguous along x) is not."""
    x, y = _r(48, 64), _r(48, 32)
    mod = triton_check(lambda x, y: x[:, ::2] + y, x, y, kernels=1)
    assert mod.kernels[0].group.gather is False
    mod = triton_check(lambda x, b: x[:, ::2] * b, x, _r(48, 1), kernels=1)
    assert mod.kernels[0].group.gather is True
    mod = triton_check(lambda x, b: x[:, ::2] * b, x, _r(32), kernels=1)
    assert mod.kernels[0].group.gather is False


def test_gather_blocks_on_specials_layouts_and_fusions():
    """NaN/inf, channels-last and expanded inputs, bf16, and a pooling fused with the
    pointwise work after it (generated through the scheduler's extended generations)."""
    pool = lambda x: F.max_pool2d(x, 3, 2, padding=1)   # noqa: E731
    x = _r(2, 3, 13, 11)
    x[0, 0, 2, 2], x[0, 1], x[1, 2, 5, 5] = float("nan"), float("-inf"), float("inf")
    triton_check(pool, x)
    # (pool again, with other sizes: automatic dynamic makes them symbolic, and the
    # output keeps eager's channels-last strides there too; a function of its own
    # compiles them statically)
    triton_check(pool, _r(2, 4, 9, 9).contiguous(memory_format=torch.channels_last), strides=True)
    triton_check(lambda x: F.max_pool2d(x, 3, 2, padding=1), _r(2, 4, 9, 9).contiguous(memory_format=torch.channels_last),
                 strides=True)
    triton_check(pool, _r(1, 4, 9, 9).expand(3, 4, 9, 9))
    triton_check(pool, _r(2, 4, 9, 9, dtype=torch.bfloat16), half_as_float=True)
    mod = triton_check(lambda x, s: torch.relu(pool(x) * s + 1), _r(2, 3, 13, 11), _r(3, 1, 1), kernels=1)
    assert mod.kernels[0].group.gather is True
    triton_check_grads(lambda x: pool(x).sin(), _r(2, 3, 9, 7).requires_grad_())
