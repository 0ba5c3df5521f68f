"""Ops whose aten kernel keeps a channels-last input's memory format keep it behind
AOTAutograd too (backends/kernel_formats.py): upsampling on every device -- torch's
decompositions (run at the Autograd key while AOTAutograd traces) store a CUDA image of
few channels contiguous, so aot_eager and triton returned other strides than eager's (the
OpInfo sweep on the H200: interpolate nearest / nearest-exact / bilinear of a 3-channel
channels-last image) -- and channel_shuffle and max_unpool2d on the CPU (the Triton
interpreter's sweep).  The CUDA rule is checked on fake CUDA tensors where torch was built
with CUDA (the GPU machine); the CPU tests compare compiled with eager, strides included."""
import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import frametrace
from differential import check
from frametrace.backends.kernel_formats import keep_kernel_formats

MODES = ["nearest", "nearest-exact", "bilinear", "bicubic"]


def _graph(mode, fake_mode, x):
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    class Up(torch.nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=2, mode=mode) + 1
    gm = torch.fx.symbolic_trace(Up())
    FakeTensorProp(gm, fake_mode).propagate(x)
    return gm


def _traced_output_stride(gm, fake_mode, x):
    """The output's strides in the graph AOTAutograd would trace (the Python dispatcher
    on, as it has it)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx
    with enable_python_dispatcher(), fake_mode:
        traced = make_fx(gm, tracing_mode="real")(x)
    out = next(n for n in traced.graph.nodes if n.op == "output").args[0]
    return (out[0] if isinstance(out, (list, tuple)) else out).meta["val"].stride()


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build of torch")
@pytest.mark.parametrize("mode", MODES)
def test_cuda_upsampling_of_channels_last_traces_channels_last(mode):
    fake_mode = FakeTensorMode()
    meta = torch.empty((2, 3, 5, 6), device="meta").contiguous(memory_format=torch.channels_last)
    x = FakeTensor(fake_mode, meta, torch.device("cuda"))
    cl = (360, 1, 36, 3)
    gm = _graph(mode, fake_mode, x)
    assert keep_kernel_formats(gm) == 1
    assert _traced_output_stride(gm, fake_mode, x) == cl


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
@pytest.mark.parametrize("mode", MODES + ["area"])
def test_pass_asks_only_for_a_channels_last_inputs_format(mode, layout):
    fake_mode = FakeTensorMode()
    x = torch.empty(2, 3, 5, 6)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(-1, -2)
    fx = fake_mode.from_tensor(x)
    gm = _graph(mode, fake_mode, fx)
    want = int(layout == "channels_last" and mode != "area")   # area: adaptive pooling
    assert keep_kernel_formats(gm) == want
    with fake_mode:
        assert gm(fx).stride() == F.interpolate(fx, scale_factor=2, mode=mode).add(1).stride()


@pytest.mark.parametrize("backend", ["aot_eager", "aot_eager_decomp_partition"])
@pytest.mark.parametrize("mode", MODES)
def test_aot_backends_return_eagers_strides(backend, mode):
    def f(x):
        return F.interpolate(x, scale_factor=2, mode=mode) * 2, x.sum()

    def cl(t):
        return t.contiguous(memory_format=torch.channels_last)
    inputs = [(cl(torch.randn(2, 3, 5, 6)),), (cl(torch.randn(2, 3, 5, 6) * 3),), (torch.randn(2, 3, 5, 6),)]
    outs = []

    def strides(fn):
        def run(x):
            out = fn(x)
            outs.append(out[0].stride())
            return out
        return run
    compiled = frametrace.optimize(f, backend=backend)
    for (x,) in inputs:
        assert strides(compiled)(x.clone(memory_format=torch.preserve_format))[0].stride() == f(x)[0].stride()
    check(f, inputs, backend=backend)


@pytest.mark.parametrize("on", [True, False])
def test_switch_turns_the_pass_off(monkeypatch, on):
    from frametrace.backends import aot_eager
    monkeypatch.setattr(frametrace.config, "keep_kernel_formats", on)
    added = []
    monkeypatch.setattr(aot_eager, "keep_kernel_formats", lambda gm: added.append(keep_kernel_formats(gm)))

    def f(x):
        return F.interpolate(x, scale_factor=2) + 1
    x = torch.randn(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(frametrace.optimize(f, backend="aot_eager")(x), f(x))
    assert added == ([1] if on else [])


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


CPU_OPS = {
    "channel_shuffle": lambda x: F.channel_shuffle(x, 2) * 2,
    "ChannelShuffle": lambda x: torch.nn.ChannelShuffle(2)(x) + 1,
    "max_unpool2d": lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2) - 1,
}


@pytest.mark.parametrize("backend", ["aot_eager", "triton"])
@pytest.mark.parametrize("name", sorted(CPU_OPS))
def test_cpu_format_keeping_ops_return_eagers_strides(name, backend, monkeypatch):
    if backend == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")
    f = CPU_OPS[name]
    inputs = [(_cl(torch.randn(2, 4, 6, 6)),), (_cl(torch.randn(2, 4, 6, 6)) * 3,), (torch.randn(2, 4, 6, 6),)]
    compiled = frametrace.optimize(f, backend=backend)
    for (x,) in inputs:
        want, got = f(x.clone(memory_format=torch.preserve_format)), compiled(x.clone(memory_format=torch.preserve_format))
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride(), (got.stride(), want.stride())
    check(f, inputs, backend=backend)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_trace_does_not_answer_layout_reads_of_a_cuda_upsampling(device, layout):
    # the trace's fake of a CUDA upsampling of a channels-last image may be contiguous
    # where the kernel's is channels-last: reads of its layout are not answered from it
    # (a break, CPython reads the real tensor); on the CPU, and of a contiguous input,
    # the fake is right
    from frametrace.variables import tensor_layout
    fake_mode = FakeTensorMode()
    meta = torch.empty((2, 3, 5, 6), device="meta")
    if layout == "channels_last":
        meta = meta.contiguous(memory_format=torch.channels_last)
    x = FakeTensor(fake_mode, meta, torch.device(device))
    want = device == "cuda" and layout == "channels_last"
    assert tensor_layout.result_unsure("interpolate", (x,), {"scale_factor": 2}) == want
    assert tensor_layout.result_unsure("upsample_bilinear2d", (x, [10, 12], False), {}) == want


def _pixel_shuffle_graph(fake_mode, x, factor):
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    class Shuffle(torch.nn.Module):
        def forward(self, x):
            return F.pixel_shuffle(x, factor)
    gm = torch.fx.symbolic_trace(Shuffle())
    FakeTensorProp(gm, fake_mode).propagate(x)
    return gm


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build of torch")
@pytest.mark.parametrize("factor", [1, 3])
def test_cuda_pixel_shuffle_of_channels_last_traces_contiguous(factor):
    # CUDA's kernel (math_pixel_shuffle) gives a contiguous result; torch's reference
    # decomposition kept the channels-last format (the H200 sweep: strides
    # (36, 1, 18, 9) from the triton backend where eager gave (36, 4, 2, 1))
    fake_mode = FakeTensorMode()
    meta = torch.empty((1, 9, 2, 2), device="meta").contiguous(memory_format=torch.channels_last)
    x = FakeTensor(fake_mode, meta, torch.device("cuda"))
    gm = _pixel_shuffle_graph(fake_mode, x, factor)
    assert keep_kernel_formats(gm) == 1
    shape = (1, 9 // factor ** 2, 2 * factor, 2 * factor)
    assert _traced_output_stride(gm, fake_mode, x) == torch.empty(shape).stride()


@pytest.mark.parametrize("factor", [1, 3])
def test_cpu_pixel_shuffle_keeps_its_format_untouched(factor):
    # (the CPU kernel keeps channels-last, as the decomposition does: nothing to ask)
    x = torch.randn(1, 9, 2, 2).contiguous(memory_format=torch.channels_last)
    gm = _pixel_shuffle_graph(FakeTensorMode(allow_non_fake_inputs=True), x, factor)
    assert keep_kernel_formats(gm) == 0
    check(lambda x: F.pixel_shuffle(x, factor),
          [(torch.randn(1, 9, 2, 2).contiguous(memory_format=torch.channels_last),) for _ in range(2)],
          backend="aot_eager")
