"""What cannot be traced yet: right results in CPython with a logged reason, and with
fullgraph=True a frametrace.Unsupported naming the operation, the file and the line."""
import decimal
import io
import logging
import os
from contextlib import redirect_stdout

import pytest
import torch

import frametrace

from conftest import compile_with

THIS_FILE = os.path.abspath(__file__)


def prints(x):
    print("value")                                 # LINE_PRINT
    return x + 1


def item(x):
    y = x.sum() * 2
    return y.item() + 1                            # LINE_ITEM


def branch(x):
    if x.sum() > 0:                                # LINE_BRANCH
        return x + 1
    return x - 1


def _line(marker):
    with open(THIS_FILE) as fh:
        for n, line in enumerate(fh, 1):
            if line.rstrip().endswith(marker):
                return n
    raise AssertionError(marker)


# 'with' over a C context manager frametrace does not know (decimal's) cannot be
# traced, and a frame cannot break its graph at a 'with':
# the whole frame runs in CPython.  The others break the graph there and go on.
LOCK = decimal.localcontext()


def locked(x):
    with LOCK:                                     # LINE_WITH
        pass
    return x + 1


@pytest.mark.parametrize("fn, marker, what, graphs, logger, message", [
    (prints, "LINE_PRINT", "print", 1, "frametrace.graph_breaks", "graph break in prints"),
    # the float item() returns is an input of the resumed graph (which adds 1)
    (item, "LINE_ITEM", "Tensor.item()", 2, "frametrace.graph_breaks", "graph break in item"),
    (branch, "LINE_BRANCH", "data-dependent", 2, "frametrace.graph_breaks",
     "graph break in branch"),
    (locked, "LINE_WITH", "'with'", 0, "frametrace", "running locked in CPython"),
])
def test_fallback_is_correct_and_logged(cnt, caplog, monkeypatch, fn, marker, what, graphs,
                                        logger, message):
    """Right results, the graphs around the untraceable code (none for a frame that runs
    in CPython), and one log naming the operation, the file and the line."""
    # logs.configure() (FRAMETRACE_LOGS) may have given the logger its own level and handler
    monkeypatch.setattr(logging.getLogger(logger), "propagate", True)
    caplog.set_level(logging.INFO, logger=logger)
    g = compile_with(cnt, fn)
    x = torch.randn(3).abs()
    with caplog.at_level(logging.INFO, logger="frametrace"), redirect_stdout(io.StringIO()) as out:
        got = g(x)
        again = g(x)
        expected = fn(x)
    assert got == expected if not isinstance(expected, torch.Tensor) else torch.equal(got, expected)
    assert again == expected if not isinstance(expected, torch.Tensor) else torch.equal(again, expected)
    assert out.getvalue() == ("value\n" * 3 if fn is prints else "")
    assert cnt.frame_count == graphs
    logs = [r.getMessage() for r in caplog.records
            if r.name == logger and message in r.getMessage()]
    assert logs, [r.getMessage() for r in caplog.records]
    assert what in logs[0] and f"{THIS_FILE}\", line {_line(marker)}" in logs[0]
    # Everything was traced by the first call: the second one logged nothing new.
    n = len(caplog.records)
    with caplog.at_level(logging.INFO, logger="frametrace"), redirect_stdout(io.StringIO()):
        g(x)
    assert len(caplog.records) == n and cnt.frame_count == graphs


@pytest.mark.parametrize("fn, marker, what", [
    (prints, "LINE_PRINT", "print"),
    (item, "LINE_ITEM", "Tensor.item()"),
    (branch, "LINE_BRANCH", "branching on a tensor"),
])
def test_fullgraph_raises_with_location(cnt, fn, marker, what):
    g = compile_with(cnt, fn, fullgraph=True)
    with pytest.raises(frametrace.Unsupported) as info, redirect_stdout(io.StringIO()):
        g(torch.randn(3))
    e = info.value
    assert what in e.reason
    assert e.user_stack[-1].filename == THIS_FILE
    assert e.user_stack[-1].lineno == _line(marker)
    text = str(e)
    assert f'File "{THIS_FILE}", line {_line(marker)}, in {fn.__name__}' in text
    assert marker in text                          # the source line itself
    assert cnt.frame_count == 0


def test_fallback_entry_is_guarded(cnt):
    """A frame that failed to trace for one input still compiles for another."""
    def f(x, debug):
        if debug:
            with LOCK:                             # f runs in CPython
                print("debug", end="")
        return x * 2
    g = compile_with(cnt, f)
    x = torch.randn(3)
    with redirect_stdout(io.StringIO()) as out:
        torch.testing.assert_close(g(x, True), x * 2)
    assert out.getvalue() == "debug" and cnt.frame_count == 0
    torch.testing.assert_close(g(x, False), x * 2)
    assert cnt.frame_count == 1
    with redirect_stdout(io.StringIO()) as out:
        torch.testing.assert_close(g(x, True), x * 2)
    assert out.getvalue() == "debug" and cnt.frame_count == 1


def test_side_effect_on_outside_list_is_replayed(cnt):
    def f(x, log):
        log.append(1)
        return x + 1
    g = compile_with(cnt, f, fullgraph=True)
    log = []
    torch.testing.assert_close(g(torch.zeros(2), log), torch.ones(2))
    torch.testing.assert_close(g(torch.zeros(2), log), torch.ones(2))
    # One compile: the list is only appended to, so its length is not guarded.
    assert log == [1, 1] and cnt.frame_count == 1


def test_user_errors_surface_unchanged(cnt):
    def f(x, y):
        return x + y
    g = compile_with(cnt, f)
    with pytest.raises(RuntimeError, match="must match the size"):
        g(torch.randn(3), torch.randn(4))

    def missing(x):
        return x + undefined_name  # noqa: F821
    h = compile_with(cnt, missing)
    with pytest.raises(NameError, match="undefined_name"):
        h(torch.randn(2))


def test_internal_error_falls_back(cnt, caplog, monkeypatch):
    def boom(self, inst):
        raise KeyError("simulated tracer bug")
    monkeypatch.setitem(frametrace.interpreter._DISPATCH, "BINARY_OP", boom)

    def f(x):
        return x + 1
    g = compile_with(cnt, f)
    with caplog.at_level(logging.WARNING, logger="frametrace"):
        torch.testing.assert_close(g(torch.zeros(2)), torch.ones(2))
    assert cnt.frame_count == 0
    assert any("internal error" in r.getMessage() for r in caplog.records)
    h = compile_with(cnt, lambda x: x + 2, fullgraph=True)
    with pytest.raises(frametrace.Unsupported, match="internal error.*simulated tracer bug"):
        h(torch.zeros(2))
