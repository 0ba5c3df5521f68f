"""Higher-order operators (torch.cond, torch.while_loop, map, checkpoint): bodies
speculated into subgraphs of one graph, refused bodies breaking the graph at the call."""
import pytest
import torch

import frametrace
from differential import check

W = torch.randn(4)
LOG = []


@pytest.fixture(autouse=True)
def _grad_mode_on():
    # Gradients are what several tests compare: they must not depend on a grad mode an
    # earlier test left behind.
    with torch.enable_grad():
        yield


def _pos_neg():
    return [(torch.randn(4).abs(),), (-torch.rand(4) - 0.1,), (torch.randn(4).abs() + 1,)]


def test_cond_tensor_pred_one_graph_no_recompile_on_flip():
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a.sin() + 1, lambda a: a.cos() * 2, (x,))
    r = check(f, _pos_neg(), fullgraph=True)
    assert r.graphs == 1 and r.compiles == 1 and r.breaks == 0


def test_cond_branches_read_closures_globals_and_frame_tensors():
    def f(x, y):
        z = x * 3

        def tb(a):
            return (a.sin() + W, z * 1)

        def fb(a):
            return (a * y, a + 1)
        return torch.cond(x.sum() > 0, tb, fb, (x,))
    for backend in ("eager", "aot_eager"):
        r = check(f, [(x, torch.randn(4)) for (x,) in _pos_neg()], fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1


def test_cond_module_branch_parameters_lifted():
    m = torch.nn.Linear(4, 4)

    def f(x):
        return torch.cond(x.sum() > 0, m, lambda a: a.cos(), (x,))
    r = check(f, _pos_neg(), fullgraph=True, backend="aot_eager")
    assert r.graphs == 1 and r.compiles == 1


def test_cond_python_bool_pred_traces_one_branch():
    def f(x, p):
        return torch.cond(p, lambda a: a.sin() * 2, lambda a: a.cos(), (x,))
    r = check(f, [(torch.randn(4), True), (torch.randn(4), True), (torch.randn(4), False)], fullgraph=True)
    assert r.graphs == 2 and r.breaks == 0


def test_cond_branch_appending_to_a_list_breaks_the_graph():
    def f(x):
        def tb(a):
            LOG.append(1)
            return a.sin()
        return torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,)) + 1
    r = check(f, _pos_neg(), globals=("LOG",))
    assert r.breaks >= 1 and any("side effect" in s for s in r.reasons())


def test_cond_branch_mutating_a_frame_list_breaks_the_graph():
    def f(x):
        acc = []

        def tb(a):
            acc.append(a)
            return a.sin()
        out = torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,))
        return out, len(acc)
    r = check(f, _pos_neg())
    assert r.breaks >= 1


def test_cond_gradients_match_cpython():
    m = torch.nn.Linear(4, 4)

    def f(x):
        return torch.cond(x.sum() > 0, lambda a: (m(a) * a.sin()).sum(), lambda a: a.cos().sum(), (x,))
    for backend in ("eager", "aot_eager"):
        c = frametrace.optimize(backend=backend, fullgraph=True)(f)
        for (xi,) in _pos_neg():
            a, b = xi.clone().requires_grad_(), xi.clone().requires_grad_()
            m.zero_grad()
            f(a).backward()
            want_w = m.weight.grad.clone()
            m.zero_grad()
            c(b).backward()
            torch.testing.assert_close(a.grad, b.grad)
            torch.testing.assert_close(want_w, m.weight.grad)


def test_cond_symbolic_size_pred_keeps_both_branches():
    def f(x):
        return torch.cond(x.shape[0] > 4, lambda a: a.sin(), lambda a: a.cos(), (x,))
    r = check(f, [(torch.randn(3),), (torch.randn(6),), (torch.randn(8),), (torch.randn(2),)],
              fullgraph=True, dynamic=True)
    assert r.graphs == 1 and r.compiles == 1


def test_nested_cond_lifts_through_both_levels():
    def f(x, y):
        def inner(a):
            return torch.cond(a.mean() > 0, lambda b: b * y, lambda b: b - y, (a,))
        return torch.cond(x.sum() > 0, inner, lambda a: a.cos(), (x,))
    r = check(f, [(x, torch.randn(4)) for (x,) in _pos_neg()], fullgraph=True, backend="aot_eager")
    assert r.graphs == 1 and r.compiles == 1


