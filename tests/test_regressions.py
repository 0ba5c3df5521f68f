"""Regression tests for bugs a review found: each compares with CPython and checks what
was compiled."""
import gc

import pytest
import torch

import frametrace

from conftest import compiled_entries, fallback_entries

A = torch.ones(2)
B = torch.zeros(2)


@frametrace.disable
def probe(t):
    return t


def counted(fn, backend="eager"):
    cnt = frametrace.testing.CompileCounter(inner=backend)
    return frametrace.optimize(backend=cnt)(fn), cnt


def test_global_swap():
    global A, B

    def f(x):
        global A, B
        A, B = B, A
        return x + 1
    g, cnt = counted(f)
    a0, b0 = A, B
    try:
        g(torch.ones(1))
        assert A is b0 and B is a0
        assert cnt.frame_count == 1
    finally:
        A, B = a0, b0


def test_list_and_attribute_swaps():
    class O:
        pass

    def f(x, l1, l2, o):
        l1[0], l2[0] = l2[0], l1[0]
        o.a, o.b = o.b, o.a
        return x + 1
    g, cnt = counted(f)
    l1, l2 = [torch.ones(1)], [torch.zeros(1)]
    o = O()
    o.a, o.b = 1, 2
    g(torch.ones(1), l1, l2, o)
    assert l1[0].item() == 0 and l2[0].item() == 1 and (o.a, o.b) == (2, 1)
    assert cnt.frame_count == 1


def test_store_does_not_redirect_a_later_store():
    class O:
        pass

    def k(x, o):
        old = o.a
        o.a = o.b
        old.v = 5
        return x + 1
    o = O()
    o.a, o.b = O(), O()
    o.a.v = o.b.v = 0
    a0, b0 = o.a, o.b
    g, cnt = counted(k)
    torch.testing.assert_close(g(torch.ones(1), o), torch.full((1,), 2.0))
    assert a0.v == 5 and b0.v == 0 and o.a is b0
    assert cnt.frame_count == 1 and len(compiled_entries(k)) == 1


def test_locals_swapped_before_a_break():
    def f(a, b):
        a, b = b, a
        probe(a)
        return a - b
    g, cnt = counted(f)
    a, b = torch.ones(1), torch.full((1,), 2.0)
    torch.testing.assert_close(g(a, b), f(a, b))
    # the graph before the break (nothing to compute) is empty; a - b after it
    assert cnt.frame_count == 1 and cnt.op_count == 1 and len(compiled_entries(f)) == 1


def test_values_below_a_break_are_read_before_it():
    class O:
        t = None

    @frametrace.disable
    def mutate(o):
        o.t = torch.full((2,), 100.0)
        return torch.zeros(2)

    def f(o):
        return o.t + mutate(o)
    o1, o2 = O(), O()
    o1.t = o2.t = torch.ones(2)
    g, cnt = counted(f)
    torch.testing.assert_close(g(o1), f(o2))
    assert cnt.frame_count == 1 and len(compiled_entries(f)) == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_grad_mode_at_a_break_inside_no_grad(backend):
    seen = []

    @frametrace.disable
    def look(t):
        seen.append(torch.is_grad_enabled())
        return t

    def f(x, w):
        with torch.no_grad():
            y = look(x * 2)
            z = y * w
        return z
    g, cnt = counted(f, backend)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    out = g(x, w)
    assert seen == [False] and not out.requires_grad and torch.is_grad_enabled()
    assert cnt.frame_count == 2


def test_break_inside_try_runs_the_handler():
    @frametrace.disable
    def bad(t):
        raise ValueError("boom")

    def f(x):
        y = x + 1
        try:
            y = bad(y)
        except ValueError:
            y = y * 10
        return y
    x = torch.ones(2)
    g, cnt = counted(f)
    torch.testing.assert_close(g(x), f(x))
    torch.testing.assert_close(g(x), f(x))
    # the break keeps the handler: a graph before the call, and the handler's in the
    # resume function that the ValueError is sent to
    assert cnt.frame_count == 2 and len(fallback_entries(f)) == 0


def test_exception_at_a_break_inside_no_grad_restores_grad_mode():
    @frametrace.disable
    def bad(t):
        raise ValueError("boom")

    def f(x):
        with torch.no_grad():
            y = bad(x + 1)
        return y
    g, cnt = counted(f)
    with pytest.raises(ValueError):
        g(torch.ones(2))
    assert torch.is_grad_enabled()
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_aliased_tensor_inputs_recompile(backend):
    def f(x, y):
        x.add_(1)
        return y * 2
    g, cnt = counted(f, backend)
    a, b = torch.zeros(2), torch.zeros(2)
    torch.testing.assert_close(g(a, b), torch.zeros(2))
    c = torch.zeros(2)
    torch.testing.assert_close(g(c, c), torch.full((2,), 2.0))       # same tensor
    d = torch.zeros(4)
    torch.testing.assert_close(g(d[:2], d[:2].view(2)), torch.full((2,), 2.0))  # views
    assert cnt.frame_count >= 2


