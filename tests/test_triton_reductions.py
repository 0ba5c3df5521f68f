"""backend="triton": reductions over any axis and over several axes.  An *outer*
reduction (its loads contiguous along the kept axis: column sums, a mean over a middle
dimension, channels-last statistics) is one kernel whose default block is wide along the
kept axis; a reduction with few outputs and long rows is *split* into exactly two kernels
(chunk partials, then their combination).  Values are compared with eager (float32; bf16
in float32 with bf16 tolerances; int64), kernels are counted, and the chosen path is
asserted (the group's layout, its default block sizes, the kernel count)."""
import pytest
import torch

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import autotune, backend, last_compiled  # noqa: E402
from frametrace.backends.triton.kernel_source import configs_for  # noqa: E402
from triton_harness import triton_check  # noqa: E402


pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def small_splits(monkeypatch):
    """Split thresholds scaled down, so that split reductions fit Triton's interpreter
    (which runs a reduction's combine function once per element)."""
    monkeypatch.setattr(autotune, "SPLIT_MIN_CHUNK", {False: 64, True: 16})
    monkeypatch.setattr(autotune, "SPLIT_MIN_WORK", 1)


TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.int64: (0, 0)}


def compiled_run(fn, *args, kernels=None, dtype=torch.float32):
    """fn compiled with the triton backend matches eager; returns the CompiledModule."""
    atol, rtol = TOL[dtype]
    mod = triton_check(fn, *args, atol=atol, rtol=rtol, half_as_float=True)
    assert not mod.externs, mod.source
    if kernels is not None:
        assert len(mod.kernels) == kernels, mod.source
    return mod


def make(shape, dtype):
    if dtype == torch.int64:
        return torch.randint(-50, 50, shape)
    return torch.randn(shape).to(dtype)


def reductions(mod):
    return [k for k in mod.kernels if k.group.reduction]


def assert_outer(kernel):
    """The kernel was generated as an outer reduction, wide along the kept axis."""
    assert kernel.group.outer, kernel.source
    assert configs_for(kernel.group)[0].xblock > 1


def assert_inner(kernel):
    assert kernel.group.outer is False, kernel.source


FLOATS = [torch.float32, torch.bfloat16]
ALL = FLOATS + [torch.int64]


# -- outer reductions: one kernel, wide along the kept axis --------------------------------------
@pytest.mark.parametrize("dtype", ALL)
def test_column_sum_is_one_outer_kernel(dtype):
    mod = compiled_run(lambda x: x.sum(0), make((257, 130), dtype), kernels=1, dtype=dtype)
    assert_outer(mod.kernels[0])
    assert mod.kernels[0].name.startswith("triton_red")  # looped over the reduced axis


@pytest.mark.parametrize("dtype", FLOATS)
def test_mean_over_a_middle_dim(dtype):
    # a short reduced extent stays in registers, a tile wide along the contiguous last dim
    mod = compiled_run(lambda x: x.mean(1), make((3, 37, 40), dtype), kernels=1, dtype=dtype)
    assert_outer(mod.kernels[0])
    cfg = configs_for(mod.kernels[0].group)[0]
    assert cfg.rblock >= 37 and cfg.xblock >= 32


def test_mean_over_a_long_middle_dim_loops():
    mod = compiled_run(lambda x: x.mean(1, keepdim=True) * 2, make((3, 200, 45), torch.float32),
                       kernels=1)
    assert_outer(mod.kernels[0])
    assert "for roffset in range" in mod.kernels[0].source


@pytest.mark.parametrize("dtype", ALL)
def test_sum_over_the_two_outer_dims(dtype):
    mod = compiled_run(lambda x: x.sum((0, 1)), make((7, 9, 33), dtype), kernels=1, dtype=dtype)
    assert_outer(mod.kernels[0])


def test_sum_over_non_adjacent_dims_kept_last_dim_contiguous():
    mod = compiled_run(lambda x: x.sum((0, 2)), make((6, 5, 7, 40), torch.float32), kernels=1)
    assert_outer(mod.kernels[0])


def test_sum_over_non_adjacent_dims_reduced_last_dim_contiguous():
    mod = compiled_run(lambda x: x.sum((1, 3)), make((6, 5, 7, 40), torch.float32), kernels=1)
    assert_inner(mod.kernels[0])


