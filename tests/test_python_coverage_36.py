"""Issue 36: constructs where torch.compile keeps one graph: global state toggled in the
frame, returned generators, min/max of 0-d tensors ...  Each test is differential
(tests/differential.py) and counts what was compiled."""
import collections
import functools

import numpy as np
import pytest
import torch

import frametrace
from differential import check


# ------------------------------------------------- torch.use_deterministic_algorithms
def _in_state(compiled):
    """Runs `compiled` from a given deterministic state and returns the state it left."""
    def outer(x, start, warn_only=False):
        torch.use_deterministic_algorithms(start, warn_only=warn_only)
        try:
            return (compiled(x), torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled())
        finally:
            torch.use_deterministic_algorithms(False)
    return outer


def _check_state(fn, inputs, **kw):
    return check(_in_state(fn), inputs,
                 compiled=lambda c: _in_state(frametrace.optimize(backend=c)(fn)), **kw)


def toggled_and_back(x):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    y = x + 1
    inside = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    return y, before, inside, torch.are_deterministic_algorithms_enabled()


def left_switched(x):
    torch.use_deterministic_algorithms(True, warn_only=True)
    return x * 2, torch.is_deterministic_algorithms_warn_only_enabled()


def switched_across_a_break(x):
    torch.use_deterministic_algorithms(True)
    y = x * 2
    print("deterministic:", torch.are_deterministic_algorithms_enabled())
    r = y + 1, torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    return r


def test_deterministic_toggled_in_frame():
    # (the read before the switch guards the entry state: one graph per entry state)
    r = _check_state(toggled_and_back, [(torch.randn(3), False), (torch.randn(3), True),
                                        (torch.randn(3), False)])
    assert r.breaks == 0 and r.graphs == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_deterministic_state_outlives_the_frame(backend):
    # The state the frame leaves is the call's, whatever the backend kept of its node.
    r = _check_state(left_switched, [(torch.randn(3), False), (torch.randn(3), True),
                                     (torch.randn(3), True, True)], backend=backend)
    assert r.breaks == 0 and r.graphs == 1


def test_deterministic_state_at_a_break(capsys):
    r = _check_state(switched_across_a_break, [(torch.randn(3), False), (torch.randn(3), True)])
    assert r.breaks == 1 and r.graphs == 2


def test_deterministic_state_put_back_after_the_compile():
    def f(x):
        torch.use_deterministic_algorithms(True)
        return x.view(7)            # fails while tracing
    r = _check_state(f, [(torch.randn(3), False)], graphs=None)
    assert r.graphs == 0
    assert not torch.are_deterministic_algorithms_enabled()


# ------------------------------------------------------------ returned generators
def _consumed(compiled, take=None):
    """Calls `compiled` and consumes the generator(s) it returns (all, or `take` items),
    so that what they yield, and when their bodies ran, is compared."""
    def outer(*args):
        out = compiled(*args)
        gens = out if isinstance(out, tuple) else (out,)
        got = []
        for g in gens:
            if hasattr(g, "__next__"):
                got.append([next(g) for _ in range(take)] if take else list(g))
            else:
                got.append(g)
        return got, args
    return outer


def _check_gen(fn, inputs, take=None, **kw):
    return check(_consumed(fn, take), inputs,
                 compiled=lambda c: _consumed(frametrace.optimize(backend=c)(fn), take), **kw)


def genexpr_over_a_local(x):
    y = x + 1
    return (y * i for i in range(3))


def counting(t, log):
    for i in range(3):
        log.append(i)           # runs as the caller consumes it
        yield t + i


def generator_of_an_intermediate(x, log):
    g = counting(x * 2, log)
    log.append("made")
    return g


def arguments_changed_after_the_call(x, log):
    y = x * 2
    g = counting(y, log)
    y.add_(1)                   # the body, run later, sees it
    x.mul_(3)
    log.append(len(log))
    return g, y


def forever(t):
    i = 0
    while True:
        yield t * i
        i += 1


def infinite_returned(x):
    return forever(x + 1)


def one_generator_twice(x):
    g = forever(x)
    return g, g


def consumed_then_returned(x):
    g = counting(x, [])
    first = next(g)
    return first, g


class Source:
    def __init__(self, k):
        self.k = k

    def items(self, t):
        for i in range(self.k):
            yield t * self.k + i


def generator_method(x, src):
    return src.items(x - 1)


def test_returned_genexpr():
    r = _check_gen(genexpr_over_a_local, [torch.randn(3), torch.randn(3)])
    assert r.breaks == 0 and r.fallbacks == 0


def test_returned_generator_runs_its_body_when_consumed():
    r = _check_gen(generator_of_an_intermediate, [(torch.randn(3), []), (torch.randn(3), [1])])
    assert r.breaks == 0 and r.fallbacks == 0


