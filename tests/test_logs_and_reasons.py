"""Why a frame did not compile, in the user's words (reasons and hints, on the
graph_breaks log with the user's line), and the logs people read: the graph log's
shapes and source lines, breaks logged once, output_code not repeating the graph log,
and frametrace.logs.set/clear."""
import contextlib
import inspect
import io
import logging
import math
import os
import random
import re
import sys
import threading
import time
import warnings

import pytest
import torch

import frametrace
from frametrace import logs
from frametrace.variables.base import Var

from differential import check

THIS_FILE = os.path.abspath(__file__)


def _var_class_names():
    """Every tracer class a reason must not show: the Var classes and the hook's."""
    import frametrace.interpreter  # noqa: F401  (loads every Var module, so every Var class)
    found, todo = set(), [Var]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    names = {c.__name__ for c in found} | {"Var", "Unhooked", "Hooked", "Lazy", "NULL"}
    return sorted(n for n in names if len(n) > 3)


INTERNAL = re.compile(r"\b(" + "|".join(map(re.escape, _var_class_names())) + r")\b")


@contextlib.contextmanager
def captured_logs(**kinds):
    """Switch log kinds on through the public API, their output in a StringIO."""
    stream = io.StringIO()
    logs.set(**kinds)
    try:
        for kind in logs.enabled():
            for h in logging.getLogger(f"frametrace.{kind}").handlers:
                if getattr(h, "_frametrace", False):
                    h.setStream(stream)
        yield stream
    finally:
        logs.clear()


# ----------------------------------------------------------------- break corpus
def print_in_try(x):
    try:
        print("hi")
        y = x + 1
    except ValueError:
        y = x
    return y * 2


def print_tensor(x):
    y = x + 1
    print(y)
    return y


def calls_time(x):
    return x + 1, time.time() > 0


def calls_random(x):
    return x * (random.random() >= 0)


def fstring_of_tensor(x):
    s = f"{x}"
    return x + len(s)


def frame_lineno(x):
    return x + inspect.currentframe().f_lineno


def logs_a_warning(x):
    logging.getLogger("frametrace_test_quiet").debug("hi %s", 1)
    return x + 1


