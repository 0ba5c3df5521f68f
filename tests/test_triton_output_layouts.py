"""The triton backend's outputs laid out as eager's: views eager returns of one
intermediate (unbind's or split's pieces) are views of one stored buffer, with eager's
strides; and upsampling keeps the input's memory format, as aten's kernels do on every
device: torch's decompositions (and the meta functions fake tensors
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

import frametrace  # noqa: E402

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


def _pieces_share_memory(outs):
    return len({t.untyped_storage().data_ptr() for t in outs}) == 1


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("fn", [
    lambda i: torch.unravel_index(i, (3, 4)),                       # a stack, unbound
    lambda i: torch.stack([i * 2, i + 1, i - 3], dim=-1).unbind(-1),
    lambda i: (i.float() * 2).view(-1, 1).expand(-1, 4).split([1, 3], dim=1),
    lambda i: (i * 3, (i + 1).unsqueeze(0).t()),                       # one a view, one not
], ids=["unravel_index", "stack_unbind", "expand_split", "mixed"])
def test_views_returned_of_one_intermediate_are_views_of_one_buffer(fn):
    calls = [(torch.tensor([1, 5, 7]),), (torch.tensor([0, 11, 2]),)]
    triton_check(fn, calls=calls, strides=True)
    want, got = fn(*calls[0]), frametrace.optimize(fn, backend="triton")(*calls[0])
    # which outputs share memory, as in eager
    assert _pieces_share_memory(want) == _pieces_share_memory(got)
