"""Containers holding tensors compared as CPython compares them: `in`, `==` / `!=`
of lists and tuples, and list.index go item by item, identity first and then `==`
and its truth (a tensor found by identity before any other needs no data; one
compared with another tensor is a break, where CPython reads the data or raises);
dicts from outside keyed by classes or TypeVars; defaultdict.fromkeys.
"""
import collections
import typing

import torch

from differential import check


def pairs(n=3):
    return [(torch.randn(3), torch.randn(3)) for _ in range(n)]


def test_membership_and_equality_by_identity_first():
    def f(x, y):
        items, t = [x, 1, "a"], (y, x)
        return (x + (x in items) + (y in t) + ("a" in ["a", x]) + (3 not in [1, 2]),
                [x, 1] == [x, 1], (y, 2) != (y, 2), [x] == [x, 2], (x,) == [x],
                items.index(x), t.index(y))

    check(f, pairs(), graphs=1, breaks=0, compiles=1)


def test_comparing_two_tensors_by_value_breaks_as_cpython_reads_them():
    # `y in [x, y]` compares x == y first: a tensor whose truth CPython reads (one
    # element) or refuses (RuntimeError for three).
    def f(x, y):
        return x + (y in [x, y])

    r = check(f, pairs(), graphs=None)
    assert r.breaks == 1, r
    check(f, [(torch.tensor([1.]), torch.tensor([1.])), (torch.tensor([1.]), torch.tensor([2.]))],
          graphs=None)


T = typing.TypeVar("T")
U = typing.TypeVar("U")


class A:
    pass


class B(A):
    pass


TABLE = {T: 5, U: 7, A: 1, B: 2}


def test_dict_keyed_by_typevars_and_classes():
    def f(x, cls):
        return x + TABLE[T] * TABLE[U] + TABLE[cls], len(TABLE)

    check(f, [(torch.randn(2), A), (torch.randn(2), B), (torch.randn(2), A)],
          graphs=2, breaks=0, compiles=2)


def test_defaultdict_fromkeys():
    def f(x):
        d = collections.defaultdict.fromkeys(["a", "b"], 0)
        d["a"] += 1
        return x + d["a"] + d["b"], type(d) is collections.defaultdict, d.default_factory

    check(f, [(torch.randn(2),) for _ in range(3)], graphs=1, breaks=0, compiles=1)
