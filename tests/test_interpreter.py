"""The symbolic interpreter: each test compares with eager and checks what compiled
(graphs and ops), through the counting backend."""
import math
import operator

import torch
import torch.nn.functional as F


from conftest import compile_with

SCALE = 3.0
WEIGHT = torch.randn(4)


def check(cnt, fn, *args, graphs=1, ops=None, **kwargs):
    """Compile fn, compare two calls with eager, check counts; returns the result."""
    expected = fn(*args, **kwargs)
    compiled = compile_with(cnt, fn, fullgraph=True)
    got = compiled(*args, **kwargs)
    again = compiled(*args, **kwargs)
    _assert_same(got, expected)
    _assert_same(again, expected)
    assert cnt.frame_count == graphs, f"{cnt.frame_count} graphs, expected {graphs}"
    if ops is not None:
        assert cnt.op_count == ops, f"{cnt.op_count} ops, expected {ops}"
    return got


def _assert_same(got, expected):
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _assert_same(g, e)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for k in expected:
            _assert_same(got[k], expected[k])
    else:
        assert got == expected


def test_issue_example(cnt):
    def f(x, y):
        return (x.sin() + y).relu() * 2
    check(cnt, f, torch.randn(8), torch.randn(8), ops=4)


def test_torch_functions_and_functional(cnt):
    def f(x):
        a = torch.cat([torch.tanh(x), F.softmax(x, dim=-1)], dim=0)
        b = F.layer_norm(x, (x.shape[-1],))
        return torch.stack([a[:4], b]).sum(dim=0)
    check(cnt, f, torch.randn(4), ops=7)


def test_tensor_methods_and_operators(cnt):
    def f(x, y):
        z = x.matmul(y.t()) @ y - x.abs().sqrt() / (y ** 2 + 1)
        return -z, z.mean(dim=1, keepdim=True), ~(z > 0), z % 2, z // 3
    check(cnt, f, torch.randn(3, 3), torch.randn(3, 3))


def test_inplace_ops_on_locals(cnt):
    def f(x):
        y = x.clone()
        y += 1
        y.mul_(2)
        y[0] = 0.0
        return y
    x = torch.randn(5)
    check(cnt, f, x, ops=4)


def test_tensor_attributes(cnt):
    def f(x):
        n, m = x.shape
        assert x.ndim == 2 and x.dim() == 2
        out = x.T.reshape(m * n) * x.size(1)
        if x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad:
            out = out + x.numel()
        return out, x.shape, x.dtype, x.size()
    got = check(cnt, f, torch.randn(2, 3))
    assert got[1] == torch.Size([2, 3])


def test_constants_fold_and_branches(cnt):
    def f(x, n, flag, mode):
        k = (n * 2 + 1) // 3 + int(math.sqrt(16)) + len("abc")
        if flag and n > 2:
            x = x * k
        else:
            x = x - k
        if mode == "double":
            x = x * 2.0
        elif mode is None:
            x = x + 0.5
        return x, k
    check(cnt, f, torch.randn(3), 4, True, "double", ops=2)


def test_loops_unrolled(cnt):
    def f(x, ws):
        for w in ws:
            x = x * w
        i = 0
        while i < 3:
            x = x + i
            i += 1
        for j, t in enumerate((x, x + 1)):
            x = x + t * j
        for a, b in zip([1, 2], [3, 4]):
            x = x + a * b
        for k in range(2, 8, 3):
            x = x - k
        return x
    check(cnt, f, torch.randn(3), [torch.randn(3), torch.randn(3)])


def test_containers_unpacking_and_returns(cnt):
    def f(pair, d, *rest, scale=2, **kw):
        a, b = pair
        first, *middle, last = [a, b, a + b, a - b]
        out = {"sum": a + b + d["bias"], "n": len(middle), "kw": kw["z"] * scale}
        return out, [first, last], (rest[0] * scale, None, "done")
    check(cnt, f, (torch.randn(2), torch.randn(2)), {"bias": torch.randn(2)}, torch.randn(2),
          scale=3, z=torch.randn(2))


