"""Loops, iterators and generators, differential against CPython: a graph break inside a
loop hands the rest of the iteration to the resume function; iterators from outside are
never consumed at trace time; generators run lazily; list and dict iterators and dict
views are live, as CPython's."""
import itertools

import pytest
import torch

import frametrace
from differential import Call, check
from conftest import quiet

W = [2.0, 3.0, 5.0]


def _inputs():
    return [(torch.randn(4),), (torch.randn(4),), (torch.randn(4),)]


# --------------------------------------------------------------------------- breaks in loops
def loop_enumerate_print(x):
    for i, w in enumerate(W):
        x = x * w
        print(i)
    return x


def loop_zip_item(x):
    for w, v in zip((2.0, 3.0, 5.0), [1.0, -1.0, 2.0]):
        x = x * w + v
        x = x + x.sum().item()
    return x


def loop_reversed_branch(x):
    for w in reversed([2.0, 3.0, 5.0]):
        x = x * w
        if x.sum() > 0:
            x = x + 1
        else:
            x = x - 1
    return x


def loop_iter_print(x):
    for w in iter(W):
        x = x * w
        print("w")
    return x


def loop_map_builtin(x):
    for w in map(float, [1, 2, 3]):
        x = x * w
        print("w")
    return x


def loop_chain(x):
    for w in itertools.chain([2.0, 3.0, 5.0], (7.0,)):
        x = x + w
        print("w")
    return x


def loop_range_item(x):
    for i in range(3):
        x = x * (i + 2)
        x = x + x.sum().item()
    return x


def loop_dict_items(x):
    d = {"a": 2.0, "b": 3.0, "c": 5.0}
    for k, w in d.items():
        x = x * w
        print(k)
    return x


def loop_genexpr(x):
    for w in (w * 2 for w in [2.0, 3.0, 5.0]):
        x = x * w
        print("w")
    return x


def loop_nested(x):
    for i, a in enumerate(W):
        for j, b in enumerate(W[:2]):
            x = x * a + b
            if i == 1 and j == 0:
                print("middle")
        x = x - i
    return x


def _break_at(k):
    def fn(x):
        for i, w in enumerate(W):
            x = x * w
            if i == k:
                print("break at", k)
        return x
    return fn


@pytest.mark.parametrize("fn", [loop_enumerate_print, loop_zip_item, loop_reversed_branch,
                                loop_iter_print, loop_map_builtin, loop_chain, loop_nested,
                                # these worked before; kept with the others
                                loop_range_item, loop_dict_items, loop_genexpr])
def test_graph_break_inside_loop_continues_the_loop(fn):
    with quiet():
        r = check(fn, _inputs())
    # Graphs on both sides of the break: one per iteration at least, and nothing falls back.
    assert r.fallbacks == 0 and r.breaks >= 1 and r.graphs >= 2, r


@pytest.mark.parametrize("k", [0, 1, 2])
def test_graph_break_at_first_middle_last_iteration(k):
    with quiet():
        r = check(_break_at(k), _inputs())
    # After a break at the last iteration the loop is empty: no graph there.
    assert r.fallbacks == 0 and r.breaks >= 1 and r.graphs >= (1 if k == 2 else 2), r


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


class _Stack(torch.nn.Module):
    def __init__(self, breaking):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(3))
        self.breaking = breaking

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i == self.breaking:
                print("layer", i)
        return x * 2


@pytest.mark.parametrize("breaking", [0, 1])
def test_graph_break_in_module_list_loop(breaking):
    torch.manual_seed(0)
    model = _Stack(breaking)
    with quiet():
        r = check(model, [(torch.randn(2, 4),), (torch.randn(2, 4),)],
                  compiled=lambda backend: __import__("frametrace").optimize(backend=backend)(model))
    assert r.fallbacks == 0 and r.breaks >= 1 and r.graphs >= 2, r


