"""reset() forgets which skipped-file forwards optimize(module) made traced, and
explain() of something already optimize()d explains what it wraps."""
import torch

import frametrace
from differential import check


def test_reset_forgets_the_forward_an_optimized_torch_module_forced():
    frametrace.optimize(torch.nn.Linear(3, 3))(torch.randn(2, 3))    # Linear.forward traced
    frametrace.reset()
    lin = torch.nn.Linear(3, 3)
    # torch.nn's files are skipped: the bound forward runs in CPython, as in a fresh process
    check(lin.forward, [torch.randn(2, 3), torch.randn(2, 3)], graphs=0)


def test_module_optimized_before_a_reset_compiles_after_it():
    lin = torch.nn.Linear(3, 3)

    def optimized_then_reset(counter):
        opt = frametrace.optimize(backend=counter)(lin)
        opt(torch.randn(2, 3))
        frametrace.reset()
        return opt
    # one graph before the reset, one after
    check(lin, [torch.randn(2, 3), torch.randn(2, 3)], compiled=optimized_then_reset,
          graphs=2, breaks=0)


def with_a_break(x):
    y = x.sin() + 1
    print("y", y.shape)
    return y.cos()


def _explained(fn, x):
    r = frametrace.explain(fn)(x)
    return r.graph_count, r.graph_break_count, r.ops_per_graph, r.result


def test_explain_of_an_optimized_function_explains_the_function():
    x = torch.randn(4)
    opt = frametrace.optimize(with_a_break)
    opt(x)                                      # compiled and cached under its own backend
    got = _explained(opt, x)
    want = _explained(with_a_break, x)
    assert got[:3] == want[:3] == (2, 1, [2, 1])
    torch.testing.assert_close(got[3], with_a_break(x))
    check(opt, [x, torch.randn(4)], compiled=lambda counter: frametrace.optimize(
        backend=counter)(opt), graphs=0)       # (the outer wrapper leaves opt's cache to it)


def test_explain_of_an_optimized_module_explains_the_module():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    opt = frametrace.optimize(m)
    x = torch.randn(2, 4)
    opt(x)
    r = frametrace.explain(opt)(x)
    assert r.graph_count == 1 and r.graph_break_count == 0
    torch.testing.assert_close(r.result, m(x))


class Holder:
    @frametrace.optimize
    def step(self, x):
        y = x * 2
        print("step")
        return y + 1


def test_explain_of_a_method_optimized_in_its_class():
    h, x = Holder(), torch.randn(3)
    h.step(x)
    r = frametrace.explain(h.step)(x)
    assert (r.graph_count, r.graph_break_count) == (2, 1)
    torch.testing.assert_close(r.result, x * 2 + 1)
