"""backend="triton": tiled (2-D block) pointwise kernels.  Where the inputs and the output
disagree about which dim is contiguous (transposes, permutes, NCHW <-> NHWC, `contiguous()`
of views), or a broadcast operand is constant along the inner dims (a per-channel weight over
NCHW activations), a pointwise kernel runs over [YBLOCK, XBLOCK] blocks on a 2-D grid.
Kernels run in Triton's interpreter; values are compared with eager."""
import re

import pytest
import torch

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, last_compiled, tiling  # noqa: E402
from triton_harness import triton_check  # noqa: E402


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def compiled_run(fn, *args, kernels=1, tol=1e-5):
    """fn compiled with the triton backend matches eager (half dtypes compared in float32);
    returns the CompiledModule.  Compiled afresh: static sizes, whatever ran before."""
    frametrace.reset()
    return triton_check(fn, *args, kernels=kernels, atol=tol, rtol=tol, half_as_float=True)


def tiled(mod, i=0):
    """Kernel i is a tiled one on a 2-D grid; returns its source."""
    k = mod.kernels[i]
    assert k.tile is not None and "tl.program_id(1)" in k.source, k.source
    assert "[:, None]" in k.source and "[None, :]" in k.source
    return k.source


def flat(mod, i=0):
    k = mod.kernels[i]
    assert k.tile is None and "tl.program_id(1)" not in k.source, k.source
    return k.source


def values(dtype, *shape):
    if dtype == torch.int64:
        return torch.randint(-50, 50, shape)
    return torch.randn(*shape).to(dtype)


TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.int64: 0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_transpose_plus_add_is_one_tiled_kernel(dtype):
    x, y = values(dtype, 9, 7), values(dtype, 7, 9)
    mod = compiled_run(lambda x, y: x.t() + y, x, y, tol=TOL[dtype])
    src = tiled(mod)
    # the transposed operand is contiguous along y, the other and the store along x
    assert "7*xindex + yindex" in src.replace("(", "").replace(")", ""), src
    assert "xmask" in src and "ymask" in src  # 7 and 9 divide no block size


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_permutes_of_3d_and_4d_tensors(dtype):
    x3, x4 = values(dtype, 5, 6, 7), values(dtype, 2, 3, 5, 6)
    mod = compiled_run(lambda x: x.permute(2, 0, 1).contiguous() * 2, x3, tol=TOL[dtype])
    tiled(mod)
    mod = compiled_run(lambda x: x.permute(1, 2, 0).contiguous(), x3, tol=TOL[dtype])
    tiled(mod)
    mod = compiled_run(lambda x: x.permute(0, 3, 1, 2).contiguous(), x4, tol=TOL[dtype])
    tiled(mod)
    mod = compiled_run(lambda x: x.permute(3, 2, 1, 0).contiguous() - 1, x4, tol=TOL[dtype])
    tiled(mod)


def test_pointwise_around_a_permute_fuses_into_the_tiled_kernel():
    x, s, b = torch.randn(2, 3, 4, 5), torch.randn(5, 1, 1), torch.randn(3)
    mod = compiled_run(lambda x, s: (x.permute(0, 3, 1, 2) * s).contiguous().relu() + 1, x, s)
    tiled(mod)
    # two outputs of one space: both stored by the one kernel
    mod = compiled_run(lambda x, b: (x.transpose(1, 3) + b, (x.transpose(1, 3) * b).sigmoid()), x, b)
    tiled(mod)
    assert len(mod.kernels[0].stores) == 2


