"""Dict keys are guarded by type and value, not by `==` (issue 29, class 5).

1 == True == 1.0, a str subclass equals its plain str, an IntEnum its int, 0.0 equals
-0.0: a dict traced with one of them must not be reused for another, because a key the
trace read out of the dict (iteration, keys(), items(), list(d), set(d), popitem)
answers `type(k)`, `k is True`, `str(k)`, `k + 0.5` from the traced object.  Each test
runs several calls, and counts the graphs: one per key type, none for a fresh dict
with keys of the types already seen."""
import collections
import enum

import pytest
import torch

from differential import check


class IE(enum.IntEnum):
    A = 1


class S(str):
    pass


def first_is_true(d, x):
    k = next(iter(d))
    return x + 1 if k is True else x - 1


def first_type(d, x):
    k = next(iter(d))
    return x + 1, type(k).__name__


def first_str(d, x):
    for k in d:
        return x * 2, str(k)


def first_isinstance(d, x):
    return x - 1, isinstance(list(d)[0], bool)


def keys_types(d, x):
    return x + 2, [type(k).__name__ for k in d.keys()]


def items_repr(d, x):
    return x + 3, [repr(k) for k, v in d.items()]


def keys_as_set(d, x):
    return x * 3, repr(set(d))


def first_plus_half(d, x):
    k = next(iter(d))
    return x + 1, k + 0.5


PROGRAMS = [first_is_true, first_type, first_str, first_isinstance, keys_types, items_repr,
            keys_as_set]
MAKERS = {"dict": dict, "OrderedDict": collections.OrderedDict,
          "defaultdict": lambda d: collections.defaultdict(int, d)}

# (keys of the dict in each call, graphs: one per distinct key type).  A dict keyed by
# a str subclass or an IntEnum is an object guarded by identity (its keys' __eq__ and
# __hash__ are its class's): the keys guard never sees it, and formatting it breaks.
KEYS = {
    "int": ([1, True, 1.0, IE.A, 1, True, 1.0], 4),
    "str": (["a", S("a"), "a"], 2),
    "tuple": ([(1, 2), (True, 2), (1.0, 2), (1, True), (1, 2), (True, 2)], 4),
    "nested": ([(1, ("a", (2,))), (1, ("a", (True,))), (1, (S("a"), (2,))), (1, ("a", (2,)))], 3),
    "zero": ([0.0, -0.0, 0, False, 0.0, -0.0], 4),
}


def _calls(keys, make):
    x = torch.arange(3.0)
    return [(make({k: 0, "z": 1}), x) for k in keys]


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("keys", KEYS)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_key_type_recompiles(program, keys, kind):
    ks, graphs = KEYS[keys]
    plain = not any(isinstance(k, S) or S in map(type, _flat(k)) for k in ks)
    check(program, _calls(ks, MAKERS[kind]), graphs=graphs, breaks=0 if plain else None)


def _flat(k):
    return [i for j in k for i in _flat(j)] if type(k) is tuple else [k]


@pytest.mark.parametrize("kind", MAKERS)
def test_key_arithmetic(kind):
    check(first_plus_half, _calls([1, True, 1.0, 1, IE.A], MAKERS[kind]), graphs=4, breaks=0)
