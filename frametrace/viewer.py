"""The bytecode diff viewer: original and transformed bytecode side by side, aligned by
source line, with what was inserted and removed colored; then each resume function,
the guards and the FX graph code.

    frametrace.show(fn)                       # fn has run compiled
    python -m frametrace diff script.py --fn forward

Width follows the terminal; without a terminal (or with color=False) it is plain text.
"""
from __future__ import annotations

import dis
import sys
import types
from collections import Counter

from . import _C, convert
from .resume import resume_codes_in


def _instructions(code):
    return [i for i in dis.get_instructions(code) if i.opname not in ("CACHE",)]


def _text(inst) -> str:
    arg = _graph_name(inst) or inst.argrepr
    if inst.opname in ("LOAD_CONST",) and isinstance(inst.argval, types.CodeType):
        arg = f"<code {inst.argval.co_qualname}>"
    elif len(arg) > 48:
        arg = arg[:45] + "..."
    return f"{inst.opname} {arg}".rstrip()


def _rows(original, transformed):
    """[(line, [(text, status)], [(text, status)])]: instructions grouped by source line;
    status is "same", "removed" (left only) or "inserted" (right only)."""
    def by_line(code):
        groups, line = {}, code.co_firstlineno
        for inst in _instructions(code):
            if inst.positions is not None and inst.positions.lineno is not None:
                line = inst.positions.lineno
            groups.setdefault(line, []).append(_text(inst))
        return groups
    left, right = by_line(original), by_line(transformed)
    rows = []
    for line in sorted(set(left) | set(right)):
        l_items, r_items = left.get(line, []), right.get(line, [])
        l_count, r_count = Counter(l_items), Counter(r_items)
        l_marked, r_marked = [], []
        seen = Counter()
        for t in l_items:
            seen[t] += 1
            l_marked.append((t, "same" if seen[t] <= r_count[t] else "removed"))
        seen = Counter()
        for t in r_items:
            seen[t] += 1
            r_marked.append((t, "same" if seen[t] <= l_count[t] else "inserted"))
        rows.append((line, l_marked, r_marked))
    return rows


def plain_diff(original, transformed) -> str:
    """The side-by-side diff as plain text (for logs)."""
    out, width = [], 44
    out.append(f"{'line':>5}  {'original':<{width}}  transformed")
    for line, left, right in _rows(original, transformed):
        for i in range(max(len(left), len(right))):
            l_text = _mark(left[i]) if i < len(left) else ""
            r_text = _mark(right[i]) if i < len(right) else ""
            out.append(f"{line if i == 0 else '':>5}  {l_text:<{width}}  {r_text}")
    return "\n".join(out)


def _mark(item):
    text, status = item
    return {"same": "  ", "removed": "- ", "inserted": "+ "}[status] + text


def _table(original, transformed, title):
    from rich.table import Table
    from rich.text import Text
    table = Table(title=title, title_justify="left", expand=True, show_lines=False)
    table.add_column("line", justify="right", style="dim", no_wrap=True)
    table.add_column(f"original: {original.co_qualname}", ratio=1, overflow="fold")
    table.add_column(f"transformed: {transformed.co_qualname}", ratio=1, overflow="fold")
    styles = {"same": "", "removed": "red", "inserted": "green"}
    for line, left, right in _rows(original, transformed):
        l_text, r_text = Text(), Text()
        for j, item in enumerate(left):
            l_text.append(("\n" if j else "") + _mark(item), style=styles[item[1]])
        for j, item in enumerate(right):
            r_text.append(("\n" if j else "") + _mark(item), style=styles[item[1]])
        table.add_row(str(line), l_text, r_text)
    return table


def _graph_name(inst):
    """The name of the compiled graph an instruction loads, or None."""
    if inst.opname == "LOAD_CONST":
        name = getattr(inst.argval, "__name__", None)
    elif inst.opname == "LOAD_GLOBAL":
        name = inst.argval
    else:
        return None
    return name if isinstance(name, str) and name.startswith("__compiled_fn_") else None


def _graph_names(code):
    return [n for n in map(_graph_name, _instructions(code)) if n is not None]


def frame_renderables(code, seen=None):
    """Rich renderables for every compiled entry of `code` and its resume functions."""
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text
    seen = set() if seen is None else seen
    if id(code) in seen:
        return []
    seen.add(id(code))
    parts = []
    for k, entry in enumerate(_C.entries(code), 1):
        where = f"{code.co_filename}:{code.co_firstlineno}"
        if entry.code is None:
            parts.append(Text(f"{code.co_qualname} ({where}) entry {k}: runs in CPython",
                              style="bold red"))
            continue
        parts.append(_table(code, entry.code, f"{code.co_qualname} ({where}) entry {k}"))
        guard_set = getattr(entry.check, "guard_set", None)
        if guard_set is not None:
            parts.append(Panel(Text("\n".join(guard_set.texts())), title="guards",
                               expand=False))
        for name in _graph_names(entry.code):
            gm = convert.graph_modules.get(name)
            if gm is not None:
                parts.append(Panel(Syntax(gm.code.strip(), "python", theme="ansi_dark",
                                          background_color="default"),
                                   title=f"FX graph {name}", expand=False))
        for resume in resume_codes_in(entry.code):
            parts.extend(frame_renderables(resume, seen))
    return parts


def _target_code(fn):
    """The code object frametrace compiled for `fn` (an optimize() wrapper, a function,
    a method or an nn.Module)."""
    import torch
    from .eval_frame import OptimizedModule
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
    from rich.console import Console
    file = file or sys.stdout
    if color is None:
        color = file.isatty()
    return Console(file=file, width=width, color_system="standard" if color else None,
                   force_terminal=bool(color), highlight=False)


def show(fn, *, color=None, file=None, width=None):
    """Print the bytecode diff viewer for a function (or module) that has run compiled:
    original vs transformed bytecode per compiled entry, its resume functions, guards and
    FX graphs.

        f = frametrace.optimize(f); f(x)
        frametrace.show(f)
    """
    console = make_console(color, file, width)
    parts = frame_renderables(_target_code(fn))
    if not parts:
        console.print(f"{_target_code(fn).co_qualname}: nothing compiled (has it run under frametrace?)")
    for part in parts:
        console.print(part)


def show_records(records, *, fn_name=None, color=None, file=None, width=None):
    """The viewer for every frame in `records` (CompileRecords), optionally only frames
    whose function is named `fn_name`; each graph break is listed with its location."""
    from .explain import break_text
    console = make_console(color, file, width)
    by_code = {}
    for r in records:
        by_code.setdefault(id(r.code), (r.code, []))[1].append(r)
    seen = set()
    shown = 0
    for code, recs in by_code.values():
        if "<resume at line" in code.co_qualname:
            continue                     # shown under the frame it resumes
        if fn_name and fn_name not in (code.co_name, code.co_qualname):
            continue
        for part in frame_renderables(code, seen):
            console.print(part)
            shown += 1
        for r in recs:
            if r.outcome == "compiled" or not r.reason:
                continue
            heading = "graph break" if r.outcome == "break" else "runs in CPython"
            console.print(break_text(heading, r.reason, r.user_stack))
    if not shown:
        console.print("no compiled frames" + (f" named {fn_name}" if fn_name else ""))
