"""nn.Modules computed in CPython at a graph break (`copy.deepcopy(module)` in the
frame, issue 36): the resume frame traces them like any module, guarded by their type
and by what the trace reads of them, never by identity (a deep copy is a new object on
every call).  torch.compile breaks at the deepcopy too, then traces the copy's call.

Each test is differential (CPython against compiled on fresh copies of the inputs, over
several calls) and counts what was compiled: one break at the deepcopy, the copy's
uses in the graph after it, no recompile on later calls with a new copy.  The attacks
change what the copy is between calls (its class, an attribute, its hooks, shared
submodules, tied weights) and must recompile or stay right.
"""
from __future__ import annotations

import copy

import pytest
import torch

import frametrace
from frametrace import convert
from differential import Report, same, with_grads


def loop(fn, state, calls, backend="eager"):
    """`fn(*state, *call)` in CPython and compiled for each call in `calls`, where
    `state` (the modules) persists across calls on each side, as in a real program:
    each side has its own deep copy of it, made once.  Compares the results and the
    state after every call; returns what was compiled (differential.Report), with
    `per_call`: how many compiles each call made."""
    counter = frametrace.testing.CompileCounter(inner=backend)
    compiled = frametrace.optimize(backend=counter)(fn)
    eager_state, compiled_state = copy.deepcopy(state), copy.deepcopy(state)
    records, per_call = [], []
    errors = convert.counters["internal_error"]
    convert.record_observers.append(records.append)
    try:
        for i, call in enumerate(calls):
            torch.manual_seed(i)
            want = fn(*eager_state, *copy.deepcopy(call))
            torch.manual_seed(i)
            before = len(records)
            got = compiled(*compiled_state, *copy.deepcopy(call))
            per_call.append(len(records) - before)
            diff = same(want, got, "return value") or same(eager_state, compiled_state, "state after the call")
            assert not diff, f"call {i}: {diff}"
    finally:
        convert.record_observers.remove(records.append)
    report = Report(counter, records, convert.counters["internal_error"] - errors)
    report.per_call = per_call
    assert report.internal_errors == 0 and report.graphs >= 1, report
    return report


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(self.lin(x)).relu()


def _copy_and_scale(m, x):
    m2 = copy.deepcopy(m)
    with torch.no_grad():
        m2.lin.weight.mul_(0.5)
    return m2(x) + m(x), m2.lin.weight.sum()


def _xs(n=4, shape=(2, 4)):
    return [(torch.randn(*shape) * (i + 1),) for i in range(n)]


def test_copy_is_traced_after_one_break_and_never_recompiles():
    torch.manual_seed(0)
    r = loop(_copy_and_scale, (Block(),), _xs(5))
    assert r.breaks == 1, r
    # The frame up to the deepcopy, then its resume frame: two compiles in all, for
    # five calls that each made a new copy.
    assert r.compiles == 2, r
    assert r.per_call == [2, 0, 0, 0, 0], r.per_call
    ops = [str(n.target) for gm in r.counter.graphs for n in gm.graph.nodes
           if n.op in ("call_function", "call_method")]
    # The copy's weight scaled and both modules' linears are in the graph.
    assert sum("linear" in t for t in ops) == 2, ops
    assert any("mul_" in t for t in ops), ops


def test_switch_off_keeps_the_copy_opaque():
    frametrace.config.trace_modules_from_breaks = False
    try:
        r = loop(_copy_and_scale, (Block(),), _xs(3))
    finally:
        frametrace.config.trace_modules_from_breaks = True
    assert r.breaks > 1, r          # each use of the copy breaks again


def test_gradients_through_the_copy_and_the_original():
    def f(m, x):
        m2 = copy.deepcopy(m)
        return (m2(x) * m(x)).sum()
    torch.manual_seed(1)
    r = loop(with_grads(f), (Block(),), [(torch.randn(3, 4, requires_grad=True),) for _ in range(4)])
    # (the harness's autograd.grad is a break of its own; f, called from the harness's
    # frame, is compiled as a frame of its own, its resume after the deepcopy too)
    assert r.per_call[1:] == [0, 0, 0], r
    assert r.counter.graphs and any(n.target is torch.nn.functional.layer_norm or "layer_norm" in str(n.target)
                                    for gm in r.counter.graphs for n in gm.graph.nodes), r


def test_training_buffers_written_into_the_returned_copy():
    # BatchNorm in training mode updates the copy's running stats: the returned copy
    # holds them, and the original's are untouched.
    def f(m, x):
        m2 = copy.deepcopy(m)
        y = m2(x)
        return y, m2
    torch.manual_seed(2)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    r = loop(f, (m,), [(torch.randn(8, 4) + i,) for i in range(4)])
    assert r.breaks == 1 and r.per_call == [2, 0, 0, 0], r


