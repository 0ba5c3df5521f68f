"""torch.use_deterministic_algorithms switched in the frame: the state the compiled call
leaves (and reads, before and after a break) is CPython's, whatever the backend kept of
the node, and the state at entry is guarded.  Differential (tests/differential.py), with
the graphs and breaks counted."""
import pytest
import torch

import frametrace
from differential import check


def _in_state(compiled):
    """Runs `compiled` from a given deterministic state and returns the state it left."""
    def outer(x, start, warn_only=False):
        torch.use_deterministic_algorithms(start, warn_only=warn_only)
        try:
            return (compiled(x), torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled())
        finally:
            torch.use_deterministic_algorithms(False)
    return outer


def _check_state(fn, inputs, **kw):
    return check(_in_state(fn), inputs,
                 compiled=lambda c: _in_state(frametrace.optimize(backend=c)(fn)), **kw)


def toggled_and_back(x):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    y = x + 1
    inside = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    return y, before, inside, torch.are_deterministic_algorithms_enabled()


def left_switched(x):
    torch.use_deterministic_algorithms(True, warn_only=True)
    return x * 2, torch.is_deterministic_algorithms_warn_only_enabled()


def switched_across_a_break(x):
    torch.use_deterministic_algorithms(True)
    y = x * 2
    print("deterministic:", torch.are_deterministic_algorithms_enabled())
    r = y + 1, torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    return r


def test_deterministic_toggled_in_frame():
    # (the read before the switch guards the entry state: one graph per entry state)
    r = _check_state(toggled_and_back, [(torch.randn(3), False), (torch.randn(3), True),
                                        (torch.randn(3), False)])
    assert r.breaks == 0 and r.graphs == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_deterministic_state_outlives_the_frame(backend):
    # The state the frame leaves is the call's, whatever the backend kept of its node.
    r = _check_state(left_switched, [(torch.randn(3), False), (torch.randn(3), True),
                                     (torch.randn(3), True, True)], backend=backend)
    assert r.breaks == 0 and r.graphs == 1


def test_deterministic_state_at_a_break(capsys):
    r = _check_state(switched_across_a_break, [(torch.randn(3), False), (torch.randn(3), True)])
    assert r.breaks == 1 and r.graphs == 2


def test_deterministic_state_put_back_after_the_compile():
    def f(x):
        torch.use_deterministic_algorithms(True)
        return x.view(7)            # fails while tracing
    r = _check_state(f, [(torch.randn(3), False)], graphs=None)
    assert r.graphs == 0
    assert not torch.are_deterministic_algorithms_enabled()


def switched_then_read_before_a_break(x):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    mode = torch.get_deterministic_debug_mode()
    print("mode", mode)         # the break traces the frame again from the entry state
    torch.use_deterministic_algorithms(False)
    return x + 1, before, mode, torch.get_deterministic_debug_mode()


def test_deterministic_state_read_again_after_a_break(capsys):
    r = _check_state(switched_then_read_before_a_break,
                     [(torch.randn(3), False), (torch.randn(3), True), (torch.randn(3), False)])
    assert r.breaks >= 1
