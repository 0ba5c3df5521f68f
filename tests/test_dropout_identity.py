"""Dropout that gives its input back (p=0, eval, training=False), with static and symbolic
sizes, on the eager and aot_eager backends: the result aliases as in CPython."""
import pytest
import torch

from differential import check

BACKENDS = ["eager", "aot_eager"]


def dropout_identity(x):
    y = torch.nn.functional.dropout(x, p=0.0, training=True)
    return y, y is x, y + 1


def dropout_then_write(x, p, training):
    y = torch.nn.functional.dropout(x, p=p, training=training)
    y.add_(1)                 # the same tensor as x where the kernel gave x back
    return y * 2


def dropout_module_eval(m, x):
    y = m(x)
    return y is x, torch.dropout(x, 0.0, True) is x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [None, True])
def test_dropout_gives_its_input_back(backend, dynamic):
    sizes = (4, 5, 7)
    r = check(dropout_identity, [torch.randn(n) for n in sizes], backend=backend, dynamic=dynamic)
    assert r.graphs >= 1 and r.breaks == 0, r
    # (both answers known while tracing: the frame computes nothing)
    r = check(dropout_module_eval, [(torch.nn.Dropout(0.5).eval(), torch.randn(n)) for n in sizes],
              backend=backend,
              dynamic=dynamic, graphs=0)
    assert r.breaks == 0 and r.fallbacks == 0, r
    r = check(dropout_then_write, [(torch.randn(n), 0.0, True) for n in sizes] +
              [(torch.randn(n), 0.5, False) for n in sizes], backend=backend, dynamic=dynamic)
    assert 1 <= r.graphs <= 6 and r.breaks == 0, r
