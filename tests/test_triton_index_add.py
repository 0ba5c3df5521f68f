"""index_add stays aten's kernel under backend="triton" (decompositions.py): torch's
decomposition makes it an accumulating index_put, whose CUDA kernel sorts the indices on
every call.  Checked against eager on fresh inputs: repeated indices, alpha, other dims,
the in-place form on a graph input and on a fresh buffer (a Mixtral expert loop's
combine), bf16, NaN, an out-of-range index (raises as in eager), symbolic sizes."""
import pytest
import torch

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend  # noqa: E402
from differential import check  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _ops(mod):
    return [str(e) for e in mod.externs]


def combine(h, idx, w):
    out = torch.zeros_like(h)
    for e in range(3):
        tok = idx[e]
        out.index_add_(0, tok, (h[tok] * w[e]).to(out.dtype))
    return out


def other_dim(x, idx, src):
    return x.index_add(1, idx, src, alpha=0.5) * 2


def in_place_on_input(x, idx, src):
    x.index_add_(0, idx, src)
    return x.sum()


def _idx(n, k, g):
    return torch.randint(0, n, (k,), generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_add_stays_one_aten_call(dtype):
    g = torch.Generator().manual_seed(0)
    calls = []
    for n in (8, 8, 12):
        h = torch.randn(n, 16, dtype=dtype, generator=g)
        h[0, 0] = float("nan")
        idx = torch.stack([_idx(n, 5, g) for _ in range(3)])    # (repeats: colliding rows)
        calls.append((h, idx, torch.randn(3, dtype=dtype, generator=g)))
    report = check(combine, calls, backend="triton", breaks=0, fallbacks=0,
                   rtol=2e-2 if dtype is torch.bfloat16 else 1e-5, atol=2e-2 if dtype is torch.bfloat16 else 1e-6)
    ops = [op for m in backend.COMPILED[-2:] for op in _ops(m)]
    assert any("index_add" in op for op in ops), ops
    assert not any("index_put" in op for op in ops), ops
    assert report.graphs >= 1


def test_index_add_other_dims_and_in_place_on_inputs():
    g = torch.Generator().manual_seed(1)
    check(other_dim, [(torch.randn(4, 6, generator=g), torch.tensor([0, 5, 5]), torch.randn(4, 3, generator=g))
                      for _ in range(3)], backend="triton", breaks=0, fallbacks=0)
    frametrace.reset()
    check(in_place_on_input, [(torch.randn(6, 3, generator=g), torch.tensor([1, 1, 4]), torch.randn(3, 3, generator=g))
                              for _ in range(3)], backend="triton", breaks=0, fallbacks=0)


def test_out_of_range_index_raises_as_in_eager():
    check(other_dim, [(torch.randn(4, 6), torch.tensor([0, 6]), torch.randn(4, 2))], backend="triton",
          graphs=None)


def scalar_index_add(x, idx, src):
    return torch.index_add(x, 0, idx, src, alpha=2).exp()


def scalar_select(x, idx):
    return torch.index_select(x * 2, 0, idx)


def test_index_add_of_0d_tensors_trains():
    """index_add's own derivative takes the source's gradient by index_select, of the 0-d
    gradient for 0-d tensors (an OpInfo sample): ops.py's index_select divided by the
    rank there (ZeroDivisionError while compiling, where the decomposition's backward
    indexed instead)."""
    from differential import check_grads
    check_grads(scalar_index_add, [(torch.tensor(1.5, requires_grad=True), idx, torch.tensor(0.5, requires_grad=True))
                                   for idx in (torch.tensor([0]), torch.tensor(0))], backend="triton", breaks=0)


def test_index_select_of_a_0d_tensor_raises_as_in_eager():
    x = torch.tensor(1.5)
    check(scalar_select, [(x, torch.tensor([0])), (x, torch.tensor(0))], backend="triton", breaks=0)
    for idx in (torch.tensor([1]), torch.tensor([-1]), torch.tensor([0, 0])):  # (eager raises each)
        frametrace.reset()
        check(scalar_select, [(x, idx)], backend="triton", graphs=None)


def scalar_squeeze(x):
    return (x * 2).squeeze(0).squeeze(-1).squeeze() + 1


def test_squeeze_of_a_0d_tensor():
    """(index_add's 0-d gradient squeezes a 0-d tensor: ops.py's squeeze divided by the
    rank there)"""
    check(scalar_squeeze, [torch.tensor(1.5)], backend="triton", breaks=0)


def own_source(x, idx):
    y = x * 2
    return y.index_add(0, idx, y)


def own_index(x, src):
    y = (x * 4).long() % 4
    return y.index_add(0, y, src)


def test_a_buffer_read_as_another_operand_is_not_written_in_place(caplog):
    """lowering.py's in-place twin (index_add_ for index_add on a buffer the graph
    computed, read by nothing else) took `y.index_add(0, idx, y)` for one that nothing
    else reads (its one FX user is the index_add itself): aten's index_add_ refused the
    overlap, and every call ran the graph up to it, then the frame again in CPython."""
    check(own_source, [(torch.randn(4, 3), torch.tensor([1, 2, 3, 0]))], backend="triton", breaks=0)
    frametrace.reset()
    check(own_index, [(torch.randn(4) + 2, torch.tensor([5, 5, 5, 5]))], backend="triton", breaks=0)
    assert "the frame runs in CPython" not in caplog.text


def _slice_in_place(x, idx, src):
    x[1:].index_add_(0, idx, src)
    return x * 2


def _transposed_in_place(x, idx, src):
    x.t().index_add_(0, idx, src)
    return x.sum(0)


def _column_in_place(x, idx, src):
    x[:, 1].index_add_(0, idx.long(), src[:, 0])
    return x + 0


def _last_dim(x, idx, src):
    return x.index_add(-1, idx, src.t()[:, :idx.shape[0]], alpha=3)    # (a transposed source)


def _out_form(x, idx, src, out):
    torch.index_add(x, 0, idx, src, alpha=True, out=out)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int8, torch.bool, torch.float64])
