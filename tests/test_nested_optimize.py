"""An optimize() wrapper (a compiled function or module) called from another compiled
function: traced into the caller's graph, a disable() inside still breaks it, a swapped
wrapper is noticed, and the wrappers stay themselves as values."""

import torch

import frametrace

from differential import check
from test_leaks import Scale  # (a module multiplying by one parameter)
from test_outside_state_guards import Then
from test_swapped_parameters import _twins


torch.manual_seed(0)
opt_linear = frametrace.optimize(torch.nn.Linear(4, 4))
opt_scale = frametrace.optimize(Scale())


@frametrace.optimize(backend="eager")
def opt_sin(x):
    return x.sin() + 1


@frametrace.disable
def logged(x):
    return x.cos()


@frametrace.optimize(backend="eager")
def opt_with_disabled(x):
    return logged(x + 1) * 2


def calls_optimized(x):
    return opt_linear(x).relu() + opt_sin(x) + opt_scale(x)


def test_optimized_module_and_function_called_from_a_compiled_function_are_traced_into_its_graph():
    check(calls_optimized, [torch.randn(2, 4), torch.randn(2, 4)], graphs=1, breaks=0)


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = frametrace.optimize(Scale())

    def forward(self, x):
        return self.inner(x) + self.inner.w


def test_optimized_submodule_is_traced_into_the_outer_modules_graph():
    eager, twin = _twins(Holder)
    r = check(eager, [torch.randn(4), torch.randn(4)], graphs=1,
              compiled=lambda counter: frametrace.optimize(backend=counter)(twin))
    assert r.breaks == 0, r


def test_disable_inside_an_optimized_function_still_breaks_the_outer_graph():
    outer = lambda x: opt_with_disabled(x) - 1     # noqa: E731
    r = check(outer, [torch.randn(4), torch.randn(4)])
    assert [(rec.outcome, rec.reason) for rec in r.records if rec.code is outer.__code__] == \
        [("break", "calling test_nested_optimize.logged")], r


def test_optimized_module_swapped_between_calls_is_noticed():
    box = {"m": opt_scale}
    def use(x):
        return box["m"](x)
    other = frametrace.optimize(torch.nn.Linear(4, 4))
    check(use, [torch.randn(4), Then(lambda: box.update(m=other), torch.randn(4))], graphs=2)


opt_disabled_scale = frametrace.disable(frametrace.optimize(Scale()))


def test_disabled_optimized_module_called_from_a_compiled_function_runs_in_cpython():
    outer = lambda x: opt_disabled_scale(x) + 1     # noqa: E731
    r = check(outer, [torch.randn(4), torch.randn(4)])
    assert [rec.outcome for rec in r.records if rec.code is outer.__code__] == ["break"], r


def test_optimized_wrappers_stay_themselves_as_values():
    def f(x):
        kinds = (isinstance(opt_scale, frametrace.OptimizedModule), type(opt_sin).__name__,
                 opt_scale.w is opt_scale._orig_mod.w, opt_sin.__name__)
        return kinds, opt_sin, opt_scale, opt_scale(x) + opt_sin(x)
    check(f, [torch.randn(4), torch.randn(4)], graphs=1, breaks=0)