@pytest.mark.parametrize("dtype", ALL)
def test_amax_amin_over_dim0(dtype):
    mod = compiled_run(lambda x: (x.amax(0), x.amin(0)), make((100, 70), dtype), kernels=1,
                       dtype=dtype)
    assert_outer(mod.kernels[0])


@pytest.mark.parametrize("dtype", ALL)
def test_argmax_over_dim0_ties_to_the_first(dtype):
    x = torch.randint(0, 4, (100, 70)).to(dtype)  # many ties
    mod = compiled_run(lambda x: (x.argmax(0), x.argmin(0)), x, kernels=1, dtype=torch.int64)
    assert_outer(mod.kernels[0])


def test_max_dim0_values_and_indices():
    mod = compiled_run(lambda x: torch.max(x, 0), make((21, 40), torch.float32), kernels=1)
    assert_outer(mod.kernels[0])


@pytest.mark.parametrize("dtype", FLOATS)
def test_nchw_channel_statistics_are_one_kernel(dtype):
    # NCHW: the reduced H*W runs are the contiguous ones (an inner reduction)
    x = make((2, 3, 5, 7), dtype)
    mod = compiled_run(lambda x: (x.mean((0, 2, 3)), x.var((0, 2, 3)),
                                  torch.var_mean(x, (0, 2, 3), keepdim=True)),
                       x, kernels=1, dtype=dtype)
    assert_inner(mod.kernels[0])


@pytest.mark.parametrize("dtype", FLOATS)
def test_channels_last_statistics_are_outer(dtype):
    x = make((2, 24, 5, 7), dtype).contiguous(memory_format=torch.channels_last)
    mod = compiled_run(lambda x: torch.var_mean(x, (0, 2, 3), correction=0), x, kernels=1,
                       dtype=dtype)
    assert_outer(mod.kernels[0])


def masked_mean(h, m):
    return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(3, 37, 48), (2, 17, 130), (1, 5, 64)])
def test_a_mask_broadcast_over_the_columns_does_not_outvote_them(dtype, shape):
    """A masked mean over a middle dimension: the mask [B, L] is read at every column of
    h [B, L, H] (contiguous along L) while h streams along H: the mask abstains, so the
    kernel is outer (wide along H), with the mask's row of infs and NaNs and an empty row
    giving eager's values."""
    B, L, H = shape
    h, m = make(shape, dtype), (torch.rand(B, L) < 0.7).to(dtype)
    m[:, 0] = 1
    h[0, 1, :3] = float("nan")
    h[-1, -1, -2:] = float("inf")
    if B > 1:
        m[1] = 0      # an empty row: 0/0
    mod = compiled_run(masked_mean, h, m, dtype=dtype)
    big = [k for k in reductions(mod) if k.group.xnumel == B * H]
    assert len(big) == 1 and len(mod.kernels) <= 2, mod.source
    assert_outer(big[0])


def test_mask_votes_again_with_the_switch_off(monkeypatch):
    from frametrace.backends.triton import config
    monkeypatch.setattr(config, "broadcast_reads_abstain", False)
    h, m = make((3, 37, 48), torch.float32), (torch.rand(3, 37) < 0.7).float()
    m[:, 0] = 1
    mod = compiled_run(masked_mean, h, m)
    big = [k for k in reductions(mod) if k.group.xnumel == 3 * 48]
    assert len(big) == 1
    assert_inner(big[0])   # a tie of one vote each: the inner layout, as before


def test_a_transposed_full_size_read_still_votes():
    """Two full-size reads, one contiguous along each axis: neither is broadcast, both vote
    (the tie keeps the inner layout); values as eager."""
    x, y = make((40, 64), torch.float32), make((64, 40), torch.float32)
    mod = compiled_run(lambda x, y: (x + y.t()).sum(1), x, y, kernels=1)
    assert_inner(mod.kernels[0])


def test_inner_reductions_keep_their_blocks():
    mod = compiled_run(lambda x: x.sum(1), make((100, 70), torch.float32), kernels=1)
    k = mod.kernels[0]
    assert_inner(k)
    assert [repr(c) for c in configs_for(k.group)] == \
        [repr(c) for c in autotune.few(autotune.candidates(100, 70, True), 100 * 70, "reduction")]


