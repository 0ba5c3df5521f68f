"""Methods of a set held opaquely (a global, an attribute, a closure, a float-keyed dict
beside it) or made in the frame: read, called and compared with CPython."""
import pytest
import torch

import frametrace
import frametrace.testing
from frametrace import convert
from differential import check


S = {1, 2}
D = {1.5: 2}


class _Holder:
    def __init__(self):
        self.s = {10}


H = _Holder()


def _read_add(x):
    y = x * 2
    m = S.add
    m(3)
    return y + len(S)


def _call_add(x):
    y = x * 2
    S.add(4)
    return y + len(S)


def _read_discard(x):
    y = x * 2
    m = S.discard
    m(1)
    return y + len(S)


def _read_copy(x):
    y = x * 2
    m = S.copy
    return y + len(m())


def _attribute_set(x):
    y = x * 2
    m = H.s.add
    m(11)
    return y + len(H.s)


def _float_keyed_dict(x):
    y = x * 2
    m = D.setdefault
    m(2.5, 3)
    return y + len(D)


@pytest.mark.parametrize("fn", [_read_add, _call_add, _read_discard, _read_copy, _attribute_set,
                                _float_keyed_dict])
def test_method_of_a_set_held_opaquely(fn):
    # `m = s.add` of a set from outside: wrap() handed the method to its owner's Var,
    # which wrapped it again (RecursionError, the frame ran in CPython)
    # (each call starts from fresh copies of the globals: a new set, so a new compile)
    r = check(fn, [torch.ones(2), torch.ones(2), torch.ones(2)], globals=("S", "D", "H"))
    assert r.graphs >= 2 and r.fallbacks == 0
    if fn is not _float_keyed_dict:
        assert r.breaks >= 3 and "opaque object" in r.reasons()[0], r


def test_method_of_a_closure_set():
    def make():
        cs = {5}

        def f(x):
            y = x + 1
            m = cs.add
            m(len(cs) + 5)
            return y * len(cs), sorted(cs)
        return f

    f, g = make(), make()
    counter = frametrace.testing.CompileCounter()
    c = frametrace.optimize(counter)(g)
    errors = convert.counters["internal_error"]
    for _ in range(3):
        a, b = f(torch.ones(2)), c(torch.ones(2))
        torch.testing.assert_close(a[0], b[0])
        assert a[1] == b[1]
    assert convert.counters["internal_error"] == errors and counter.frame_count >= 2


def test_method_of_a_set_made_in_the_frame():
    def f(x):
        s = {1}
        m = s.add
        m(2)
        return x + len(s), s

    check(f, [torch.ones(2), torch.ones(2)], graphs=1, breaks=0)
