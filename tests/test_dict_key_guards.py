"""Dict keys are guarded by type and value, not by `==` (issue 29, class 5).

1 == True == 1.0, a str subclass equals its plain str, an IntEnum its int, 0.0 equals
-0.0: a dict traced with one of them must not be reused for another, because a key the
trace read out of the dict (iteration, keys(), items(), list(d), set(d), popitem)
answers `type(k)`, `k is True`, `str(k)`, `k + 0.5` from the traced object.  Each test
runs several calls, and counts the graphs: one per key type, none for a fresh dict
with keys of the types already seen."""
import collections
import enum
import math

import pytest
import torch

import frametrace
from differential import check


class IE(enum.IntEnum):
    A = 1
    B = 2


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


@pytest.mark.parametrize("keys", ["int", "tuple", "zero"])
@pytest.mark.parametrize("program", [first_is_true, first_type, keys_types], ids=lambda f: f.__name__)
def test_key_type_recompiles_dynamic(program, keys):
    # (dynamic=True: a number read from the frame may become a symbolic input; a key
    # of the dict never does)
    ks, graphs = KEYS[keys]
    check(program, _calls(ks, dict), graphs=graphs, breaks=0, dynamic=True)


# -- the lazy guards: a dict read by key is guarded on that key alone --

def read_by_key(d, x):
    return x + d[1] + d.get(2.0, 5) + (1 in d) + (True in d)


def test_lookups_by_the_program_s_key_need_no_recompile():
    # The lookup key is the program's: {True: 3}[1] is 3 in CPython too.  The key
    # objects the dict holds are not read, so their types do not matter.
    calls = [({1: 3, 2: 4}, torch.ones(2)), ({True: 3, 2: 4}, torch.ones(2)),
             ({1.0: 3, 2.0: 4}, torch.ones(2)), ({1: 3}, torch.ones(2)), ({IE.A: 3}, torch.ones(2))]
    check(read_by_key, calls, graphs=2, breaks=0)


def read_then_iterate(d, x):
    y = x + d[1]
    for k in d:
        y = y + (10 if k is True else 1) + (100 if type(k) is float else 0)
    return y


@pytest.mark.parametrize("lazy", [True, False])
def test_read_by_key_then_whole(lazy, monkeypatch):
    import frametrace
    monkeypatch.setattr(frametrace.config, "lazy_dict_guards", lazy)
    calls = [({1: 3, 2: 4}, torch.ones(2)), ({True: 3, 2: 4}, torch.ones(2)),
             ({1.0: 3, 2: 4}, torch.ones(2)), ({1: 3, 2: 4}, torch.ones(2)),
             ({1: 3, 2.0: 4}, torch.ones(2)), ({True: 3, 2: 4}, torch.ones(2))]
    check(read_then_iterate, calls, graphs=4, breaks=0)


def lookup_only(d, x):
    return x + d.get("a", 0) + ("b" in d)


@pytest.mark.parametrize("lazy", [True, False])
def test_lazy_switch(lazy, monkeypatch):
    import frametrace
    monkeypatch.setattr(frametrace.config, "lazy_dict_guards", lazy)
    calls = [({"a": 1}, torch.ones(1)), ({"a": 1, "c": 2}, torch.ones(1)), ({"a": 1, "b": 2}, torch.ones(1)),
             ({"a": 1, "c": 3}, torch.ones(1))]
    # lazy: the key "c" is not read; whole: every key and value is guarded
    check(lookup_only, calls, graphs=2 if lazy else 4, breaks=0)


# -- OrderedDict views, popitem, set(d) --

def views(d, x):
    return x + 1, repr(d.keys()), repr(d.items()), [type(v).__name__ for v in d.values()]


def pop_last(d, x):
    k, v = d.popitem()
    return x + v, repr(k), type(k).__name__, d


@pytest.mark.parametrize("kind", MAKERS)
def test_views_and_popitem(kind):
    make = MAKERS[kind]
    calls = [(make({1: 0, (1, 2): 1}), torch.ones(1)), (make({True: 0, (1, 2): 1}), torch.ones(1)),
             (make({1: 0, (True, 2): 1}), torch.ones(1)), (make({1: 0, (1, 2): 1}), torch.ones(1))]
    # (repr() of a dict_items and popitem() are graph breaks: the graph before them is
    # what is guarded, the key read back runs in CPython)
    check(views, calls, graphs=3)
    check(pop_last, calls, graphs=3)


# -- NaN keys: a dict finds a NaN only by identity --

NAN_A, NAN_B = float("nan"), float("nan")


def key_in(d, x, k):
    return x + 1, k in d, d.get(k, "absent")