def test_outer_default_blocks():
    """The defaults: a tile 16-256 wide along the contiguous axis, a short looped RBLOCK
    (Inductor's outer configs); short reduced extents in registers."""
    first = lambda x, r: autotune.outer_candidates(x, r)[0]  # noqa: E731
    big = first(65536, 1024)  # a mean over the middle of (64, 1024, 1024)
    assert (big.xblock, big.rblock, big.num_warps) == (64, 8, 4)
    mid = first(8192, 8192)  # a column sum of 8192x8192 (split first, see below)
    assert (mid.xblock, mid.rblock) == (16, 32)
    short = first(65536, 16)
    assert short.rblock == 16 and short.xblock * short.rblock >= 2048
    assert autotune.split_count(8192, 8192, outer=True) == 16
    assert autotune.split_count(65536, 1024, outer=True) == 1
    assert autotune.split_count(256, 64 * 56 * 56, outer=False) == 4   # BatchNorm statistics
    assert autotune.split_count(1, 8192 * 8192, outer=False) == 512    # a full sum
    assert autotune.split_count(4096, 4096, outer=False) == 1
    assert autotune.split_count(2, 20000, outer=False) == 1  # too little work to pay a launch


# -- split reductions: exactly two kernels --------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(64, 50), (37, 41)])  # chunks even, and ragged (masked)
def test_full_sum_is_split(small_splits, shape, dtype):
    mod = compiled_run(lambda x: x.sum(), make(shape, dtype), kernels=2, dtype=dtype)
    first, second = reductions(mod)
    assert first.group.xnumel > 1 and second.group.xnumel == 1


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["mean", "amax", "amin"])
def test_full_mean_max_min_split(small_splits, name, dtype):
    compiled_run(lambda x: getattr(x, name)(), make((37, 41), dtype), kernels=2, dtype=dtype)


def test_full_any_split(small_splits):
    x = torch.zeros(37, 41)
    x[20, 7] = 1.0
    compiled_run(lambda x: (x != 0).any(), x, kernels=2)
    compiled_run(lambda x: (x > 5).any(), x + 0.5, kernels=2)


@pytest.mark.parametrize("dtype", ALL)
def test_column_sum_of_few_columns_is_split(small_splits, dtype):
    mod = compiled_run(lambda x: x.sum(0), make((1031, 5), dtype), kernels=2, dtype=dtype)
    first, second = reductions(mod)
    assert_outer(first)
    assert first.group.xnumel % 5 == 0 and second.group.xnumel == 5


def test_column_max_of_few_columns_is_split(small_splits):
    compiled_run(lambda x: x.amax(0, keepdim=True), make((1031, 5), torch.float32), kernels=2)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 3, 16, 16), (1, 2, 1, 1031)])  # chunks even, ragged
@pytest.mark.parametrize("keepdim", [False, True])
def test_nchw_channel_var_mean_is_split(small_splits, shape, dtype, keepdim):
    """Per-channel statistics of few channels: chunk sums and centred sums of squares,
    then their combination (x read once)."""
    x = make(shape, dtype) * 3 + 5  # an offset mean: a one-pass formula would lose digits
    mod = compiled_run(lambda x: torch.var_mean(x, (0, 2, 3), correction=int(keepdim), keepdim=keepdim),
                       x, kernels=2, dtype=dtype)
    assert "in_ptr1" not in reductions(mod)[0].source  # one input: the chunks read x only


@pytest.mark.parametrize("name", ["mean", "var", "var0"])
def test_nchw_channel_mean_and_var_split(small_splits, name):
    fn = {"mean": lambda x: x.mean((0, 2, 3)), "var": lambda x: x.var((0, 2, 3)),
          "var0": lambda x: x.var((0, 2, 3), unbiased=False)}[name]
    compiled_run(fn, make((4, 3, 16, 16), torch.float32), kernels=2)


def test_argmax_is_not_split(small_splits):
    mod = compiled_run(lambda x: x.argmax(), make((37, 41), torch.float32), kernels=1)
    assert_inner(mod.kernels[0])


def test_split_reduction_with_a_fused_prologue_and_epilogue(small_splits):
    x, y = make((37, 41), torch.float32), make((37, 41), torch.float32)
    compiled_run(lambda x, y: ((x - y) ** 2).mean().sqrt(), x, y, kernels=2)


