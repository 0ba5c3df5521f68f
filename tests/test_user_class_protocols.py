"""Instances of user classes in the protocols CPython runs on them, traced: a class's
own __new__ (inlined, then __init__ only on an instance of the class), object.__new__,
binary and comparison operators by the user's dunders (in-place first, the reflected
one first for a subclass on the right, NotImplemented passing on, == and != falling
back to identity, TypeError when nothing answers), str() / repr() / callable() of an
instance, and dataclass fields with a default_factory.
"""
import dataclasses
import typing

import torch

from differential import check


def xs(n=3):
    return [(torch.randn(3),) for _ in range(n)]


class Doubled:
    def __new__(cls, v):
        obj = super().__new__(cls)
        obj.v = v * 2
        return obj

    def __init__(self, v):
        self.w = v + 1


class MaybeInt:
    def __new__(cls, v):
        if v < 0:
            return v * 10          # not a MaybeInt: no __init__ runs
        return object.__new__(cls)

    def __init__(self, v):
        self.v = v


class Plain:
    pass


def test_own_new_and_object_new():
    def f(x):
        d = Doubled(x)
        m, n = MaybeInt(3), MaybeInt(-2)
        p = object.__new__(Plain)
        p.t = x
        return d.v + d.w, m.v, n, type(m) is MaybeInt, p.t * 3, isinstance(p, Plain)

    check(f, xs(), graphs=1, breaks=0, compiles=1)


class Money:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        if not isinstance(other, Money):
            return NotImplemented
        return self.v == other.v

    def __lt__(self, other):
        return self.v < other.v

    def __add__(self, other):
        if isinstance(other, (int, float)):
            return Money(self.v + other)
        if isinstance(other, Money):
            return Money(self.v + other.v)
        return NotImplemented

    def __radd__(self, other):
        return Money(other * 100 + self.v)

    def __iadd__(self, other):
        self.v = self.v - other
        return self


class Euro(Money):
    def __radd__(self, other):
        return Euro(-1)

    def __gt__(self, other):
        return "euro-gt"


class NoEq:
    def __init__(self, v):
        self.v = v


def test_operators_by_user_dunders():
    def f(x):
        a, b, c = Money(x), Money(2), Money(2)
        s = a + b + 1
        r = 5 + b
        e = b + Euro(3)         # Euro's __radd__ first: it derives from Money
        b += 1
        return (s.v, r.v, e.v, b.v, b == c, b != c, c == Money(2), c != Money(2),
                c == 2, c != 2, b < c, Money(1) < Euro(3), a == a)

    check(f, xs(), graphs=1, breaks=0, compiles=1)


def test_equality_falls_back_to_identity():
    def f(x, outside):
        a, b = NoEq(x), NoEq(x)
        return x + 1, a == b, a != b, a == a, a != a, a == outside, outside == outside, \
            outside != outside

    check(f, [(torch.randn(2), NoEq(1)), (torch.randn(2), NoEq(2))], graphs=1, breaks=0)


def test_comparison_nothing_answers_raises_type_error():
    def f(x):
        y = x + 1
        return NoEq(y) < NoEq(y)

    check(f, xs(2), graphs=None)


class Named:
    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return f"Named({self.v!r})"

    def __call__(self, y):
        return y + self.v


class Shown(Named):
    def __str__(self):
        return f"<{self.v}>"


def test_str_repr_callable():
    def f(x):
        a, b = Named(2), Shown(3)
        text = str(a) + repr(a) + str(b) + repr(b)
        return x + len(text), text, callable(a), callable(NoEq(1)), a(x)

    check(f, xs(), graphs=1, breaks=0, compiles=1)


@dataclasses.dataclass
class History:
    items: list = dataclasses.field(default_factory=list)
    meta: dict = dataclasses.field(default_factory=lambda: {"n": 0})
    scale: float = 2.0


def test_dataclass_default_factory_makes_a_new_value_each_time():
    def f(x):
        h, g = History(), History()
        h.items.append(x * h.scale)
        h.meta["n"] += 1
        return h.items[0], len(g.items), g.meta["n"], h.meta["n"]

    check(f, xs(), graphs=1, breaks=0, compiles=1)


class Point(typing.NamedTuple):
    x: torch.Tensor
    k: int = 2

    def scaled(self):
        return self.x * self.k

    @property
    def norm(self):
        return self.x.abs().sum()

    @classmethod
    def origin(cls, like):
        return cls(torch.zeros_like(like), 0)

    @staticmethod
    def unit():
        return 1


def test_namedtuple_subclass_methods():
    def f(x):
        p = Point(x, 3)
        o = Point.origin(x)
        return p.scaled() + p.norm + p.unit(), o.scaled(), o.k, p._replace(k=4).scaled()

    check(f, xs(), graphs=1, breaks=0, compiles=1)