def test_nan_lookup_is_not_answered_from_the_trace():
    # The trace's lookup would be made with the traced NaN object; which NaN object
    # the program holds at run time is not guarded: the lookup runs in CPython.
    calls = [({1: 1}, torch.ones(1), NAN_A), ({NAN_A: 1}, torch.ones(1), NAN_B),
             ({NAN_B: 1}, torch.ones(1), NAN_B), ({NAN_A: 1}, torch.ones(1), NAN_A),
             ({1: 1}, torch.ones(1), NAN_B)]
    r = check(key_in, calls)
    assert r.breaks >= 1 and any("NaN" in reason for reason in r.reasons())


def nan_first(d, x):
    k = next(iter(d))
    return x + 1, k != k, k in [NAN_A], repr(k)


def test_nan_key_read_back():
    calls = [({NAN_A: 1}, torch.ones(1)), ({NAN_B: 1}, torch.ones(1)), ({NAN_A: 1}, torch.ones(1)),
             ({1.0: 1}, torch.ones(1))]
    check(nan_first, calls)


# -- frozenset keys, and constant values other than dict keys --

def frozen_first(d, x):
    k = next(iter(d))
    return x + 1, repr(sorted(k, key=repr)), [type(m).__name__ for m in k]


def test_frozenset_keys():
    calls = [({frozenset({1, 2}): 0}, torch.ones(1)), ({frozenset({True, 2}): 0}, torch.ones(1)),
             ({frozenset({1.0, 2}): 0}, torch.ones(1)), ({frozenset({1, 2}): 0}, torch.ones(1))]
    check(frozen_first, calls)


def slice_parts(s, x):
    return x[s], s.start is True, type(s.stop).__name__, repr(s)


def test_slice_values_by_type():
    calls = [(slice(1, 3), torch.arange(4.0)), (slice(True, 3), torch.arange(4.0)),
             (slice(1, 3), torch.arange(4.0)), (slice(1, True), torch.arange(4.0)),
             (slice(True, 3), torch.arange(4.0))]
    check(slice_parts, calls, graphs=3, breaks=0)


def complex_text(c, x):
    return x + 1, repr(c), str(c.imag)


def test_complex_signed_zeros():
    calls = [(complex(1, 0.0), torch.ones(1)), (complex(1, -0.0), torch.ones(1)),
             (complex(-0.0, 1), torch.ones(1)), (complex(1, 0.0), torch.ones(1)),
             (complex(1, -0.0), torch.ones(1))]
    check(complex_text, calls, graphs=3, breaks=0)


def element_types(seq, x):
    return x + 1, [type(v).__name__ for v in seq], seq[0] is True


@pytest.mark.parametrize("make", [list, tuple], ids=["list", "tuple"])
def test_sequence_elements_by_type(make):
    calls = [(make([1, (2,)]), torch.ones(1)), (make([True, (2,)]), torch.ones(1)),
             (make([1.0, (2,)]), torch.ones(1)), (make([1, (True,)]), torch.ones(1)),
             (make([IE.A, (2,)]), torch.ones(1)), (make([1, (2,)]), torch.ones(1))]
    check(element_types, calls, graphs=5, breaks=0)


def set_members(s, x):
    return x + 1, sorted(type(v).__name__ for v in s)


@pytest.mark.parametrize("make", [set, frozenset])
def test_set_members_by_type(make):
    calls = [(make({1, 2}), torch.ones(1)), (make({True, 2}), torch.ones(1)),
             (make({1.0, 2}), torch.ones(1)), (make({1, 2}), torch.ones(1))]
    check(set_members, calls)


# -- lookup keys the program holds that are not plain constants --

def get_and_in(d, k, x):
    return x + d.get(k, 0), k in d


def test_intenum_and_tuple_lookup_keys():
    # An IntEnum member finds the int key it equals; the dict is then guarded whole
    # (a guard on `d[IE.A]` alone cannot be written).  Was an internal error.
    calls = [({1: 1}, IE.A, torch.ones(1)), ({1: 2}, IE.A, torch.ones(1)), ({True: 3}, IE.A, torch.ones(1)),
             ({2: 3}, IE.A, torch.ones(1)), ({(1, 2): 1}, (True, 2), torch.ones(1)),
             ({(1, 2): 1}, (1.0, 2), torch.ones(1))]
    r = check(get_and_in, calls)
    assert r.fallbacks == 0 and r.breaks == 0


def test_str_subclass_lookup_key():
    calls = [({"a": 1}, S("a"), torch.ones(1)), ({"a": 1}, "a", torch.ones(1)),
             ({S("a"): 1}, "a", torch.ones(1)), ({"b": 1}, S("a"), torch.ones(1))]
    check(get_and_in, calls)


def dd_text(d, x):
    return x + 1, repr(d), str(d.copy())


