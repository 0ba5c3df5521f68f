"""What a graph break hands over to its resume function: values below the break read before
it, grad mode inside no_grad, a handler around the break, grad mode restored when it raises."""
import pytest
import torch

import frametrace
from conftest import compiled_entries, counted, fallback_entries


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
