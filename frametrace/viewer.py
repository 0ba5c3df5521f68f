"""The bytecode diff viewer: original and transformed bytecode side by side, aligned as a
diff aligns two texts (an instruction both keep sits on one row), with each source line
and its text, offsets and jump targets (``>>``, as dis prints them), what was inserted
and removed colored; then each resume function (by the name the logs use), the guards
and the FX graph code.

    frametrace.show(fn)                       # fn has run compiled
    python -m frametrace diff script.py --fn forward

Width follows the terminal; without a terminal (or with color=False) it is plain text.
A resume function starts with a jump into a copy of the original body: the part it
jumps over is never run, and is folded into one row.
"""
from __future__ import annotations

import os
import sys
import torch

from . import _C, convert
from .bytecode_diff import (_def_line, _graph_name, _instructions, _mark, _numbered, _rows,
                            _source, plain_diff)  # noqa: F401  (plain_diff: viewer.plain_diff)
from .explain import UNBOUNDED_WIDTH, break_text, is_terminal
from .resume import resume_codes_in
from .eval_frame import OptimizedModule


def _table(original, transformed, title, notes=None, wide=False):
    """The side-by-side table.  On a console of some width (a terminal), each line's
    source is a row of its own, with the line's graph breaks beside it, over the rows of
    its instructions, which wrap where they are too long.  `wide`: for output no
    terminal shows (a pipe, a file): the source in a column of its own, every column as
    wide as its longest cell, nothing wrapped or cut."""
    from rich.table import Table  # (optional dependency)
    from rich.text import Text  # (optional dependency)
    table = Table(title=title, title_justify="left", expand=not wide, show_lines=False,
                  show_edge=False, pad_edge=False)
    table.add_column("line", justify="right", style="dim", no_wrap=True)
    if wide:
        table.add_column("source", no_wrap=True, style="yellow")
        table.add_column(f"original: {original.co_qualname}", no_wrap=True)
        table.add_column(f"transformed: {transformed.co_qualname}", no_wrap=True)
    else:
        table.add_column(f"original: {original.co_qualname}", ratio=1, overflow="fold")
        table.add_column(f"transformed: {transformed.co_qualname}", ratio=1, overflow="fold")
    styles = {"same": "", "removed": "red", "inserted": "green", "folded": "dim italic",
              "note": "bold red"}

    def cell(item):
        if item is None:
            return Text("")
        return Text(_mark(item) if item[1] != "note" else item[0], style=styles[item[1]])

    if not wide:
        shown = set()
        for line, left, right in _numbered(_rows(original, transformed)):
            if line is not None:
                said = notes.get(line, []) if notes and line not in shown else []
                shown.add(line)
                table.add_row(str(line), Text(_source(original, line), style="yellow",
                                              overflow="ellipsis", no_wrap=True),
                              Text("\n".join(said), style=styles["note"]))
            table.add_row("", cell(left), cell(right))
        return table
    for line, left, right in _numbered(_rows(original, transformed), notes):
        table.add_row("" if line is None else str(line),
                      "" if line is None else _source(original, line), cell(left), cell(right))
    return table



def _graph_names(code):
    return [n for n in map(_graph_name, _instructions(code)) if n is not None]


def is_resume(code) -> bool:
    return "<resume at line" in code.co_qualname


def frame_renderables(code, seen=None, notes=None, wide=False):
    """Rich renderables for every compiled entry of `code` and its resume functions.
    `notes`: {code: {line: [text]}}, shown at their line (the graph breaks); `wide`:
    see `_table`."""
    from rich.panel import Panel  # (optional dependency)
    from rich.syntax import Syntax  # (optional dependency)
    from rich.text import Text  # (optional dependency)
    seen = set() if seen is None else seen
    if id(code) in seen:
        return []
    seen.add(id(code))
    notes = notes or {}
    parts = []
    kind = "resume function " if is_resume(code) else ""
    for k, entry in enumerate(_C.entries(code), 1):
        where = f"{code.co_filename}:{_def_line(code)}"
        if entry.code is None:
            parts.append(Text(f"{kind}{code.co_qualname} ({where}) entry {k}: runs in CPython",
                              style="bold red"))
            continue
        parts.append(_table(code, entry.code, f"{kind}{code.co_qualname} ({where}) entry {k}",
                            notes.get(code), wide))
        guard_set = getattr(entry.check, "guard_set", None)
        if guard_set is not None:
            parts.append(Panel(Text("\n".join(guard_set.texts())), title="guards",
                               expand=False))
        for name in _graph_names(entry.code):
            gm = convert.graph_modules.get(name)
            if gm is not None:
                parts.append(Panel(Syntax(convert.readable_graph(gm), "python", theme="ansi_dark",
                                          background_color="default", word_wrap=True),
                                   title=f"FX graph {name}", expand=False))
        for resume in resume_codes_in(entry.code):
            parts.extend(frame_renderables(resume, seen, notes, wide))
    return parts