def test_defaultdict_text_names_its_factory():
    # (was the plain dict's text: as_const() of a defaultdict is a dict)
    calls = [(collections.defaultdict(int, {1: 0}), torch.ones(1)),
             (collections.defaultdict(list, {True: 0}), torch.ones(1))]
    check(dd_text, calls)


# -- identity of equal constants: `is`, and `in` (which tries `is` first) --

BIG_A, BIG_B = 10**20, int(str(10**20))     # equal, two objects


def is_and_in(a, b, x):
    return x + 1, a is b, a in [b], [a, b].count(b)


def test_identity_of_equal_constants_is_guarded():
    # `a is b` of two equal ints (not a small int's one object) was answered from the
    # traced objects, unguarded
    calls = [(BIG_A, BIG_A, torch.ones(1)), (BIG_A, BIG_B, torch.ones(1)), (BIG_B, BIG_B, torch.ones(1)),
             (BIG_A, 5, torch.ones(1)), (1, True, torch.ones(1)), (None, None, torch.ones(1))]
    check(is_and_in, calls, graphs=5)


def test_nan_identity_in_lists_and_tuples():
    # NaN equals only itself: `x in [y]` of two NaNs is whether they are one object
    calls = [(NAN_A, NAN_A, torch.ones(1)), (NAN_A, NAN_B, torch.ones(1)), (NAN_B, NAN_B, torch.ones(1)),
             ((1, NAN_A), (1, NAN_A), torch.ones(1)), ((1, NAN_A), (1, NAN_B), torch.ones(1))]
    r = check(is_and_in, calls)
    assert r.breaks >= 1


def nan_in_list(seq, k, x):
    return x + 1, k in seq, seq.count(k)


def test_nan_member_read_back_after_a_break():
    # (the NaN argument is loaded from the frame after a break, not as the traced object)
    calls = [([NAN_A], NAN_A, torch.ones(1)), ([NAN_A], NAN_B, torch.ones(1)), ([1, 2], 2, torch.ones(1)),
             ([1, 2], True, torch.ones(1)), ([NAN_B, 1], NAN_B, torch.ones(1))]
    check(nan_in_list, calls)


def nan_in_set(k, x):
    return x + 1, k in {NAN_A}, len({k, NAN_A}), k in {1: 2}


def test_nan_set_member():
    calls = [(NAN_A, torch.ones(1)), (NAN_B, torch.ones(1)), (1, torch.ones(1)), (NAN_A, torch.ones(1))]
    r = check(nan_in_set, calls, graphs=None)
    assert r.compiles >= 2 and any("NaN" in reason for reason in r.reasons())


# -- keys whose repr is no expression: the check names them as constants --

CPU = torch.device("cpu")


def by_device(d, x):
    return x + d[CPU], x * d.get(torch.float32, 0), (CPU, torch.float32) in d


def test_device_keys_do_not_recompile_every_call():
    # `d[device(type='cpu')]` in the Python check raised NameError: every call recompiled
    calls = [({CPU: 1, torch.float32: 2}, torch.ones(1)), ({CPU: 1, torch.float32: 2}, torch.ones(1)),
             ({torch.device("cpu"): 1, torch.float32: 2}, torch.ones(1)),
             ({CPU: 3, torch.float32: 2}, torch.ones(1)), ({(CPU, torch.float32): 1, CPU: 3}, torch.ones(1))]
    check(by_device, calls, graphs=3, breaks=0)


def key_is_arg(d, k, t):
    return t * len(d), [q is k for q in d]


def test_tuple_key_identity_with_an_argument():
    # (fuzzer, seed 5) `q is k` of a tuple key read back and an equal tuple argument:
    # one object when both are the code's constant, answered False from the trace
    k1, k2 = (1.0, "a"), (1, "a")
    calls = [(collections.OrderedDict([(2.0, 1), (k1, 2)]), k1, torch.ones(2)),
             (collections.OrderedDict([(k2, 2)]), (1, "a"[:]), torch.ones(2)),
             (collections.OrderedDict([(k2, 2)]), (1, "".join("a")), torch.ones(2)),
             ({k2: 2}, k2, torch.ones(2)), ({(1, "a"): 2}, (1, "b"), torch.ones(2))]
    check(key_is_arg, calls)


def get_with_tensor_default(d, t):
    return d.get(-0.0, t).sum(), d.get(IE.A, t)


def test_get_of_a_dict_held_as_an_object():
    # (fuzzer, seed 5) a dict keyed by a str subclass is an object: get() with a tensor
    # default recursed until RecursionError (an internal error)
    calls = [({S("a"): torch.ones(1), IE.A: torch.ones(1)}, torch.ones(2)),
             ({S("a"): torch.ones(1), 0: torch.ones(1)}, torch.ones(2))]
    check(get_with_tensor_default, calls)


# -- a seeded sweep: programs reading keys back, dicts of mixed key types, in random
# orders, plain and dynamic=True --

