"""backend="triton" on convolution nets: convolutions stay aten calls and their epilogues
(bias, inference BatchNorm, activation, residual add) are one kernel; channels-last
values keep their layout (kernels walk memory in its order, no layout copies, graph
outputs with eager's strides); ResNet bottleneck and ConvNeXt blocks and stages."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, last_compiled, wrapper  # noqa: E402
from frametrace.backends.triton.ir import Extern  # noqa: E402
from triton_harness import triton_check  # noqa: E402

CL = torch.channels_last
FAILURES = []  # errors of compiled graphs that then ran eagerly (backend._give_up)


@pytest.fixture(autouse=True)
def _interpret(triton_interpreter, monkeypatch):
    # a wrapper that fails on its first call runs the graph eagerly: record it
    FAILURES.clear()
    give_up = backend._give_up
    monkeypatch.setattr(backend, "_give_up", lambda gm, e: (FAILURES.append(e), give_up(gm, e))[1])
    monkeypatch.setattr(wrapper, "LAYOUT_COPIES", [0])


def compiled_run(fn, *args, kernels=None, atol=1e-5, rtol=1e-5):
    """fn compiled with the triton backend matches eager, values and strides (triton_check);
    no graph gave up to run eagerly and no layout copies were made; returns the
    CompiledModule."""
    with torch.no_grad():
        mod = triton_check(fn, *args, kernels=kernels, atol=atol, rtol=rtol, strides=True,
                           half_as_float=True)
    assert not FAILURES, FAILURES
    assert wrapper.LAYOUT_COPIES[0] == 0
    return mod


def _randomize_bn(m):
    for bn in m.modules():
        if isinstance(bn, nn.BatchNorm2d):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.normal_()
    return m.eval()


WEIGHTS_CL = "weights channels-last, input contiguous"


def _prepare(m, x, fmt, dtype=torch.float32):
    m, x = m.to(dtype), x.to(dtype)
    if fmt in (CL, WEIGHTS_CL):
        m = m.to(memory_format=CL)
    if fmt is CL:
        x = x.to(memory_format=CL)
    return m, x


class ConvBNReLU(nn.Module):
    def __init__(self, cin, cout, k=3):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_conv_bias_batchnorm_relu_is_one_kernel(fmt):
    torch.manual_seed(0)
    m, x = _prepare(_randomize_bn(ConvBNReLU(3, 8)), torch.randn(2, 3, 8, 8), fmt)
    mod = compiled_run(m, x, kernels=1)
    assert mod.externs == ["aten.convolution.default"]
    src = mod.kernels[0].source
    # the conv output is read once, in memory order; the conv's bias is added here, not by
    # a pass of cuDNN's own; the channel parameters broadcast (over NCHW, a tiled kernel
    # loads them once per row of H*W)
    assert src.count("tl.load(") == 6, src
    assert re.search(r"aten_\d+\(\w+, \w+, None,", mod.source), mod.source
    if fmt is CL:
        assert "tl.load(in_ptr0 + (xindex))" in src and "(xindex % 8)" in src, src
    else:
        assert "tl.load(in_ptr0 + ((xindex + 64*yindex)))" in src and "(yindex % 8)" in src, src


def test_conv_batchnorm_relu_bfloat16_channels_last():
    torch.manual_seed(0)
    m, x = _prepare(_randomize_bn(ConvBNReLU(4, 8)), torch.randn(2, 4, 8, 8), CL, torch.bfloat16)
    compiled_run(m, x, kernels=1, atol=2e-2, rtol=2e-2)


class Bottleneck(nn.Module):
    """ResNet-50's block, with a projection shortcut."""
    def __init__(self, cin, width, stride=1):
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                        nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.downsample(x))


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL, WEIGHTS_CL])
def test_resnet_bottleneck_block(fmt):
    torch.manual_seed(0)
    m, x = _prepare(_randomize_bn(Bottleneck(8, 4, stride=2)), torch.randn(2, 8, 8, 8), fmt)
    # one epilogue kernel per conv output consumer: bn1+relu, bn2+relu, bn3+bn+add+relu
    mod = compiled_run(m, x, kernels=3, atol=1e-4, rtol=1e-4)
    assert mod.externs == ["aten.convolution.default"] * 4


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_two_bottlenecks_residual_stays_in_the_convs_layout(fmt):
    torch.manual_seed(0)
    m = nn.Sequential(Bottleneck(8, 4), Bottleneck(16, 4))
    m, x = _prepare(_randomize_bn(m), torch.randn(2, 8, 8, 8), fmt)
    mod = compiled_run(m, x, kernels=6, atol=1e-4, rtol=1e-4)
    if fmt is CL:
        # the residual sum (read by the next block's convs and its add) is stored
        # channels-last, as the convolutions return it
        assert "(128, 1, 128, 16)" not in mod.source
        assert mod.source.count("(1024, 1, 128, 16)") >= 2, mod.source


