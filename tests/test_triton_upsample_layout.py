"""Upsampling keeps the input's memory format through the triton backend, as aten's
kernels do on every device: torch's decompositions (and the meta functions fake tensors
follow) store a CUDA image of few channels contiguous, a speed heuristic of Inductor's,
where eager's result is channels-last (seen on the H200 by the OpInfo sweep:
interpolate bilinear / nearest / nearest-exact of a 3-channel channels-last image)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

pytest.importorskip("triton")
from frametrace.backends.triton.decompositions import decompositions  # noqa: E402
from triton_harness import triton_check  # noqa: E402

aten = torch.ops.aten

CASES = [
    (aten.upsample_nearest2d.vec, (2, 3, 5, 6), ([10, 12], None)),
    (aten.upsample_nearest2d.default, (2, 3, 5, 6), ([10, 12],)),
    (aten._upsample_nearest_exact2d.vec, (2, 3, 5, 6), ([7, 9], None)),
    (aten.upsample_bilinear2d.vec, (2, 3, 5, 6), ([10, 12], False, None)),
    (aten.upsample_bilinear2d.default, (2, 3, 5, 6), ([10, 12], True)),
    (aten.upsample_trilinear3d.vec, (1, 2, 3, 4, 5), ([6, 8, 10], False, None)),
]


@pytest.mark.parametrize("op,shape,args", CASES, ids=[str(c[0]) for c in CASES])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_decomposition_keeps_the_inputs_memory_format(op, shape, args, device):
    # (fake tensors: the CUDA rule is checked without a GPU)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    mode = FakeTensorMode()
    x = FakeTensor(mode, torch.empty(shape, device="meta").contiguous(memory_format=fmt), torch.device(device))
    plain = FakeTensor(mode, torch.empty(shape, device="meta"), torch.device(device))
    with mode:
        out = decompositions()[op](x, *args)
        out_plain = decompositions()[op](plain, *args)
    assert out.is_contiguous(memory_format=fmt), out.stride()
    assert out_plain.is_contiguous(), out_plain.stride()


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
def test_interpolate_values_and_strides_as_eager(mode, layout):
    def f(x):
        return F.interpolate(x, scale_factor=2, mode=mode) + 1

    x = torch.randn(2, 3, 5, 6)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(-1, -2)
    triton_check(f, x, calls=[(x,), (x * 2,)], strides=True)