NAN = float("nan")
SWEEP_KEYS = [1, True, 1.0, IE.A, 0, False, 0.0, -0.0, "a", S("a"), (1, 2), (True, 2), (1, (2,)),
              (1.0, (2,)), None, 2, 2.0, IE.B, frozenset({1}), frozenset({True}), NAN, float("inf"),
              10**20, float(10**20)]


def sweep_p1(d, x):
    return x + 1, [(type(k).__name__, repr(k)) for k in d]


def sweep_p2(d, x):
    return x + len(d), sorted(map(repr, d.keys()))


def sweep_p3(d, x):
    y = x
    for k, v in d.items():
        y = y + v
        if k is True:
            y = y * 2
        if k == 1:
            y = y + 1
    return y


def sweep_p4(d, x):
    return x + 1, repr(list(d.items())), 1 in d, True in d, 1.0 in d, "a" in d


def sweep_p5(d, x):
    d2 = dict(d)
    d2[1] = 7
    return x + 1, repr(list(d2.items())), d2.get(True), d


def sweep_p6(d, x):
    ks = list(d)
    return x + 1, [k is True for k in ks], [k is None for k in ks], [isinstance(k, int) for k in ks]


def sweep_p7(d, x):
    s = set(d)
    return x + 1, sorted(repr(type(k)) for k in s), len(s)


def sweep_p8(d, x):
    out = x
    for k in d:
        if isinstance(k, float):
            out = out + (math.copysign(1.0, k) if k == k else 5.0)
    return out


def sweep_p9(d, x):
    return x + 1, repr(dict.fromkeys(d, 0)), repr(d.copy())


def sweep_p10(d, x):
    return x + 1, str(next(iter(d.values()), None)), repr(next(reversed(d), None))


def sweep_p11(d, x):
    return x + 1, d.get(1, "no"), d.get(True, "no"), d.get("a", "no"), d.get((1, 2), "no"), d.get(0.0, "no")


def sweep_p12(d, x):
    y = x + d.get(2, 0)
    return y, [type(k).__name__ for k in d][:1]


def sweep_p13(d, x):
    k = next(iter(d))
    return x + 1, k if not isinstance(k, frozenset) else sorted(k, key=repr), [k] == [1], (k,) == (True,)


def sweep_p14(d, x):
    ks = tuple(d)
    return x + 1, ks.count(1), ks.index(ks[-1]), {ks[0]: 1}


def sweep_p15(d, x):
    for k in d:
        if k in (1, 2):
            x = x + 1
        if k is IE.A or k is IE.B:
            x = x * 3
    return x


SWEEP_PROGRAMS = [sweep_p1, sweep_p2, sweep_p3, sweep_p4, sweep_p5, sweep_p6, sweep_p7, sweep_p8,
                  sweep_p9, sweep_p10, sweep_p11, sweep_p12, sweep_p13, sweep_p14, sweep_p15]


@pytest.mark.parametrize("seed", range(6))
def test_mixed_key_sweep(seed):
    import random
    rng = random.Random(seed)
    graphs = 0
    for _ in range(8):
        program, make = rng.choice(SWEEP_PROGRAMS), rng.choice(list(MAKERS.values()))
        calls = []
        for _ in range(4):
            d = {k: rng.randint(0, 3) for k in rng.sample(SWEEP_KEYS, rng.randint(1, 3))}
            calls.append((make(d), torch.ones(2)))
        # (a program may return its input unchanged for some keys: no graph)
        graphs += check(program, calls, graphs=None, dynamic=rng.random() < 0.3).graphs
        frametrace.reset()
    assert graphs >= 8


# -- dict.get with a tensor default, mixed keys (found by the program fuzzer) --
def get_with_a_tensor_default(d, t):
    out = [d.get(0, t).sum(), d.get((1, "a"), t).sum()]
    d[2] = t * 2
    out.append(d.pop("b", None))
    return t * len(d), out


@pytest.mark.parametrize("kind", [collections.OrderedDict, dict])
def test_get_with_a_tensor_default_of_a_dict_with_mixed_keys(kind):
    # (dict_keys family, seed 291: 12 programs) a dict keyed by a str subclass or an
    # IntEnum is held as an object: its get() with a tensor default called get() again
    # until RecursionError, an internal error, on every call
    calls = [(kind([(S("b"), torch.ones(2))]), torch.ones(2)),
             (kind([(IE.A, torch.zeros(2)), (1, torch.ones(2)), ("b", torch.ones(2))]), torch.ones(2)),
             (kind([((1.0, "a"), torch.ones(2)), (S("a"), torch.ones(2))]), torch.zeros(2)),
             (kind([(0, torch.ones(2))]), torch.ones(2))]
    r = check(get_with_a_tensor_default, calls)
    assert r.internal_errors == 0 and r.graphs >= 1
