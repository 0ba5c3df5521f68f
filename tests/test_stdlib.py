"""The standard library while tracing: itertools, functools, collections, operator,
enum, random, iterators returned from the frame, and functions made while tracing that
outlive the call that made them.  Differential (values, side effects on arguments,
exceptions) with the graphs and breaks torch.compile would have."""
import collections
import enum
import functools
import itertools
import operator
import random
import sys

import pytest
import torch

import frametrace
from differential import check


def _x():
    return torch.randn(3)


# --------------------------------------------------------------------------- itertools
def groupby_counts(x):
    out = []
    for k, grp in itertools.groupby([1, 1, 2, 3, 3, 3, 1]):
        out.append((k, len(list(grp))))
    return x + len(out), out


def groupby_old_groups_are_exhausted(x):
    groups = list(itertools.groupby("aabbbc"))
    return x * 2, [(k, list(g)) for k, g in groups]


def groupby_with_key_interleaved(x):
    it = itertools.groupby([(1, x), (1, x + 1), (2, x * 2)], key=operator.itemgetter(0))
    k, g = next(it)
    first = next(g)
    k2, g2 = next(it)
    return k, first, k2, list(g2), list(g)


@pytest.mark.parametrize("fn", [groupby_counts, groupby_old_groups_are_exhausted,
                                groupby_with_key_interleaved])
def test_groupby(fn):
    check(fn, [_x()], fullgraph=True, graphs=1)


def tee_independent(x):
    a, b = itertools.tee(iter([x, x + 1, x + 2]))
    n = next(a)
    return list(b), list(a), n


def tee_advances_the_source(x):
    src = iter([1, 2, 3, 4])
    a, b, c = itertools.tee(src, 3)
    return x + next(a) + next(a) + next(b), list(src), list(c)


@pytest.mark.parametrize("fn", [tee_independent, tee_advances_the_source])
def test_tee(fn):
    check(fn, [_x()], fullgraph=True, graphs=1)


def itertools_mix(x):
    acc = list(itertools.accumulate([1, 2, 3]))
    c = itertools.count(3)
    prod = [a * b for a, b in itertools.product([1, 2], [x])]
    pairs = list(itertools.pairwise([x, x + 1, x + 2]))
    star = list(itertools.starmap(operator.mul, [(x, 2), (x, 3)]))
    longest = list(itertools.zip_longest([x], [1, 2], fillvalue=0))
    flat = list(itertools.chain.from_iterable([[x], [x + 1]]))
    return acc, next(c) + next(c), prod, pairs, star, longest, flat, \
        sum(itertools.repeat(x, 3)), list(itertools.islice([x, x, x, x], 1, 3)), \
        list(itertools.combinations([1, 2, 3], 2)), list(itertools.permutations([1, 2]))


def test_itertools_mix():
    check(itertools_mix, [_x()], fullgraph=True, graphs=1)


# --------------------------------------------------------------------------- torch.utils._pytree
from torch.utils import _pytree as pytree  # noqa: E402


def pytree_round_trip(x):
    leaves, spec = pytree.tree_flatten({"a": x, "b": [x, (x, None)], "c": NT(x, 1)})
    return pytree.tree_unflatten([t * 2 if isinstance(t, torch.Tensor) else t for t in leaves], spec)


def pytree_map_over_argument(x, tree):
    return pytree.tree_map(lambda t: t + x, tree)


def pytree_leaves_and_spec(x):
    leaves, spec = pytree.tree_flatten([x, {"k": x}])
    return sum(pytree.tree_leaves([x, (x, x)])), leaves, spec.num_leaves, spec


def test_pytree_flatten_unflatten():
    check(pytree_round_trip, [_x()], fullgraph=True, graphs=1)


def test_pytree_map_over_an_argument():
    check(pytree_map_over_argument, [(_x(), {"u": [_x()], "v": (_x(),)}),
                                     (_x(), {"u": [_x()], "v": (_x(),)})], fullgraph=True, graphs=1)


