"""Instances of user classes in the protocols CPython runs on them, traced: a class's
own __new__ (inlined, then __init__ only on an instance of the class), object.__new__,
binary and comparison operators by the user's dunders (in-place first, the reflected
one first for a subclass on the right, NotImplemented passing on, == and != falling
back to identity, TypeError when nothing answers), str() / repr() / callable() of an
instance, and dataclass fields with a default_factory.
"""
import collections.abc
import dataclasses
import typing

import torch

from differential import Then, check


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


class Tag:
    pass


LIN = torch.nn.Linear(2, 2)


def test_id_of_tensors_objects_classes_and_modules():
    def f(x, y, o):
        m = LIN
        d = {id(x): x + 1, id(o): 5, id(Tag): 7, id(m): 9}
        d[id(y)] = y * 2
        k = id(o)
        return (len(d), d[id(x)], d[k], d[id(type(o))], d[id(m)], id(x) == id(y),
                id(x) != id(y), id(y) in d, id(Tag()) in d, m(x))

    x = torch.randn(2)
    calls = [(x, x, Tag()), (x, torch.randn(2), Tag()), (x, x, Tag())]
    # (x passed twice, or two tensors: which it is, is guarded)
    check(f, calls, graphs=2, breaks=0, compiles=2)


def test_id_kept_by_the_program_is_computed_at_run_time():
    import frametrace

    def f(x):
        return {id(x): 1}, id(x)

    x = torch.randn(2)
    d, i = frametrace.optimize(f, backend="eager")(x)
    assert i == id(x) and list(d) == [id(x)]
    y = torch.randn(2)
    d, i = frametrace.optimize(f, backend="eager")(y)
    assert i == id(y) and list(d) == [id(y)]


@dataclasses.dataclass(frozen=True)
class Key:
    a: int
    b: str = "x"


def test_frozen_dataclass_instances_as_dict_keys_and_set_members():
    def f(x):
        d = {Key(1): x + 1, Key(2, "y"): x * 2}
        s = {Key(1), Key(1), Key(3)}
        d[Key(1)] = d[Key(1)] * 10
        return d[Key(2, "y")], d, len(s), Key(1) in s, Key(2) in s, Key(1) in d, d.get(Key(9))

    # (the returned dict is built again at run time: its keys' generated __hash__ runs
    # under the hook, a frame of no graph)
    r = check(f, xs(), graphs=1, breaks=0)
    assert [rec.code.co_name for rec in r.records].count("f") == 1, r


class Registry(collections.abc.MutableMapping):
    def __init__(self, **kw):
        self._d = dict(kw)

    def __getitem__(self, k):
        return self._d[k]

    def __setitem__(self, k, v):
        self._d[k] = v

    def __delitem__(self, k):
        del self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


class OwnKeys(Registry):
    def keys(self):
        return ["b"]


def takes(a=0, b=0):
    return a * 10 + b


def test_dict_and_star_star_of_a_user_mapping():
    def f(x, m):
        local = Registry(a=x, b=2)
        d = dict(local)
        d.update(m)
        return d, takes(**m), {**local, "c": 3}, dict(OwnKeys(a=1, b=5)), x + takes(**OwnKeys(a=1, b=5))

    check(f, [(torch.randn(2), Registry(a=1, b=2)), (torch.randn(2), Registry(a=3, b=4))],
          graphs=None, breaks=0)


class Shape:
    pass


class Square(Shape):
    pass


def test_subclasses_are_read_again_by_the_guard():
    def f(x):
        return x + len(Shape.__subclasses__()), [c.__name__ for c in Shape.__subclasses__()]

    x = torch.randn(2)
    keep = []
    try:
        check(f, [(x,), (x,), Then(lambda: keep.append(type("Circle", (Shape,), {})), x), (x,)],
                  graphs=2, breaks=0, compiles=2)
    finally:
        keep.clear()


def _target(a, b=2, *rest, c=3, **kw):
    return a


def test_signature_bind_and_apply_defaults():
    import inspect

    def f(x):
        ba = inspect.signature(_target).bind(x, 5, 6, d=7)
        before = dict(ba.arguments)
        ba.apply_defaults()
        return (ba.arguments["a"] + ba.arguments["b"] + ba.arguments["c"], ba.args[0] * 2,
                ba.args[1:], ba.kwargs, list(before), list(ba.arguments))

    check(f, xs(), graphs=1, breaks=0, compiles=1)

    def missing(x):
        return inspect.signature(_target).bind(c=x)      # TypeError: missing 'a'

    check(missing, xs(2), graphs=None)


class Indexable:
    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return f"Indexable({self.v})"

    def __index__(self):
        return 2


def test_builtin_left_operands_that_take_any_object():
    # str % obj formats it, list * obj asks its __index__: neither is NotImplemented
    # (CPython runs them); a number or None on the left always is
    def f(x):
        a = Indexable(3)
        return x + 1, "%s!" % a, [1] * a, 3 == a, None != a, (1,) == a

    check(f, xs(2), graphs=None)