def _target_code(fn):
    """The code object frametrace compiled for `fn` (an optimize() wrapper, a function,
    a method or an nn.Module)."""
    if isinstance(fn, OptimizedModule):
        fn = fn._orig_mod
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    while isinstance(fn, (_C.Hooked, _C.Unhooked)):
        fn = fn.fn
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"show() expects a function or module frametrace compiled, not {fn!r}")
    return code


def make_console(color=None, file=None, width=None):
    """A console for `file`: colored on a terminal (or with color=True), as wide as the
    terminal there; elsewhere (a pipe, a file) wide enough that no line is cut."""
    from rich.console import Console  # (optional dependency)
    file = file or sys.stdout
    if color is None:
        color = is_terminal(file)
    if width is None and not is_terminal(file):
        width = UNBOUNDED_WIDTH
    return Console(file=file, width=width, color_system="standard" if color else None,
                   force_terminal=bool(color), highlight=False)


def _layout(console) -> dict:
    return {"wide": console.width >= UNBOUNDED_WIDTH}


def show(fn, *, color=None, file=None, width=None):
    """Print the bytecode diff viewer for a function (or module) that has run compiled:
    original vs transformed bytecode per compiled entry, its resume functions, guards and
    FX graphs.

        f = frametrace.optimize(f); f(x)
        frametrace.show(f)
    """
    console = make_console(color, file, width)
    parts = frame_renderables(_target_code(fn), **_layout(console))
    if not parts:
        console.print(f"{_target_code(fn).co_qualname}: nothing compiled (has it run under frametrace?)")
    for part in parts:
        console.print(part)


def break_notes(records) -> dict:
    """{code: {line: [text]}}: each graph break (and frame run in CPython) of `records`
    at the line of its frame where it happened (for a break inside a function the frame
    calls, that call's line, with the inner place named)."""
    notes: dict = {}
    for r in records:
        if r.outcome == "compiled" or not r.reason:
            continue
        stack = r.user_stack
        outer = stack[0] if stack else None
        if outer is None or outer.filename != r.code.co_filename:
            continue
        what = "graph break" if r.outcome == "break" else "runs in CPython"
        text = f"{what}: {r.reason}"
        inner = stack[-1]
        if inner is not outer:
            text += f" (in {inner.name}, {os.path.basename(inner.filename)}:{inner.lineno})"
        lines = notes.setdefault(r.code, {}).setdefault(outer.lineno, [])
        if text not in lines:
            lines.append(text)
    return notes


def show_records(records, *, fn_name=None, color=None, file=None, width=None) -> int:
    """The viewer for every frame in `records` (CompileRecords), optionally only frames
    whose function is named `fn_name`; each graph break is shown at its line, and listed
    after the frame with its location.  Returns how many frames it showed."""
    console = make_console(color, file, width)
    notes = break_notes(records)
    by_code = {}
    for r in records:
        by_code.setdefault(id(r.code), (r.code, []))[1].append(r)
    seen = set()
    shown = 0
    for code, recs in by_code.values():
        if is_resume(code):
            continue                     # shown under the frame it resumes
        if fn_name and fn_name not in (code.co_name, code.co_qualname):
            continue
        for part in frame_renderables(code, seen, notes, **_layout(console)):
            console.print(part)
        shown += 1
        listed = set()
        for r in (r for c, rs in by_code.values() if c is code or _resumes(c, code) for r in rs):
            if r.outcome == "compiled" or not r.reason:
                continue
            where = r.user_stack[-1] if r.user_stack else None
            key = (r.code.co_qualname, r.reason, where and (where.filename, where.lineno))
            if key in listed:
                continue                 # (the same break compiled again: explain(), a recompile)
            listed.add(key)
            heading = "graph break" if r.outcome == "break" else "runs in CPython"
            console.print(break_text(f"{heading} in {r.code.co_qualname}", r.reason, r.user_stack,
                                     r.hint))
    return shown


def _resumes(code, original) -> bool:
    return is_resume(code) and code.co_filename == original.co_filename and \
        code.co_qualname.startswith(original.co_qualname + ".<resume at line")
