"""The status line of a long compile (issue 30, item 8): on a terminal, once a compile
has run past `config.compile_status_after`, a transient line names the frame (function,
file:line) and the phase; it is erased when the compile ends; never written when stderr
is no terminal, never to the logs, never with `config.compile_status = False`; the
compile path reports through `progress` and knows nothing of the UI."""
import ast
import io
import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import frametrace
from frametrace import compile_status, config, progress

from differential import check

THIS_FILE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(THIS_FILE))


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _line(marker):
    with open(THIS_FILE) as fh:
        return next(n for n, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def slow_backend(gm, example_inputs):
    time.sleep(0.8)
    return gm.forward


def _until(condition, seconds=30):
    """Wait for what the line's worker and refresh thread do (late on a loaded machine)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def shown_backend(gm, example_inputs):
    """Slow until the line is up."""
    _until(lambda: compile_status.status.live is not None)
    time.sleep(0.3)
    return gm.forward


def slow_to_compile(x):                 # SLOW_DEF
    return x.sin() * 2 + 1


@pytest.fixture
def starts(monkeypatch):
    """How many times the line was drawn."""
    calls = []
    real = compile_status._start

    def counting(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(compile_status, "_start", counting)
    return calls


def _compile_slowly(backend=slow_backend):
    frametrace.reset()
    r = check(slow_to_compile, [torch.randn(3), torch.randn(3)], backend=backend, graphs=1)
    assert r.compiles == 1 if hasattr(r, "compiles") else True
    return r


def test_shown_on_a_terminal_for_a_slow_compile_then_erased(monkeypatch, starts):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(config, "compile_status_after", 0.1)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _compile_slowly(shown_backend)
    out = terminal.getvalue()
    assert len(starts) == 1                                    # one compile: one line
    assert f"compiling slow_to_compile (test_compile_status.py:{_line('SLOW_DEF')})" in out
    assert "backend compile (" in out
    # gone when done: nothing of it after the last erase, and nothing left running
    assert compile_status.status.live is None and compile_status.status.session is None
    last_erase = out.rfind("\x1b[2K")
    assert last_erase >= 0 and "frametrace" not in out[last_erase:]


def test_never_through_a_pipe(monkeypatch, starts):
    monkeypatch.setattr(config, "compile_status_after", 0.0)
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    _compile_slowly()
    assert pipe.getvalue() == "" and not starts


def test_never_when_turned_off(monkeypatch, starts):
    monkeypatch.setattr(config, "compile_status_after", 0.0)
    monkeypatch.setattr(config, "compile_status", False)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _compile_slowly()
    assert terminal.getvalue() == "" and not starts


def test_not_for_a_quick_compile(monkeypatch, starts):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)

    def quick(x):
        return x + 1
    frametrace.reset()
    check(quick, [torch.randn(3)] * 3, graphs=1)
    assert terminal.getvalue() == "" and not starts


def test_never_in_the_logs(monkeypatch, starts):
    monkeypatch.setattr(config, "compile_status_after", 0.1)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        _compile_slowly(shown_backend)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert starts
    assert not [m for m in records if "compiling slow_to_compile" in m]


def test_autotuning_phase_names_the_kernel(monkeypatch, starts):
    monkeypatch.setenv("COLUMNS", "200")
    # (the triton backend reports each kernel it tunes; here a fake one inside a frame)
    monkeypatch.setattr(config, "compile_status_after", 0.05)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)

    def tuning_backend(gm, example_inputs):
        for n, name in enumerate(("triton_poi_0", "triton_red_1"), 1):
            span = progress.begin("autotune", name)
            _until(lambda: f"autotuning kernel {n} ({name})" in terminal.getvalue())
            progress.end(span)
        return gm.forward
    frametrace.reset()
    check(slow_to_compile, [torch.randn(3)], backend=tuning_backend, graphs=1)
    out = terminal.getvalue()
    assert "autotuning kernel 1 (triton_poi_0)" in out
    assert "autotuning kernel 2 (triton_red_1)" in out


def _imports(path):
    tree = ast.parse(open(path).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(f"{node.module or ''}:{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_imports_run_one_way():
    pkg = os.path.join(ROOT, "frametrace")
    assert _imports(os.path.join(pkg, "progress.py")) <= {"__future__:annotations"}
    for module in ("convert.py", "graph.py", os.path.join("backends", "triton", "autotune.py")):
        names = _imports(os.path.join(pkg, module))
        assert not any("compile_status" in n or n.startswith("rich") for n in names), module


def test_a_quick_compile_draws_nothing_and_imports_no_ui():
    script = textwrap.dedent("""
        import io, sys, torch, frametrace
        class T(io.StringIO):
            def isatty(self):
                return True
        frametrace.optimize(lambda x: x - 1)(torch.ones(2))    # (the first compile is slow)
        sys.stderr = T()
        f = frametrace.optimize(lambda x: x * 2)
        for _ in range(3):
            f(torch.ones(2))
        out = sys.stderr.getvalue()
        sys.stderr = sys.__stderr__
        print(repr(out), "rich.live" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["''", "False"]


def test_one_line_on_a_narrow_terminal(monkeypatch, starts):
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setattr(config, "compile_status_after", 0.1)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _compile_slowly(shown_backend)
    drawn = [l for l in re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue()))
             if l.strip()]
    assert drawn and all(len(l) <= 40 for l in drawn)
    assert all(l.lstrip("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ").startswith("frametrace: compiling") for l in drawn)


def test_a_compile_in_another_thread_leaves_the_line_alone(monkeypatch, starts):
    import threading
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(config, "compile_status_after", 0.05)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    status = compile_status.status

    def other():
        span = progress.begin("frame", other.__code__)
        progress.phase("backend compile (somebody else's)")
        progress.end(span)

    def backend(gm, example_inputs):
        _until(lambda: status.live is not None)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        time.sleep(0.3)
        return gm.forward
    frametrace.reset()
    check(slow_to_compile, [torch.randn(3)], backend=backend, graphs=1)
    out = terminal.getvalue()
    assert "compiling slow_to_compile" in out and "somebody else's" not in out
    assert status.session is None and status.live is None and not status.depth