def test_index_add_on_views_other_dtypes_and_indices(dtype):
    """In place on a slice, a transpose and a column of an input; the last dim of a
    non-contiguous source with an int alpha; the out= form; int32, empty and repeated
    indices, integer and bool tensors: as eager."""
    g = torch.Generator().manual_seed(2)

    def t(*shape):
        v = torch.randn(*shape, generator=g) * 3
        return v > 0 if dtype is torch.bool else v.to(dtype)
    for idx in (torch.tensor([0, 3, 3]), torch.tensor([2, 0, 2], dtype=torch.int32)):
        for f, args in ((_slice_in_place, (t(5, 3), idx, t(3, 3))), (_transposed_in_place, (t(5, 4), idx, t(3, 5))),
                        (_column_in_place, (t(5, 3), idx, t(3, 3))), (_out_form, (t(4, 3), idx, t(3, 3), t(4, 3)))):
            frametrace.reset()
            check(f, [args], backend="triton", breaks=0, fallbacks=0)
    if dtype is not torch.bool:     # (an int alpha: bool tensors take a bool)
        frametrace.reset()
        check(_last_dim, [(t(3, 6), torch.tensor([5, 0, 5]), t(6, 3)), (t(3, 6), torch.tensor([], dtype=torch.long), t(6, 3))],
              backend="triton", breaks=0, fallbacks=0)


def _trained(x, src, idx):
    y = (x * 2).index_add(1, idx, src * 3, alpha=0.5)
    y.index_add_(0, idx[:2], y[1:3] * 1)
    return y.sin()


def test_index_add_gradients_over_symbolic_sizes():
    from differential import check_grads
    g = torch.Generator().manual_seed(3)
    calls = [(torch.randn(n, k + 1, generator=g, requires_grad=True), torch.randn(n, k, generator=g, requires_grad=True),
              torch.randint(0, 2, (k,), generator=g)) for n, k in ((4, 2), (5, 3), (7, 4))]
    check_grads(_trained, calls, backend="triton", breaks=0, dynamic=True)


def test_index_add_opinfo_samples():
    """PyTorch's OpInfo samples of index_add (0-d tensors, negative dims, alphas), out of
    place, in place on the input, and their gradients, against eager."""
    from torch.testing._internal.common_methods_invocations import op_db
    from differential import check_grads
    op = next(o for o in op_db if o.name == "index_add")

    def out_of_place(x, dim, idx, src, alpha):
        return torch.index_add(x, dim, idx, src, alpha=alpha)

    def in_place(x, dim, idx, src, alpha):
        x.index_add_(dim, idx, src, alpha=alpha)
        return x
    for grad in (False, True):
        for s in op.sample_inputs("cpu", torch.float32, requires_grad=grad):
            args = (s.input, *s.args, s.kwargs.get("alpha", 1))
            for f in (out_of_place,) if grad else (out_of_place, in_place):
                frametrace.reset()
                (check_grads if grad else check)(f, [args], backend="triton", breaks=0)