def warns(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.warn("careful")
    return x + 1


def id_of_tensor(x):
    return x + (id(x) > 0)


def opens_file(x):
    with open(THIS_FILE) as fh:
        fh.read(1)
    return x + 1


@frametrace.disable
def _disabled(x):
    return x + 1


def calls_disabled(x):
    return _disabled(x) * 2


def float_then_math(x):
    f = float(x.sum())
    return x * math.sqrt(abs(f) + 1)


def str_of_tensor(x):
    return x + len(str(x))


def sets_module_attr(x):
    torch._frametrace_test_attr = 1
    return x + 1


def holds_lock(x):
    with threading.Lock():
        return x + 1


def tensor_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def item_value(x):
    return x * x.sum().item()


def hashes_tensor(x):
    return x + (hash(x) != 0)


CORPUS = [print_in_try, print_tensor, calls_time, calls_random, fstring_of_tensor,
          frame_lineno, logs_a_warning, warns, id_of_tensor, opens_file, calls_disabled,
          float_then_math, str_of_tensor, sets_module_attr, holds_lock, tensor_branch,
          item_value, hashes_tensor]


@pytest.mark.parametrize("fn", CORPUS, ids=lambda f: f.__name__)
def test_break_reasons_name_no_tracer_classes(fn, capsys):
    r = check(fn, [torch.randn(3), torch.randn(3)], graphs=None)
    # (3.13's logging.getLogger takes its lock in a `with`, which traces: no break there,
    # where 3.11's tests the lock's truth)
    whole = fn is logs_a_warning and sys.version_info >= (3, 13)
    assert r.breaks + r.fallbacks >= 1 or whole and r.graphs == 1, r
    for rec in r.records:
        if rec.reason:
            for text in (rec.reason, getattr(rec, "hint", None) or ""):
                assert not INTERNAL.search(text), f"{fn.__name__}: {text!r}"
            assert "0x" not in rec.reason, rec.reason          # no object addresses
            assert rec.user_stack and rec.user_stack[0].filename == THIS_FILE


def test_reasons_say_what_the_user_wrote():
    def reason_of(fn):
        r = check(fn, [torch.randn(3)], graphs=None)
        return [(rec.reason, rec.hint) for rec in r.records if rec.reason]
    (reason, hint), = reason_of(print_tensor)
    assert reason.startswith("print()") and "tensor" in reason
    assert "print" in hint and "compiled function" in hint
    assert reason_of(calls_time)[0][0] == "calling time.time"
    assert "written in C" in reason_of(calls_time)[0][1]
    reason, hint = reason_of(calls_disabled)[0]
    assert reason == "calling test_logs_and_reasons._disabled" and "frametrace.disable" in hint
    assert reason_of(sets_module_attr)[0][0] == "setting attribute '_frametrace_test_attr' on module torch"
    assert "a lock object computed outside the graph" in reason_of(holds_lock)[-1][0]
    # (id() itself traces: what needs the address, a comparison with a number, breaks)
    assert reason_of(id_of_tensor)[0][0] == \
        "gt on id() of the tensor x (float32[3]) and 0 (an address known only at run time)"
    assert "torch.cond" in reason_of(tensor_branch)[0][1]


def test_optimizer_step_is_traced_not_a_break():
    """torch.optim's step is traced (it once broke the graph with an "optimizer outside the
    compiled function" hint): the training step breaks only at backward()."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    records = []
    frametrace.convert.record_observers.append(records.append)
    try:
        frametrace.optimize(train_step)(torch.randn(4, 3))
    finally:
        frametrace.convert.record_observers.remove(records.append)
    reasons = [r.reason for r in records if r.reason]
    assert reasons and not any("step" in r for r in reasons), reasons
    assert any("backward" in r for r in reasons), reasons


def test_fullgraph_error_carries_the_hint():
    with pytest.raises(frametrace.Unsupported) as info:
        frametrace.optimize(fullgraph=True)(print_tensor)(torch.randn(2))
    text = str(info.value)
    assert "Hint: move the print()" in text and f'File "{THIS_FILE}"' in text


def test_every_fallback_is_on_the_graph_breaks_log():
    # A frame that cannot break where it failed (a `with` over an object made outside
    # the graph) runs whole in CPython: the graph_breaks log says why, and where.
    with captured_logs(graph_breaks=True) as out:
        r = check(holds_lock, [torch.randn(3)], graphs=None)
    assert r.fallbacks == 1, r
    text = out.getvalue()
    line = inspect.getsourcelines(holds_lock)[1] + 1
    assert "[frametrace.graph_breaks] running in CPython: holds_lock.<resume at line" in text
    assert f'File "{THIS_FILE}", line {line}, in holds_lock' in text


def test_internal_errors_are_on_the_graph_breaks_log(monkeypatch):
    from frametrace import convert

    def boom(*args, **kwargs):
        raise ZeroDivisionError("tracer bug")

    def f(x):
        return x + 1
    monkeypatch.setattr(convert, "_finish", boom)
    before = convert.counters["internal_error"]
    with captured_logs(graph_breaks=True) as out:
        assert torch.equal(frametrace.optimize(f)(torch.ones(2)), torch.full((2,), 2.0))
    assert convert.counters["internal_error"] == before + 1
    text = out.getvalue()
    assert "running in CPython: " in text and "internal error in frametrace (ZeroDivisionError: tracer bug)" in text
    assert f'File "{THIS_FILE}"' in text


def test_a_break_is_logged_once_across_recompiles():
    def f(x, n):
        y = x * n
        print("", end="")
        return y + 1
    with captured_logs(graph_breaks=True, recompiles=True) as out:
        r = check(f, [(torch.ones(2), 2), (torch.ones(2), 3)], graphs=None)
    text = out.getvalue()
    assert r.breaks == 2 and text.count("recompiling f") == 1
    assert text.count("graph break in ") == 1, text


def helper_scale(a):
    return a.relu() * 2                 # HELPER_LINE


def graph_fn(x, y):
    z = x @ y                           # MATMUL_LINE
    return helper_scale(z).sum(dim=0)


def test_graph_log_has_shapes_and_user_lines():
    with captured_logs(graph=True, output_code=True) as out:
        r = check(graph_fn, [(torch.randn(3, 4), torch.randn(4, 5))], graphs=1)
    text = out.getvalue()
    graph = text.split("[frametrace.output_code]")[0]
    assert 'matmul: "f32[3, 5]" = l_x @ l_y' in graph
    assert 'sum_1: "f32[5]"' in graph
    assert f"# File: {THIS_FILE}:{_line('MATMUL_LINE')} in graph_fn, code: z = x @ y" in graph
    assert f"# File: {THIS_FILE}:{_line('HELPER_LINE')} in helper_scale, code: return a.relu() * 2" in graph
    # The eager backend runs the FX code as it is: output_code says so in one line.
    code_log = text.split("[frametrace.output_code]")[1]
    assert "runs the FX graph as it is" in code_log and "def forward" not in code_log
    assert r.graphs == 1


def test_output_code_logs_what_a_backend_made():
    def backend(gm, example_inputs):
        def run(*args):
            return gm(*args)
        run.source_code = "# my kernel source"
        return run
    with captured_logs(output_code=True) as out:
        r = check(graph_fn, [(torch.randn(3, 4), torch.randn(4, 5))], backend=backend, graphs=1)
    assert "# my kernel source" in out.getvalue() and r.graphs == 1


def _line(marker):
    with open(THIS_FILE) as fh:
        return next(n for n, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def test_logs_set_and_clear():
    assert logs.clear() == []
    assert logs.set(graph=True, graph_breaks=True) == ["graph", "graph_breaks"]
    assert logging.getLogger("frametrace.graph").isEnabledFor(logging.INFO)
    assert logs.set(graph=False) == ["graph_breaks"]
    assert not any(getattr(h, "_frametrace", False) for h in logging.getLogger("frametrace.graph").handlers)
    assert logs.set(all=True) == list(logs.KINDS)
    assert logs.set(graph_breaks=True) == list(logs.KINDS)      # twice on: one handler
    assert len(logging.getLogger("frametrace.graph_breaks").handlers) == 1
    assert logs.clear() == []
    assert logging.getLogger("frametrace.graph_breaks").propagate
    with pytest.raises(ValueError, match="unknown log kind"):
        logs.set(graphs=True)
    assert logs.configure("graph_breaks,recompiles") == ["graph_breaks", "recompiles"]
    assert logs.enabled() == ["graph_breaks", "recompiles"]
    assert logs.clear() == []


def test_logs_doc_example_runs():
    import doctest
    failures, tried = doctest.testmod(logs, verbose=False)
    logs.clear()
    assert tried >= 3 and failures == 0
