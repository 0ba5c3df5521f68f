"""Resume functions, guards and builtins: gaps where a compiled frame (or a resume
function run in CPython) answered differently from CPython.  Differential tests."""
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


class _Plain:
    def __init__(self):
        self.v = 1


class _WithFoo:
    foo = 5


def test_hasattr_and_getattr_follow_a_class_assigned_in_the_frame():
    def f(o, x):
        before = hasattr(o, "foo"), getattr(o, "foo", None)
        o.__class__ = _WithFoo
        return x + 1, before, hasattr(o, "foo"), getattr(o, "foo", 0), hasattr(o, "bar"), \
            hasattr(o, "v")
    check(f, [(_Plain(), torch.ones(2)), (_Plain(), torch.zeros(2))])


def test_isinstance_of_an_abc_notices_a_later_register():
    import abc

    class Shape(abc.ABC):
        pass

    class Square:
        pass

    def f(o, x):
        return x + 1 if isinstance(o, Shape) else x - 1, issubclass(type(o), (int, Shape))
    counter = frametrace.testing.CompileCounter()
    compiled = frametrace.optimize(backend=counter)(f)
    x = torch.ones(2)
    assert compiled(Square(), x)[1] is False and torch.equal(compiled(Square(), x)[0], x - 1)
    Shape.register(Square)
    got, want = compiled(Square(), x), f(Square(), x)
    assert got[1] is want[1] is True and torch.equal(got[0], want[0])
    assert counter.frame_count == 2


def test_isinstance_of_a_runtime_protocol_looks_at_the_instance():
    import typing

    @typing.runtime_checkable
    class Closer(typing.Protocol):
        def close(self): ...

    class Thing:
        pass

    def with_close():
        t = Thing()
        t.close = print
        return t

    def f(o, x):
        return x + 1 if isinstance(o, Closer) else x - 1
    check(f, [(with_close(), torch.ones(2)), (Thing(), torch.ones(2)), (with_close(), torch.ones(2))])


def test_parameters_without_recursion_guard_only_the_module_own_parameters():
    def f(m, x):
        total = x
        for p in m.parameters(recurse=False):
            total = total + p.sum()
        return total, [n for n, _ in m.named_buffers(recurse=False)]

    def g(m, x):
        return sum(p.sum() for p in m.parameters()) + x

    m = torch.nn.Linear(2, 2)
    m.inner = torch.nn.Linear(2, 2)
    x = torch.ones(2)
    counter = frametrace.testing.CompileCounter()
    cf, cg = frametrace.optimize(backend=counter)(f), frametrace.optimize(backend=counter)(g)
    cf(m, x), cg(m, x)
    m.inner.more = torch.nn.Linear(2, 2)      # what recurse=False does not walk changed
    m.other = torch.nn.ReLU()
    for compiled, fn in ((cf, f), (cg, g)):
        got, want = compiled(m, x), fn(m, x)
        assert str(got) == str(want)
    assert counter.frame_count == 3           # f once; g again (its walk changed)


def test_numpy_scalars_passed_in_then_python_numbers():
    # No wrong answer was found with NumPy scalars (they are opaque values: a torch op
    # on one breaks the graph, and their types are guarded); this keeps it so.
    np = __import__("numpy")

    def f(x, s):
        return x * s, type(s) is np.float64, isinstance(s, float), s * 2, (x + s).dtype, \
            x.int() * s

    inputs = [np.float32(2.0), np.float64(3.0), 2.5, np.int64(2), 2, np.float32(4.0)]
    check(f, [(torch.ones(2), s) for s in inputs], max_graphs=len(inputs))