def loop_map_user_fn(x, seen):
    def f(w):
        seen.append(w)
        return w
    for w in map(f, W):
        x = x * w
        print(len(seen))
    return x


def test_graph_break_in_loop_over_map_with_effects_is_exact():
    # Pulling the rest of map(f, ...) at the break would run f early: CPython instead.
    with quiet():
        check(loop_map_user_fn, [(torch.randn(4), []), (torch.randn(4), [])], graphs=None)


# --------------------------------------------------------------------------- iterator arguments
def sum_of_iterator(x, it):
    return x + sum(tuple(it))


def loop_over_iterator_arg(x, it):
    for w in it:
        x = x * w
    return x


def next_of_iterator_arg(x, it):
    return x * next(it)


def _check_iterator_calls(fn, calls):
    """Differential by hand (the harness compares arguments by equality, which
    iterators lack): each call gets its own iterator over the same values on both sides;
    values returned and what the iterators have left must agree."""
    import frametrace
    compiled = frametrace.optimize(fn)
    for values, repeat in calls:
        it_eager, it_compiled = iter(values), iter(values)
        x = torch.randn(3)
        for _ in range(repeat):
            want, got = fn(x, it_eager), compiled(x, it_compiled)
            assert torch.equal(want, got), (fn.__name__, values, want, got)
        assert list(it_eager) == list(it_compiled)


@pytest.mark.parametrize("fn", [sum_of_iterator, loop_over_iterator_arg, next_of_iterator_arg])
def test_iterator_argument_is_not_consumed_at_trace_time(fn):
    # A new iterator with other contents on each call (the old one freed: its id is
    # reused), and one iterator passed twice (the second call sees what is left).
    _check_iterator_calls(fn, [([1, 2, 3], 1), ([4, 5], 1), ([6, 7, 8], 1), ([1, 2, 3], 2)])


# --------------------------------------------------------------------------- lazy generators
def _gen(log, n):
    for i in range(n):
        log.append(i)
        yield i + 1


def next_of_generator(x, log):
    g = _gen(log, 3)
    return x * next(g)


def any_of_generator(x, log):
    return x * any(v > 1 for v in _gen(log, 4))


def zip_generator_with_short(x, log):
    for a, b in zip(_gen(log, 5), [1.0, 2.0]):
        x = x * a + b
    return x


def generator_interleaved(x, log):
    for v in _gen(log, 3):
        log.append(-v)
        x = x + v
    return x


@pytest.mark.parametrize("fn", [next_of_generator, any_of_generator, zip_generator_with_short,
                                generator_interleaved])
def test_generators_run_lazily(fn):
    check(fn, [(torch.randn(3), []), (torch.randn(3), [7])])


# --------------------------------------------------------------------------- live list/dict iteration
def list_growing_while_iterated(x):
    ws = [1.0, 2.0]
    for w in ws:
        if len(ws) < 5:
            ws.append(w + 1)
        x = x * w
    return x, ws


def enumerate_list_growing(x):
    ws = [1.0, 2.0]
    for i, w in enumerate(ws):
        if i < 3:
            ws.append(w)
        x = x + w
    return x


def dict_growing_while_iterated(x):
    d = {"a": 1}
    for k in d:
        d[k + "x"] = 2
        x = x + 1
    return x


def test_list_iterator_sees_appended_items():
    check(list_growing_while_iterated, _inputs(), breaks=0)
    check(enumerate_list_growing, _inputs(), breaks=0)


def test_dict_changed_size_during_iteration_raises():
    check(dict_growing_while_iterated, _inputs(), graphs=None)


# --------------------------------------------------------------------------- dict views
def keys_view_is_live(x):
    d = {"a": 1}
    k = d.keys()
    v = d.values()
    it = d.items()
    d["new"] = 2
    return x + len(k), "new" in k, list(k), list(v), list(it)


def values_view_iterated_after_update(x, d):
    vals = d.values()
    d["z"] = 4.0
    for w in vals:
        x = x * w
    return x