def test_returned_generator_sees_later_changes_of_its_arguments():
    r = _check_gen(arguments_changed_after_the_call, [(torch.randn(3), []), (torch.randn(3), [0])])
    assert r.breaks == 0 and r.fallbacks == 0


def test_returned_infinite_generator_consumed_partly():
    r = _check_gen(infinite_returned, [torch.randn(3), torch.randn(3)], take=4)
    assert r.breaks == 0 and r.fallbacks == 0


def test_returned_generator_identity_kept():
    def outer(compiled):
        def run(x):
            a, b = compiled(x)
            return a is b, next(a), next(b), next(a)
        return run
    r = check(outer(one_generator_twice), [torch.randn(3)],
              compiled=lambda c: outer(frametrace.optimize(backend=c)(one_generator_twice)), graphs=None)
    assert r.breaks == 0 and r.fallbacks == 0


def test_generator_started_in_the_frame_still_right():
    _check_gen(consumed_then_returned, [torch.randn(3), torch.randn(3)], graphs=None)


def test_returned_generator_of_a_method():
    r = _check_gen(generator_method, [(torch.randn(3), Source(2)), (torch.randn(3), Source(3))])
    assert r.breaks == 0 and r.fallbacks == 0


# -------------------------------------------------------- min/max of 0-d tensors
def min_max_used_inside(x):
    a, b = x.sum(), x.mean()
    return x * min(a, b) + max(a, b, x[0]) - max(b, a)


def min_max_returned(x):
    return min(x.sum(), x.amax()), max([x.sum(), x.mean() * 3, x.amin()])


def min_max_of_inputs(a, b):
    return max(a, b)                # CPython returns `a` or `b` itself


def min_max_written(x):
    a, b = x.sum(), x.mean()
    m = max(a, b)
    m += 1                          # writes a or b
    return a, b, m


def min_max_returned_with_an_item(x):
    a, b = x.sum(), x.mean()
    return a, min(a, b)


NAN = float("nan")


def test_min_max_of_0d_tensors():
    inputs = [torch.randn(3), torch.tensor([1.0, NAN, 2.0]), torch.tensor([NAN, 1.0, 1.0]),
              torch.tensor([2.0, 2.0, 2.0])]
    r = check(min_max_used_inside, inputs)
    assert r.breaks == 0 and r.graphs == 1
    r = check(min_max_returned, inputs)
    assert r.breaks == 0 and r.graphs == 1


def test_min_max_that_could_tell_the_new_tensor_apart_refused():
    # (the frame runs in CPython: values as CPython's, the objects too)
    r = check(min_max_of_inputs, [(torch.tensor(1.0), torch.tensor(2.0))], graphs=0)
    assert r.fallbacks == 1
    r = check(min_max_written, [torch.randn(3), torch.tensor([1.0, 1.0, 1.0])], graphs=0)
    r = check(min_max_returned_with_an_item, [torch.randn(3)], graphs=0)


def test_min_max_of_mixed_tensors_not_picked():
    # different dtypes, shapes, or a key: compared in Python as before
    def f(x):
        return min(x.sum(), x.sum().int()), max(x[0], x[1:2])
    check(f, [torch.randn(3)], graphs=None)


def test_identity_of_a_min_max_result_not_guessed():
    def f(x):
        a, b = x.sum(), x.mean()
        m = max(a, b)
        return x * m, m is a, id(m) == id(b)
    r = check(f, [torch.randn(3), torch.tensor([1.0, -1.0, 3.0])], graphs=None)
    assert r.fallbacks >= 1


def _is(p, q):
    return p is q


def test_identity_of_a_min_max_result_in_an_inlined_call():
    # (a break at the call would run it in CPython on the new tensor)
    def f(x):
        a, b = x.sum(), x.mean()
        m = min(a, b)
        return x * m, _is(m, a)
    r = check(f, [torch.randn(3), torch.tensor([1.0, -1.0, 3.0])], graphs=None)
    assert r.fallbacks >= 1


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


# ------------------------------------------------- iterators passed in by the caller
def _over_iterator(compiled):
    """Calls `compiled` on an iterator over `items` and reports how far the caller's
    iterator was advanced (what is left of it), and whether it got it back."""
    def outer(x, items, *rest):
        it = iter(items)
        try:
            out = compiled(x, it, *rest)
        except Exception as e:
            out = e
        if isinstance(out, tuple) and out and out[-1] is it:
            out = out[:-1] + ("the caller's iterator",)
        items.append(100)               # seen by an iterator that is not exhausted
        return out, list(it)
    return outer


