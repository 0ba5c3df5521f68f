"""A graph that raises midway (an index out of range only the data decide) inside
grad-mode `with` blocks leaves grad mode as CPython's blocks would: put back as the
exception leaves them.  It used to stay switched off for the rest of the program (the
fuzzer found it: every later test ran under no_grad)."""
import pytest
import torch

import frametrace


def _in_no_grad_writes_then_fails(t, i):
    with torch.no_grad():
        t += 1                        # an input written: the graph cannot run again
        return t[i] * 2


def _in_no_grad_after_a_break(t):
    with torch.no_grad():
        if t.sum() > 0:               # a graph break inside the block
            t += t.view(-1)[(t > -1).long().sum().view(1)]
    return t


def _nested_blocks(t, i):
    with torch.no_grad():
        t += 1
        with torch.enable_grad():
            y = t[i]
    return y


def _set_as_a_function(t, i):
    torch.set_grad_enabled(False)     # not scoped: CPython leaves it off
    t += 1
    return t[i]


def _outcome(fn, args):
    torch.set_grad_enabled(True)
    try:
        got = ("value", fn(*args))
    except Exception as e:
        got = ("raised", type(e).__name__)
    mode = torch.is_grad_enabled()
    torch.set_grad_enabled(True)
    return got[0], got[1] if got[0] == "raised" else None, mode


@pytest.mark.parametrize("fn, calls", [
    (_in_no_grad_writes_then_fails, [(torch.ones(3), 1), (torch.ones(3), 5), (torch.ones(3), 0)]),
    (_in_no_grad_after_a_break, [(torch.full((2,), -3.0),), (torch.ones(2),), (torch.ones(2),)]),
    (_nested_blocks, [(torch.ones(3), 1), (torch.ones(3), 7)]),
    (_set_as_a_function, [(torch.ones(3), 1), (torch.ones(3), 9)]),
])
def test_grad_mode_after_a_graph_raises_matches_cpython(fn, calls):
    cc = frametrace.testing.CompileCounter()
    compiled = frametrace.optimize(cc)(fn)
    for args in calls:
        want = _outcome(fn, [a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        got = _outcome(compiled, [a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        assert got == want, (args, got, want)
    assert cc.frame_count >= 1
