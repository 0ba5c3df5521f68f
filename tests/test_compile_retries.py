"""A compile attempt that fails while something was symbolic is retried before the
frame is given up (convert._drive): after AOTAutograd's restart for a float it
cannot keep symbolic (TensorifyScalarRestartAnalysis) once with the floats constant
and the sizes still symbolic; after any other failure, or a second restart, with
static sizes from then on.  Each test runs a loop of calls and counts the graphs,
compiles and fallbacks, so that a driver that gave up (ran the frame in CPython) or
retried forever could not pass."""
import logging

import pytest
import torch

import frametrace
from frametrace import convert
from differential import check


class TensorifyScalarRestartAnalysis(RuntimeError):
    """Stands for AOTAutograd's restart: the driver knows it by its name."""


def _symbolic(gm) -> set:
    """"f" where a graph input is a symbolic float, "i" where a size is symbolic."""
    kinds = set()
    for n in gm.graph.nodes:
        v = n.meta.get("example_value") if n.op == "placeholder" else None
        if isinstance(v, torch.SymFloat):
            kinds.add("f")
        elif isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in v.shape):
            kinds.add("i")
    return kinds


def refuses_symbolic_sizes(gm, example_inputs):
    if "i" in _symbolic(gm):
        raise RuntimeError("this backend wants static sizes")
    return gm.forward


def restarts_on_floats(gm, example_inputs):
    if "f" in _symbolic(gm):
        raise TensorifyScalarRestartAnalysis("a float it cannot keep symbolic")
    return gm.forward


def restarts_on_anything_symbolic(gm, example_inputs):
    if _symbolic(gm):
        raise TensorifyScalarRestartAnalysis("anything symbolic")
    return gm.forward


def scale(x, lr):
    return x * lr + lr


@pytest.fixture(autouse=True)
def _fresh():
    frametrace.reset()
    yield
    frametrace.reset()


@pytest.fixture
def driver_log(caplog):
    caplog.set_level(logging.INFO, logger="frametrace")
    return caplog


def _lines(caplog, text):
    return [r for r in caplog.records if r.name == "frametrace" and text in r.getMessage()]


SIZES = [(torch.ones(3), 0.5), (torch.ones(4), 0.5), (torch.ones(5), 0.5), (torch.ones(6), 0.5)]
# the float changes at the second call, the size at the third and fourth
FLOATS = [(torch.ones(3), 0.5), (torch.ones(3), 0.25), (torch.ones(4), 0.25), (torch.ones(5), 0.25)]


def test_a_backend_that_refuses_symbolic_sizes_gets_static_ones_from_then_on(driver_log):
    r = check(scale, SIZES, backend=refuses_symbolic_sizes, fallbacks=0, breaks=0)
    # one compile per size; the backend saw one more graph: the second size's symbolic
    # attempt, which failed and was undone
    assert r.compiles == 4 and r.graphs == 5, r
    warned = _lines(driver_log, "failed with symbolic sizes")
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "this backend wants static sizes" in warned[0].getMessage()
    assert not _lines(driver_log, "a float could not stay symbolic")


def test_a_restart_for_a_float_keeps_the_sizes_symbolic(driver_log):
    r = check(scale, FLOATS, backend=restarts_on_floats, fallbacks=0, breaks=0)
    assert len(_lines(driver_log, "a float could not stay symbolic")) == 1
    assert not _lines(driver_log, "failed with symbolic sizes")
    # the sizes stayed symbolic: the sizes 4 and 5 share a graph (the backend saw one
    # more: the attempt with the float symbolic)
    assert r.compiles == 3 and r.graphs == 4, r


def test_a_second_restart_makes_the_sizes_static_quietly(driver_log):
    r = check(scale, FLOATS, backend=restarts_on_anything_symbolic, fallbacks=0, breaks=0)
    assert len(_lines(driver_log, "a float could not stay symbolic")) == 1
    static = _lines(driver_log, "failed with symbolic sizes")
    # expected of AOTAutograd: logged at INFO, not a warning
    assert len(static) == 1 and static[0].levelno == logging.INFO
    # static sizes from then on: a graph per size (and two attempts undone)
    assert r.compiles == 4 and r.graphs == 6, r


def test_fullgraph_retries_before_raising_and_compiles_static(driver_log):
    r = check(scale, SIZES, backend=refuses_symbolic_sizes, fullgraph=True, fallbacks=0)
    assert r.compiles == 4 and r.graphs == 5, r
    assert len(_lines(driver_log, "failed with symbolic sizes")) == 1


@frametrace.disable
def _opaque(t):
    return t


def breaks(x, lr):
    y = x * lr
    _opaque(y)
    return y + lr


def test_a_break_is_retried_static_when_its_graph_fails_symbolic(driver_log):
    r = check(breaks, SIZES, backend=refuses_symbolic_sizes, fallbacks=0)
    assert r.breaks == 4 and len(_lines(driver_log, "failed with symbolic sizes")) >= 1, r
    assert not _lines(driver_log, "running breaks in CPython")


def test_fullgraph_raises_unsupported_after_the_static_attempt(driver_log):
    compiled = frametrace.optimize(backend="eager", fullgraph=True, dynamic=True)(breaks)
    for n in (3, 4):
        with pytest.raises(frametrace.Unsupported, match="_opaque"):
            compiled(torch.ones(n), 0.5)
    # the symbolic attempt failed first: one more, static, before the user hears of it
    assert len(_lines(driver_log, "failed with symbolic sizes")) == 1