def test_subscripts_and_slices(cnt):
    def f(x, idx):
        return x[0], x[:, 1:3], x[..., ::2], x[None, idx], x[1:, -1], x[(0, 1)]
    check(cnt, f, torch.randn(3, 4), 1, ops=6)


def test_globals_and_closures(cnt):
    bias = torch.randn(4)
    factor = 0.5

    def f(x):
        return (x * SCALE + WEIGHT) * factor + bias
    check(cnt, f, torch.randn(4), ops=4)


def test_return_input_and_constants_only(cnt):
    def identity(x, n):
        return x, n + 1
    x = torch.randn(3)
    out = compile_with(cnt, identity, fullgraph=True)(x, 1)
    assert out[0] is x and out[1] == 2
    assert cnt.frame_count == 0   # nothing to compute: no graph at all


def test_mutating_input_in_place(cnt):
    def f(x):
        x.add_(1)
    x = torch.zeros(3)
    assert compile_with(cnt, f, fullgraph=True)(x) is None
    assert torch.equal(x, torch.ones(3)) and cnt.frame_count == 1


def test_return_types_and_multi_output_ops(cnt):
    def f(x):
        values, indices = x.max(dim=1)
        top = torch.topk(x, 2)
        a, b = x.chunk(2, dim=0)
        return values + top.values.sum(1), indices, a - b
    check(cnt, f, torch.randn(4, 5))


def test_builtins_on_traced_values(cnt):
    def f(xs, x):
        n = len(xs)
        total = xs[0]
        for t in xs[1:]:
            total = total + t
        ok = isinstance(x, torch.Tensor) and isinstance(n, int) and not isinstance(x, (int, float))
        return total / n if ok else total, abs(x), min(n, 5), max(2.0, float(n)), round(2.567, 1)
    check(cnt, f, [torch.randn(2) for _ in range(3)], torch.randn(2))


def test_string_formatting_is_folded(cnt):
    def f(x, name):
        key = f"{name}_{x.shape[0]:03d}"
        return x * len(key), key.upper()
    check(cnt, f, torch.randn(2), "layer")


def test_factories_with_dtype_and_device(cnt):
    def f(x):
        z = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        o = torch.ones_like(x) * torch.tensor(3.0)
        return z + o + torch.arange(x.numel()).reshape(x.shape).to(x.dtype)
    check(cnt, f, torch.randn(2, 3))


def test_operator_module_and_math(cnt):
    def f(x):
        return operator.mul(x, math.pi) + math.floor(2.7)
    check(cnt, f, torch.randn(3))


def test_enum_members_are_constants(cnt):
    import enum

    class Mode(str, enum.Enum):
        FAST = "fast"
        SLOW = "slow"

    def f(x, mode):
        if mode == Mode.FAST and mode is Mode.FAST:
            return x * 2
        return x - 1
    g = compile_with(cnt, f, fullgraph=True)
    x = torch.randn(2)
    torch.testing.assert_close(g(x, Mode.FAST), x * 2)
    torch.testing.assert_close(g(x, Mode.SLOW), x - 1)
    torch.testing.assert_close(g(x, Mode.FAST), x * 2)
    assert cnt.frame_count == 2          # one per member, guarded by identity


def test_nullcontext(cnt):
    import contextlib

    def f(x, use):
        ctx = torch.no_grad() if use else contextlib.nullcontext()
        with ctx:
            y = x * 2
        with contextlib.nullcontext(y) as z:
            return z + 1
    x = torch.randn(2, requires_grad=True)
    g = compile_with(cnt, f, fullgraph=True)
    torch.testing.assert_close(g(x, False), f(x, False))
    assert g(x, False).requires_grad and not g(x, True).requires_grad
    assert cnt.frame_count == 2
