"""In-place writes that eager refuses or that AOTAutograd cannot copy back, where the
FakeTensors accept them: the op runs in CPython at a graph break, so the program gets
eager's exception (or eager's result), on every backend."""
import pytest
import torch

import frametrace
from differential import check

BACKENDS = ["eager", "aot_eager"]


def _prefix_then(op):
    def f(x, y):
        z = x * 2
        getattr(x, op)(y)
        return z, x
    return f


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["ne_", "clamp_max_", "floor_divide_", "atan2_", "copysign_", "add_", "gt_"])
def test_inplace_op_that_would_broadcast_its_own_argument_raises_as_eager(backend, op):
    # The meta kernels resize x to the broadcast shape as they would an out= tensor;
    # eager raises "output with shape [10, 1, 5] doesn't match the broadcast shape".
    f = _prefix_then(op)
    r = check(f, [(torch.randn(10, 1, 5), torch.randn(10, 10, 5)),
                  (torch.randn(10, 1, 5), torch.randn(10, 10, 5)),
                  (torch.randn(10, 10, 5), torch.randn(10, 1, 5))], backend=backend)
    assert r.breaks >= 1 and r.graphs >= 1, r
    assert any("change the shape" in why for why in r.reasons()), r.reasons()


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_inplace_op_broadcasting_its_argument(backend):
    def f(x, y):
        return x.gcd_(y) + 1
    check(f, [(torch.randint(1, 9, (3, 1)), torch.randint(1, 9, (3, 4))),
              (torch.randint(1, 9, (3, 4)), torch.randint(1, 9, (3, 1)))], backend=backend, graphs=None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_op_with_a_leading_broadcast_dim(backend):
    def f(x, y):
        w = x.sin()
        x.add_(y)           # (5,) += (1, 5): eager refuses, the result would be (1, 5)
        return w
    r = check(f, [(torch.randn(5), torch.randn(1, 5)), (torch.randn(5), torch.randn(5))],
              backend=backend)
    assert r.breaks == 1, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_inplace_ops_stay_in_one_graph(backend):
    def f(x, y, z):
        x.add_(y)               # (4, 5) += (5,)
        x.clamp_max_(z)         # (4, 5) with (4, 1)
        x.addr_(y[:4], y)       # non-pointwise: shapes do not broadcast, the result is x's
        return x * 2
    check(f, [(torch.randn(4, 5), torch.randn(5), torch.randn(4, 1)) for _ in range(3)],
          backend=backend, graphs=1, breaks=0)


@pytest.fixture
def one_thread():
    # Eager's norm kernel updates the channels of the running stats in parallel threads:
    # with the stats expanded, the channels read and write one shared element and race
    # (three updates applied one after another, or fewer), so eager itself differs from
    # run to run on more than one thread.  It was "order-dependent" only in that CI runs
    # with two threads and a single file was run with one.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm", ["batch_norm", "instance_norm"])
def test_training_norm_writing_expanded_running_stats(backend, norm, one_thread):
    # Eager writes the running stats whatever their layout; functionalization cannot
    # copy back into a tensor whose elements share memory.
    def f(x, rm, rv):
        y = x + 1
        if norm == "batch_norm":
            out = torch.nn.functional.batch_norm(y, rm, rv, training=True)
        else:
            out = torch.nn.functional.instance_norm(y, rm, rv, use_input_stats=True)
        return out * 2, rm, rv

    def inputs():
        # Every channel alike: the channels' writes into the one shared element race
        # (the norm runs them in parallel threads), their value does not.
        return (torch.randn(4, 1, 5).expand(4, 3, 5).clone(), torch.zeros(1).expand(3), torch.ones(3))
    r = check(f, [inputs() for _ in range(3)], backend=backend)
    assert r.breaks >= 1, r
    assert any("share memory" in why for why in r.reasons()), r.reasons()
    # With plain running stats the norm stays in the graph.
    r = check(f, [(torch.randn(4, 3, 5), torch.zeros(3), torch.ones(3)) for _ in range(3)],
              backend=backend, breaks=0, graphs=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_running_stats_updated_once_when_the_graph_raises_after_them(backend):
    # native_batch_norm's schema does not mark its running stats written: a graph that
    # updated them and then raised must not run its frame again in CPython as if it had
    # changed nothing (the stats would move twice).
    def f(x, rm, rv, idx):
        y = torch.nn.functional.batch_norm(x, rm, rv, training=True, momentum=0.5)
        return y[idx] * 2

    def inputs(i):
        return (torch.randn(4, 3), torch.zeros(3), torch.ones(3), torch.tensor([i]))

    def warm(x, rm, rv):
        return torch.nn.functional.batch_norm(x, rm, rv, training=True, momentum=0.5)
    # The fake mode's cache of native_batch_norm, filled by an earlier trace, answers
    # without running the meta function's copy_ into the stats.
    frametrace.optimize(warm, backend=backend)(*inputs(0)[:3])
    frametrace.reset()
    r = check(f, [inputs(1), inputs(7), inputs(2), inputs(9)], backend=backend)
    assert r.graphs == 1 and r.breaks == 0, r


# -- an in-place write to an expanded tensor (found by the program fuzzer) --
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