def test_head_merge_permute_keeps_rows_contiguous_and_flat():
    # attention heads: the last dim stays innermost, so every load runs along it already
    x, s = torch.randn(2, 3, 5, 4), torch.randn(4)
    mod = compiled_run(lambda x, s: (x.permute(0, 2, 1, 3) * s).contiguous(), x, s)
    flat(mod)
    mod = compiled_run(lambda x: x.transpose(1, 2).reshape(2, 5, 12) + 1, x)
    flat(mod)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_nchw_to_nhwc_and_back(dtype):
    x = values(dtype, 2, 3, 5, 7)
    mod = compiled_run(lambda x: x.permute(0, 2, 3, 1).contiguous(), x, tol=TOL[dtype])
    src = tiled(mod)
    assert mod.kernels[0].tile.ynumel == 2 * 5 * 7 and "ymask" in src and "xmask" in src
    # a channels-last input (NHWC memory) made NCHW-contiguous
    x_cl = x.contiguous(memory_format=torch.channels_last)
    mod = compiled_run(lambda x: x.contiguous() * 2, x_cl, tol=TOL[dtype])
    tiled(mod)
    assert mod.kernels[0].tile.ynumel == 2 * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_channels_last_copy_is_tiled_when_its_stored_layout_differs(dtype):
    """`contiguous(memory_format=torch.channels_last)`: a transposition where the result
    is stored channels-last (as eager's is), a plain copy where it is stored row-major."""
    def to_nhwc(x):
        return x.contiguous(memory_format=torch.channels_last)
    x = values(dtype, 2, 3, 5, 7)
    mod = compiled_run(to_nhwc, x, tol=TOL[dtype])
    out = mod.kernels[0].stores[0].buffer
    if out.stride == (105, 35, 7, 1):
        flat(mod)
    else:
        assert out.stride == (105, 1, 21, 3)
        tiled(mod)


