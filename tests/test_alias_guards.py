"""Guards on memory shared between tensor inputs that a graph writes: many written
inputs (an optimizer's parameters and state) are checked in one pass, and every way of
sharing memory at run time that the trace did not see is still noticed."""
import gc
import types

import torch

from differential import check


def sgd_update(ps, gs):
    for p, g in zip(ps, gs):
        p.add_(g, alpha=-0.1)
    return ps[0] * 2


def _lists(n, size=4):
    return [torch.randn(size) for _ in range(n)], [torch.randn(size) for _ in range(n)]


def _check_source(fn):
    checks = [o for o in gc.get_objects()
              if type(o) is types.FunctionType and o.__name__ == "___check" and hasattr(o, "source")]
    return "\n".join(c.source for c in checks if c.__code__.co_filename.endswith(f" {fn.__name__}>"))


def many_updates(ps, gs):
    return sgd_update(ps, gs)


def test_many_written_inputs_are_guarded_in_one_pass_not_per_pair():
    ps, gs = _lists(40)
    r = check(many_updates, [(ps, gs), _lists(40)], graphs=1, breaks=0)
    src = _check_source(many_updates)
    assert "___unshared" in src and src.count("untyped_storage") == 0
    assert r.graphs == 1


def _same_tensor_twice():
    ps, gs = _lists(6)
    ps[3] = ps[1]          # one parameter listed twice: its update applies twice
    return ps, gs


def _view_of_another():
    ps, gs = _lists(6, size=8)
    base = torch.randn(16)
    ps[2], ps[4] = base[:8], base[8:]   # two views of one storage, disjoint
    return ps, gs


def _written_read_elsewhere():
    ps, gs = _lists(6)
    gs[5] = ps[0]          # a gradient that is another input's parameter
    return ps, gs


def _empty_tensors():
    ps, gs = _lists(6)
    ps[1], ps[2] = torch.empty(0), torch.empty(0)
    gs[1], gs[2] = torch.empty(0), torch.empty(0)
    return ps, gs


def test_sharing_memory_at_run_time_is_noticed():
    # first calls: nothing shared; then each kind of sharing the trace did not see
    inputs = [_lists(6), _lists(6), _same_tensor_twice(), _view_of_another(),
              _written_read_elsewhere(), _lists(6)]
    r = check(sgd_update, inputs, breaks=0)
    assert r.graphs >= 3   # the shared cases compile programs of their own


def test_empty_tensors_may_share_the_null_pointer():
    r = check(sgd_update, [_empty_tensors(), _empty_tensors(), _empty_tensors()], breaks=0)
    assert r.graphs == 1