# -- training BatchNorm: its statistics are these reductions ---------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("split", [False, True])
def test_training_batch_norm_lowers_its_statistics(request, split, dtype):
    if split:
        request.getfixturevalue("small_splits")
    m, ref = torch.nn.BatchNorm2d(3).to(dtype), torch.nn.BatchNorm2d(3).to(dtype)
    x = make((4, 3, 9, 11), dtype) * 2 + 1
    got = frametrace.optimize(backend="triton", fullgraph=True)(m)(x)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float(), ref(x).float(), atol=atol, rtol=rtol)
    for a, b in [(m.running_mean, ref.running_mean), (m.running_var, ref.running_var)]:
        torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)
    mod = last_compiled()
    assert all("batch_norm" not in op for op in mod.externs), mod.source
    stats = [k for k in reductions(mod)]
    assert len(stats) == (2 if split else 1), mod.source


# -- symbolic sizes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["col_sum", "mid_mean", "col_argmax"])
def test_outer_reductions_with_symbolic_sizes(name):
    fn = {"col_sum": lambda x: x.sum(0), "mid_mean": lambda x: x.mean(1),
          "col_argmax": lambda x: x.argmax(0)}[name]
    f = frametrace.optimize(backend="triton", dynamic=True)(fn)
    for shape in [(37, 20, 9), (50, 3, 33)]:
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), fn(x), atol=1e-4, rtol=1e-4)
    mod = last_compiled()
    assert mod.symbolic and len(mod.kernels) == 1
    assert_outer(mod.kernels[0])


# -- index arithmetic of multi-axis reductions -----------------------------------------------------
def loads(kernel):
    return [line for line in kernel.source.splitlines() if "tl.load" in line]


def test_reduced_plane_index_is_one_remainder():
    """The H and W digits of an NCHW plane rejoin: one `% (H*W)`, a run Triton sees whole."""
    mod = compiled_run(lambda x: x.mean((0, 2, 3)), make((2, 3, 5, 7), torch.float32), kernels=1)
    (line,) = loads(mod.kernels[0])
    assert "rindex % 35" in line and "// 7" not in line and "% 7" not in line, line


def test_split_chunks_are_whole_planes(small_splits):
    """A split of per-channel statistics cuts at plane boundaries: a chunk's index is a
    plain offset, with no division."""
    mod = compiled_run(lambda x: torch.var_mean(x, (0, 2, 3)), make((8, 3, 10, 10), torch.float32),
                       kernels=2)
    first = reductions(mod)[0]
    assert first.group.rnumel % 100 == 0
    assert all("//" not in line and "%" not in line for line in loads(first)), loads(first)


# -- sibling split reductions share their passes --------------------------------------------------
def test_sibling_split_reductions_share_two_kernels(small_splits):
    """amax and amin of one tensor: both partials in one kernel (one pass over x), both
    combinations in the other, though each partial is followed by its own combination."""
    mod = compiled_run(lambda x: (x.amax(), x.amin()), make((37, 41), torch.float32), kernels=2)
    assert len(mod.kernels[0].stores) == 2


def test_sibling_column_split_reductions(small_splits):
    compiled_run(lambda x: (x.sum(0), (x * x).sum(0), x.amax(0)), make((1031, 5), torch.float32),
                 kernels=2)


def test_split_mean_and_var_of_channels_share_a_pass(small_splits):
    compiled_run(lambda x: (x.mean((0, 2, 3)), x.var((0, 2, 3))), make((4, 3, 16, 16), torch.float32),
                 kernels=2)


def test_a_reduction_reading_the_kernel_between_does_not_move_before_it(small_splits):
    # the second sum's partials read the first's result: they stay after its combination
    compiled_run(lambda x: (x - x.sum(0)).sum(0), make((1031, 5), torch.float32), kernels=4)


# -- a row's result read under another lane's mask ------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 7])
def test_stack_of_sums_fused_with_the_last_sum_reads_its_whole_row(n):
    # The stack of scalar sums is n elements, as is the last sum's row, so the stack is
    # that sum's epilogue, indexed by the same rindex: the sum must not take the mask
    # of the stack's branch that reads it (it summed d[n - 1] alone).  torch 2.14
    # decomposes norm() into such a sum (a training loop's stack of grad norms).
    def f(a, b, d):
        return torch.stack([a.sum(), b.norm(), *([a.amax()] * (n - 3)), (d * d).sum()][-n:])

    calls = [(make((5,), torch.float32), make((3, 4), torch.float32), make((n,), torch.float32))
             for _ in range(3)]
    mod = triton_check(f, calls=calls, atol=1e-4, rtol=1e-4)
    last = [k for k in mod.kernels if len(k.stores) and k.group.reduction][-1]
    assert last.group.rnumel == n and "tl.reduce(" in last.source, mod.source
