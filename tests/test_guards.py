"""Guards and recompiles: each changed fact compiles exactly one new entry, and the
values stay right; unchanged calls reuse the cache."""
import gc
import logging
import warnings

import torch

import frametrace
from frametrace import _C

from conftest import compile_with, counted

OFFSET = 1.0
TABLE = {"scale": 2.0}


def entries(fn):
    return _C.entries(fn.__wrapped__.__code__)


def test_dtype_change_recompiles_once(cnt):
    def f(x):
        return x * 2 + 1
    g = compile_with(cnt, f)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    for _ in range(3):
        torch.testing.assert_close(g(x.double()), f(x.double()))
    assert cnt.frame_count == 2 and len(entries(g)) == 2


def test_shape_change_recompiles_once(cnt):
    def f(x):
        return x.sum(0) * x.shape[0]
    g = compile_with(cnt, f)
    a, b = torch.randn(3, 2), torch.randn(5, 2)
    torch.testing.assert_close(g(a), f(a))
    torch.testing.assert_close(g(b), f(b))
    torch.testing.assert_close(g(b), f(b))
    torch.testing.assert_close(g(a), f(a))
    assert cnt.frame_count == 2


def test_stride_and_requires_grad_are_guarded(cnt):
    def f(x):
        return x + 1
    g = compile_with(cnt, f)
    x = torch.randn(3, 4)
    g(x)
    torch.testing.assert_close(g(x.t()), f(x.t()))       # same shape class, new strides
    y = torch.randn(3, 4, requires_grad=True)
    out = g(y)
    assert out.requires_grad
    assert cnt.frame_count == 3


def test_global_value_change_recompiles_once(cnt):
    global OFFSET

    def f(x):
        return x + OFFSET
    g = compile_with(cnt, f)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(g(x), x + 1.0)
        OFFSET = 5.0
        torch.testing.assert_close(g(x), x + 5.0)
        torch.testing.assert_close(g(x), x + 5.0)
    finally:
        OFFSET = 1.0
    assert cnt.frame_count == 2


def test_global_dict_entry_is_guarded(cnt):
    def f(x):
        return x * TABLE["scale"]
    g = compile_with(cnt, f)
    x = torch.randn(3)
    torch.testing.assert_close(g(x), x * 2.0)
    TABLE["scale"] = 3.0
    try:
        torch.testing.assert_close(g(x), x * 3.0)
    finally:
        TABLE["scale"] = 2.0
    assert cnt.frame_count == 2


def test_grad_mode_change_recompiles_once(cnt):
    def f(x, w):
        return (x @ w).tanh()
    g = compile_with(cnt, f)
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    out = g(x, w)
    assert out.requires_grad
    with torch.no_grad():
        out = g(x, w)
        out = g(x, w)
    assert not out.requires_grad
    torch.testing.assert_close(out, f(x, w).detach())
    assert cnt.frame_count == 2


def test_python_int_argument_is_specialized(cnt):
    def f(x, n):
        return x * n
    g = compile_with(cnt, f)
    x = torch.randn(3)
    torch.testing.assert_close(g(x, 2), x * 2)
    torch.testing.assert_close(g(x, 2), x * 2)
    torch.testing.assert_close(g(x, 3), x * 3)
    torch.testing.assert_close(g(x, 3.0), x * 3.0)   # float 3.0 is not int 3
    assert cnt.frame_count == 3


def test_list_length_and_items_are_guarded(cnt):
    def f(xs):
        out = xs[0]
        for t in xs[1:]:
            out = out + t
        return out
    g = compile_with(cnt, f)
    a = [torch.randn(2) for _ in range(3)]
    torch.testing.assert_close(g(a), sum(a[1:], a[0]))
    torch.testing.assert_close(g(a[:2]), a[0] + a[1])
    assert cnt.frame_count == 2


def test_unused_arguments_add_no_guards(cnt):
    def f(x, unused):
        return x + 1
    g = compile_with(cnt, f)
    x = torch.randn(3)
    g(x, torch.randn(5))
    g(x, "anything")
    g(x, torch.randn(5).double())
    assert cnt.frame_count == 1


def test_aliased_inputs_are_guarded(cnt):
    def f(x, y):
        x.add_(1)
        return y * 2
    g = compile_with(cnt, f)
    a = torch.zeros(3)
    out = g(a, a)                      # y is x: sees the add
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    b, c = torch.zeros(3), torch.zeros(3)
    out = g(b, c)                      # distinct: must not reuse the aliased entry
    torch.testing.assert_close(out, torch.zeros(3))
    assert torch.equal(b, torch.ones(3))
    assert cnt.frame_count == 2


