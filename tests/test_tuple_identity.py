"""`is` on dict keys read back and on tuples is CPython's answer on the very objects.

A dict's keys are traced as values (guarded by type and value): a key read back
(iteration, keys(), next(iter(d))) is an equal object, which may or may not be the
object the caller holds.  Where the trace answers `is` it guards which objects they are;
where it cannot, the comparison runs in CPython (a break), on the real objects: a key
is reloaded from its dict, a tuple from where it came, never rebuilt.  A dict the frame
changes keeps its key objects, and an iterator over it made after the change still
runs."""
from __future__ import annotations

import collections

import torch

import frametrace
from differential import Call, Then, check


def _t():
    return torch.ones(2)


def _tuples():
    """Equal tuples that are different objects (made at run time, not code constants)."""
    return (1, "".join("a")), (1, "".join("a")), (2, int("3"))


def _calls():
    a, b, c = _tuples()
    return [Call({a: 1, c: 2}, a, _t()), Call({a: 1, c: 2}, b, _t()), Call({c: 1, a: 2}, a, _t()),
            Call({b: 1, c: 2}, b, _t()), Call({a: 1, c: 2}, a, _t()), Call({b: 1}, a, _t())]


def loop_is(d, q, t):
    out = []
    for k in d:
        out.append((k is q, k is not q))
    return t * len(d), out


def first_key(d, q, t):
    k = next(iter(d))
    return t + 1, k is q, id(k) == id(q), k is not q, k == q


def items_and_keys(d, q, t):
    ks = list(d.keys())
    return t - 1, [(k is q, v) for k, v in d.items()], ks[0] is q, ks[-1] is q


def test_tuple_key_read_back_is_the_dicts_object():
    for fn in (loop_is, items_and_keys):
        r = check(fn, _calls())
        # the key and the argument, both from the frame: which objects they are is
        # guarded (one entry per pattern of identities, served again)
        assert r.breaks == 0 and r.compiles == 4, (fn.__name__, r)
    r = check(first_key, _calls(), graphs=None)
    # id() runs in CPython, on the very objects
    assert r.graphs >= 1 and r.breaks >= 1, r
    assert all("id()" in why for why in r.reasons()), r.reasons()


def test_tuple_key_and_a_tuple_made_in_the_frame():
    # A tuple the frame builds is a new object; one the code holds as a constant may be
    # the caller's too: CPython answers
    def f(d, t):
        made = (1, "".join("a"))
        return t + 1, [k is made for k in d], [k is (2, 3) for k in d]

    a, b, c = _tuples()
    calls = [Call({a: 1, c: 2}, _t()), Call({b: 1, (2, 3): 2}, _t()), Call({a: 1}, _t())]
    r = check(f, calls, graphs=None)
    assert r.graphs >= 1, r


def test_tuple_key_identity_after_the_frame_writes_the_dict():
    def setdef(d, q, t):
        d[q] = 5                # an existing key keeps its object; a new one is q
        return t - 1, [k is q for k in d], len(d)

    def write_then_loop(d, q, t):
        d[q] = 0
        for k in d:
            if k is q:
                t = t + 1
        d[(9, 9)] = 1
        return t

    for fn in (setdef, write_then_loop):
        r = check(fn, _calls(), graphs=None)
        assert r.graphs >= 1, r


def observed(f):
    """`f`, then what the caller sees: which key objects the dict holds, and whether a
    key returned is one of them."""
    def run(d, q, t, a):
        out = f(d, q, t)
        return out, [(k is a, k is q) for k in d], [any(r is k for k in d) for r in out[1:]]
    return run


def _caller_calls():
    def call(keys, q):
        a = keys[0]
        return Call({k: i for i, k in enumerate(keys)}, q, _t(), a)
    a, b, c = _tuples()
    s1, s2 = "".join(["x", "y"]), "".join(["x", "y"])
    big1, big2 = int("1" * 25), int("1" * 25)
    return [call([a, c], b), call([a, c], a), call([b, c], a), call([c, a], c),
            call([s1, "z"], s2), call([s1, "z"], s1), call([big1, 3], big2), call([big1, 3], big1)]


