"""Failure kinds the program fuzzer found (tests/fuzz_programs.py), each as a small
differential test of its own."""
import pytest
import torch

from differential import check


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
