"""Failure kinds the program fuzzer found (tests/fuzz_programs.py), each as a small
differential test of its own."""
import collections
import enum

import pytest
import torch

from differential import Then, check


class Box:
    def __init__(self, n=0):
        self.n = n


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_inplace_write_to_an_expanded_tensor_raises_after_earlier_side_effects(backend):
    # Eager refuses to write in place to a tensor whose elements share memory; the
    # writes before it (a list, an attribute) have happened when it raises.  Fake
    # tensors do not raise, and a functionalized graph would write without raising.
    def f(t0, t1, xs, o):
        xs.append(1)
        o.n += 1
        t1 += t0
        return t1 * 2

    base = torch.tensor([-3.0, -3.0])
    r = check(f, [(torch.ones(2), torch.zeros(2), [], Box()),
                  (torch.ones(2), base[1:].expand(2), [], Box()),
                  (torch.ones(2), torch.zeros(2), [5], Box(3))], backend=backend)
    assert r.breaks >= 1 and r.graphs >= 2


def test_inplace_write_through_an_expanded_view_made_in_the_frame():
    def f(x, xs):
        xs.append(x.sum())
        y = x[:1].expand(3)
        y.mul_(2)
        return y

    r = check(f, [(torch.ones(3), []), (torch.zeros(3), [1])])
    assert r.breaks == r.compiles >= 1       # the write runs (and raises) in CPython


# -- found by the focused families of tests/fuzz_programs.py (issue 29) --

class IE(enum.IntEnum):
    A = 1
    B = 2


class S(str):
    pass


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


def write_through_a_chunk_view(x, w):
    v = x.chunk(2)[0]
    u = v.t()
    u.add_(w.sum())
    return (v * w.sum()).sum()


def test_write_through_a_view_of_a_chunk_output_with_an_operand_that_requires_grad():
    # (views family; 8 of 80 programs on 32f4331, none on main) a multi-output view's
    # view written in place with an operand that requires grad: eager raises "...is a
    # view and is being modified inplace...", the view-chain shortcut raised another error
    calls = [(torch.arange(12.0).view(4, 3), torch.ones(2, requires_grad=True)),
             (torch.arange(12.0).view(4, 3) - 5, torch.ones(2, requires_grad=True)),
             (torch.arange(12.0).view(4, 3), torch.ones(2))]
    r = check(write_through_a_chunk_view, calls)
    assert r.graphs >= 1


class Base:
    k = 1

    def __init__(self, v):
        self.v = v


class Mid(Base):
    k = 2


class B(Mid):
    pass


def base_attr_by_walking(o, t):
    return o.v * 0 + t, getattr(type(o).__mro__[1], "k", 0), o.__class__.__bases__[0].k


def set_base_k_true():
    Base.k = True


def test_base_attribute_changed_between_calls_read_by_walking_the_class():
    # (classes family; 19 of 80 programs on 32f4331, none on main) Base.k changed from
    # 1 to True between calls, read through __mro__[1] / __bases__[0] of a Mid object:
    # the traced 1 stayed (type int where CPython gives bool)
    saved = Base.k
    try:
        calls = [(B(torch.ones(2)), torch.ones(2)), (Mid(torch.ones(2)), torch.ones(2)),
                 Then(set_base_k_true, Mid(torch.ones(2)), torch.ones(2))]
        r = check(base_attr_by_walking, calls)
        assert r.graphs >= 2
    finally:
        Base.k = saved


def steps_with_backward(ps, opt, t):
    for _ in range(3):
        loss = sum((p * t.mean()).sum() for p in ps)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ps[0].sum().item()


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1, fused=True),
], ids=["Adam", "SGD", "Adagrad"])
def test_fused_optimizer_stepped_after_backward_in_the_frame(make):
    # (optimizers family; 13 of 80 programs on 32f4331, none on main) the fused kernels
    # write their arguments through tensor lists and return None: the graph dropped them
    def call(warm):
        ps = [torch.tensor([-3.0, 0.0], requires_grad=True), torch.tensor([-2.0, 0.0, 1.0], requires_grad=True)]
        opt = make(ps)
        if warm:            # state made by an eager step first
            for p in ps:
                p.grad = torch.ones_like(p)
            opt.step()
        return ps, opt, torch.tensor([-1.0, 2.0])

    r = check(steps_with_backward, [call(True), call(False)])
    assert r.graphs >= 1


def batch_norm_layout(x):
    y = torch.nn.functional.batch_norm(x, None, None, training=True)
    z = y.clone(memory_format=torch.preserve_format)
    return z.stride(), y.is_contiguous(), z


def test_layout_of_a_batch_norm_output_on_expanded_transposed_and_sliced_inputs():
    # (layouts family; 6 of 80 programs on 32f4331, none on main) strides read after a
    # batch norm of a non-contiguous input: answered from the fake tensor's layout
    calls = [(torch.arange(-1.0, 3.0).view(1, 4).expand(3, 4),),
             (torch.arange(-5.0, 7.0).view(4, 3).t(),),
             (torch.arange(-9.0, 15.0).view(3, 8)[:, ::2],)]
    r = check(batch_norm_layout, calls)
    assert r.graphs >= 1 and r.breaks >= 1      # the batch norm compiled, the stride read a break