def test_pointwise_on_channels_last_input_walks_memory_order():
    x = torch.randn(2, 3, 4, 5).to(memory_format=CL)
    mod = compiled_run(lambda x: torch.sigmoid(x) * 2 + x, x, kernels=1)
    src = mod.kernels[0].source
    assert "tl.load(in_ptr0 + (xindex)," in src and "tl.store(out_ptr0 + (xindex)," in src, src


def test_as_strided_of_a_computed_value_is_stored():
    # the wrapper once named a buffer no kernel stored: a view of a computed value read
    # as memory (not through the value) counted neither as a kernel's read nor the wrapper's
    compiled_run(lambda x: x.sin().as_strided((2, 3), (1, 2)) + 1, torch.randn(6), kernels=2)
    compiled_run(lambda x: x.cos().as_strided((3, 2), (1, 3)), torch.randn(6), kernels=1)
    compiled_run(lambda x, w: torch.mm(x.exp().as_strided((2, 2), (1, 2)), w),
                 torch.randn(4), torch.randn(2, 3), kernels=1)


# -- ConvNeXt (timm's ConvNeXt-Tiny structure, tiny sizes) --------------------------------
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over channels of NCHW, as permute / LayerNorm / permute."""
    def forward(self, x):
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class LayerNorm2dStats(nn.LayerNorm):
    """LayerNorm over channels of NCHW, as mean and variance over dim 1."""
    def forward(self, x):
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        x = (x - mean) * torch.rsqrt(var + self.eps)
        return x * self.weight[:, None, None] + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        shortcut = x
        x = self.conv_dw(x).permute(0, 2, 3, 1)
        x = self.fc2(F.gelu(self.fc1(self.norm(x))))
        x = x * self.gamma
        return x.permute(0, 3, 1, 2) + shortcut


class ConvNeXt(nn.Module):
    def __init__(self, dims=(4, 8, 8), depth=2, norm2d=LayerNorm2d):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), norm2d(dims[0], eps=1e-6))
        stages = []
        for i, d in enumerate(dims):
            down = [norm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], d, 2, stride=2)] if i else []
            stages.append(nn.Sequential(*down, *[ConvNeXtBlock(d) for _ in range(depth)]))
        self.stages = nn.Sequential(*stages)
        self.head_norm = norm2d(dims[-1], eps=1e-6)
        self.fc = nn.Linear(dims[-1], 5)

    def forward(self, x):
        x = self.stages(self.stem(x))
        # timm's NormMlpClassifierHead: pool, LayerNorm2d of (B, C, 1, 1), flatten, fc
        # (its buffers were the ones the wrapper named without storing them)
        return x, self.fc(torch.flatten(self.head_norm(F.adaptive_avg_pool2d(x, 1)), 1))


@pytest.mark.parametrize("norm2d", [LayerNorm2d, LayerNorm2dStats])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_convnext_stages(fmt, norm2d):
    torch.manual_seed(0)
    m, x = _prepare(ConvNeXt(norm2d=norm2d).eval(), torch.randn(2, 3, 32, 32), fmt)
    with torch.no_grad():
        features, logits = frametrace.optimize(backend="triton", fullgraph=True)(m)(x)
        want_features, want_logits = m(x)
    assert not FAILURES, FAILURES
    torch.testing.assert_close(features, want_features, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)
    # eager's blocks end channels-last (permute back + residual add): so do ours
    assert features.stride() == want_features.stride()
    assert wrapper.LAYOUT_COPIES[0] == 0
    mod = last_compiled()
    assert mod.externs.count("aten.convolution.default") == 1 + 2 + 3 * 2


def test_output_read_first_by_a_conv_keeps_eagers_strides():
    # `y` reads a reduction over its innermost dimension, so it is stored row-major (to
    # share the reduction's kernel) for the conv; eager's `y` is channels-last (it
    # follows x): the output is a copy in eager's layout
    def f(x, w):
        y = x - x.mean(3, keepdim=True)
        return F.conv2d(y, w, padding=1) + 1, y
    x = torch.randn(2, 4, 6, 6).to(memory_format=CL)
    w = torch.randn(3, 4, 3, 3)
    with torch.no_grad():
        got = frametrace.optimize(backend="triton", fullgraph=True)(f)(x, w)
        want = f(x, w)
    assert not FAILURES, FAILURES
    # the reduction with y (row-major), the conv's epilogue, y's copy
    assert len(last_compiled().kernels) == 3, last_compiled().source
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
        assert g.stride() == e.stride()


@pytest.mark.parametrize("kw", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2),
                                dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True),
                                dict(kernel_size=(2, 3), stride=(1, 2), ceil_mode=True)])
def test_max_pool2d_values_and_indices_in_one_kernel(kw):
    x = torch.randn(2, 3, 7, 9)
    x[0, 0, 1, 1] = float("nan")
    x[1, 2, :3, :3] = float("-inf")
    f = lambda x: F.max_pool2d(x * 2, return_indices=True, **kw)  # noqa: E731
    got, idx = frametrace.optimize(backend="triton", fullgraph=True)(f)(x)
    want, want_idx = f(x)
    assert not FAILURES, FAILURES
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.equal(idx, want_idx)
    mod = last_compiled()
    assert len(mod.kernels) == 2 and mod.externs == [], mod.source  # x * 2 is stored first


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_resnet_stem_and_head(fmt):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8)
            self.layer = nn.Sequential(Bottleneck(8, 2), Bottleneck(8, 4, stride=2))
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layer(x), 1), 1))
    torch.manual_seed(0)
    m, x = _prepare(_randomize_bn(Net()), torch.randn(2, 3, 32, 32), fmt)
    # stem epilogue, max pool, 3 per block (the last one with the average pool)
    mod = compiled_run(m, x, kernels=8, atol=1e-4, rtol=1e-4)
    assert mod.externs == ["aten.convolution.default"] * 9 + ["aten.addmm.default"]


def test_as_strided_reads_memory_in_eagers_layout():
    # `y` is stored row-major for the conv (it reads a reduction over its last dim);
    # eager's `y` is channels-last, and as_strided reads that memory
    def f(x, w):
        y = x - x.amax(3, keepdim=True)
        return F.conv2d(y, w) + 1, y.as_strided((4, 6), (6, 1)) * 2
    x = torch.randn(1, 2, 3, 4).to(memory_format=CL)
    w = torch.randn(3, 2, 1, 1)
    with torch.no_grad():
        got = frametrace.optimize(backend="triton", fullgraph=True)(f)(x, w)
        want = f(x, w)
    assert not FAILURES, FAILURES
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


def test_contiguous_copy_is_stored_row_major():
    # .contiguous() of a permute: stored as asked (not in its input's order), so the
    # view after it is a view, not another copy
    def f(x, w):
        y = (x * 2 + x.exp()).permute(0, 2, 3, 1).contiguous()
        return torch.mm(y.view(-1, 3), w), torch.mm(y.view(-1, 3), w + 1)
    mod = compiled_run(lambda x, w: sum(f(x, w)), torch.randn(2, 3, 4, 5), torch.randn(3, 4),
                       kernels=3)  # y, w + 1, the sum
    assert "empty_strided((2, 4, 5, 3), (60, 15, 3, 1)" in mod.source, mod.source


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["nchw", "channels_last"])
def test_channels_last_convs_copy_the_input_once_and_stay_channels_last(monkeypatch, fmt):
    # (on CUDA "auto" chooses it for nets like ResNet; here it is forced)
    from frametrace.backends.triton import config as tconfig
    monkeypatch.setattr(tconfig, "channels_last_convs", True)
    torch.manual_seed(0)
    m = nn.Sequential(_randomize_bn(ConvBNReLU(3, 8)), Bottleneck(8, 4)).eval()
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=fmt)
    mod = compiled_run(m, x)
    convs = [e for e in mod.wrapper.schedule if isinstance(e, Extern) and "convolution" in str(e.op)]
    assert len(convs) == 5
    for e in convs:   # every conv reads a channels-last activation
        b = e.args[0]
        assert b.stride == tuple(torch.empty(b.shape).contiguous(memory_format=CL).stride()), (b, mod.source)
    copies = 0 if fmt is CL else 1    # the image, once; every epilogue stores channels-last
    assert len(mod.kernels) == 4 + copies, mod.source


@pytest.mark.parametrize("conv", ["conv1d", "conv_transpose2d", "grouped_conv3d"])
def test_conv_bias_is_added_by_the_kernel_after_it(conv):
    torch.manual_seed(0)
    if conv == "conv1d":
        x, w, b = torch.randn(2, 4, 16), torch.randn(6, 4, 3), torch.randn(6)
        fn = lambda x: F.conv1d(x, w, b, padding=1)  # noqa: E731  (returned as it is)
    elif conv == "conv_transpose2d":
        x, w, b = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(3)
        fn = lambda x: torch.sigmoid(F.conv_transpose2d(x, w, b, stride=2))  # noqa: E731
    else:
        x, w, b = torch.randn(1, 4, 3, 4, 5), torch.randn(6, 2, 1, 3, 3), torch.randn(6)
        fn = lambda x: F.conv3d(x, w, b, padding=(0, 1, 1), groups=2).relu()  # noqa: E731
    mod = compiled_run(fn, x, kernels=1)
    assert re.search(r"aten_\d+\(\w+, \w+, None,", mod.source), mod.source


@pytest.mark.parametrize("case", ["conv2d", "grouped", "unbatched", "transpose", "unbatched_transpose"])
def test_channels_last_convs_return_eagers_strides(monkeypatch, case):
    # A convolution run channels-last for speed (on CUDA "auto" chooses it) whose result
    # is a graph output, itself or a view of it (unbatched): eager's strides come back,
    # a copy (the H200 sweep: conv2d / conv_transpose2d outputs (144, 1, 24, 4) where
    # eager gave (144, 36, 6, 1)).
    from frametrace.backends.triton import config as tconfig
    monkeypatch.setattr(tconfig, "channels_last_convs", True)
    torch.manual_seed(0)
    x, w, kw = {
        "conv2d": (torch.randn(1, 4, 5, 5), torch.randn(3, 4, 3, 3), {}),
        "grouped": (torch.randn(2, 4, 6, 6), torch.randn(8, 1, 3, 3), {"groups": 4}),
        "unbatched": (torch.randn(4, 6, 6), torch.randn(8, 1, 3, 3), {"groups": 4}),
        "transpose": (torch.randn(1, 2, 5, 5), torch.randn(2, 4, 3, 3), {}),
        "unbatched_transpose": (torch.randn(2, 5, 5), torch.randn(2, 4, 3, 3), {}),
    }[case]
    conv = F.conv_transpose2d if "transpose" in case else F.conv2d
    mod = compiled_run(lambda x: conv(x, w, **kw), x)   # (strides compared with eager's)
    convs = [e for e in mod.wrapper.schedule if isinstance(e, Extern) and "convolution" in str(e.op)]
    assert len(convs) == 1 and len(mod.kernels) == 2, mod.source   # the input's copy, the output's
