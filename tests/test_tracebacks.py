"""Exceptions from the user's code, raised through compiled frames, print as CPython
prints them: the same user frames, each once, at the same lines, with the same ^^^
column markers (3.11+ keeps each instruction's source columns; the rewritten
bytecode keeps the original instructions' positions, resume functions too).

Each test runs the function in CPython and compiled (the differential harness first,
for values and exceptions) and compares the formatted tracebacks' entries for this
file's frames."""
import logging
import sys
import traceback

import pytest
import torch

import frametrace
from differential import check

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="column positions: 3.11+")


def user_traceback(fn, *args) -> list[str]:
    """The formatted traceback of `fn(*args)`, from the first frame of this file's
    functions under test on (the caller's frame differs: it is this helper), and the
    exception line."""
    try:
        fn(*args)
    except Exception as e:
        lines = traceback.format_exception(e)
    else:
        raise AssertionError("expected an exception")
    text = "".join(lines[1:])       # (without "Traceback (most recent call last):")
    entries = text.split('  File "')
    keep = [e for e in entries[1:] if e.startswith(__file__) and ", in user_traceback\n" not in e]
    return keep + [lines[-1]]


def compare(fn, *args, breaks=None):
    """CPython's and the compiled traceback of `fn(*args)` are the same."""
    r = check(fn, [args], graphs=None, breaks=breaks)
    want = user_traceback(fn, *args)
    got = user_traceback(frametrace.optimize(fn), *args)
    assert got == want, "\n".join(["CPython:", *want, "compiled:", *got])
    # there are markers to compare (3.13 prints none for some lines: then the lines are)
    assert any("^" in e or "~" in e for e in want) or sys.version_info >= (3, 13)
    return r


def check_positive(v):
    if v < 0:
        raise ValueError("negative: " + str(v))
    return v


def inner(x, n):
    y = x * 2
    return y + check_positive(n)


def raises_in_inlined_call(x, n):
    z = x.sin()
    return inner(z, n) * 3


def missing_key(x, d):
    y = x.cos()
    return y + d["missing"]


def view_after_print(x):
    y = x + 1
    print("", end="")
    return y.view(7, 7)


def view_at_break(x):
    y = x + 1
    return y.view(7, 7)


def index_error_at_break(x, lst):
    y = x + 1
    lst.append(1)
    return y[lst[5]]


def index_in_graph(x, i):
    y = x * 2
    return y[i] + 1


def raises_in_loop(x, n):
    for i in range(3):
        x = x + 1
        print("", end="")
        if i == n:
            x = x.view(9, 9)
    return x


def reraised_in_handler(x):
    try:
        print("", end="")
        return x.view(5, 5)
    except RuntimeError:
        x = x + 1
        raise


def callee_breaks(x):
    print("", end="")
    return x.view(4, 4)


def caller_of_breaking_callee(x):
    y = x + 1
    return callee_breaks(y) * 2


def test_error_in_inlined_call():
    compare(raises_in_inlined_call, torch.ones(2), -1)


def test_subscript_error_keeps_its_columns():
    compare(missing_key, torch.ones(2), {})


def test_error_at_the_instruction_a_frame_breaks_at():
    compare(view_at_break, torch.ones(3))
    compare(index_error_at_break, torch.ones(3), [])


def test_error_in_a_resume_function_shows_the_frame_once():
    r = compare(view_after_print, torch.ones(3))
    assert r.breaks >= 1, r


def test_error_raised_by_the_graph_at_run_time():
    # The graph raises (an index only the data decide), the frame runs again in
    # CPython: the traceback is that run's, without frametrace's frames.
    r = compare(index_in_graph, torch.ones(3), torch.tensor(7))
    assert r.graphs >= 1, r
    try:
        frametrace.optimize(index_in_graph)(torch.ones(3), torch.tensor(7))
    except IndexError as e:
        files = [fs.filename for fs in traceback.extract_tb(e.__traceback__)]
    assert not [f for f in files if "/frametrace/" in f], files


def test_error_in_a_loop_that_breaks_each_iteration():
    compare(raises_in_loop, torch.ones(2), 1)


def test_reraise_from_a_handler():
    compare(reraised_in_handler, torch.ones(2))


def test_breaking_callee_of_a_compiled_caller():
    compare(caller_of_breaking_callee, torch.ones(2))



def mismatched_matmul(x, w):
    y = x + 1
    return y @ w


def test_only_the_users_error_is_printed(caplog):
    # The op fails on FakeTensors while tracing (a graph break; CPython raises the
    # error): torch's own ERROR record of its meta kernel is not shown.
    with caplog.at_level(logging.DEBUG, logger="torch._subclasses.fake_tensor"):
        compare(mismatched_matmul, torch.ones(2, 5), torch.ones(3, 4))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