def test_aliased_list_inputs():
    def f(x, l1, l2):
        l1.append(1)
        return x + len(l2)
    g, cnt = counted(f)
    torch.testing.assert_close(g(torch.zeros(1), [], []), torch.zeros(1))
    shared = []
    torch.testing.assert_close(g(torch.zeros(1), shared, shared), torch.ones(1))
    assert shared == [1]
    assert cnt.frame_count == 2          # the lists being one object fails a guard


def test_list_identity_and_aliasing_of_new_lists():
    class O:
        pass

    def f(x, lst, o):
        lst.append(x)
        new = [x]
        o.a = new
        o.b = new
        return lst
    lst, o = [], O()
    g, cnt = counted(f)
    out = g(torch.ones(1), lst, o)
    assert out is lst and len(lst) == 1 and o.a is o.b
    # no tensor op, so no graph: the transformed code only replays the mutations
    assert cnt.frame_count == 0 and len(compiled_entries(f)) == 1


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


def test_optimized_call_while_compiling_keeps_the_hook_state():
    from frametrace import _C

    @frametrace.optimize
    def inner(x):
        return x * 3

    calls = []

    def backend(gm, example_inputs):
        calls.append(inner(torch.ones(2)))      # frametrace used from inside a compile
        return gm.forward

    @frametrace.optimize(backend=backend)
    def outer(x):
        return inner(x + 1) + 1

    x = torch.ones(2)
    for _ in range(2):
        torch.testing.assert_close(outer(x), (x + 1) * 3 + 1)
        assert not _C.hook_installed() and _C.get_callback() is None
    assert calls and all(torch.equal(c, torch.full((2,), 3.0)) for c in calls)
    # the hook still installs and compiles afterwards
    cnt = frametrace.testing.CompileCounter()
    torch.testing.assert_close(frametrace.optimize(backend=cnt)(lambda t: t - 1)(x), x - 1)
    assert cnt.frame_count == 1


def test_alias_guards_only_for_inputs_the_graph_writes():
    def f(x, y, z):
        h = x * 2
        h.add_(1)                  # an intermediate: no input can alias it
        y[:1].mul_(3)              # an input, through a view
        return h + z

    g, cnt = counted(f, "eager")
    x, y, z = torch.ones(2), torch.ones(2), torch.ones(2)
    torch.testing.assert_close(g(x, y, z), torch.full((2,), 4.0))
    texts = [gd.text for e in compiled_entries(f) for gd in e.check.guards]
    alias = sorted(t for t in texts if "memory" in t)
    assert alias == ["no other tensor input shares memory with y"]
    same, expected_same = torch.ones(2), torch.ones(2)
    expected = f(expected_same, expected_same, z)
    torch.testing.assert_close(g(same, same, z), expected)
    torch.testing.assert_close(same, expected_same)
    assert cnt.frame_count == 2


def test_returned_closure_keeps_its_cells():
    def f(x):
        n = 3
        w = x * 2                       # a tensor the closure captures
        size = x.shape[0]               # a size (symbolic after a second shape)

        def inner(y):
            return y[:n] + w[:n] + size
        return inner, x + 1

    g, cnt = counted(f)
    for length in (5, 6, 7):
        x = torch.arange(float(length))
        inner, out = g(x)
        ref_inner, ref_out = f(x)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(inner(torch.ones(4)), ref_inner(torch.ones(4)))
    assert cnt.frame_count == 2


def test_inputs_traced_aliased_do_not_recompile_on_every_call():
    def f(a, b):
        b.add_(1)                  # writes through a view of `a` when aliased
        return a * 2

    g, cnt = counted(f)
    for _ in range(4):
        base, ref_base = torch.zeros(6), torch.zeros(6)
        torch.testing.assert_close(g(base, base[1:]), f(ref_base, ref_base[1:]))
        torch.testing.assert_close(base, ref_base)
    assert cnt.frame_count == 1
    x, y = torch.zeros(5), torch.zeros(5)
    torch.testing.assert_close(g(x, y), torch.zeros(5))
    assert cnt.frame_count == 2
    texts = {gd.text for e in compiled_entries(f) for gd in e.check.guards}
    assert {"a and b share memory", "no other tensor input shares memory with b"} <= texts
