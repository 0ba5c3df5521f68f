"""Resume functions, compiled or run in CPython: locals() lists only the user's names, and
zero-argument super() works after a break when `self` is a cell."""
import torch

import frametrace
from differential import check

@frametrace.disable
def opaque(t):
    return t


def test_locals_in_a_resume_function_run_in_cpython_lists_only_user_names():
    def f(x):
        y = x + 1
        z = [opaque(y), 2]
        try:
            raise ValueError
        except ValueError:        # no break while an exception is handled: the resume
            opaque(y)             # frame runs in CPython
        return sorted(locals())
    r = check(f, [torch.ones(2), torch.zeros(2)], breaks=1)
    assert r.fallbacks == 1


class _Base:
    def g(self, x):
        return x * 2


class _CellSelf(_Base):
    k = 3

    def g(self, x):
        y = opaque(x + 1)
        h = lambda: self          # noqa: E731  (self is a cell)
        return super().g(y) + h().k


class _CellSelfInCPython(_Base):
    def g(self, x):
        y = opaque(x + 1)
        h = lambda: self          # noqa: E731
        try:
            raise ValueError
        except ValueError:        # no break while an exception is handled: the resume
            opaque(y)             # frame runs in CPython
        s = super()
        return s.g(y), h() is self


def test_zero_argument_super_after_a_break_when_self_is_a_cell():
    def f(b, x):
        return b.g(x)
    # (f breaks at the call of g, whose own frame breaks at opaque())
    r = check(f, [(_CellSelf(), torch.ones(2)), (_CellSelf(), torch.zeros(2))], breaks=None)
    assert 1 <= r.breaks <= 2 and r.fallbacks == 0, r


def test_zero_argument_super_in_a_resume_frame_run_in_cpython_when_self_is_a_cell():
    def f(b, x):
        return b.g(x)
    r = check(f, [(_CellSelfInCPython(), torch.ones(2)), (_CellSelfInCPython(), torch.zeros(2))])
    assert r.fallbacks >= 1


def test_break_after_a_closure_over_a_free_variable_of_the_frame():
    # The frame passes its own free variable `scale` on to a closure it builds (3.13 loads
    # that cell with LOAD_FAST, an argument bytecode gives as a FreeVar); the resume
    # function after the break keeps it a free variable.
    scale = [2.0]

    def f(x):
        times = lambda t: t * scale[0]      # noqa: E731
        y = opaque(x + 1)
        return times(y) + 1
    check(f, [torch.ones(2), torch.zeros(2)], breaks=1)