@pytest.fixture
def channels_last_stores(monkeypatch):
    """Computed 4-D values stored channels-last, as the lowering may choose for them."""
    from frametrace.backends.triton import ir
    init = ir.Computed.__init__

    def channels_last(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if len(self.shape) == 4 and all(isinstance(n, int) for n in self.shape):
            n, c, h, w = self.shape
            b = self.buffer
            self.buffer = ir.Buffer(b.name, b.shape, (h * w * c, 1, w * c, c), b.dtype, b.device)
    monkeypatch.setattr(ir.Computed, "__init__", channels_last)


def test_a_value_stored_channels_last_is_written_by_a_tiled_kernel(channels_last_stores):
    def f(x, w):
        return (x * w[:, None, None]).relu() + 1
    x, w = torch.randn(2, 4, 3, 5), torch.randn(4)
    mod = compiled_run(f, x, w, kernels=None)
    src = tiled(mod)
    assert mod.kernels[0].stores[0].buffer.stride == (60, 1, 20, 4)
    # the row-major input along x, the channels-last store along y (channels innermost)
    assert "tl.store(out_ptr0 + ((4*xindex + 60*(yindex // 4) + (yindex % 4)))" in src, src
    # only the store runs along the channels (the sum is one address): flat, stored strided
    mod = compiled_run(lambda x: torch.full_like(x, 2.0) + x.sum(), x, kernels=None)
    k = next(k for k in mod.kernels if not k.group.reduction)
    assert k.stores[0].buffer.stride == (60, 1, 20, 4) and flat(mod, mod.kernels.index(k))
    assert "tl.store(out_ptr0 + ((60*(xindex // 60) + 4*(xindex % 15) + ((xindex // 15) % 4)))" \
        in k.source, k.source


def test_a_value_stored_channels_last_by_a_reduction_kernel(channels_last_stores):
    def f(x):
        y = x * 2
        return y, y.sum((2, 3)), y.relu() + x.mean()
    mod = compiled_run(f, torch.randn(2, 3, 4, 5), kernels=None, tol=1e-4)
    # y shares the kernel of x.mean() (120 elements, one row of 120), stored channels-last
    k = next(k for k in mod.kernels if k.group.reduction and len(k.stores) == 2)
    assert "3*(rindex % 20) + ((rindex // 20) % 3)" in k.source, k.source


@pytest.mark.parametrize("shape,dims", [((6, 9), (1, 0)), ((3, 5, 7), (0, 2, 1)),
                                        ((4, 3, 5, 2), (0, 1, 3, 2))])
def test_contiguous_of_a_transposed_view(shape, dims):
    x = torch.randn(*shape)
    mod = compiled_run(lambda x: x.permute(*dims).contiguous(), x)
    tiled(mod)
    # a transposed graph input (non-contiguous strides) made contiguous
    xt = torch.randn(*reversed(shape)).permute(*reversed(range(len(shape))))
    mod = compiled_run(lambda x: x.contiguous() + 0, xt)
    tiled(mod)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channel_broadcast_over_nchw_loads_once_per_row(dtype):
    x = values(dtype, 2, 3, 8, 12)
    mean, var, w, b = (torch.randn(3).to(dtype) for _ in range(4))
    var = var.abs() + 0.5

    def bn_relu(x, mean, var, w, b):  # inference BatchNorm's arithmetic, then ReLU
        c = (slice(None), None, None)
        return ((x - mean[c]) * torch.rsqrt(var[c] + 1e-5) * w[c] + b[c]).relu()
    mod = compiled_run(bn_relu, x, mean, var, w, b, tol=TOL[dtype])
    src = tiled(mod)
    assert mod.kernels[0].tile.kind == "broadcast" and mod.kernels[0].tile.xnumel == 96
    # the per-channel operands: one address per row, masked along y only
    assert src.count("(yindex % 3)), ymask") == 4, src
    # 7x7 rows would leave too many lanes of their blocks masked off: flat
    mod = compiled_run(bn_relu, values(dtype, 2, 3, 7, 7), mean, var, w, b, tol=TOL[dtype])
    flat(mod)


def test_odd_sizes_over_several_blocks_on_both_axes():
    x, y = torch.randn(70, 37), torch.randn(37, 70)
    mod = compiled_run(lambda x, y: (x.t() * y).exp() - x.t(), x, y, tol=1e-4)
    tiled(mod)
    launcher = mod.namespace[re.search(r"(kernel\d+)\(", mod.source).group(1)]
    assert len(launcher.grid) == 2 and launcher.grid[0] > 1 and launcher.grid[1] > 1
    assert launcher.constexprs() == [launcher.kwargs["YBLOCK"], launcher.kwargs["XBLOCK"]]


def test_contiguous_pointwise_stays_flat():
    mod = compiled_run(lambda x, y, b: torch.sigmoid(x * y + b) * 2, torch.randn(6, 7),
                       torch.randn(6, 7), torch.randn(7))
    src = flat(mod)
    assert "tl.program_id(0)" in src and "yindex" not in src
    # a broadcast along a short inner dim is not worth a tile
    mod = compiled_run(lambda x, s: x * s[:, None], torch.randn(6, 7), torch.randn(6))
    flat(mod)


def test_reductions_over_transposed_inputs_are_unchanged():
    mod = compiled_run(lambda x, y: (x.t() + y).sum(-1), torch.randn(9, 7), torch.randn(7, 9))
    assert mod.kernels[0].tile is None


def test_symbolic_sizes_stay_flat():
    f = frametrace.optimize(backend="triton", dynamic=True)(lambda x, y: x.t() + y)
    for n in (5, 6, 9):
        x, y = torch.randn(n, 4), torch.randn(4, n)
        torch.testing.assert_close(f(x, y), x.t() + y)
        mod = last_compiled()
        assert mod.symbolic and mod.kernels[0].tile is None


def test_symbolic_sizes_divide_by_their_whole_product():
    # H == W: one symbol s, and a flat index divided by s*s (printed `// s*s`, it was
    # divided by s and multiplied by s)
    def f(x, w):
        return x * w[:, None, None] + 1
    g = frametrace.optimize(backend="triton", dynamic=True)(f)
    for n in (5, 7, 4):
        x, w = torch.randn(2, 3, n, n), torch.randn(3)
        torch.testing.assert_close(g(x, w), f(x, w))
        mod = last_compiled()
        assert mod.symbolic and "// (" in mod.kernels[0].source, mod.kernels[0].source


def test_grid_axes_swap_when_y_blocks_overflow_the_second_axis():
    t = tiling.Tile(2 ** 24, 64, "transpose")
    assert t.swap
    c = t.configs[0]
    gy, gx = t.grid(c)
    assert gy == 2 ** 24 // c.yblock and gx == 64 // c.xblock
    small = tiling.Tile(64, 2 ** 24, "transpose")
    assert not small.swap and small.grid(small.configs[0])[1] == 64 // small.configs[0].yblock


def test_scalar_operands_constants_and_mixed_shapes_in_a_tiled_kernel():
    x, y, s = torch.randn(6, 9), torch.randn(9, 6), torch.tensor(3.0)

    def f(x, y, s):
        a = x.t() * s + y
        return a.reshape(-1) * 2, (a.relu() + 1).reshape(6, 9), torch.full_like(x, 2.0).t().contiguous()
    mod = compiled_run(f, x, y, s, kernels=None)
    src = "".join(tiled(mod, i) for i in range(len(mod.kernels)))
    assert re.search(r"tl.load\(in_ptr\d \+ \(0\)\)", src), src  # a 0-d operand: one scalar
    assert any(len(k.stores) == 3 for k in mod.kernels) and "tl.full([YBLOCK, XBLOCK]" in src


def test_fast_wrapper_launches_the_2d_grid(monkeypatch):
    """The GPU's fast wrapper (Triton's low-level launcher: gridX, gridY, gridZ, then the
    arguments and the constexprs), generated here with the GPU-only parts stubbed."""
    from types import SimpleNamespace

    from triton.runtime import driver

    from frametrace.backends.triton import autotune
    x, y = torch.randn(70, 37), torch.randn(37, 70)
    mod = compiled_run(lambda x, y: x.t() + y, x, y)
    name = re.search(r"(kernel\d+)\(", mod.source).group(1)
    launcher = mod.namespace[name]
    launcher.compiled = SimpleNamespace(run=None, function=None, packed_metadata=None)
    monkeypatch.setattr(autotune, "interpreted", lambda: False)
    monkeypatch.setattr(mod.wrapper.lowered, "device", torch.device("cuda", 0))
    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_stream=None))
    src = mod.wrapper.fast_source([x, y])
    gx, gy = launcher.grid
    assert gx > 1 and gy > 1
    assert f"run_{name}({gx}, {gy}, 1, stream, " in src, src
    assert f"buf1, {launcher.kwargs['YBLOCK']}, {launcher.kwargs['XBLOCK']})" in src, src


