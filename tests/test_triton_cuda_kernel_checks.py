"""backend="triton" on CUDA where aten's CUDA kernels check or lay out what the
decompositions and fake tensors do not (found by the OpInfo sweep on the H200):

- an attention operand whose layout eager's kernel rejects (a channels-last query for
  `_efficient_attention_forward`) is passed as eager has it, so the call raises as eager's
  does (the wrapper realigns only operands our kernels stored in another layout);
- a softmax gradient whose grad and input dtypes differ stays the aten call, whose checks
  CUDA's kernel makes
  (the decomposition would compute an answer where eager raises);
- inference batch norm's saved statistics are tensors of their own, never the running
  mean itself (the decomposition returned `running_mean.to(dtype)`, the same tensor).

They need a GPU (the machine's suite runs them); each compares with eager through
`check` and asserts the graph went through the triton backend."""
import pytest
import torch

from differential import check

pytest.importorskip("triton")
from frametrace.backends.triton import backend  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
aten = torch.ops.aten


def _went_through_triton():
    assert backend.COMPILED, "no graph went through the triton backend"


def test_efficient_attention_rejects_a_channels_last_query_as_eager():
    backend.COMPILED.clear()

    def f(q, k, v):
        return aten._efficient_attention_forward(q, k, v, None, None, None, None, None, 0.0, 0, False)[0] * 2

    def qkv(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q, k, v = (torch.randn(2, 8, 4, 16, device="cuda", generator=g) for _ in range(3))
        return q.contiguous(memory_format=torch.channels_last), k, v
    with pytest.raises(RuntimeError):
        f(*qkv(0))
    check(f, [qkv(0), qkv(1)], backend="triton")


@pytest.mark.parametrize("input_dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_softmax_backward_with_a_dtype_cuda_rejects_raises_as_eager(input_dtype):
    def f(g, out):
        return aten._softmax_backward_data(g, out, 1, input_dtype) + 1

    def args(s):
        gen = torch.Generator(device="cuda").manual_seed(s)
        return torch.randn(4, 5, device="cuda", generator=gen), torch.rand(4, 5, device="cuda", generator=gen)
    try:
        f(*args(0))
        eager_raises = False
    except RuntimeError:
        eager_raises = True
    check(f, [args(0), args(1)], backend="triton")
    if not eager_raises:
        _went_through_triton()


def test_inference_batch_norm_statistics_do_not_alias_the_running_mean():
    backend.COMPILED.clear()

    def f(x, w, b, rm, rv):
        out, mean, invstd = aten.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)
        return out, mean, invstd, mean is rm

    def args(s):
        gen = torch.Generator(device="cuda").manual_seed(s)
        return (torch.randn(4, 3, 5, device="cuda", generator=gen), torch.rand(3, device="cuda", generator=gen),
                torch.randn(3, device="cuda", generator=gen), torch.randn(3, device="cuda", generator=gen),
                torch.rand(3, device="cuda", generator=gen) + 0.5)
    check(f, [args(0), args(1)], backend="triton")
    x, w, b, rm, rv = args(2)
    import frametrace
    _, mean, _, _ = frametrace.optimize(f, backend="triton")(x, w, b, rm, rv)
    assert mean.untyped_storage().data_ptr() != rm.untyped_storage().data_ptr()
    _went_through_triton()