def test_dict_views_are_live():
    check(keys_view_is_live, _inputs())
    check(values_view_iterated_after_update, [(torch.randn(3), {"a": 2.0}), (torch.randn(3), {"a": 3.0})])


# --------------------------------------------------------------------------- builds across a break
def _breaks_and_returns_dict(x):
    print("break")
    return {"a": x + 1}


def _breaks_and_returns_list(x):
    print("break")
    return [x + 1, x]


def dict_unpack_of_breaking_call(x):
    return {**_breaks_and_returns_dict(x), "b": x}


def list_unpack_of_breaking_call(x):
    return [x, *_breaks_and_returns_list(x)]


def test_container_display_across_a_break():
    with quiet():
        check(dict_unpack_of_breaking_call, _inputs())
        check(list_unpack_of_breaking_call, _inputs())


def list_growing_after_a_break(x, ws):
    for w in ws:
        print("w")
        if len(ws) < 5:
            ws.append(w + 1)
        x = x * w
    return x


def local_list_growing_after_a_break(x):
    ws = [1.0, 2.0]
    for w in ws:
        x = x + x.sum().item()
        if len(ws) < 4:
            ws.append(w + 1)
        x = x * w
    return x, ws


def test_list_iterator_handed_over_live_at_a_break():
    with quiet():
        r = check(list_growing_after_a_break, [(torch.randn(3), [1.0, 2.0]), (torch.randn(3), [3.0])])
        assert r.fallbacks == 0 and r.breaks >= 2, r
        r = check(local_list_growing_after_a_break, _inputs())
        assert r.fallbacks == 0 and r.breaks >= 2, r


def dict_growing_after_a_break(x):
    d = {"a": 1}
    for k in d:
        print(k)
        d[k + "x"] = 2
        x = x + 1
    return x


def dict_items_mutated_after_a_break(x, d):
    for k, v in d.items():
        print(k)
        x = x * v
        if k == "a":
            d["a"] = 10.0       # same size: fine in CPython, the value is read live
    return x


def test_dict_iterator_at_a_break_stays_live():
    with quiet():
        check(dict_growing_after_a_break, _inputs(), graphs=None)
        check(dict_items_mutated_after_a_break, [(torch.randn(3), {"a": 2.0, "b": 3.0})])


def loop_over_values_view_arg(x, vals):
    for w in vals:
        x = x * w
    return x


def test_dict_view_argument_contents_are_not_baked_in():
    import frametrace
    compiled = frametrace.optimize(loop_over_values_view_arg)
    d = {"a": 2.0}
    vals = d.values()
    x = torch.randn(3)
    for value in (2.0, 3.0):
        d["a"] = value
        assert torch.equal(loop_over_values_view_arg(x, vals), compiled(x, vals))


def test_hugging_face_layers_loop_with_a_break_in_layer_0():
    transformers = pytest.importorskip("transformers")
    import frametrace
    torch.manual_seed(0)
    config = transformers.BloomConfig(n_layer=3, hidden_size=32, n_head=4, vocab_size=100)
    model = transformers.BloomForCausalLM(config).eval()
    model.transformer.h[0].register_forward_pre_hook(lambda mod, args: print("layer 0"))

    def logits(input_ids):
        with torch.no_grad():
            return model(input_ids=input_ids).logits

    with quiet():
        r = check(logits, [(torch.randint(0, 100, (1, 7)),), (torch.randint(0, 100, (1, 7)),)])
    assert r.breaks >= 1 and r.graphs >= 2, r


def enumerate_list_growing_after_a_break(x, ws):
    for i, w in enumerate(ws, 1):
        print(i)
        if len(ws) < 4:
            ws.append(w + i)
        x = x * w
    return x


def test_enumerate_over_a_live_list_at_a_break():
    with quiet():
        r = check(enumerate_list_growing_after_a_break, [(torch.randn(3), [1.0, 2.0]), (torch.randn(3), [3.0])])
    assert r.fallbacks == 0 and r.breaks >= 2, r


