"""torch's helpers that model code calls, traced or answered while tracing instead of
breaking: torch.nn.init's initialisers and torch.distributions (traced through as user
code where the program calls them; their frames run in CPython when CPython calls
them), torch.jit / torch.onnx / torch.fx "am I being traced" flags (answered and
guarded), torch.overrides.is_tensor_like, and the symbolic_shapes helpers
(guard_size_oblivious, statically_known_true ...) asked about a size.
"""
import pytest
import torch
import torch.fx._symbolic_trace as fx_trace
from torch.fx.experimental.symbolic_shapes import (guard_size_oblivious, is_concrete_int,
                                                   statically_known_true)

import frametrace
from differential import Then, check


def xs(*shape, n=3):
    return [(torch.randn(*shape),) for _ in range(n)]


def test_nn_init_of_new_weights_and_of_a_parameter():
    def f(x, lin):
        w = torch.empty(4, 4)
        torch.nn.init.xavier_uniform_(w, gain=torch.nn.init.calculate_gain("relu"))
        torch.nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
        torch.nn.init.zeros_(lin.bias)
        torch.nn.init.constant_(w[0], 0.5)
        return lin(x @ w)

    inputs = [(torch.randn(3, 4), torch.nn.Linear(4, 2)) for _ in range(3)]
    r = check(f, inputs, graphs=None, breaks=0)
    assert r.graphs == r.compiles >= 1, r       # (an entry per module instance)


def _validation(on):
    saved = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(on)
    yield
    torch.distributions.Distribution.set_default_validate_args(saved)


@pytest.fixture
def no_validation():
    yield from _validation(False)


@pytest.fixture
def validation():
    # (CPython's default; importing torch._dynamo turns it off for the process)
    yield from _validation(True)


def test_distributions_trace_without_validation(no_validation):
    def f(x):
        d = torch.distributions.Normal(x, torch.ones_like(x) * 2)
        c = torch.distributions.Categorical(logits=x)
        return d.log_prob(x + 1), d.rsample(), d.stddev, c.entropy(), c.probs

    check(f, xs(3, 4), graphs=1, breaks=0, compiles=1)


def test_validating_distributions_run_whole_in_cpython(validation):
    # Validation branches on the arguments' values; the constructor and log_prob are
    # called in CPython (a break each) rather than breaking inside at every check.

    def f(x):
        d = torch.distributions.Normal(x, torch.ones_like(x))
        return d.log_prob(x + 1) * 2

    r = check(f, xs(3, 4), graphs=None)
    assert r.breaks == 2, r

    def bad(x):
        return torch.distributions.Normal(x, -torch.ones_like(x)).mean + 1

    check(bad, xs(3), graphs=None)      # raises ValueError on both sides


def test_tracing_flags_are_answered():
    def f(x):
        if torch.jit.is_scripting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return x - 1
        if fx_trace.is_fx_tracing():
            return x - 2
        return x + 1

    check(f, xs(3), graphs=1, breaks=0, compiles=1)


def test_fx_tracing_flag_is_guarded():
    def f(x):
        return x - 2 if fx_trace.is_fx_tracing() else x + 1

    # (torch 2.14 keeps the flag per thread, set through _set_is_fx_tracing; before, a
    # module global)
    set_flag = getattr(fx_trace, "_set_is_fx_tracing", None) or \
        (lambda on: setattr(fx_trace, "_is_fx_tracing_flag", on))

    def flag(on):
        return lambda: set_flag(on)

    try:
        x = torch.randn(3)
        check(f, [(x,), Then(flag(True), x), Then(flag(True), x), Then(flag(False), x)],
              graphs=2, breaks=0, compiles=2)
    finally:
        set_flag(False)


def test_is_tensor_like():
    def f(x, n):
        a = torch.overrides.is_tensor_like(x)
        b = torch.overrides.is_tensor_like(n)
        return x + (1 if a else 0) + (10 if b else 0)

    # (the int's second value makes it a symbolic number: a second entry)
    check(f, [(torch.randn(3), 2), (torch.randn(3), 3), (torch.randn(3), 4)], graphs=2,
          breaks=0, compiles=2)


def test_symbolic_shape_helpers_on_dynamic_sizes():
    def f(x):
        if guard_size_oblivious(x.shape[0] == 1):
            x = x * 2
        if statically_known_true(x.shape[0] >= 0):
            x = x + 1
        return x

    inputs = [(torch.randn(n, 2),) for n in (3, 4, 5, 1, 6)]
    r = check(f, inputs, graphs=None, breaks=0, dynamic=True)
    # size 1 is specialised (as any 0/1 size is); the others share one entry
    assert r.compiles == 2, r


def test_symbolic_shape_helpers_answer_as_cpython_does():
    # On the symbol, statically_known_true(s0 == 3) is False and is_concrete_int(s0)
    # too; CPython, given the numbers, says True.  Deciding them guards.
    def f(x):
        if statically_known_true(x.shape[0] == 3):
            x = x * 2
        if is_concrete_int(x.shape[0]):
            x = x - 100
        return x

    inputs = [(torch.randn(n, 2),) for n in (3, 4, 3, 5)]
    check(f, inputs, graphs=None, breaks=0, dynamic=True)


def test_symbolic_shape_helpers_on_static_sizes():
    def f(x):
        if guard_size_oblivious(x.shape[0] == 1) or not statically_known_true(x.shape[0] == 3):
            return x * 2
        return x + 1

    check(f, [(torch.randn(3),), (torch.randn(3),), (torch.randn(1),)], graphs=2, breaks=0)
