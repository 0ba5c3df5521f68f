"""aot_eager on graphs AOTAutograd cannot compile although eager runs them: the graph runs
as eager ops under torch.func.functionalize (input writes applied after the rest, as
AOTAutograd applies them), with a warning; with the switch off, BackendCompilerFailed."""
import warnings

import pytest
import torch

import frametrace
from differential import Call, check, check_grads


def masked_put(x, m, v):
    # A boolean mask's backward needs nonzero(): AOTAutograd's trace of it has a
    # data-dependent size and fails; eager's autograd does not care.
    return torch.index_put(x, (m,), v) * 2


def _inputs(n):
    m = torch.tensor([True, False, True, False, True])
    return [(torch.randn(5, requires_grad=True), m, torch.randn(3, requires_grad=True)) for _ in range(n)]


def test_graph_aot_autograd_refuses_runs_functionalized_with_gradients():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = check_grads(masked_put, _inputs(3), backend="aot_eager")
    assert r.graphs == 1 and r.breaks == 0, r
    assert any("functionalized" in str(w.message) for w in seen)


def test_input_writes_stay_deferred_when_the_graph_raises():
    # The backend promises input writes after the rest of the graph (so a graph that
    # raises is run again in CPython): the fallback keeps that promise.
    def f(x, m, v, w, idx):
        w.add_(1)
        y = torch.index_put(x, (m,), v)
        return y[idx] * w.sum()

    def call(i):
        x, m, v = _inputs(1)[0]
        return Call(x, m, v, torch.zeros(2), torch.tensor([i]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = check_grads(f, [call(1), call(9), call(2), call(7)], backend="aot_eager")
    assert r.graphs >= 1, r


def test_switch_off_raises_backend_compiler_failed(monkeypatch):
    monkeypatch.setattr(frametrace.config, "aot_eager_functionalized_fallback", False)
    c = frametrace.optimize(masked_put, backend="aot_eager")
    with pytest.raises(frametrace.BackendCompilerFailed):
        c(*_inputs(1)[0])