def test_cache_size_limit_falls_back_with_one_warning(cnt):
    frametrace.config.cache_size_limit = 3

    def f(x, n):
        return x + n
    # (static ints: with automatic dynamic, n = 2 would make n symbolic)
    g = compile_with(cnt, f, dynamic=False)
    x = torch.randn(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(6):
            torch.testing.assert_close(g(x, n), x + n)
        for n in range(6):
            torch.testing.assert_close(g(x, n), x + n)
    assert cnt.frame_count == 3
    limit_warnings = [w for w in caught if "cache_size_limit" in str(w.message)]
    assert len(limit_warnings) == 1
    assert len(entries(g)) == 3


def test_recompile_log_names_failing_guard(cnt, caplog):
    def f(x):
        return x + 1
    g = compile_with(cnt, f)
    with caplog.at_level(logging.INFO, logger="frametrace.recompiles"):
        g(torch.randn(2))
        g(torch.randn(2, dtype=torch.float64))
    messages = [r.getMessage() for r in caplog.records if r.name == "frametrace.recompiles"]
    assert len(messages) == 1
    assert "guard failed" in messages[0] and "x: Tensor float32[2]" in messages[0]


def test_guard_text_is_readable(cnt):
    def f(x, n):
        return x * n
    g = compile_with(cnt, f)
    g(torch.randn(2, 3), 4)
    texts = entries(g)[0].check.guard_set.texts()
    assert "x: Tensor float32[2, 3] stride=[3, 1] device=cpu requires_grad=False" in texts
    assert "n == 4" in texts and "grad mode: on" in texts


def test_default_dtype_is_guarded_when_read(cnt):
    def f(x):
        return torch.ones(2, dtype=torch.get_default_dtype()) + x
    g = compile_with(cnt, f)
    x = torch.randn(2)
    assert g(x).dtype == torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert g(x).dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
    assert cnt.frame_count == 2


def test_shared_source_prefixes_are_read_once_per_check(cnt):
    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)
            self.scale = 2

        def forward(self, x):
            return self.b(self.a(x)) * self.scale

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x)

    model = Outer()
    g = compile_with(cnt, model, fullgraph=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(g(x), model(x))
    check = _C.entries(type(model).forward.__code__)[0].check
    # `self._modules['inner']` is read by many guards, evaluated once into a local
    assert check.source.count("['inner']") == 1 and check.source.count("self._modules") == 1
    model.inner.scale = 3                     # a guarded value deep in the chain
    torch.testing.assert_close(g(x), model(x))
    model.inner.b = torch.nn.Linear(4, 4)     # a new module object
    torch.testing.assert_close(g(x), model(x))
    assert cnt.frame_count == 3


# -- -0.0, a global shadowing a builtin, the gc running inside guards --
def test_negative_zero_is_not_zero():
    def f(x, c):
        return x / c
    g, cnt = counted(f)
    x = torch.ones(1)
    assert g(x, 0.0).item() == float("inf")
    assert g(x, -0.0).item() == float("-inf")
    assert cnt.frame_count == 2


def test_a_global_shadowing_a_builtin_is_seen():
    ns = {}
    exec("def f(x):\n    return x + abs(-1)\n", ns)
    g, cnt = counted(ns["f"])
    x = torch.zeros(1)
    torch.testing.assert_close(g(x), torch.ones(1))
    torch.testing.assert_close(g(x), torch.ones(1))
    assert cnt.frame_count == 1
    ns["abs"] = lambda v: 10
    torch.testing.assert_close(g(x), torch.full((1,), 10.0))
    assert cnt.frame_count == 2          # the shadowing global failed a guard


def test_gc_inside_guards_does_not_crash(young_heap):
    class Helper:
        def __init__(self):
            self.me = self          # only the cycle collector frees it

        def __call__(self, t):
            return t + 1

    def f(x, h):
        return h(x)
    g, cnt = counted(f)
    x = torch.zeros(2)
    for _ in range(20):
        h = Helper()
        torch.testing.assert_close(g(x, h), x + 1)
        del h
        gc.collect()
    # each Helper is a new object guarded by type: one graph serves them all
    assert cnt.frame_count == 1