def test_pytree_leaves_and_returned_spec():
    compiled = frametrace.optimize(backend="eager", fullgraph=True)(pytree_leaves_and_spec)
    x = _x()
    got, want = compiled(x), pytree_leaves_and_spec(x)
    assert torch.equal(got[0], want[0]) and got[2] == want[2] and got[3] == want[3]


class _Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


def pytree_leaf_count(x, tree):
    return x * len(pytree.tree_leaves(tree))


def test_pytree_registering_a_node_type_is_noticed():
    compiled = frametrace.optimize(backend="eager", fullgraph=True)(pytree_leaf_count)
    x = _x()
    tree = [_Pair(1, 2)]
    assert torch.equal(compiled(x, tree), x * 1)        # a leaf
    pytree.register_pytree_node(_Pair, lambda p: ([p.a, p.b], None),
                                lambda leaves, ctx: _Pair(*leaves))
    assert torch.equal(compiled(x, tree), x * 2)        # a node: the registry was guarded


# --------------------------------------------------------------------------- iterators
def iter_with_sentinel(x, xs):
    it = iter(lambda: xs.pop(0), 0)
    return x * sum(it), xs


def test_iter_callable_sentinel_is_lazy():
    # The sentinel stops the calls: items after it stay in the list.
    check(iter_with_sentinel, [(_x(), [1, 2, 3, 0, 4]), (_x(), [5, 0])], fullgraph=True)


def dunder_iter_of_constants(x):
    it = range(3).__iter__()
    return x * next(it) + next(it), list("abc".__iter__()), list((1, 2).__iter__())


def test_dunder_iter_of_constants():
    check(dunder_iter_of_constants, [_x()], fullgraph=True, graphs=1)


def next_default_when_exhausted(x):
    it = iter([x])
    a = next(it)
    return a + next(it, 5), next(iter(()), None)


def test_next_default_when_exhausted():
    check(next_default_when_exhausted, [_x()], fullgraph=True, graphs=1)


def return_islice(x):
    return itertools.islice([x, x + 1, x * 2], 1, None)


def return_zip_and_map(x):
    return zip([x, x + 1], "ab"), map(str, [1, 2])


def return_partly_consumed_list_iterator(x, xs):
    it = iter(xs)
    next(it)
    xs.append(9)            # a list iterator is live: it sees this
    return x + 1, it


def return_generator(x):
    def g():
        yield x
        yield 3
    it = g()
    next(it)
    return it, x + 1


def _drained(result):
    """What the returned iterators give, for comparison (consumes them)."""
    if isinstance(result, tuple):
        return tuple(_drained(v) for v in result)
    if hasattr(result, "__next__"):
        return type(result), list(result)
    return result


@pytest.mark.parametrize("fn,args", [(return_islice, ()), (return_zip_and_map, ()),
                                     (return_partly_consumed_list_iterator, ([1, 2, 3],)),
                                     (return_generator, ())])
def test_returned_iterators_keep_type_and_items(fn, args):
    check(lambda x, *a: _drained(fn(x, *a)), [(_x(), *args)], graphs=None)   # (CPython reference)
    compiled = frametrace.optimize(backend="eager", fullgraph=True)(fn)
    x = _x()
    got = _drained(compiled(x, *[list(a) for a in args]))
    want = _drained(fn(x, *[list(a) for a in args]))
    from differential import same
    assert same(want, got) is None, same(want, got)


def return_lazy_map_of_tensor_op(x):
    return map(lambda t: t + 1, [x, x])


def test_returning_an_iterator_that_would_compute_later_breaks():
    # CPython adds when the caller pulls, after whatever the caller did to x: the
    # frame runs in CPython rather than computing ahead.
    x = _x()
    compiled = frametrace.optimize(backend="eager")(return_lazy_map_of_tensor_op)
    it = compiled(x)
    x.add_(1)
    assert torch.equal(next(it), x + 1)


# --------------------------------------------------------------------------- functions made here
def _make_counter(start):
    n = start

    def inc():
        nonlocal n
        n = n + 1
        return n

    def get():
        return n
    return inc, get


