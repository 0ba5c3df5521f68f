"""Numbers that cross a graph break, and float arguments.

A float or int computed in CPython at a graph break (``x.item()``, a NumPy call) is a
symbolic input of the resumed frame's graph: arithmetic and torch ops on it stay in
that graph (one graph on each side of the break, not a break per use), and it is never
pinned to the value seen, so one entry serves every value.  Code that needs the plain
number (formatting it, ``range(n)``) breaks there instead.  A float argument that changes
between calls becomes symbolic on the next compile, as torch.compile's automatic
dynamic floats do.
"""
import math

import pytest
import torch

import frametrace
from differential import check


def randn(*shape):
    return torch.randn(*shape)


def test_item_result_feeds_the_resumed_graph():
    def f(x):
        y = x.sum().item()
        z = x * y + 1
        return z.cos() * y, y * 2 - 1

    r = check(f, [(randn(4),), (randn(4),), (randn(4),), (randn(4),)])
    # x.sum() | item() in CPython | everything after, for every value of y
    assert (r.graphs, r.breaks, r.compiles) == (2, 1, 2), r


def test_numpy_result_feeds_the_resumed_graph():
    np = pytest.importorskip("numpy")

    @frametrace.disable
    def numpy_total(k):
        return float(np.arange(k).sum())

    def f(x, k):
        y = x * 2
        a = numpy_total(k)                   # runs in CPython: one break
        return y + a, a / 2

    r = check(f, [(randn(3), 3), (randn(3), 3), (randn(3), 3)])
    assert (r.breaks, r.graphs) == (1, 2), r


def test_branch_on_a_number_from_a_break_guards_the_relation():
    def f(x):
        y = x.sum().item()
        if y > 0:
            return x + y
        return x - y

    xs = [torch.full((3,), v) for v in (1.0, 2.0, -1.0, -3.0, 0.5)]
    r = check(f, xs)
    # one entry per side of the comparison, not one per value
    assert r.breaks == 1 and r.compiles <= 3, r


def test_formatting_a_number_from_a_break_breaks_instead_of_pinning():
    def f(x, log):
        y = x.sum().item()
        log.append(f"loss {y:.3f}")
        return x * y

    r = check(f, [(randn(4), []), (randn(4), []), (randn(4), [])])
    # item(), the formatting and the string built from it run in CPython; every entry
    # is made by the first call and reused for every later value
    assert (r.breaks, r.compiles, r.fallbacks) == (3, 4, 0), r


def test_int_from_a_break_slices_symbolically():
    def f(x):
        n = int(x.sum().item())
        return x[:n] * 2, n + 1

    xs = [torch.full((6,), v / 6) for v in (3.0, 2.0, 4.0, 5.0, 2.0)]
    r = check(f, xs)
    assert r.breaks == 1 and r.compiles < 6, r


def test_non_finite_numbers_from_a_break():
    def f(x, s):
        y = x.sum().item() * s
        return x + y, y

    r = check(f, [(randn(3), 1.0), (randn(3), math.inf), (randn(3), math.nan), (randn(3), 2.0)])
    assert r.breaks >= 1, r


def test_float_argument_becomes_symbolic_after_it_changes():
    def f(x, s):
        return x * s + s

    r = check(f, [(randn(3), s) for s in (1.5, 2.5, 3.5, 4.5, 0.25)])
    # first compile pins 1.5; the second makes s symbolic and serves every later value
    assert (r.graphs, r.compiles) == (2, 2), r


def test_float_argument_non_finite_and_int_values():
    def f(x, s):
        return x * s

    inputs = [(randn(3), 1.5), (randn(3), 2.5), (randn(3), math.inf), (randn(3), math.nan),
              (randn(3), 3), (randn(3), True)]
    check(f, inputs)


def test_float_argument_in_python_arithmetic_and_branches():
    def f(x, lr):
        step = lr * 0.5
        if lr > 1.0:
            return x - step
        return x + step

    r = check(f, [(randn(3), s) for s in (0.1, 0.2, 0.3, 2.0, 3.0, 0.4)])
    assert r.compiles <= 4, r


@pytest.mark.parametrize("backend", ["aot_eager", "aot_eager_decomp_partition"])
def test_numbers_from_breaks_under_aot_backends(backend):
    def f(x):
        y = x.sum().item()
        return (x * y).sin(), y + 1

    def inputs():
        return [(torch.randn(4, requires_grad=True),) for _ in range(3)]

    check(f, inputs(), backend=backend)
    # gradients through the resumed graph, with y as an input
    x = torch.randn(4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    frametrace.reset()
    frametrace.optimize(backend)(f)(x)[0].sum().backward()
    f(x2)[0].sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_fullgraph_item_still_raises():
    def f(x):
        return x * x.sum().item()

    with pytest.raises(frametrace.Unsupported):
        frametrace.optimize(fullgraph=True)(f)(randn(3))