def test_cond_branch_with_graph_break_breaks_the_outer_graph():
    def f(x):
        def tb(a):
            print("side")
            return a.sin()
        return torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,)) * 2
    r = check(f, _pos_neg())
    assert r.breaks >= 1 and any("torch.cond true_fn cannot be traced" in s for s in r.reasons())


def test_cond_branch_writing_its_input_in_place_breaks_the_graph():
    def f(x):
        def tb(a):
            a.add_(1)
            return a.sin()
        return torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,))
    r = check(f, _pos_neg())
    assert r.breaks >= 1 and any("writes in place to an input" in s for s in r.reasons())


def test_while_loop_one_graph_with_lifted_closure():
    def f(i, x, w):
        def body(i, x):
            return i + 1, x * w + 1
        return torch.while_loop(lambda i, x: i < 4, body, (i, x))
    for backend in ("eager", "aot_eager"):
        r = check(f, [(torch.tensor(0), torch.randn(3), torch.randn(3)),
                      (torch.tensor(2), torch.randn(3), torch.randn(3))], fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1


def test_while_loop_body_changing_shape_breaks_the_graph():
    def f(x):
        return torch.while_loop(lambda x: x.sum() < 100, lambda x: (x.repeat(2),), (x,))
    r = check(f, [(torch.ones(2),)], graphs=None)
    # (Only f's own compiles: CPython's while_loop runs torch's compiler, during which a
    # GC callback another library installed may be traced too.)
    mine = [x for x in r.records if x.code is f.__code__]
    assert [x.outcome for x in mine] == ["break"] and "metadata" in mine[0].reason
    assert mine[0].graph_module is None or not any(
        n.op == "call_function" for n in mine[0].graph_module.graph.nodes)


def _checkpoint_case():
    from torch.utils.checkpoint import checkpoint
    lin = torch.nn.Linear(8, 8)

    def region(a, b):
        return (lin(a).relu() * b).sin().cos()

    def f(x, y):
        return checkpoint(region, x, y, use_reentrant=False).sum()

    def plain(x, y):
        return region(x, y).sum()
    return lin, f, plain


def test_checkpoint_values_and_gradients_match_cpython():
    lin, f, _ = _checkpoint_case()
    r = check(f, [(torch.randn(4, 8), torch.randn(4, 8)), (torch.randn(4, 8), torch.randn(4, 8))],
              fullgraph=True)
    assert r.graphs == 1
    for backend in ("eager", "aot_eager"):
        c = frametrace.optimize(backend=backend, fullgraph=True)(f)
        for _ in range(2):
            x, y = torch.randn(4, 8), torch.randn(4, 8)
            a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
            lin.zero_grad()
            f(a, y).backward()
            want = lin.weight.grad.clone()
            lin.zero_grad()
            c(b, y).backward()
            torch.testing.assert_close(a.grad, b.grad)
            torch.testing.assert_close(want, lin.weight.grad)


def test_checkpoint_region_is_recomputed_in_the_aot_eager_backward():
    _, f, plain = _checkpoint_case()

    def saved_by(fn):
        saved = []
        x = torch.randn(4, 8, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fn(x, torch.randn(4, 8))
        out.backward()
        return len(saved)
    with_ckpt = saved_by(frametrace.optimize(backend="aot_eager", fullgraph=True)(f))
    without = saved_by(frametrace.optimize(backend="aot_eager", fullgraph=True)(plain))
    # Only the region's inputs (x, y, weight, bias) are kept; its intermediates are not.
    assert with_ckpt == 4 and without > with_ckpt


def test_checkpoint_over_random_ops_compiles():
    # (its recompute draws the forward's numbers again: tests/test_model_loops.py)
    from torch.utils.checkpoint import checkpoint

    def f(x):
        return checkpoint(lambda a: torch.nn.functional.dropout(a, 0.5).sin(), x,
                          use_reentrant=False) + 1
    r = check(f, [(torch.randn(8),), (torch.randn(8),)])
    assert r.breaks == 0 and r.graphs == 1, r
