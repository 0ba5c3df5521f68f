"""torch._check facts about numbers read from data (unbacked) and sizes are enforced by
runtime asserts, also inside higher-order ops, and a failing check raises torch's message."""
import pytest
import torch
from torch._higher_order_ops.wrap import wrap

import frametrace
import frametrace.testing
from differential import check


@pytest.fixture
def capture_scalars(monkeypatch):
    monkeypatch.setattr(frametrace.config, "capture_scalar_outputs", True)
    monkeypatch.setattr(frametrace.config, "capture_dynamic_output_shape_ops", True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_check_of_unbacked_against_sum_of_sizes(capture_scalars, backend):
    # torch._check(u0 == a + b) made u0 stand for a + b, and the assert pass merged the
    # item() node with the graph's a + b: `item == item`, checked by nothing.
    def f(x, y, n):
        u0 = n.item()
        torch._check(u0 == x.size(0) + y.size(0))
        return x.sum() + y.sum() + u0

    r = check(f, [(torch.ones(2), torch.ones(3), torch.tensor(5)),
                  (torch.ones(2), torch.ones(3), torch.tensor(6)),
                  (torch.ones(4), torch.ones(3), torch.tensor(7)),
                  (torch.ones(4), torch.ones(5), torch.tensor(8))],
              backend=backend, dynamic=True, graphs=1, breaks=0)
    assert r.compiles == 1


def _is_size_and_twice(x, n):
    u0 = n.item()
    torch._check_is_size(u0)
    torch._check(u0 == x.size(0) * 2)
    return torch.ones(u0).sum() + x.sum()


def _two_reads(x, n):
    u0, u1 = n.tolist()
    torch._check(u0 == u1 + x.size(0))
    return x.sum() + u0 - u1


def _bounds(x, n):
    u0 = n.item()
    torch._check(u0 >= 2)
    torch._check(u0 <= 5)
    return x * u0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn,inputs", [
    (_is_size_and_twice, [(torch.ones(4), torch.tensor(8)), (torch.ones(4), torch.tensor(7)),
                          (torch.ones(5), torch.tensor(10)), (torch.ones(5), torch.tensor(-1))]),
    (_two_reads, [(torch.ones(4), torch.tensor([6, 2])), (torch.ones(4), torch.tensor([6, 3])),
                  (torch.ones(5), torch.tensor([7, 2])), (torch.ones(5), torch.tensor([7, 3]))]),
    (_bounds, [(torch.ones(3), torch.tensor(3)), (torch.ones(3), torch.tensor(1)),
               (torch.ones(3), torch.tensor(6)), (torch.ones(3), torch.tensor(5))]),
])
def test_checks_relating_reads_and_sizes(capture_scalars, backend, fn, inputs):
    r = check(fn, inputs, backend=backend, dynamic=True, breaks=0, fallbacks=0)
    assert r.graphs == 1, r


def _even_then_random(x, n):
    u0 = n.item()
    torch._check(u0 % 2 == 0, lambda: "n must be even")
    return torch.randn(2) + x.sum() + u0


def _even_default_message(x, n):
    u0 = n.item()
    torch._check(u0 % 2 == 0)
    return torch.randn(2) + x.sum() + u0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_even_then_random, _even_default_message])
def test_failing_check_in_a_graph_that_cannot_rerun_raises_torchs_message(capture_scalars, backend, fn):
    # (the graph drew random numbers: its error is the program's, so it must be the
    # error torch._check raises, message included)
    r = check(fn, [(torch.ones(2), torch.tensor(4)), (torch.ones(3), torch.tensor(5)),
                   (torch.ones(3), torch.tensor(6))], backend=backend, dynamic=True, breaks=0)
    assert r.graphs == 1, r


def _nonzero_multiple_of_4(x):
    y = x.nonzero()
    torch._check(y.shape[0] % 4 == 0)
    return torch.zeros(y.shape[0]) + x.sum()


def _in_cond(x):
    return torch.cond(x.shape[0] % 4 == 0, lambda: _nonzero_multiple_of_4(x),
                      lambda: _nonzero_multiple_of_4(x))


def _in_checkpoint(x):
    return torch.utils.checkpoint.checkpoint(_nonzero_multiple_of_4, x, use_reentrant=False)


def _in_wrap(x):
    return wrap(_nonzero_multiple_of_4, x)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_in_cond, _in_checkpoint, _in_wrap])
def test_check_inside_a_higher_order_op_is_enforced(capture_scalars, backend, fn):
    # (torch.compile's test_cond_runtime_assert_generation: the body's torch._check
    # stayed a Python call, which AOTAutograd traced into its own ShapeEnv and checked
    # nowhere)
    r = check(fn, [torch.ones(4, 4), torch.ones(5, 5), torch.zeros(3, 3), torch.ones(2, 2),
                   torch.ones(3, 3)],
              backend=backend, dynamic=True, breaks=0, fallbacks=0)
    assert r.graphs >= 1
