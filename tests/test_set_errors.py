"""Errors of set operations raise in the trace as CPython raises them (type and message),
so a `try`/`except` in the frame catches them in one graph, and a unittest assertRaises
context (a plain-Python class from the standard library) runs traced."""
import unittest

import torch

from differential import check


def set_errors(x, n):
    p = {1, 2, 3}
    out = []
    for op in ("sub", "lt", "isub", "iter", "hash", "remove", "pop", "args"):
        try:
            if op == "sub":
                p - n
            elif op == "lt":
                p < n
            elif op == "isub":
                q = set(p)
                q -= n
            elif op == "iter":
                p.update(n)
            elif op == "hash":
                p.add([n])
            elif op == "remove":
                p.remove(n + 100)
            elif op == "pop":
                set().pop()
            else:
                p.issubset()
        except (TypeError, KeyError) as e:
            out.append((op, type(e).__name__, str(e)))
    return x + 1, out


def test_set_errors_are_raised_and_caught_in_one_graph():
    check(set_errors, [(torch.ones(2), 1), (torch.zeros(2), 1)], fullgraph=True, graphs=1)


CASE = unittest.TestCase()          # (the default method name needs no method)


def asserting(x, s):
    CASE.assertRaises(TypeError, lambda: s - 1)
    CASE.assertRaises(TypeError, s.issubset)
    with CASE.assertRaises(KeyError):
        s.remove(99)
    return x * len(s)


def test_unittest_assert_raises_is_traced():
    # the set is made in the frame here (sets passed in are read through guards)
    def made_in_frame(x):
        return asserting(x, {1, 2})
    check(made_in_frame, [torch.ones(2), torch.zeros(2)], fullgraph=True, graphs=1)
