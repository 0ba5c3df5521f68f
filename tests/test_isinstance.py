"""isinstance and issubclass in traced code: a metaclass's own checks, legacy tensor types
(by dtype), an ABC registered later, a runtime-checkable Protocol."""
import torch

import frametrace
from differential import check

# -- isinstance / issubclass --
ACCEPT_INTS = True


class _DuckMeta(type):
    def __instancecheck__(cls, obj):
        return hasattr(obj, "shape")

    def __subclasscheck__(cls, sub):
        return ACCEPT_INTS and sub is int


class Duck(metaclass=_DuckMeta):
    pass


def test_metaclass_instancecheck_and_subclasscheck_are_followed():
    def f(x, n):
        return x + 1, isinstance(x, Duck), isinstance(n, Duck), isinstance(n, (str, Duck)), \
            issubclass(int, Duck), issubclass(float, (Duck, str)), isinstance(x, (Duck, int))
    check(f, [(torch.ones(2), 3), (torch.randn(2), 3)], graphs=1, breaks=0)

    def g(x):
        return x + 1, issubclass(int, Duck)

    global ACCEPT_INTS
    try:
        cnt = frametrace.testing.CompileCounter()
        h = frametrace.optimize(backend=cnt)(g)
        assert h(torch.ones(1))[1] is True
        ACCEPT_INTS = False          # the check read a global: the compiled code notices
        assert h(torch.ones(1))[1] is False and cnt.frame_count == 2
    finally:
        ACCEPT_INTS = True


def test_isinstance_of_legacy_tensor_types_follows_dtype():
    def f(x):
        return x + 1, isinstance(x, torch.FloatTensor), isinstance(x, torch.DoubleTensor), \
            isinstance(x, (torch.LongTensor, torch.IntTensor)), isinstance(x * 2, torch.FloatTensor), \
            isinstance(x, torch.cuda.FloatTensor), isinstance(x, torch.Tensor)
    check(f, [torch.ones(2), torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.long),
              torch.ones(2)], compiles=3, breaks=0)


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
