"""Attacks on the MoE-loop fast paths (tests/test_triton_moe_loop.py): shared kernel
sources by symbol position (`config.canonical_symbols`), runtime asserts as Python
comparisons (`config.python_size_asserts`), one nonzero of stacked masks
(`config.batch_nonzero`), extern ordering by the sizes they read and bind (foreach), and
CUDA's NaN-propagating pooling max (`config.pool_hardware_max`).  Each program runs
compiled and eagerly over several calls with varied inputs (tests/differential.py), and
checks what compiled: graph count, no fallbacks, and that the fast path fired."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config as tconfig  # noqa: E402
from differential import check  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture(autouse=True)
def _capture(monkeypatch):
    monkeypatch.setattr(frametrace.config, "capture_dynamic_output_shape_ops", True)
    monkeypatch.setattr(frametrace.config, "capture_scalar_outputs", True)


def _srcs():
    return [m.source for m in backend.COMPILED]


def _batched(n=None):
    srcs = _srcs()
    got = sum(s.count("nonzeros(") for s in srcs)
    return got if n is None else got == n


# ---- batch_nonzero -------------------------------------------------------------------

def three_d(x):
    return (x > 0).nonzero(), (x < -0.5).nonzero(), (x.abs() > 1).nonzero()


def one_d(x):
    return (x > 0).nonzero(), (x < 0).nonzero(), torch.where(x > 1)


def non_contiguous(x):
    t = x.t()
    return (t > 0).nonzero(), (t < 0).nonzero() + 1


def expanded(x):
    m = (x[0] > 0).expand(3, x.shape[1])
    return m.nonzero(), (x > 0).nonzero()


def channels_last(x):
    y = x.contiguous(memory_format=torch.channels_last)
    return (y > 0).nonzero(), (y < 0).nonzero()


def float_masks(x):
    # (float, int and NaN values: nonzero counts NaN, -0.0 is zero)
    a = x * (x.abs() > 0.5)
    b = (x * 3).to(torch.int32)
    return a.nonzero(), (a + 0).nonzero(), b.nonzero(), (b - 1).nonzero()


def argwhere_and_index(x, y):
    m, n = x > 0, y > 0
    return torch.argwhere(m), x[m], y[n], torch.argwhere(n)


def aliasing_masks(x):
    m = x > 0
    return m.nonzero(), m.nonzero(), m[:].nonzero()


def many(x):
    return [(x > t / 10).nonzero() for t in range(-6, 6)]


def dependent(x):
    a = (x[0] > 0).nonzero()
    k = a.shape[0]
    b = (x[1] > k / 10).nonzero()
    c = (x[2] > 0).nonzero()
    return a, b, c


def with_random(x):
    a = (x > 0).nonzero()
    r = torch.rand_like(x)
    b = (x > r).nonzero()
    return a, b, (x < 0).nonzero()


def empty_masks(x):
    # (masks with nothing set: parts of no row)
    return (x > 100).nonzero(), (x > 200).nonzero(), (x < -100).nonzero()


def unbacked_masks(x, y):
    # (masks whose size the data decides: stacked at their shared u0, 0 on a call)
    a = (x > 0).nonzero()[:, 0]
    v = y[a]
    return (v > 0).nonzero(), (v < 0).nonzero(), (v.abs() > 1).nonzero()


def views_of_one(x):
    # (each mask a view at its own offset of one permuted buffer, as the MoE router's)
    m = (x > 0).permute(2, 0, 1)
    return [m[i].nonzero() for i in range(m.shape[0])]


def test_batch_nonzero_unbacked_and_view_masks():
    g = torch.Generator().manual_seed(9)
    calls = [(torch.randn(6, generator=g), torch.randn(6, 3, generator=g)) for _ in range(3)]
    calls.append((-torch.ones(6), torch.randn(6, 3, generator=g)))
    backend.COMPILED.clear()
    check(unbacked_masks, calls, backend="triton", graphs=1, breaks=0, fallbacks=0, rtol=0, atol=0)
    assert _batched(1), _srcs()
    backend.COMPILED.clear()
    check(views_of_one, [(torch.randn(3, 4, 5, generator=g),) for _ in range(3)], backend="triton",
          graphs=1, breaks=0, fallbacks=0, rtol=0, atol=0)
    assert _batched(1) and _srcs()[0].count("= nonzeros0[") == 5, _srcs()


def _xs(shape, n=4, nan=False, seed=3):
    g = torch.Generator().manual_seed(seed)
    calls = []
    for i in range(n):
        x = torch.randn(*shape, generator=g)
        if nan:
            x.view(-1)[i] = float("nan")
        if i == 1:
            x.view(-1)[:3] = -0.0
        calls.append((x,))
    return calls


@pytest.mark.parametrize("fn, shape, nbatch", [
    (three_d, (3, 4, 5), 1), (one_d, (9,), 1), (non_contiguous, (4, 6), 1),
    (expanded, (3, 7), 0), (channels_last, (2, 3, 4, 5), 1), (float_masks, (5, 6), None),
    (aliasing_masks, (4, 5), 1), (many, (4, 5), None), (dependent, (3, 8), None),
    (empty_masks, (3, 4), None)])
def test_batch_nonzero_shapes(fn, shape, nbatch):
    backend.COMPILED.clear()
    check(fn, _xs(shape, nan=fn in (float_masks, three_d)), backend="triton", graphs=1,
          breaks=0, fallbacks=0, rtol=0, atol=0)
    if nbatch is not None:
        assert _batched() == nbatch, _srcs()
    else:
        assert _batched() >= (fn is not dependent), _srcs()


def test_batch_nonzero_index_and_argwhere():
    backend.COMPILED.clear()
    g = torch.Generator().manual_seed(4)
    calls = [(torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)) for _ in range(3)]
    check(argwhere_and_index, calls, backend="triton", graphs=1, breaks=0, fallbacks=0)


def test_batch_nonzero_with_random_ops():
    # (the backend's random numbers are not eager's: each mask's nonzero against the
    # random values the graph returns)
    backend.COMPILED.clear()
    cf = frametrace.optimize(backend="triton")(lambda x: with_random(x) + (x,))
    for (x,) in _xs((4, 5)):
        a, b, c, _ = cf(x)
        assert torch.equal(a, (x > 0).nonzero()) and torch.equal(c, (x < 0).nonzero())
        assert b.shape[1] == 2 and b.dtype == torch.int64
    assert _batched() >= 1


def rows(x):
    return (x > 0).nonzero(), (x < 0).nonzero(), (x[0] > 0).nonzero(), (x[1] > 0).nonzero()


def test_batch_nonzero_strides_and_memory_match_eager():
    # (parts of no row, one row and several: eager's (1, n) strides, and each its own
    # memory, not a view of the batch's one nonzero)
    backend.COMPILED.clear()
    cf = frametrace.optimize(backend="triton")(rows)
    for x in ([[1., -1, 1, 1], [-1, -1, -1, 1]], [[1., -1, -1, -1], [-1, -1, -1, 1]],
              [[-1., -1, -1, -1], [-1, -1, -1, -1]], [[1., -1, -1, -1], [-1, -1, -1, 1]]):
        x = torch.tensor(x)
        got = cf(x)
        for w, g_ in zip(rows(x), got):
            assert torch.equal(w, g_) and w.stride() == g_.stride(), (w.stride(), g_.stride())
        ptrs = [t.untyped_storage().data_ptr() for t in got if t.numel()]
        assert len(set(ptrs)) == len(ptrs)
        got[2].add_(100)    # (writing one result leaves the others as they were)
        assert torch.equal(got[3], (x[1] > 0).nonzero())
    assert _batched(2) and len(backend.COMPILED) == 1, _srcs()


def test_batch_nonzero_dynamic_sizes():
    backend.COMPILED.clear()
    g = torch.Generator().manual_seed(5)
    calls = [(torch.randn(n, 3, generator=g),) for n in (4, 6, 9, 2, 9)]
    r = check(rows, calls, backend="triton", breaks=0, fallbacks=0, rtol=0, atol=0)
    assert r.graphs <= 2, r
    assert "nonzeros(" in backend.COMPILED[-1].source


# ---- python_size_asserts -------------------------------------------------------------

def equal_counts(x, y):
    # (the condition reads u0 and u1, the message neither: the wrapper's del of them
    # went between the `if` and its raise, an IndentationError compiling the wrapper)
    a, b = x.nonzero(), y.nonzero()
    torch._check(a.shape[0] == b.shape[0])
    return a + b


def mod_and_max(x):
    n = x.nonzero().shape[0]
    torch._check(n % 2 == 0)
    torch._check(n // 3 != 1)
    torch._check(max(n, 2) < 7)
    return x * n


def item_size(x):
    n = x.sum().item()
    torch._check_is_size(n)
    torch._check(n < 10)
    return torch.zeros(n) + 1


def callable_msg(x):
    n = x.nonzero().shape[0]
    torch._check(n != 2, lambda: f"bad count {n}")
    return torch.arange(n) * 2.0


def _t(*vals, dtype=torch.float32):
    return (torch.tensor(vals, dtype=dtype),)


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("fn, calls", [
    (equal_counts, [_t(1., 0, 1) + _t(1., 1, 0), _t(1., 0, 1) + _t(1., 1, 1), _t(0., 0, 1) + _t(0., 1, 0)]),
    (mod_and_max, [_t(1., 0, 1, 0), _t(1., 1, 1, 1), _t(1., 1, 0, 0), _t(0., 1, 1, 1), _t(0., 1, 1, 0)]),
    (item_size, [_t(1, 2, dtype=torch.int64), _t(5, 6, dtype=torch.int64), _t(-5, 2, dtype=torch.int64),
                 _t(0, 3, dtype=torch.int64)]),
    (callable_msg, [_t(1., 0, 1, 1), _t(1., 0, 1, 0), _t(0., 1, 1, 1), _t(0., 0, 0, 0)])])
def test_python_size_asserts(monkeypatch, on, fn, calls):
    monkeypatch.setattr(tconfig, "python_size_asserts", on)
    backend.COMPILED.clear()
    check(fn, calls, backend="triton", graphs=1, breaks=0, fallbacks=0)
    src = backend.COMPILED[0].source
    assert ("raise RuntimeError(" in src) == on, src


# ---- extern order by the sizes read and bound (foreach) --------------------------------

def optimizer_like(p, g, m):
    p.add_(g, alpha=-0.1)
    idx = (g > 0).nonzero()
    n = idx.shape[0]
    torch._check(n <= p.numel())
    m.mul_(0.9).add_(g)
    return idx, p.sum() * n


def item_then_write(x, y):
    n = (x > 0).sum().item()
    torch._check_is_size(n)
    torch._check(n <= x.shape[0])
    y.add_(1)
    return torch.ones(n) * y[0], y[:n] * 2


def unique_then_write(x, y):
    u = torch.unique(x)
    y.mul_(2)
    return u * 2, y + u.shape[0]


def nonzeros_and_writes(x, y):
    a = (x > 0).nonzero()
    y.add_(a.shape[0])
    b = (y > 1).nonzero()
    x.sub_(1)
    return a, b, torch.zeros(a.shape[0] + b.shape[0])


@pytest.mark.parametrize("fn", [optimizer_like, item_then_write, unique_then_write, nonzeros_and_writes])
def test_inputs_written_with_data_sizes(fn):
    g = torch.Generator().manual_seed(6)
    if fn is optimizer_like:
        calls = [tuple(torch.randn(6, generator=g) for _ in range(3)) for _ in range(3)]
    elif fn is unique_then_write:
        calls = [(torch.randint(0, 5, (8,), generator=g).float(), torch.randn(3, generator=g)) for _ in range(3)]
    else:
        calls = [(torch.randn(8, generator=g), torch.randn(8, generator=g)) for _ in range(3)]
    backend.COMPILED.clear()
    check(fn, calls, backend="triton", graphs=1, breaks=0, fallbacks=0)
    assert len(backend.COMPILED) == 1


# ---- pool_hardware_max ---------------------------------------------------------------

@pytest.fixture
def cuda_pool(monkeypatch):
    from frametrace.backends.triton import ops
    monkeypatch.setattr(ops, "_on_cuda", lambda L: True)


def _pool_input(dtype, shape=(2, 3, 9, 9)):
    g = torch.Generator().manual_seed(7)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        x = torch.randint(max(info.min, -100), min(info.max, 100), shape, generator=g, dtype=torch.int64)
        x.view(-1)[::7] = info.min
        x.view(-1)[1::11] = info.max
        return x.to(dtype)
    x = torch.randn(*shape, generator=g)
    if x.dim() == 3:
        x[0, 0, :3] = float("nan")
        x[1] = float("-inf")
        return x.to(dtype)
    x[0, 0, 0, 0] = float("nan")       # (a window's first tap NaN, later ones larger)
    x[0, 0, 0, 1] = 5.0
    x[0, 1] = float("-inf")
    x[1, 0, 3, 3:6] = float("nan")
    x[1, 1, :, 2] = float("inf")
    return x.to(dtype)


@pytest.mark.usefixtures("cuda_pool")
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int64, torch.float16, torch.bfloat16,
                                   torch.float32])
@pytest.mark.parametrize("args", [dict(kernel_size=3, stride=2, padding=1),
                                  dict(kernel_size=2, stride=2, dilation=2, ceil_mode=True),
                                  dict(kernel_size=(3, 2), stride=(1, 3), padding=(1, 1), ceil_mode=True)])
def test_pool_hardware_max(dtype, args):
    from triton_harness import triton_check
    mod = triton_check(lambda x: F.max_pool2d(x, **args), _pool_input(dtype), half_as_float=True)
    assert any("tl.maximum(" in k.source for k in mod.kernels), [k.source for k in mod.kernels]
    triton_check(lambda x: F.max_pool2d(x, **args), _pool_input(dtype, (3, 8, 7)), half_as_float=True)


@pytest.mark.usefixtures("cuda_pool")
def test_pool_hardware_max_not_with_indices():
    from triton_harness import triton_check, triton_check_grads
    x = _pool_input(torch.float32)
    mod = triton_check(lambda x: F.max_pool2d(x, 3, 2, padding=1, return_indices=True), x)
    assert not any("tl.maximum(" in k.source for k in mod.kernels)
    y = torch.randn(2, 3, 9, 9).requires_grad_()
    triton_check_grads(lambda x: F.max_pool2d(x, 3, 2, padding=1).sum(), y)


# ---- a failing check and the graph's writes of its inputs ------------------------------

def check_then_write(x, m):
    n = m.nonzero().shape[0]
    torch._check(n != 2)
    x.add_(n)
    return x * 2


def check_then_two_writes(x, y, m):
    a = m.nonzero()
    torch._check(a.shape[0] != 2)
    x.mul_(a.shape[0])
    y.add_(x)
    return a


_MASKS = [torch.tensor(v) for v in ([1., 0, 1, 1], [1., 0, 1, 0], [0., 1, 1, 1], [0., 0, 1, 1], [0., 0, 1, 0])]


@pytest.mark.parametrize("asserts", [True, False])
@pytest.mark.parametrize("fn", [check_then_write, check_then_two_writes])
def test_failing_check_before_input_writes(monkeypatch, asserts, fn):
    # (the store into the input was scheduled before the check, which reads nothing it
    # makes: a failing call left x written where eager raises first)
    monkeypatch.setattr(tconfig, "python_size_asserts", asserts)
    g = torch.Generator().manual_seed(8)
    calls = [(torch.randn(4, generator=g),) * (1 if fn is check_then_write else 0) +
             ((torch.randn(4, generator=g), torch.randn(4, generator=g)) if fn is check_then_two_writes else ()) +
             (m,) for m in _MASKS]
    backend.COMPILED.clear()
    check(fn, calls, backend="triton", graphs=1, breaks=0, fallbacks=0)


def write_then_check(x, m):
    x.add_(1)
    n = m.nonzero().shape[0]
    torch._check(n != 2)
    return x * n


@pytest.mark.parametrize("first", [True, False])
def test_failing_check_after_input_write_is_consistent(first):
    # (the functional graph writes its inputs at its end, as torch.compile's: a check that
    # fails leaves them unwritten, on the first call (run again as the graph) as on later
    # ones (the wrapper's own raise); the kernel's store went before the check, and a later
    # call raised with the input written)
    cf = frametrace.optimize(backend="triton")(write_then_check)
    masks = _MASKS[1:] if first else _MASKS
    for m in masks:
        x = torch.randn(4)
        before = x.clone()
        if m.count_nonzero() == 2:
            with pytest.raises(RuntimeError):
                cf(x, m)
            assert torch.equal(x, before)
        else:
            out = cf(x, m)
            assert torch.equal(x, before + 1) and torch.equal(out, (before + 1) * m.count_nonzero())


def size_vs_input(x, m):
    n = m.nonzero().shape[0]
    torch._check(n < x.shape[0])     # (an unbacked size against an input's)
    return x[:n] * 2


def test_python_size_assert_against_input_size():
    g = torch.Generator().manual_seed(10)
    calls = [(torch.randn(n, generator=g), torch.rand(5, generator=g) > p)
             for n, p in ((6, .5), (6, .1), (3, .2), (8, .9), (3, .5))]
    backend.COMPILED.clear()
    check(size_vs_input, calls, backend="triton", max_graphs=2, breaks=0, fallbacks=0)
    assert all("raise RuntimeError(" in s for s in _srcs())


def assert_async(x):
    torch._assert_async((x > -5).all())
    return x * 2


@pytest.mark.parametrize("be", ["triton", "aot_eager", "eager"])
def test_assert_async_raises(be):
    # (torch._assert_async(t) is recorded with eager's message: the overload without one
    # is no side effect to torch.fx, and AOTAutograd dropped it, as under torch.compile)
    check(assert_async, [(torch.randn(4),), (torch.full((4,), -6.0),), (torch.randn(4),)], backend=be)


# ---- the expert loop with the graph's writes and under autograd -------------------------

E = 4


def moe_stats(h, idx, w1, counts):
    # (a per-expert token count kept in an input: input writes that read each u_e, with
    # the batched nonzeros, and their asserts, before them)
    final = torch.zeros_like(h)
    mask = F.one_hot(idx, num_classes=E).permute(2, 1, 0)
    for e in range(E):
        pos, tok = torch.where(mask[e])
        counts[e] += tok.shape[0]
        final.index_add_(0, tok, F.silu(F.linear(h[tok], w1[e])))
    return final


def moe_train(h, idx, w1):
    final = torch.zeros_like(h)
    mask = F.one_hot(idx, num_classes=E).permute(2, 1, 0)
    for e in range(E):
        pos, tok = torch.where(mask[e])
        final = final.index_add(0, tok, F.silu(F.linear(h[tok], w1[e])))
    return final.sum()


def _moe_calls():
    g = torch.Generator().manual_seed(11)
    w1 = torch.randn(E, 8, 8, generator=g) / 3
    calls = []
    for i in range(4):
        idx = torch.zeros(10, 2, dtype=torch.long) if i == 2 else torch.randint(0, E, (10, 2), generator=g)
        calls.append((torch.randn(10, 8, generator=g), idx, w1, torch.zeros(E)))
    return calls


def test_moe_loop_writing_an_input():
    backend.COMPILED.clear()
    check(moe_stats, _moe_calls(), backend="triton", graphs=1, breaks=0, fallbacks=0, rtol=1e-4, atol=1e-4)
    assert _batched(1), _srcs()


def test_moe_loop_under_autograd():
    from differential import check_grads
    calls = [(h.clone().requires_grad_(), idx, w.clone().requires_grad_()) for h, idx, w, _ in _moe_calls()]
    backend.COMPILED.clear()
    check_grads(moe_train, calls, backend="triton", graphs=1, breaks=0, fallbacks=0, rtol=1e-4, atol=1e-4)
    assert _batched() >= 1, _srcs()


def two_batches_write(x, y, st):
    # (two batches, of two shapes, whose counts an input write reads, and a check on them)
    a, b = (x > 0).nonzero(), (x < 0).nonzero()
    c, d = (y > 0).nonzero(), (y < -1).nonzero()
    st.add_(torch.tensor([a.shape[0], b.shape[0], c.shape[0], d.shape[0]], dtype=st.dtype))
    torch._check(a.shape[0] + b.shape[0] <= x.numel())
    return a, b, c, d


def test_two_batches_and_an_input_write():
    g = torch.Generator().manual_seed(12)
    calls = [(torch.randn(3, 4, generator=g), torch.randn(5, generator=g), torch.zeros(4)) for _ in range(3)]
    backend.COMPILED.clear()
    check(two_batches_write, calls, backend="triton", graphs=1, breaks=0, fallbacks=0)
    assert _batched(2), _srcs()
