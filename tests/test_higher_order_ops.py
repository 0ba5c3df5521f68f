"""Higher-order operators (torch.cond, torch.while_loop, map, checkpoint): bodies
speculated into subgraphs of one graph, refused bodies breaking the graph at the call."""
import torch

import frametrace
from differential import check

W = torch.randn(4)
LOG = []


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
