"""Class attributes reached by walking the class (``type(o).__mro__[1].k``,
``o.__class__.__bases__[0].k``, ``type(o).__dict__.get(...)``, a registry over the MRO's
dicts, a metaclass's attribute): every read is guarded on the class it was read from,
so a class changed between calls (a value replaced, an attribute added or deleted,
``__bases__`` or ``__class__`` assigned) recompiles, and nothing else does."""
import sys
import os

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from differential import Then, check  # noqa: E402


def classes():
    class A:
        k = 1
        z = 3

    class B(A):
        pass

    return A, B


def _noop():
    pass


# (name, function of (x, o), change of the classes A, B, C between calls)
WALKS = {
    "mro": (lambda x, o: x + type(o).__mro__[1].k, lambda A, B, C: setattr(A, "k", 5)),
    "class_bases": (lambda x, o: x + o.__class__.__bases__[0].k, lambda A, B, C: setattr(A, "k", 5)),
    "base": (lambda x, o: x + type(o).__base__.k, lambda A, B, C: setattr(A, "k", 5)),
    "own_dict_get": (lambda x, o: x + type(o).__dict__.get("z", 0), lambda A, B, C: setattr(B, "z", 7)),
    "base_dict_item": (lambda x, o: x + type(o).__mro__[1].__dict__["k"], lambda A, B, C: setattr(A, "k", 5)),
    "getattr_walk": (lambda x, o: x + getattr(type(o).__mro__[1], "k"), lambda A, B, C: setattr(A, "k", 5)),
    "getattr_default_added": (lambda x, o: x + getattr(type(o).__mro__[1], "new", 0),
                              lambda A, B, C: setattr(A, "new", 4)),
    "getattr_default_deleted": (lambda x, o: x + getattr(type(o).__mro__[1], "z", 0),
                                lambda A, B, C: delattr(A, "z")),
    "hasattr_base": (lambda x, o: x + (type(o).__base__.k if hasattr(type(o).__base__, "k") else 0),
                     lambda A, B, C: delattr(A, "k")),
    "bases_assigned": (lambda x, o: x + type(o).__mro__[1].k, lambda A, B, C: setattr(B, "__bases__", (C,))),
    "mro_length": (lambda x, o: x + len(type(o).__mro__), lambda A, B, C: setattr(B, "__bases__", (C,))),
    "class_assigned": (lambda x, o: x + type(o).__mro__[0].__dict__.get("k", -1),
                       lambda A, B, C: None),     # (o's class set by the test below)
}


def registry(x, o):
    # what a registry walking the MRO's dicts does
    for c in type(o).__mro__:
        if "k" in c.__dict__:
            return x + c.__dict__["k"]
    return x


WALKS["registry_shadowed"] = (registry, lambda A, B, C: setattr(B, "k", 9))
WALKS["registry_unshadowed"] = (registry, lambda A, B, C: delattr(A, "k"))


def _class_c():
    class C:
        k = 100
    return C


@pytest.mark.parametrize("name", sorted(WALKS))
def test_walk_changed_between_calls(name):
    fn, change = WALKS[name]
    A, B = classes()
    C = _class_c()
    o = B()
    x = torch.ones(2)

    def act():
        if name == "class_assigned":
            o.__class__ = A
        else:
            change(A, B, C)
    # The change happens before the third call: one entry before, one after.
    check(fn, [(x, o), (x, o), Then(act, x, o), (x, o)], compiles=2, breaks=0)


@pytest.mark.parametrize("name", sorted(WALKS))
def test_walk_unrelated_change_keeps_the_entry(name):
    """A change the trace did not read (another attribute of the same classes, another
    class) reuses the entry."""
    fn, _ = WALKS[name]
    A, B = classes()
    C = _class_c()
    o = B()
    x = torch.ones(2)

    def act():
        A.unrelated = 1
        B.unrelated2 = 2
        C.k = 7
    check(fn, [(x, o), Then(act, x, o), (x, o)], compiles=1, breaks=0)


def test_walk_reaches_a_new_class_object_per_call():
    """The same walk on instances of two classes: one entry each."""
    A, B = classes()

    class D(A):
        k = 40
    x = torch.ones(2)
    check(WALKS["mro"][0], [(x, B()), (x, D()), (x, B()), (x, D())], graphs=2, breaks=0)


def test_metaclass_attribute():
    class M(type):
        x = 1

    class A(metaclass=M):
        pass

    class B(A):
        pass

    def f(x, o):
        return x + type(type(o)).x + type(o).x       # the metaclass's, by both paths

    def change():
        M.x = 6
    o = B()
    x = torch.ones(2)
    check(f, [(x, o), (x, o), Then(change, x, o), (x, o)], graphs=2, breaks=0)


def test_metaclass_attribute_of_a_class_argument():
    class M(type):
        x = 1

    class A(metaclass=M):
        pass

    def change():
        M.x = 6
    x = torch.ones(2)
    check(lambda x, c: x + type(c).x, [(x, A), (x, A), Then(change, x, A)], graphs=2, breaks=0)


def test_classmethod_and_staticmethod_through_the_walk():
    class P:
        s = 3

        @classmethod
        def cm(cls):
            return cls.s

        @staticmethod
        def sm():
            return 4

    class Q(P):
        s = 5

    def f(x, o):
        return x + type(o).__mro__[1].cm() + type(o).__base__.sm() + type(o).cm()

    def value():
        P.s = 10

    def method():
        P.cm = classmethod(lambda cls: 100)

    def static():
        P.sm = staticmethod(lambda: 200)
    q = Q()
    x = torch.ones(2)
    check(f, [(x, q), (x, q), Then(value, x, q), Then(method, x, q), Then(static, x, q), (x, q)],
          graphs=4, breaks=0)


def test_init_subclass_registry():
    registry_ = {}

    class Base:
        def __init_subclass__(cls, **kw):
            super().__init_subclass__(**kw)
            registry_[cls.__name__] = cls

    class S1(Base):
        v = 1

    def f(x, name):
        return x + registry_[name].v + type(registry_[name]).__name__.__len__()

    def replace():
        class S1(Base):
            v = 7

    def change():
        registry_["S1"].v = 8
    x = torch.ones(2)
    check(f, [(x, "S1"), (x, "S1"), Then(replace, x, "S1"), Then(change, x, "S1"), (x, "S1")],
          graphs=3, breaks=0)
