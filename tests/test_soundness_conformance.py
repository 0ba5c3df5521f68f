"""Soundness failures found by running PyTorch's own Dynamo unit tests against frametrace
(wrong values, wrong exceptions, internal errors), each as our own differential test."""
import collections


import torch

import frametrace

from differential import check


class Registry(dict):
    """A dict subclass: its `in`, `len` and `[]` are dict's builtins, read on the object."""


class OrderedRegistry(collections.OrderedDict):
    pass


def _branch_on_keys(x, d):
    if "key1" in d:
        x = x + 2
    if "key2" in d:
        x = x + 4
    return x + 8


def test_dict_subclass_membership_is_guarded():
    for cls in (Registry, OrderedRegistry):
        check(_branch_on_keys, [(torch.ones(3), cls(key1=torch.ones(3))),
                                (torch.ones(3), cls(key2=torch.ones(3))),
                                (torch.ones(3), cls(key1=1, key2=2))], graphs=3, breaks=0)


def test_dict_subclass_length_and_truth_are_guarded():
    def f(x, d):
        if d:
            x = x + len(d)
        return x * 2

    check(f, [(torch.ones(2), Registry(a=1)), (torch.ones(2), Registry(a=1, b=2)),
              (torch.ones(2), Registry())], graphs=3, breaks=0)


def test_dict_subclass_item_is_guarded():
    def f(x, d):
        return x * d["scale"]

    check(f, [(torch.ones(2), Registry(scale=2)), (torch.ones(2), Registry(scale=3)),
              (torch.ones(2), Registry(scale=3))], graphs=2, breaks=0)


def test_factory_with_requires_grad_in_the_graph_makes_a_real_leaf():
    # AOTAutograd returned the new leaf detached (requires_grad=False): backward failed.
    def f(x):
        leaf = torch.ones(2, requires_grad=True)
        return leaf, leaf * x

    r = check(f, [torch.arange(2.0), torch.arange(2.0) + 1], backend="aot_eager")
    assert r.breaks >= 1
    leaf, out = frametrace.optimize("aot_eager")(f)(torch.arange(2.0))
    out.sum().backward()
    assert torch.equal(leaf.grad, torch.arange(2.0))


def test_torch_flag_read_with_no_argument_is_guarded():
    # torch.autograd._profiler_enabled() was folded to its value at trace time, unguarded.
    def f(x):
        if torch.autograd._profiler_enabled():
            return x + 1
        return x - 1

    opt = frametrace.optimize("eager")(f)
    x = torch.zeros(2)
    assert torch.equal(opt(x), f(x))
    with torch.autograd.profiler.profile():
        assert torch.equal(opt(x), f(x))
    check(f, [torch.zeros(2), torch.ones(2)], graphs=1, breaks=0)


def test_torch_state_setter_runs_at_every_call():
    # Run at trace time only, torch.set_num_threads changed the state once.
    def f(x, n):
        torch.set_num_threads(n)
        return x * 2

    before = torch.get_num_threads()
    try:
        opt = frametrace.optimize("eager")(f)
        opt(torch.ones(2), 1)
        torch.set_num_threads(2)
        opt(torch.ones(2), 1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_saved_tensor_hooks_do_not_run_while_tracing():
    # The pack hook ran on the trace's FakeTensors too: one call packed twice.
    counts = {"pack": 0, "unpack": 0}

    def pack(t):
        counts["pack"] += 1
        return t

    def unpack(t):
        counts["unpack"] += 1
        return t

    def f(x, y):
        return x * y

    x, y = torch.ones(4, requires_grad=True), torch.ones(4)
    for backend in ("eager", "aot_eager"):
        frametrace.reset()
        counts.update(pack=0, unpack=0)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = frametrace.optimize(backend)(f)(x, y)
            assert counts == {"pack": 1, "unpack": 0}, (backend, counts)
            out.sum().backward()
            assert counts == {"pack": 1, "unpack": 1}, (backend, counts)
    check(f, [(x, y)], backend="aot_eager")


def test_set_isdisjoint_and_issuperset_stop_at_the_deciding_item():
    # CPython stops iterating a non-set argument at the first item that decides; the
    # trace consumed all of it, so the iterator was left empty.
    def f(x, items):
        s = {2, 4, 5}
        it = iter(items)
        disjoint = s.isdisjoint(it)
        it2 = iter(items)
        superset = s.issuperset(it2)
        return x + len(list(it)) + 10 * len(list(it2)), disjoint, superset

    check(f, [(torch.zeros(1), [9, 2, 5, 6]), (torch.zeros(1), [1, 3]),
              (torch.zeros(1), [2, 4, 7, 8])], graphs=3, breaks=0)


def test_none_test_of_a_value_computed_at_a_graph_break_is_guarded():
    # re.match breaks the graph; its Match result went on to the resume function as
    # unguarded data, and `if m is not None` was decided once for all later calls.
    import re

    def f(t):
        m = re.match(r"^(.+)\?$", t)
        if m is not None:
            return "optional"
        m = re.match(r"^(.+)\[([0-9]+)?\]$", t)
        if m is not None:
            return m.group(1)
        return "base"

    r = check(f, ["Tensor", "int[]", "Tensor?", "int[2]", "Tensor", "int[]"], graphs=0)
    assert r.breaks >= 1 and r.fallbacks == 0


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


class _Stepper:
    def __init__(self):
        self.state = torch.zeros(4)

    def step(self):
        self.state.add_(1)


@frametrace.disable
def _opaque_step(obj):
    obj.step()


def test_a_compile_frees_what_it_traced_without_waiting_for_the_gc():
    # The tracer referred to itself (root = self): the objects its Vars held lived on
    # until the next GC pass, so `state = None` did not free an optimizer's tensors.
    import gc
    import weakref

    holder = {"obj": _Stepper()}

    def f(x):
        _opaque_step(holder["obj"])
        return x + 1

    check(f, [torch.zeros(2)], breaks=1)
    frametrace.optimize("eager")(f)(torch.zeros(2))
    ref = weakref.ref(holder["obj"].state)
    gc.disable()
    try:
        holder["obj"] = None
        assert ref() is None
    finally:
        gc.enable()


def test_an_object_whose_hash_raises_is_no_internal_error():
    # torchgen's frozen dataclasses (module "torchgen", taken for a library): their
    # __init__ frame got `self` before its fields exist, and looking it up among the
    # library handlers hashed it (AttributeError inside the tracer).
    from torchgen.model import BaseTy, BaseType

    def f(names):
        return [BaseType(BaseTy[n]) for n in names]

    check(f, [(["Tensor", "int"],), (["float"],)], graphs=0)   # no internal error


def test_aot_eager_decomp_partition_backend_matches_eager():
    # PyTorch's own tests name this backend; it was a ValueError here.
    def f(x, w):
        y = torch.nn.functional.batch_norm(x, None, None, training=True)
        return (y @ w).relu().sum()

    check(f, [(torch.randn(4, 3), torch.randn(3, 2, requires_grad=True))],
          backend="aot_eager_decomp_partition", graphs=1)
    w = torch.randn(3, 2, requires_grad=True)
    x = torch.randn(4, 3)
    frametrace.optimize("aot_eager_decomp_partition")(f)(x, w).backward()
    expected = torch.autograd.grad(f(x, w), w)[0]
    assert torch.allclose(w.grad, expected, atol=1e-5)