def closures_from_an_inlined_call(x):
    inc, get = _make_counter(3)
    inc()
    return x + get(), inc, get


def test_closures_made_by_an_inlined_call_outlive_it_and_share_their_cell():
    compiled = frametrace.optimize(backend="eager", fullgraph=True)(closures_from_an_inlined_call)
    x = _x()
    y, inc, get = compiled(x)
    y2, inc2, get2 = closures_from_an_inlined_call(x)
    assert torch.equal(y, y2)
    assert [inc(), get(), inc(), get()] == [inc2(), get2(), inc2(), get2()]
    assert inc.__qualname__ == inc2.__qualname__


class Holder:
    pass


def closure_stored_on_an_argument(x, h):
    def make(k):
        def scale(t):
            return t * k
        scale.factor = k
        return scale
    h.fn = make(x.shape[0])
    y = x * 2

    def over_tensor(t):
        return t + y
    h.add = over_tensor
    return x + 1


def test_closure_stored_on_an_object_and_function_attributes():
    h, h2 = Holder(), Holder()
    x = _x()
    compiled = frametrace.optimize(backend="eager", fullgraph=True)(closure_stored_on_an_argument)
    assert torch.equal(compiled(x, h), closure_stored_on_an_argument(x, h2))
    assert h.fn(2) == h2.fn(2) and h.fn.factor == h2.fn.factor
    assert torch.equal(h.add(x), h2.add(x))


def function_attributes(x):
    def f():
        return 1
    f.tag = 3
    f.__doc__ = "doc"
    f.__annotations__ = {"return": int}
    return x * f.tag, hasattr(f, "tag"), hasattr(f, "other"), f.__name__, f.__doc__, \
        f.__annotations__


def test_attributes_set_on_a_function_made_here():
    check(function_attributes, [_x()], fullgraph=True, graphs=1)


# --------------------------------------------------------------------------- functools, operator
def reduce_and_operator(x):
    total = functools.reduce(operator.add, [x, x, x])
    prod = functools.reduce(lambda a, b: a * b, [1, 2, 3], 10)
    return total, prod, operator.itemgetter(1, 0)([x, 2]), operator.attrgetter("shape")(x), \
        operator.methodcaller("sum")(x), operator.truth(0), operator.neg(x)


def test_reduce_and_operator():
    check(reduce_and_operator, [_x()], fullgraph=True, graphs=1)


def partial_introspection(x):
    q = functools.partial(torch.add, x, alpha=2)
    return q.func is torch.add, len(q.args), q.keywords["alpha"], hasattr(q, "__name__"), \
        hasattr(q, "func"), q(x), PARTIAL.func is torch.mul, PARTIAL(x), hasattr(PARTIAL, "tag")


PARTIAL = functools.partial(torch.mul, other=2)


def test_partial_introspection():
    global PARTIAL
    r = check(partial_introspection, [_x()], fullgraph=True, graphs=1)
    compiled = frametrace.optimize(backend="eager", fullgraph=True)(partial_introspection)
    x = _x()
    try:
        PARTIAL = functools.partial(torch.mul, other=3)
        PARTIAL.tag = 1                 # hasattr(PARTIAL, "tag") was guarded
        got, want = compiled(x), partial_introspection(x)
    finally:
        PARTIAL = functools.partial(torch.mul, other=2)
    assert got[-1] is want[-1] is True and torch.equal(got[-2], want[-2])


@functools.lru_cache(None)
def _pure_cached(n):
    return tuple(range(n)), n * 2


SCALE = 2


@functools.cache
def _cached_reads_global(n):
    return n * SCALE


@functools.cache
def _cached_returns_list(n):
    return [n]


def call_pure_cached(x):
    return x * _pure_cached(3)[1], _pure_cached(2)[0]


def call_cached_reading_a_global(x):
    return x * _cached_reads_global(3)


def call_cached_returning_a_list(x):
    lst = _cached_returns_list(3)
    lst.append(1)               # CPython: the cached list itself grows
    return x + len(lst)


