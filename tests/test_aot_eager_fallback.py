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


def _masked_put_plus(x, m, v, w):
    return torch.index_put(x, (m,), v) * 2 + w.sum(0).sum()


@pytest.mark.parametrize("geometry, overlapping", [
    (((2, 3), (2, 1)), True),       # rows overlap without a zero stride
    (((3, 2), (1, 2)), True),
    (((2, 2, 2), (3, 2, 1)), True),  # undecided by sorting strides: listed
    (((2, 3), (1, 2)), False),      # interleaved, disjoint
    (((2, 2), (3, 2)), False),      # strides out of order, disjoint
    (((3, 2), (2, 3)), False),      # undecided by sorting strides, disjoint
])
def test_no_fallback_for_an_input_whose_elements_overlap(geometry, overlapping):
    size, stride = geometry
    m = torch.tensor([True, False, True, False, True])

    def call():
        w = torch.arange(12.).as_strided(size, stride)
        return Call(torch.randn(5, requires_grad=True), m, torch.randn(3, requires_grad=True), w)
    if not overlapping:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = check_grads(_masked_put_plus, [call() for _ in range(3)], backend="aot_eager")
        assert r.graphs == 1 and r.breaks == 0, r
        return
    # only read, the overlapping input has nothing to copy back: the fallback runs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = check_grads(_masked_put_plus, [call() for _ in range(3)], backend="aot_eager")
    assert r.graphs == 1 and r.breaks == 0, r


@pytest.mark.parametrize("fn, writes", [
    (lambda w: w.sum(0) * 2, False),
    (lambda w: w.add_(1), True),
    (lambda w: torch.relu_(w), True),
    (lambda w: torch.nn.functional.relu(w, inplace=True), True),
    (lambda w: torch.add(w, 1, out=w), True),
    (lambda w: w.__setitem__(0, 1.0), True),
], ids=["read", "method", "function", "inplace=", "out=", "setitem"])
def test_a_graph_that_may_write_gets_no_fallback_over_overlapping_inputs(fn, writes):
    # (the tracer breaks before most writes into overlapping memory: this is the
    # backend's own refusal, for a write that reaches it)
    from frametrace.backends.aot_eager import _may_write
    gm = torch.fx.symbolic_trace(fn)
    assert _may_write(gm) == writes


def test_backward_over_an_expanded_input_aot_autograd_refuses_runs_functionalized():
    # max_unpool3d's backward over an expanded input: AOTAutograd's trace fails ("Cannot
    # view a tensor with..."), eager computes it; nothing is written, so the fallback runs
    # (it raised BackendCompilerFailed: the OpInfo sweep's errors on aot_eager)
    def f(x, idx):
        return torch.nn.functional.max_unpool3d(x, idx, 2) * 3

    def call(i):
        x = torch.randn(1, 2, 1, 1, 1).expand(1, 2, 2, 2, 2).detach().requires_grad_(True)
        idx = torch.tensor([[[[[0, 3], [5, 6]], [[9, 10], [12, 15]]]] * 2]).reshape(1, 2, 2, 2, 2)
        return Call(x, idx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = check_grads(f, [call(i) for i in range(2)], backend="aot_eager")
    assert r.graphs == 1 and r.breaks == 0, r


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_write_into_an_as_strided_input_whose_rows_overlap(backend):
    # Eager's add_ adds twice into the element both rows hold; a functionalized graph
    # would copy back one sum.  torch's own overlap test answers "too hard" for it.
    def f(x, w):
        w.add_(x)
        return w * 2

    def call(i):
        return Call(torch.full((2, 3), float(i)), torch.arange(6.).as_strided((2, 3), (2, 1)))
    r = check(f, [call(i) for i in (1, 2, 3)], backend=backend)
    assert r.breaks == 1 and r.graphs == 1, r
    assert any("share memory" in why for why in r.reasons()), r.reasons()


def _put_and_view_of_written(x, m, v, w):
    w.add_(1)
    return torch.index_put(x, (m,), v), w[1:]


def test_no_fallback_for_an_output_that_is_a_view_of_an_input(monkeypatch):
    # functionalize hands such an output back as a copy: a write through it would miss
    # the input.  No fallback: BackendCompilerFailed, never a wrong value; with
    # suppress_errors the frame runs in CPython, views and all.
    x, m, v = _inputs(1)[0]
    c = frametrace.optimize(_put_and_view_of_written, backend="aot_eager")
    w = torch.zeros(3)
    with pytest.raises(frametrace.BackendCompilerFailed):
        c(x, m, v, w)
    monkeypatch.setattr(frametrace.config, "suppress_errors", True)

    def written_through_the_view(fn):
        def run(x, m, v, w):
            out, view = fn(x, m, v, w)
            view.add_(5)
            return out
        return run
    frametrace.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(written_through_the_view(_put_and_view_of_written),
              [Call(*_inputs(1)[0], torch.zeros(3)) for _ in range(3)], backend="aot_eager",
              compiled=lambda counter: written_through_the_view(
                  frametrace.optimize(backend=counter)(_put_and_view_of_written)))