def test_cat_of_a_transposed_part_and_a_row_broadcast_part():
    # the broadcast part's address varies along y only, its condition along x
    f = lambda a, b: torch.cat([a.t(), b.expand(-1, 5)], 1) + 1  # noqa: E731
    mod = compiled_run(f, torch.randn(4, 6), torch.randn(6, 1))
    src = tiled(mod)
    assert "tl.load(in_ptr0 + (yindex + (xindex) * 0), ymask & xmask & " in src, src


def test_split_of_reads_each_index_compiled_once():
    """tiling._split_of's votes (each index printed and compiled once, evaluated at each
    dim's step): a row-contiguous read, a transposed one, a broadcast one, and no vote for
    an index that depends on a loaded value."""
    import sympy
    from frametrace.backends.triton import indexing
    x = indexing.XINDEX
    shape = [4, 6]
    steps = [6, 1]
    assert tiling._split_of(x, shape, steps) == ("row", None)
    transposed = indexing.ModIdx(x, 6) * 4 + indexing.FloorDiv(x, 6)
    assert tiling._split_of(transposed, shape, steps) == ("transpose", 1)
    assert tiling._split_of(indexing.FloorDiv(x, 6), shape, steps) == ("broadcast", 1)
    assert tiling._split_of(x + sympy.Symbol("tmp3", integer=True), shape, steps) is None