def test_lru_cache_of_a_pure_function_is_traced_through():
    check(call_pure_cached, [_x()], fullgraph=True, graphs=1)


def test_lru_cache_answers_stay_cpythons_when_the_function_is_not_pure():
    global SCALE
    _cached_reads_global.cache_clear()
    _cached_returns_list.cache_clear()
    compiled = frametrace.optimize(backend="eager")(call_cached_reading_a_global)
    x = _x()
    try:
        assert torch.equal(compiled(x), x * 6)
        SCALE = 3                           # the cache still answers 6
        assert torch.equal(compiled(x), x * 6)
    finally:
        SCALE = 2
    compiled = frametrace.optimize(backend="eager")(call_cached_returning_a_list)
    assert [compiled(x)[0].item() for _ in range(3)] == [x[0].item() + n for n in (2, 3, 4)]


# --------------------------------------------------------------------------- collections
def deque_in_frame(x):
    d = collections.deque([1, 2, 3], maxlen=3)
    d.append(4)
    d.rotate(1)
    d.appendleft(0)
    d.extend([5])
    return x * d[0], list(d), d.popleft(), d


def test_deque_made_in_frame():
    check(deque_in_frame, [_x()], fullgraph=True, graphs=1)


def deque_argument_mutated(x, d):
    d.append(len(d))
    first = d.popleft()
    d.appendleft(7)
    return x + first, d


def test_deque_argument_methods_are_written_back():
    r = check(deque_argument_mutated, [(_x(), collections.deque([1, 2])),
                                       (_x(), collections.deque([1, 2], maxlen=2)),
                                       (_x(), collections.deque([3, 4, 5]))], fullgraph=True)
    assert r.graphs == 3        # length and maxlen are guarded


NT = collections.namedtuple("NT", "a b")


def namedtuple_iteration(x, nt):
    return [t * 2 for t in nt], sum(NT(1, 2))


def test_namedtuple_iteration():
    check(namedtuple_iteration, [(_x(), NT(_x(), _x()))], fullgraph=True, graphs=1)


# --------------------------------------------------------------------------- enum, strings, misc
class Color(enum.Enum):
    RED = 1
    BLUE = "b"


class Weird(enum.Enum):
    A = 1

    @property
    def value(self):
        return 42


def enum_value_and_name(x, c):
    return x * Color.RED.value, Color.BLUE.name, c.value, c.name


def test_enum_member_value_and_name():
    check(enum_value_and_name, [(_x(), Color.RED), (_x(), Color.BLUE)], fullgraph=True)


def overridden_enum_value(x):
    return x * Weird.A.value


def test_enum_with_its_own_value_property_is_not_guessed():
    r = check(overridden_enum_value, [_x()], graphs=None)
    assert r.fallbacks + r.breaks >= 1 or r.graphs >= 1


def strings_computed_in_frame(x):
    s = "-".join([str(i) for i in range(3)])
    t = ",".join(k.upper() for k in ("a", "b"))
    return x + len(s), s, t, b"abc".decode(), "\u00e9".encode().decode("utf-8")


def test_join_and_decode_of_strings_computed_here():
    check(strings_computed_in_frame, [_x()], fullgraph=True, graphs=1)


def distributed_available(x):
    return x + 1 if torch.distributed.is_available() else x - 1


def test_torch_distributed_is_available():
    check(distributed_available, [_x()], fullgraph=True, graphs=1)


def python_random(x):
    a = random.random()
    b = random.randint(1, 10)
    return x * a + b, random.random()


def test_python_random_same_values_and_state_as_cpython():
    # Not traced: the call breaks the graph, and CPython draws the numbers.
    for seed in (0, 1):
        random.seed(seed)
        want = python_random(torch.ones(3))
        want_next = random.random()
        random.seed(seed)
        got = frametrace.optimize(backend="eager")(python_random)(torch.ones(3))
        assert torch.allclose(got[0], want[0]) and got[1] == want[1]
        assert random.random() == want_next


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------ namedtuple in the frame
GlobalPair = collections.namedtuple("GlobalPair", "a b", defaults=[7])


