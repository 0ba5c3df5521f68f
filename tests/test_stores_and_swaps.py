"""Stores replayed after a compiled graph land where CPython puts them: globals, list
items and attributes swapped, a store that must not redirect a later one, locals swapped
before a graph break."""
import torch

import frametrace
from conftest import compiled_entries, counted


A = torch.ones(2)
B = torch.zeros(2)


@frametrace.disable
def probe(t):
    return t


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