def _check_iter(fn, inputs, **kw):
    return check(_over_iterator(fn), inputs,
                 compiled=lambda c: _over_iterator(frametrace.optimize(backend=c)(fn)), **kw)


def next_with_default(x, it):
    a = next(it, 10)
    b = next(it, 20)
    return x * a + b


def membership(x, it):
    return x + (2 in it), x * (7 in it)


def loop_with_break(x, it):
    for v in it:
        x = x + v
        if v > 1:
            break
    return x


def consumed_then_raises(x, it):
    a = next(it)
    if a > 0:
        raise ValueError(f"first item {a}")
    return x + a


def returned_after_next(x, it):
    return x + next(it), it


def across_a_break(x, it):
    a = next(it)
    print("between", a)
    return x + a + next(it, 0)


def list_grown_while_iterating(x, it, items):
    a = next(it)
    items.append(a + 10)
    return x + sum(it)


ITEMS = [[1, 2, 3], [4], [], [0, 5, 1, 2], [3, 2, 7, 1]]


def test_next_on_an_iterator_passed_in():
    r = _check_iter(next_with_default, [(torch.randn(3), list(i)) for i in ITEMS], graphs=None)
    assert r.breaks == 0 and r.fallbacks == 0 and r.graphs >= 1


def test_in_on_an_iterator_passed_in():
    r = _check_iter(membership, [(torch.randn(3), list(i)) for i in ITEMS], graphs=None)
    assert r.breaks == 0 and r.fallbacks == 0 and r.graphs >= 1


def test_loop_over_an_iterator_passed_in():
    r = _check_iter(loop_with_break, [(torch.randn(3), list(i)) for i in ITEMS], graphs=None)
    assert r.breaks == 0 and r.fallbacks == 0 and r.graphs >= 1


def test_iterator_passed_in_consumed_before_an_exception():
    _check_iter(consumed_then_raises, [(torch.randn(3), [1, 2]), (torch.randn(3), [0, 2]),
                                       (torch.randn(3), [3])], graphs=None)


def test_iterator_passed_in_returned_as_itself():
    r = _check_iter(returned_after_next, [(torch.randn(3), [1, 2]), (torch.randn(3), [5, 6, 7])],
                    graphs=None)
    assert r.breaks == 0 and r.fallbacks == 0


def test_iterator_passed_in_across_a_break(capsys):
    _check_iter(across_a_break, [(torch.randn(3), [1, 2]), (torch.randn(3), [5])], graphs=None)


def test_iterator_passed_in_with_its_list():
    def outer(compiled):
        def run(x, items):
            it = iter(items)
            return compiled(x, it, items), list(it), items
        return run
    r = check(outer(list_grown_while_iterating), [(torch.randn(3), [1, 2]), (torch.randn(3), [5])],
              compiled=lambda c: outer(frametrace.optimize(backend=c)(list_grown_while_iterating)),
              graphs=None)
    assert r.fallbacks == 0


def membership_breaks_midway(x, it):
    a = next(it)
    found = x[0] in it              # tensor == tensor: a decision on data, a break
    return x + a, found


def test_iterator_passed_in_with_a_break_inside_in():
    def items(*vals):
        return [torch.tensor(float(v)) for v in vals]
    _check_iter(membership_breaks_midway, [(torch.tensor([2.0, 1.0]), items(1, 3, 2, 5)),
                                           (torch.tensor([9.0, 1.0]), items(1, 3))], graphs=None)


# ------------------------------------------------- vmap of a function writing in place
def _add_one(t):
    t.add_(1)
    return t * 2


def _scale_by(t, u):
    t.mul_(u)
    return t.sum()


def vmap_writes_its_input(x):
    return torch.func.vmap(_add_one)(x)


def vmap_result_unused(x, y):
    torch.func.vmap(_scale_by)(x, y)
    return x + 1


def vmap_writes_an_unbatched_argument(x, y):
    def f(t, u):
        u.add_(t.sum())
        return u * 1
    return torch.func.vmap(f, in_dims=(1, None))(x, y), y.clone()


def vmap_writes_a_view_of_an_input(x):
    out = torch.func.vmap(_add_one)(x[:, 1:])
    return out, x.sum()


def vmap_writes_an_intermediate(x):
    y = x * 2
    out = torch.func.vmap(_add_one)(y)
    return out + y, y


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_vmap_of_a_function_writing_in_place(backend):
    for fn, inputs in [(vmap_writes_its_input, [torch.randn(2, 3), torch.randn(2, 3)]),
                       (vmap_result_unused, [(torch.randn(2, 3), torch.randn(2, 3))]),
                       (vmap_writes_a_view_of_an_input, [torch.randn(3, 4)]),
                       (vmap_writes_an_intermediate, [torch.randn(2, 3)])]:
        r = check(fn, inputs, backend=backend)
        assert r.breaks == 0 and r.graphs == 1, fn.__name__