def writes_keys(d, q, t):
    d[q] = 7
    d.pop(int("3") if False else 3, None)
    return t + 1, next(iter(d)), list(d)[-1]


def test_written_dict_keeps_its_key_objects_and_returns_them():
    # The dict written back after the graph held the traced key objects (the first
    # call's), and a key returned was the traced object, not the caller's.
    r = check(observed(writes_keys), _caller_calls(),
              compiled=lambda counter: observed(frametrace.optimize(backend=counter)(writes_keys)))
    assert r.graphs >= 1 and r.breaks == 0, r


def test_str_and_int_keys_identity_is_guarded():
    # Keys whose `is` the guards can state (both from the frame's inputs): no break, and
    # a change of which objects they are is a recompile, not a wrong answer.
    def f(d, q, t):
        return t * 2, [k is q for k in d]

    s1, s2 = "".join(["x", "y"]), "".join(["x", "y"])
    n1, n2 = int("1" * 25), int("1" * 25)
    calls = [Call({s1: 1, "z": 2}, s1, _t()), Call({s1: 1, "z": 2}, s2, _t()),
             Call({s2: 1, "z": 2}, s2, _t()), Call({s1: 1, "z": 2}, s1, _t()),
             Call({n1: 1}, n1, _t()), Call({n1: 1}, n2, _t()), Call({n2: 1}, n2, _t())]
    r = check(f, calls)
    assert r.breaks == 0 and r.compiles == 4, r


def test_iterator_made_after_the_frame_deleted_a_key():
    # The iterator, a local at the break, was made before the dict's writes were
    # replayed: "dictionary changed size during iteration"
    def f(d, q, t):
        del d[(2, 3)]
        d[q] = 1
        it = iter(d)
        first = next(it)
        print(end="")
        return t + 1, first is q, [k is q for k in it]

    r = check(f, _calls()[:4], graphs=None)
    assert r.graphs >= 1, r


def test_dict_changed_between_calls():
    a, b, c = _tuples()
    held = {a: 1, c: 2}

    def f(q, t):
        return t + 1, [k is q for k in held], next(iter(held)) is q

    def swap_key():
        held.clear()
        held[b] = 1
        held[c] = 2

    def back():
        held.clear()
        held[a] = 1
        held[c] = 2
    calls = [Call(a, _t()), Call(a, _t()), Then(swap_key, a, _t()), Call(b, _t()),
             Then(back, a, _t()), Call(b, _t())]
    r = check(f, calls, graphs=None)
    assert r.graphs >= 1, r


def test_ordered_dict_keys():
    a, b, c = _tuples()

    def f(d, q, t):
        d.move_to_end(c)
        return t + 1, [k is q for k in d], next(reversed(d)) is c

    calls = [Call(collections.OrderedDict([(a, 1), (c, 2)]), a, _t()),
             Call(collections.OrderedDict([(c, 1), (a, 2)]), b, _t()),
             Call(collections.OrderedDict([(b, 1), (c, 2)]), b, _t())]
    check(f, calls, graphs=None)


Pair = collections.namedtuple("Pair", "a b")


def hands_back(nt, q, t):
    return t + 1, nt, q, (nt, q)


def _identities(f):
    def run(nt, q, t):
        out = f(nt, q, t)
        return out[0], out[1] is nt, out[2] is q, out[3][0] is nt, out[3][1] is q
    return run


def test_tuples_from_outside_are_handed_back_as_themselves():
    # A tuple or namedtuple argument returned was rebuilt: equal, another object
    calls = [Call(Pair(1, "".join("x")), (1, "".join("y")), _t()) for _ in range(3)]
    r = check(_identities(hands_back), calls,
              compiled=lambda counter: _identities(frametrace.optimize(backend=counter)(hands_back)))
    assert r.graphs == 1 and r.breaks == 0 and r.compiles == 1, r
