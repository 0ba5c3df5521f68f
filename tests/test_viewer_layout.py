"""The bytecode diff viewer's layout (issue 30, item 7): frametrace's own error handling
around a graph call folded into one row, rows aligned by source line (a transformed
instruction is shown under the line it carries), the `def` line first (not a
decorator), each graph break's reason at its line, `frametrace diff` of a missing file
a one-line error (status 2), and a real terminal (tmux) at 80 and 200 columns."""
import dis
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import frametrace
from frametrace import convert, viewer

from differential import check

THIS_FILE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(THIS_FILE))


def _line(marker):
    with open(THIS_FILE) as fh:
        return next(n for n, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def _decorator(fn):
    return fn


@_decorator
def breaks_once(x):                     # DEF_LINE
    y = x.sin() * 2
    print("between")                    # BREAK_LINE
    return y + 1


def _compiled():
    frametrace.reset()
    records = []
    convert.record_observers.append(records.append)
    try:
        check(breaks_once, [torch.ones(3)], graphs=2, breaks=1)
    finally:
        convert.record_observers.remove(records.append)
    return records, frametrace._C.entries(breaks_once.__code__)[0].code


def test_error_handling_is_one_row():
    _, transformed = _compiled()
    rows = viewer._rows(breaks_once.__code__, transformed)
    right = [r[2][0] for r in rows if r[2]]
    folded = [t for t in right if "rerun guard of the graph call" in t]
    assert len(folded) == 1                   # one graph call: one row for its handler
    assert not any("graph_errors_rerun" in t or "CHECK_EXC_MATCH" in t for t in right)
    # what the handler held is counted in the row, not listed
    n = int(re.search(r"\((\d+) instructions\)", folded[0]).group(1))
    assert n > 10
    # right after the graph call (its inputs and CALL): the rows up to the break fit a
    # screen
    call = next(i for i, t in enumerate(right) if "__compiled_fn_" in t)
    fold = right.index(folded[0])
    assert 0 < fold - call <= 6 and re.search(r"\bCALL\b", right[fold - 1])


def _offset(text):
    return int(re.match(r"(?:>>)?\s*(\d+)", text).group(1))


def test_rows_are_aligned_by_source_line():
    _, transformed = _compiled()
    rows = viewer._rows(breaks_once.__code__, transformed)
    def_line = _line("DEF_LINE")
    for side, code in ((1, breaks_once.__code__), (2, transformed)):
        lines = {i.offset: i.positions.lineno for i in dis.get_instructions(code)
                 if i.opname != "CACHE"}
        last = def_line
        for line, *cells in rows:
            item = cells[side - 1]
            if item is None or item[1] == "folded":
                continue
            at = lines[_offset(item[0])]
            at = def_line if at in (None, code.co_firstlineno) else at
            # every instruction is shown on the rows of the line it belongs to
            assert line == at, (line, item)
    # a row never pairs two instructions of different lines
    for line, left, right in rows:
        if left and right and left[1] == right[1] == "same":
            assert left[0].split()[-2:] == right[0].split()[-2:] or \
                left[0].split(None, 1)[1:] and right[0].split(None, 1)[1:]


def test_def_line_first_not_the_decorator():
    _, transformed = _compiled()
    text = viewer.plain_diff(breaks_once.__code__, transformed)
    first = text.splitlines()[1]
    assert first.lstrip().startswith(f"{_line('DEF_LINE')} ")
    assert "def breaks_once(x):" in first and "@_decorator" not in text
    buffer = io.StringIO()
    frametrace.show(breaks_once, file=buffer, width=120)
    shown = buffer.getvalue()
    assert f"breaks_once ({THIS_FILE}:{_line('DEF_LINE')})" in shown
    assert "@_decorator" not in shown


def test_break_reason_at_its_line():
    records, _ = _compiled()
    for width in (None, 100):                 # a pipe (no width), and a terminal's
        buffer = io.StringIO()
        viewer.show_records(records, fn_name="breaks_once", file=buffer, width=width)
        lines = buffer.getvalue().splitlines()
        table = lines[:next(i for i, l in enumerate(lines) if "guards" in l)]
        at = next(i for i, l in enumerate(table) if re.match(rf"\s*{_line('BREAK_LINE')} │", l))
        assert 'print("between")' in table[at]
        # the reason on the line's row or the one under it, before the next line's
        near = "\n".join(table[at:at + 2])
        assert "graph break: print()" in near, near
        nxt = next(i for i, l in enumerate(table) if re.match(rf"\s*{_line('BREAK_LINE') + 1} │", l))
        assert at < nxt
        if width is None:
            assert max(map(len, lines)) > 120             # a pipe cuts nothing


SCRIPT = textwrap.dedent("""
    import torch, frametrace

    @frametrace.optimize
    def step(x):
        y = x * 2
        print("between")
        return y + 1

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj_with_a_rather_long_name = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.proj_with_a_rather_long_name(x).relu()

    step(torch.ones(2))
    net = frametrace.optimize(Net())
    net(torch.randn(4, 8))
""")


def _diff(tmp_path, *args, source=SCRIPT):
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run([sys.executable, "-m", "frametrace", "diff", str(script), *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)


def test_missing_script_is_one_line_and_status_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "frametrace", "diff", str(tmp_path / "missing.py")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "missing.py" in out.stderr
    assert "no such file" in out.stderr


def test_pipe_shows_whole_lines_and_objects_the_script_made(tmp_path):
    out = _diff(tmp_path)
    assert out.returncode == 0, out.stderr
    # the module's frame is shown although its guards name an object of the script
    # (alive until shown), and its graph's signature is one whole line
    assert "transformed: Net.forward" in out.stdout
    sig = next(l for l in out.stdout.splitlines()
               if "def forward(self, l_x" in l and "rather_long_name" in l)
    assert "l_self__modules__proj_with_a_rather_long_name____parameters__bias" in sig
    assert re.search(r'\): *│?\s*$', sig), sig


def _tmux(*args):
    return subprocess.run(["tmux", *args], capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
@pytest.mark.parametrize("columns", [80, 200])
def test_first_screen_in_a_real_terminal(tmp_path, columns):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    session = f"ft_layout{os.getpid()}_{columns}"
    cmd = f"cd {ROOT} && {sys.executable} -m frametrace diff {script} --fn step; sleep 60"
    started = _tmux("new-session", "-d", "-s", session, "-x", str(columns), "-y", "40", cmd)
    if started.returncode != 0:
        pytest.skip(f"tmux cannot open a session here: {started.stderr.strip()}")
    try:
        screen = previous = ""
        for _ in range(240):
            time.sleep(0.5)
            previous, screen = screen, _tmux("capture-pane", "-p", "-t", session).stdout
            if "transformed: step" in screen and screen == previous:
                break
        lines = screen.splitlines()
        if not screen.strip():
            pytest.skip("tmux shows nothing here (no terminal it can draw in)")
        assert "transformed: step" in screen, f"the viewer never showed the frame:\n{screen}"
        assert max(map(len, lines)) <= columns
        head = next(i for i, l in enumerate(lines) if "transformed: step" in l)
        first_row = next(l for l in lines[head + 2:] if l.strip())
        assert "def step(x):" in first_row                  # the def, not the decorator
        # the first screen reaches the break, its reason and the folded handler
        assert any("graph break: print()" in l for l in lines)
        assert any("rerun guard" in l for l in lines)
    finally:
        _tmux("kill-session", "-t", session)


def test_script_error_shows_the_users_frames_only(tmp_path):
    source = SCRIPT + "raise RuntimeError('late')\n"
    out = _diff(tmp_path, "--no-color", source=source)
    assert out.returncode == 1 and "RuntimeError: late" in out.stderr
    assert "__main__.py" not in out.stderr and "script.py" in out.stderr
    assert "transformed: step" in out.stdout


def test_each_break_listed_once(tmp_path):
    # explain() in the script compiles the frame again: the same break, listed once
    source = SCRIPT + "frametrace.explain(step)(torch.ones(2))\n"
    out = _diff(tmp_path, "--fn", "step", "--no-color", source=source)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("graph break in step:") == 1


def breaks_in_try(x):
    y = x * 2
    try:
        print("inside")                 # TRY_BREAK
    except ValueError:
        return y - 1
    return y + 1


def test_the_users_handler_path_is_not_folded():
    # the transformed code sends what the print raises to a resume function at the
    # user's except: that call is the user's, shown; only frametrace's cleanup is folded
    frametrace.reset()
    check(breaks_in_try, [torch.ones(3)], breaks=1)
    transformed = frametrace._C.entries(breaks_in_try.__code__)[0].code
    right = [r[2][0] for r in viewer._rows(breaks_in_try.__code__, transformed) if r[2]]
    resumes = [t for t in right if "<resume at line" in t]
    assert len(resumes) == 2, right                  # after the print, and at the except
    assert any("rerun guard" in t for t in right)