def test_another_class_at_the_break_recompiles():
    # The resume frame's module is a Linear on some calls, a Block on others.
    def f(models, k, x):
        m2 = copy.deepcopy(models[k])
        return m2(x)
    torch.manual_seed(3)
    models = {"lin": torch.nn.Linear(4, 4), "block": Block()}
    calls = [(k, torch.randn(2, 4)) for k in ("lin", "block", "lin", "block", "block")]
    r = loop(f, (models,), calls)
    # The frame and its resume, for each key (a constant string) and so each class;
    # nothing after.
    assert r.per_call == [2, 2, 0, 0, 0], r.per_call


class Scaled(torch.nn.Module):
    def __init__(self, scale, shared=False):
        super().__init__()
        self.scale = scale
        self.a = torch.nn.Linear(4, 4)
        self.b = self.a if shared else torch.nn.Linear(4, 4)
        self.count = 0

    def forward(self, x):
        self.a.count = getattr(self.a, "count", 0) + 1
        return self.b(x) * self.scale + getattr(self.b, "count", 0)


def _copy_and_run(m, x):
    m2 = copy.deepcopy(m)
    return m2(x), m2


@pytest.mark.parametrize("scales", [(1.0, 2.0, 2.0), (1, True, 1.0)])
def test_attribute_values_of_the_copy_are_guarded(scales):
    # An attribute that differs between calls (a float, and 1 / True / 1.0, which are
    # equal but not the same): each value computed as CPython does.
    torch.manual_seed(4)
    m = Scaled(1.0)

    def f(m, s, x):
        m.scale = s             # the original changed between calls, then copied
        return _copy_and_run(m, x)
    loop(f, (m,), [(s, torch.randn(2, 4)) for s in scales])


def test_shared_and_distinct_submodules_are_told_apart():
    # `a` and `b` are one module on some calls and two on others: an attribute written
    # through `a` is read through `b` only when they are the same object.
    torch.manual_seed(5)
    models = {s: Scaled(2.0, shared=s) for s in (True, False)}

    def f(models, s, x):
        return _copy_and_run(models[s], x)
    r = loop(f, (models,), [(s, torch.randn(2, 4)) for s in (True, False, True, False)])
    assert r.per_call[2:] == [0, 0], r.per_call


def test_tied_weights_in_the_copy_stay_tied():
    def f(m, x):
        m2 = copy.deepcopy(m)
        with torch.no_grad():
            m2[0].weight.add_(1.0)          # seen through m2[1].weight as well
        return m2(x)
    torch.manual_seed(6)
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False))
    tied[1].weight = tied[0].weight
    untied = copy.deepcopy(tied)
    untied[1].weight = torch.nn.Parameter(tied[0].weight.detach().clone())
    models = {"tied": tied, "untied": untied}

    def g(models, k, x):
        return f(models[k], x)
    r = loop(g, (models,), [(k, torch.randn(2, 4)) for k in ("tied", "untied", "tied", "untied")])
    assert r.per_call[2:] == [0, 0], r.per_call


def test_hooks_added_to_the_copy_are_run():
    seen = []

    def hook(mod, args, out):
        seen.append(tuple(out.shape))
        return out * 2

    def f(m, x, hooked):
        m2 = copy.deepcopy(m)
        if hooked:
            m2.register_forward_hook(hook)
        return m2(x)

    torch.manual_seed(7)
    # The hook is registered in the frame, so the copy has one on some calls: guarded,
    # never skipped.
    loop(f, (torch.nn.Linear(4, 4),), [(torch.randn(2, 4), h) for h in (False, True, False, True)])
    assert seen, "the hook never ran"


def test_a_module_made_at_a_break_inside_a_module_forward():
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            ema = copy.deepcopy(self.block)
            with torch.no_grad():
                for p in ema.parameters():
                    p.mul_(0.9)
            return ema(x) - self.block(x)

    torch.manual_seed(8)
    outer = Outer()
    r = loop(lambda m, x: m(x), (outer,), _xs(4, (3, 4)))
    assert r.per_call[1:] == [0, 0, 0], r.per_call
    # Outer.forward (its own frame: the lambda's call of it breaks at the deepcopy
    # inside) and its resume, with ema's scaling and both blocks in one graph.
    assert any(sum("linear" in str(n.target) for n in gm.graph.nodes) == 2 for gm in r.counter.graphs), r