def zip_list_growing_after_a_break(x, ws):
    for a, b in zip(ws, [1.0, 2.0, 3.0, 4.0]):
        print(a)
        if len(ws) < 4:
            ws.append(a + b)
        x = x * a + b
    return x


def zip_over_fresh_lists_with_a_break(x):
    for a, b in zip([1.0, 2.0], [3.0, 4.0]):
        print(a)
        x = x * a + b
    return x


def reversed_list_changed_while_iterated(x):
    ws = [1.0, 2.0, 3.0]
    for w in reversed(ws):
        ws[0] = 10.0
        x = x * w
    return x


def test_reversed_list_iterator_is_live():
    check(reversed_list_changed_while_iterated, _inputs(), breaks=0)


def genexpr_over_list_growing_after_a_break(x, ws):
    for w in (w * 2 for w in ws):
        print(w)
        if len(ws) < 4:
            ws.append(w)
        x = x * w
    return x


def generator_over_attribute_list(x, holder):
    def items():
        for w in holder.ws:
            yield w
    for w in items():
        print(w)
        if len(holder.ws) < 4:
            holder.ws.append(w + 1)
        x = x * w
    return x


class _Holder:
    def __init__(self, ws):
        self.ws = ws


def test_generator_over_a_live_list_at_a_break_is_exact():
    with quiet():
        check(genexpr_over_list_growing_after_a_break, [(torch.randn(3), [1.0, 2.0])], graphs=None)
        check(generator_over_attribute_list, [(torch.randn(3), _Holder([1.0, 2.0]))], graphs=None)


def zip_enumerate_dict_after_a_break(x, ws, d):
    for (i, w), k in zip(enumerate(ws), d):
        print(i)
        if len(ws) < 4:
            ws.append(w + i)
        x = x * w + d[k]
    return x


def test_zip_over_a_live_list_at_a_break_is_exact():
    with quiet():
        # Handed over as zip(live iterators): the list can change after the break.
        r = check(zip_list_growing_after_a_break, [(torch.randn(3), [1.0, 2.0]), (torch.randn(3), [3.0])])
        assert r.fallbacks == 0 and r.breaks >= 2, r
        r = check(zip_enumerate_dict_after_a_break,
                  [(torch.randn(3), [1.0, 2.0], {"a": 1.0, "b": 2.0, "c": 3.0})])
        assert r.fallbacks == 0 and r.breaks >= 2, r
        # Lists nothing else can reach: the rest is handed over, graphs on both sides.
        r = check(zip_over_fresh_lists_with_a_break, _inputs())
    assert r.fallbacks == 0 and r.breaks >= 2, r


def set_growing_while_iterated(x):
    s = {1, 2}
    for v in s:
        s.add(v + 10)
        x = x + v
    return x


def test_set_changed_size_during_iteration_raises():
    check(set_growing_while_iterated, _inputs(), graphs=None)


def _gen_with_finally(log):
    try:
        yield 1.0
        yield 2.0
    finally:
        log.append("closed")


def generator_with_finally_consumed(x, log):
    for v in _gen_with_finally(log):
        log.append(v)
        x = x * v
    return x


def test_generator_cleanup_runs_as_in_cpython():
    check(generator_with_finally_consumed, [(torch.randn(3), []), (torch.randn(3), [])], graphs=None)


# -- an iterator object of a user class --
class Countdown:
    """An iterator object of a user class: __iter__ returns self."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n <= 0:
            raise StopIteration
        self.n -= 1
        return self.n


def test_for_over_a_user_iterator_object_is_no_internal_error():
    # Unpacking it called __iter__ again on the result (itself): RecursionError.
    def f(x):
        x = x * 2
        for i in Countdown(3):
            x = x + i
        return x

    check(f, [torch.zeros(2), torch.ones(2)], max_graphs=4)


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
