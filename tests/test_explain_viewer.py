"""explain(), the logs and the bytecode diff viewer (as text, and once in a real
terminal through tmux)."""
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import traceback

import pytest
import torch

import frametrace
from frametrace import logs

THIS_FILE = os.path.abspath(__file__)


def with_breaks(x):
    y = x.sin() + 1
    print("y", y.shape)                 # BREAK_PRINT
    if y.sum() > 0:                     # BREAK_BRANCH
        y = y * 2
    return y.cos()


def _line(marker):
    with open(THIS_FILE) as fh:
        return next(n for n, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def test_explain_fields(capsys):
    x = torch.randn(4).abs()
    report = frametrace.explain(with_breaks)(x)
    assert report.graph_count == 3
    assert report.graph_break_count == 2
    assert report.ops_per_graph == [2, 2, 2]        # sin+add | sum+gt | mul+cos
    assert all(isinstance(g, torch.fx.GraphModule) for g in report.graphs)
    first, second = report.break_reasons
    assert "print" in first.reason and "tensor" in second.reason
    for b, marker in ((first, "BREAK_PRINT"), (second, "BREAK_BRANCH")):
        assert isinstance(b.user_stack[-1], traceback.FrameSummary)
        assert b.user_stack[-1].filename == THIS_FILE
        assert b.user_stack[-1].lineno == _line(marker)
    assert any("x: Tensor float32[4]" in g for g in report.guards)
    assert len(report.compile_times) >= 3 and all(t > 0 for t in report.compile_times)
    torch.testing.assert_close(report.result, with_breaks(x))


def test_explain_report_text(monkeypatch):
    # (str() wraps at the terminal's width: wide enough for this file's path wherever the
    # checkout lies)
    monkeypatch.setenv("COLUMNS", "400")
    text = str(frametrace.explain(with_breaks)(torch.randn(4).abs()))
    assert "graphs" in text and "graph breaks" in text
    assert f'File "{THIS_FILE}", line {_line("BREAK_PRINT")}, in with_breaks' in text
    assert 'print("y", y.shape)' in text                   # the source line
    assert "def forward" in text                            # graph code
    assert "\x1b[" not in text                              # no color codes in str()


def test_explain_leaves_other_entries_alone():
    cnt = frametrace.testing.CompileCounter()

    def f(x):
        return x * 3
    g = frametrace.optimize(backend=cnt)(f)
    x = torch.randn(2)
    g(x)
    frametrace.explain(f)(x)
    frametrace.explain(f)(x)
    g(x)
    assert cnt.frame_count == 1
    assert len(frametrace._C.entries(f.__code__)) == 1      # explain's entries are gone


def test_explain_module_one_graph():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    report = frametrace.explain(m)(torch.randn(2, 4))
    assert report.graph_count == 1 and report.graph_break_count == 0


def test_logs_configure_and_recompile_values():
    stream = io.StringIO()
    kinds = logs.configure("recompiles,graph_breaks,guards,graph,bytecode,output_code")
    assert kinds == ["recompiles", "graph_breaks", "guards", "graph", "bytecode", "output_code"]
    handlers = []
    for kind in kinds:
        lg = logging.getLogger(f"frametrace.{kind}")
        for h in lg.handlers:
            if getattr(h, "_frametrace", False):
                h.setStream(stream)
                handlers.append(h)
    try:
        def f(x, n):
            return x * n
        g = frametrace.optimize(f)
        g(torch.ones(2), 2)
        g(torch.ones(2), 3)
        g2 = frametrace.optimize(with_breaks)
        g2(torch.ones(3))
    finally:
        for kind in kinds:       # back as they were: other tests capture these loggers
            lg = logging.getLogger(f"frametrace.{kind}")
            lg.handlers = [h for h in lg.handlers if not getattr(h, "_frametrace", False)]
            lg.setLevel(logging.NOTSET)
            lg.propagate = True
    out = stream.getvalue()
    assert "[frametrace.recompiles] recompiling f" in out
    assert "guard failed: n == 2 (now: n = 3)" in out
    assert "[frametrace.graph_breaks] graph break in with_breaks" in out
    assert f'line {_line("BREAK_PRINT")}' in out
    assert "[frametrace.guards] guards of f" in out and "x: Tensor float32[2]" in out
    assert "[frametrace.graph] graph __compiled_fn_" in out and "def forward" in out
    assert "[frametrace.bytecode] bytecode of f" in out and "LOAD_GLOBAL" in out
    assert "[frametrace.output_code]" in out
    with pytest.raises(ValueError, match="unknown log kind"):
        logs.configure("nonsense")


def test_show_text_side_by_side():
    g = frametrace.optimize(with_breaks)
    g(torch.ones(3))
    buffer = io.StringIO()
    frametrace.show(g, file=buffer, width=160)
    text = buffer.getvalue()
    assert "\x1b[" not in text                                # not a terminal: plain text
    assert "original: with_breaks" in text and "transformed: with_breaks" in text
    assert re.search(r"\+\s+\d+ LOAD_CONST __compiled_fn_", text)       # inserted
    assert re.search(r"-\s+\d+ LOAD_(METHOD|ATTR) .*sin", text)    # removed (3.12 spells it differently)
    assert "<resume at line" in text                          # resume functions shown
    assert "guards" in text and "FX graph" in text
    # Aligned by source line: the print line's source is a row of its own (with its graph
    # break beside it), and the row under it holds both sides.
    lines = text.splitlines()
    at = next(i for i, l in enumerate(lines) if f"{_line('BREAK_PRINT')} │" in l)
    assert 'print("y", y.shape)' in lines[at]
    assert "LOAD_GLOBAL" in lines[at + 1]


def test_show_width_is_respected():
    g = frametrace.optimize(with_breaks)
    g(torch.ones(3))
    for width in (80, 140):
        buffer = io.StringIO()
        frametrace.show(g, file=buffer, width=width)
        assert max(len(l) for l in buffer.getvalue().splitlines()) <= width


SCRIPT = textwrap.dedent("""
    import torch, frametrace

    @frametrace.optimize
    def step(x):
        y = x * 2
        print("between")
        return y + 1

    def other(x):
        return x - 1

    step(torch.ones(2))
    frametrace.optimize(other)(torch.ones(2))
""")


def test_cli_diff_plain(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, "-m", "frametrace", "diff", str(script), "--fn", "step",
                          "--no-color", "--width", "150"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "between" in out.stdout
    assert "original: step" in out.stdout and "transformed: step" in out.stdout
    assert "original: other" not in out.stdout                # --fn filters
    assert "graph break" in out.stdout and 'print("between")' in out.stdout
    assert "\x1b[" not in out.stdout


def _installed() -> bool:
    from importlib import metadata
    try:
        metadata.distribution("frametrace")
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed(), reason="frametrace used from a source tree, not installed")
def test_console_script_is_installed():
    exe = shutil.which("frametrace")
    assert exe is not None
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "diff" in out.stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_viewer_in_a_real_terminal(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    session = f"frametrace{os.getpid()}"
    cmd = f"{sys.executable} -m frametrace diff {script} --fn step; sleep 30"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "120", cmd],
                   check=True)
    try:
        # The diff is paged: its first screen shows the columns' titles, not the break
        # further down, so wait for the titles and for the screen to stop changing.
        screen = previous = ""
        for _ in range(120):
            time.sleep(0.5)
            previous, screen = screen, subprocess.run(
                ["tmux", "capture-pane", "-p", "-e", "-t", session],
                capture_output=True, text=True).stdout
            if "transformed: step" in screen and screen == previous:
                break
        assert "transformed: step" in screen
        assert "\x1b[" in screen                                # colored in a terminal
        plain = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                               capture_output=True, text=True).stdout
        assert max(len(l) for l in plain.splitlines()) <= 200
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