def namedtuple_made_in_the_frame(x):
    Pt = collections.namedtuple("Pt", ["a", "b"])
    p = Pt(x, x + 1)
    q = p._replace(b=x * 3)
    return (p.a * p.b, p[0], len(p), q.b, tuple(q), Pt.__name__, Pt._fields, Pt.__module__,
            repr(Pt(1, 2)), isinstance(p, tuple))


def namedtuple_with_defaults(x):
    Pt = collections.namedtuple("Pt", "a b c", defaults=[5, "s"])
    p = Pt(x)
    a, b, c = p
    return a + b, c, repr(Pt(1, c=2)), str(GlobalPair(3)), GlobalPair(x, b=2).b


def namedtuple_wrong_arguments(x, which):
    Pt = collections.namedtuple("Pt", "a b")
    if which == 0:
        return Pt(x, a=1)             # TypeError: multiple values
    if which == 1:
        return Pt(x)                  # TypeError: missing b
    return Pt(x, 1, 2)                # TypeError: too many


def test_namedtuple_made_in_the_frame():
    r = check(namedtuple_made_in_the_frame, [torch.randn(3), torch.randn(3)])
    assert r.breaks == 0 and r.graphs == 1
    r = check(namedtuple_with_defaults, [torch.randn(3), torch.randn(3)])
    assert r.breaks == 0 and r.graphs == 1


def test_namedtuple_wrong_arguments_raise_as_cpython():
    check(namedtuple_wrong_arguments, [(torch.randn(3), 0), (torch.randn(3), 1), (torch.randn(3), 2)],
          graphs=None)


def test_namedtuple_repr_names_its_fields():
    # (a namedtuple instance's constant was a plain tuple: its repr lost the names)
    def f(x):
        return x + 1, repr(GlobalPair(1, 2)), str(GlobalPair(3)), f"{GlobalPair(4, 5)}"
    assert check(f, [torch.randn(3)]).breaks == 0


class _Doubled(collections.namedtuple("_Doubled", "a b")):
    def __new__(cls, a, b=3):
        return super().__new__(cls, a * 2, b)


def test_namedtuple_subclass_with_its_own_new_runs_it():
    # (its instances were made as if __new__ were the namedtuple's: a wrong answer)
    def f(x):
        p = _Doubled(x)
        return p.a + p.b, repr(_Doubled(1, 2))
    check(f, [torch.randn(3)], graphs=None)


# ------------------------------------------------------- lru_cache on traced tensors
CACHE_CALLS = []


@functools.lru_cache(maxsize=None)
def _cached_scale(t, k=2):
    CACHE_CALLS.append(k)           # runs on a miss only
    return t * k


def cached_on_a_fresh_tensor(x):
    y = x + 1
    a = _cached_scale(y, 3)
    b = _cached_scale(y, 3)         # CPython's cache hit: the same object, no second run
    y.add_(1)
    c = _cached_scale(y, 3)         # a hit too: the result computed before the write
    d = _cached_scale(y, 3.0)       # 3 == 3.0: one key
    return a, b is a, c is a, d is a, _cached_scale(x * 2, 4)


def cached_on_an_input(x):
    return _cached_scale(x, 5)


def cached_key_outlives_the_frame(x):
    y = x + 1
    return _cached_scale(y, 6), y


def test_lru_cache_called_on_a_tensor_made_in_the_frame():
    r = check(cached_on_a_fresh_tensor, [torch.randn(3), torch.randn(3)], globals=["CACHE_CALLS"])
    assert r.breaks == 0 and r.graphs == 1


def test_lru_cache_whose_key_could_be_found_again_not_traced():
    # (an input may be in the cache already; a key that outlives the frame would be
    # found by a later call in CPython)
    r = check(cached_on_an_input, [torch.randn(3)], globals=["CACHE_CALLS"], graphs=None)
    assert any("lru_cache" in reason for reason in r.reasons())
    r = check(cached_key_outlives_the_frame, [torch.randn(3)], globals=["CACHE_CALLS"], graphs=None)
    assert r.fallbacks == 1
