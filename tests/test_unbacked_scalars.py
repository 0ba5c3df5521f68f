"""Numbers read out of tensors (``t.item()``, ``t.tolist()``, ``int(t)``, ``float(t)``,
``bool(t)``, a tensor as a slice bound) with ``config.capture_scalar_outputs``: graph
values whose value the trace never knows (unbacked symbols).  They feed later ops in the
same graph, one compile serves every value, ``torch._check`` facts about them are
asserted when the graph runs, code that needs their value is a graph break (never a
guard), and they cross graph breaks as real numbers.  With the flag off, ``item()`` is
one break whose result feeds the resumed graph.
"""
import pytest
import torch

import frametrace
from conftest import no_unbacked_guards, opaque
from differential import check as _check


def check(fn, inputs, compiles=None, **kwargs):
    # `compiles` counts fn's own entries: other frames may compile around it (torch
    # 2.11 runs a filelock helper while it compiles), which says nothing about fn.
    r = _check(fn, inputs, **kwargs)
    if compiles is not None:
        assert compiled_entries(r, fn) == compiles, r
    return r

BACKENDS = ["eager", "aot_eager"]


@pytest.fixture
def capture():
    cfg = frametrace.config
    saved = cfg.capture_scalar_outputs, cfg.capture_dynamic_output_shape_ops
    cfg.capture_scalar_outputs = True
    yield
    cfg.capture_scalar_outputs, cfg.capture_dynamic_output_shape_ops = saved



def compiled_entries(r, fn):
    return sum(rec.code is fn.__code__ for rec in r.records)


def k(v):
    return torch.tensor(v)