def test_vmap_writing_an_unbatched_argument_raises_as_cpython():
    # (vmap refuses an in-place write of a batched value into an unbatched tensor)
    check(vmap_writes_an_unbatched_argument, [(torch.randn(3, 2), torch.randn(2))], graphs=None)


def test_vmap_writing_a_leaf_that_requires_grad_raises_as_cpython():
    check(vmap_writes_its_input, [torch.randn(2, 3, requires_grad=True)], graphs=None)


# ------------------------------------------------------------------ NumPy objects

class _Arrays:
    def __init__(self, dtype):
        self.a = np.arange(1, 4).astype(dtype) * dtype(3) if dtype is not np.bool_ else \
            np.array([True, False, True])
        self.dt = np.dtype("float32")


def numpy_scalars_from_arrays(x, h):
    # h.a.sum() is a NumPy scalar: torch takes it as a Python int or float
    return x * h.a.sum() + (h.dt == np.float32), x > h.a.mean(), x - h.a.max()


def numpy_finfo_and_bool_scalars(x):
    fi = np.finfo(np.float32)
    table = {np.dtype("float32"): 1, np.dtype("int64"): 2}
    return (x.clamp(min=float(fi.min), max=float(fi.max)) + (fi.eps > 0), x * np.bool_(True),
            table[np.dtype(np.float32)], hash(np.dtype("float32")) == hash(np.dtype(np.float32)))


def numpy_scalar_in_place(x, h):
    x *= h.a.sum()
    return x


@pytest.mark.parametrize("tensor_dtype", [torch.float32, torch.float64, torch.int32, torch.bool])
def test_numpy_scalars_with_tensors(tensor_dtype):
    for np_dtype in (np.float64, np.float32, np.int8, np.int64, np.int16, np.bool_):
        frametrace.reset()
        x = torch.arange(3).to(tensor_dtype)
        r = check(numpy_scalars_from_arrays, [(x, _Arrays(np_dtype))])
        assert r.breaks == 0 and r.graphs == 1, np_dtype
        frametrace.reset()
        check(numpy_scalar_in_place, [(x, _Arrays(np_dtype))], graphs=None)   # (or raises)
    frametrace.reset()
    r = check(numpy_finfo_and_bool_scalars, [torch.arange(3).to(tensor_dtype)])
    assert r.breaks == 0 and r.graphs == 1


def switched_then_read_before_a_break(x):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    mode = torch.get_deterministic_debug_mode()
    print("mode", mode)         # the break traces the frame again from the entry state
    torch.use_deterministic_algorithms(False)
    return x + 1, before, mode, torch.get_deterministic_debug_mode()


def test_deterministic_state_read_again_after_a_break(capsys):
    r = _check_state(switched_then_read_before_a_break,
                     [(torch.randn(3), False), (torch.randn(3), True), (torch.randn(3), False)])
    assert r.breaks >= 1


def loop_with_a_break_inside(x, it):
    for v in it:
        x = x + v
        if v == 2:
            print("two")        # a graph break inside the loop over the caller's iterator
        if v > 4:
            break
    return x


def test_loop_over_an_iterator_passed_in_with_a_break_inside(capsys):
    _check_iter(loop_with_a_break_inside, [(torch.randn(3), list(i)) for i in ITEMS + [[2, 5, 6]]],
                graphs=None)


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


def generator_over_a_cell_rebound_later(x, d):
    k = 1

    def gen(extra):
        for i in range(2):
            yield x * k + extra["v"] + i

    g = gen(d)
    k = 5                       # the body, run later, reads the cell: 5
    d["v"] = 7
    return g


def test_returned_generator_reads_cells_and_containers_as_left():
    r = _check_gen(generator_over_a_cell_rebound_later, [(torch.randn(3), {"v": 1}),
                                                          (torch.randn(3), {"v": 2})], graphs=None)
    assert r.breaks == 0 and r.fallbacks == 0


def test_min_max_of_tensors_that_require_grad_not_picked():
    # (the item not chosen gets no gradient in CPython; where() would give it zeros)
    def f(w, v):
        m = max(w.sum(), v.sum())
        m.backward()
        return w.grad is None, v.grad is None
    check(f, [(torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True))], graphs=None)


def test_min_max_result_hashed_not_guessed():
    # (a dict keyed by tensors finds the chosen item by identity in CPython)
    def f(x):
        a, b = x.sum(), x.mean()
        table = {a: "a", b: "b"}
        return x * 2, table[max(a, b)]
    r = check(f, [torch.randn(3), torch.tensor([3.0, -1.0, 0.0])], graphs=None)
    assert r.fallbacks >= 1