@pytest.mark.parametrize("backend", BACKENDS)
def test_item_feeds_later_ops_in_one_graph(capture, backend):
    def f(x, t):
        n = t.item()
        return torch.zeros(n) + n, x * n, n * 2 + 1

    x = torch.randn(4)
    r = check(f, [(x, k(3)), (x, k(5)), (x, k(0)), (x, k(7))], backend=backend,
              fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_int_and_item_of_a_float_tensor(capture, backend):
    def f(x):
        s = x.sum()
        a, b, c = s.item(), float(s), int(s)
        return x * a + b, c, c + 1

    r = check(f, [torch.randn(5) * 4 for _ in range(4)], backend=backend,
              fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


def test_int_of_a_non_finite_tensor_raises_as_in_cpython(capture):
    def f(x):
        return int(x.sum()) + 1

    check(f, [torch.tensor([1.5, 2.0]), torch.tensor([float("nan"), 1.0]),
              torch.tensor([float("inf"), 1.0]), torch.tensor([-2.5, 0.25])], graphs=1, compiles=1)


def test_tolist_unpacks_into_graph_numbers(capture):
    def f(x, m):
        a, b, c = x.tolist()
        rows = m.tolist()
        return a * b + c, x * c, rows[1][0] - rows[0][1]

    r = check(f, [(torch.tensor([1, 2, 3]), torch.tensor([[1, 2], [3, 4]])),
                  (torch.tensor([4, -5, 6]), torch.tensor([[0, 7], [9, 4]]))],
              fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


def test_bool_of_a_tensor_is_a_graph_value(capture):
    def f(x):
        b = bool(x.sum() > 0)
        return b, x * 2

    check(f, [torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -2.0]), torch.tensor([float("nan"), 1.0])],
          fullgraph=True, graphs=1, compiles=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_and_view_by_a_number_from_data(capture, backend):
    def f(x, t):
        n = t.item()
        return x.view(n, -1) * 2, x[:n], x[t:] + 1

    x = torch.randn(12)
    # 5 does not divide 12: view raises (in the graph's runtime assert, then as CPython does)
    r = check(f, [(x, k(3)), (x, k(4)), (x, k(6)), (x, k(2)), (x, k(5))], backend=backend,
              fullgraph=True, graphs=1, compiles=1)
    no_unbacked_guards(r)


def test_check_with_a_message_function_is_asserted_when_the_graph_runs(capture):
    def f(x, t):
        n = t.item()
        torch._check(n > 1, lambda: "n must exceed 1")
        torch._check(n <= x.shape[0], lambda: f"n={n} is too large")
        return x[:n] * 2, n

    x = torch.randn(8)
    r = check(f, [(x, k(3)), (x, k(8)), (x, k(1)), (x, k(9)), (x, k(2))], fullgraph=True, graphs=1)
    # (a failed check runs the frame again in CPython, which calls the message function)
    assert compiled_entries(r, f) == 1, r
    no_unbacked_guards(r)


def test_check_is_size_lets_a_number_size_a_tensor(capture):
    def f(t):
        n = t.item()
        torch._check_is_size(n)
        return torch.ones(n, 2).sum(0) + n

    with pytest.warns(FutureWarning):
        check(f, [k(2), k(0), k(6), k(-1)], fullgraph=True, graphs=1, compiles=1)


def test_check_with_a_message_function_on_sizes_needs_no_capture():
    def f(x):
        torch._check(x.shape[0] > 1, lambda: "too short")
        return x * 2

    check(f, [torch.randn(3), torch.randn(3)], fullgraph=True, graphs=1)


def test_branch_on_a_number_from_data_is_a_graph_break_not_a_guard(capture):
    def f(x, t):
        n = t.item()
        if n > 3:
            return x + n
        return x - n

    x = torch.randn(4)
    r = check(f, [(x, k(v)) for v in (5, 1, 7, 2, 9, 0)])
    # the item() graph | the branch, on the number passed in: one entry per side
    assert r.breaks == 1 and r.compiles <= 3, r
    no_unbacked_guards(r)
    with pytest.raises(frametrace.Unsupported):
        frametrace.optimize(backend="eager", fullgraph=True)(f)(x, k(5))


def test_number_from_data_crosses_a_graph_break(capture):
    def f(x, t):
        n = t.item()
        y = x[:n] * 2
        opaque(n)
        return y + n, n

    x = torch.randn(8)
    r = check(f, [(x, k(v)) for v in (3, 5, 6, 7, 4)], breaks=1)
    # f up to the break, and after it: once with the sizes seen first, then once with
    # x[:n]'s size symbolic (automatic dynamic) for every later value
    assert (r.graphs, r.compiles) == (3, 3), r
    no_unbacked_guards(r)


def test_item_without_capture_is_one_break_feeding_the_resumed_graph():
    assert frametrace.config.capture_scalar_outputs is False

    def f(x):
        s = x.sum() * 2
        v = s.item()
        return x * v + 1, v - 1

    r = check(f, [torch.randn(4) for _ in range(4)])
    assert (r.graphs, r.breaks, r.compiles) == (2, 1, 2), r


def test_int_and_bool_without_capture_are_one_break_each():
    def f(x):
        n = int(x.sum() * 3)
        return x * n + 1

    def g(x):
        b = bool(x.sum() > 0)
        return x * b + 1

    inputs = [torch.randn(4) for _ in range(5)]
    r = check(f, inputs)
    assert (r.graphs, r.breaks, r.compiles) == (2, 1, 2), r
    r = check(g, [torch.full((3,), v) for v in (1.0, -1.0, 2.0, -3.0)])
    # the resumed graph is specialized on the bool: one entry for each value
    assert (r.graphs, r.breaks, r.compiles) == (3, 1, 3), r


def _tensors_of_numbers(x):
    y = x.sum().item()
    n = int(x.sum() > 0)
    return (torch.tensor([[y, 1.0], [n, y * 2]]) + x, torch.tensor([n, 3]),
            torch.tensor([n > 0, True]), torch.tensor((y,), dtype=torch.float64))


def test_tensor_of_numbers_from_data_stays_in_the_graph(capture):
    check(_tensors_of_numbers, [torch.randn(2) for _ in range(4)], fullgraph=True,
          graphs=1, compiles=1)


def test_tensor_of_numbers_from_a_break_is_not_pinned_to_their_values():
    r = check(_tensors_of_numbers, [torch.randn(2) for _ in range(4)])
    # item() and int() break; no entry per value of y
    assert (r.graphs, r.breaks, r.compiles) == (3, 2, 3), r


def test_triton_backend_falls_back_cleanly_on_numbers_from_data(capture, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")   # an internal error would raise

    def f(x, t):
        n = t.item()
        return torch.ones(n, 3) * x.sum().item() + 1, x[:n].cos()

    x = torch.randn(6)
    check(f, [(x, k(2)), (x, k(4)), (x, k(0))], backend="triton", fullgraph=True,
          graphs=1, compiles=1)


def test_a_decision_inside_torch_on_unbacked_sizes_is_a_graph_break(capture):
    # torch.cond compares its branches' output sizes: two different unbacked symbols
    # here, which no guard may decide (it was an internal error, the frame run whole
    # in CPython).
    def f(x, n):
        k = n.item()
        return torch.cond(x.sum() > 0, lambda t: t[:k] + 1, lambda t: t[:k] - 1, (x,))

    r = check(f, [(torch.randn(6), k(3)), (-torch.ones(6), k(4)), (torch.ones(6), k(2))])
    assert r.internal_errors == 0 and r.breaks >= 1
    assert any("read from data" in reason for reason in r.reasons()), r
