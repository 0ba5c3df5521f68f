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

import difflib
import dis
import linecache
import sys
import types

from . import _C, convert
from .resume import resume_codes_in

# Instructions after which the next one is not reached by falling through.
_NO_FALLTHROUGH = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
                   "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP",
                   "JUMP_NO_INTERRUPT"}
_JUMPS = {dis.opname[op] for op in (*dis.hasjrel, *getattr(dis, "hasjabs", ()))}
_WIDTH_OF = {"same": "  ", "removed": "- ", "inserted": "+ ", "folded": "  "}


def _instructions(code):
    return [i for i in dis.get_instructions(code) if i.opname not in ("CACHE",)]


def _arg_text(inst) -> str:
    arg = _graph_name(inst) or inst.argrepr
    value = inst.argval
    if inst.opname == "LOAD_CONST" and isinstance(value, types.CodeType):
        arg = f"<code {value.co_qualname}>"
    elif inst.opname == "LOAD_CONST" and isinstance(value, (types.FunctionType, type)):
        arg = f"<{'class' if isinstance(value, type) else 'function'} {value.__qualname__}>"
    elif not arg and inst.arg is not None and inst.opname not in _JUMPS:
        arg = str(inst.arg)
    if len(arg) > 48:
        arg = arg[:45] + "..."
    return arg


def _key(inst) -> str:
    """What makes two instructions "the same" across the two listings: a jump's
    target offset differs between them, so it is left out."""
    return inst.opname if inst.opname in _JUMPS else f"{inst.opname} {_arg_text(inst)}"


def _text(inst) -> str:
    marker = ">>" if inst.is_jump_target else "  "
    return f"{marker}{inst.offset:>5} {inst.opname} {_arg_text(inst)}".rstrip()


def _reachable(code, instrs) -> list[bool]:
    """Which instructions the code can reach from its start: falling through, jumps,
    and the handlers of reached ranges of the exception table."""
    index = {inst.offset: i for i, inst in enumerate(instrs)}
    entries = list(getattr(dis.Bytecode(code), "exception_entries", ()))
    seen = [False] * len(instrs)
    todo = [0] if instrs else []
    while todo:
        i = todo.pop()
        if i >= len(instrs) or seen[i]:
            continue
        seen[i] = True
        inst = instrs[i]
        if inst.opname in _JUMPS and inst.argval in index:
            todo.append(index[inst.argval])
        if inst.opname not in _NO_FALLTHROUGH:
            todo.append(i + 1)
        for e in entries:
            if e.start <= inst.offset < e.end and e.target in index:
                todo.append(index[e.target])
    return seen


def _listing(code):
    """[(line, key, text)] of `code`, with each run of unreachable instructions (a
    resume function's copy of the body before where it resumes) folded into one."""
    instrs = _instructions(code)
    reached = _reachable(code, instrs)
    out, line = [], code.co_firstlineno
    i = 0
    while i < len(instrs):
        inst = instrs[i]
        if inst.positions is not None and inst.positions.lineno is not None:
            line = inst.positions.lineno
        if reached[i]:
            # (an instruction matches its like on the same source line only)
            out.append((line, (line, _key(inst)), _text(inst)))
            i += 1
            continue
        j = i
        while j < len(instrs) and not reached[j]:
            j += 1
        out.append((line, None, f"   ... {j - i} instructions never run (offsets "
                                f"{inst.offset}-{instrs[j - 1].offset}) folded"))
        i = j
    return out


def _rows(original, transformed):
    """[(line, (text, status) | None, (text, status) | None)]: the two listings aligned
    as difflib aligns two texts; status is "same", "removed" (left only), "inserted"
    (right only) or "folded".  `line` is the original's (None on rows it has no
    instruction on: what the transformed code inserted belongs to no source line)."""
    left, right = _listing(original), _listing(transformed)
    matcher = difflib.SequenceMatcher(None, [k for _, k, _ in left], [k for _, k, _ in right],
                                      autojunk=False)
    rows = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for a, b in zip(left[i1:i2], right[j1:j2]):
                rows.append((a[0], (a[2], "same"), (b[2], "same")))
            continue
        ls, rs = left[i1:i2], right[j1:j2]
        for k in range(max(len(ls), len(rs))):
            a = ls[k] if k < len(ls) else None
            b = rs[k] if k < len(rs) else None
            rows.append((a[0] if a is not None else None, a and (a[2], "folded" if a[1] is None else "removed"),
                         b and (b[2], "folded" if b[1] is None else "inserted")))
    return rows


def _source(code, line) -> str:
    return linecache.getline(code.co_filename, line).strip()


def _numbered(rows):
    """Rows with the line number and source text on the first row of each line."""
    last = None
    for line, left, right in rows:
        yield (line if line != last else None), left, right
        if line is not None:
            last = line


def plain_diff(original, transformed) -> str:
    """The side-by-side diff as plain text (for logs)."""
    out, width, src = [], 48, 32
    out.append(f"{'line':>5}  {'source':<{src}}  {'original':<{width}}  transformed")
    for line, left, right in _numbered(_rows(original, transformed)):
        text = _source(original, line) if line is not None else ""
        text = text if len(text) <= src else text[:src - 3] + "..."
        out.append(f"{line if line is not None else '':>5}  {text:<{src}}  "
                   f"{_mark(left):<{width}}  {_mark(right)}".rstrip())
    return "\n".join(out)


def _mark(item):
    if item is None:
        return ""
    text, status = item
    return _WIDTH_OF[status] + text


def _table(original, transformed, title):
    from rich.table import Table
    from rich.text import Text
    table = Table(title=title, title_justify="left", expand=True, show_lines=False,
                  show_edge=False, pad_edge=False)
    table.add_column("line", justify="right", style="dim", no_wrap=True)
    table.add_column("source", ratio=2, overflow="ellipsis", no_wrap=True, style="yellow")
    table.add_column(f"original: {original.co_qualname}", ratio=3, overflow="fold")
    table.add_column(f"transformed: {transformed.co_qualname}", ratio=3, overflow="fold")
    styles = {"same": "", "removed": "red", "inserted": "green", "folded": "dim italic"}
    for line, left, right in _numbered(_rows(original, transformed)):
        cells = [Text(_mark(item), style=styles[item[1]]) if item else Text("")
                 for item in (left, right)]
        table.add_row("" if line is None else str(line),
                      "" if line is None else _source(original, line), *cells)
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


def is_resume(code) -> bool:
    return "<resume at line" in code.co_qualname


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
    kind = "resume function " if is_resume(code) else ""
    for k, entry in enumerate(_C.entries(code), 1):
        where = f"{code.co_filename}:{code.co_firstlineno}"
        if entry.code is None:
            parts.append(Text(f"{kind}{code.co_qualname} ({where}) entry {k}: runs in CPython",
                              style="bold red"))
            continue
        parts.append(_table(code, entry.code, f"{kind}{code.co_qualname} ({where}) entry {k}"))
        guard_set = getattr(entry.check, "guard_set", None)
        if guard_set is not None:
            parts.append(Panel(Text("\n".join(guard_set.texts())), title="guards",
                               expand=False))
        for name in _graph_names(entry.code):
            gm = convert.graph_modules.get(name)
            if gm is not None:
                parts.append(Panel(Syntax(convert.readable_graph(gm), "python", theme="ansi_dark",
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


def show_records(records, *, fn_name=None, color=None, file=None, width=None) -> int:
    """The viewer for every frame in `records` (CompileRecords), optionally only frames
    whose function is named `fn_name`; each graph break is listed with its location.
    Returns how many frames it showed."""
    from .explain import break_text
    console = make_console(color, file, width)
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
        for part in frame_renderables(code, seen):
            console.print(part)
        shown += 1
        for r in (r for c, rs in by_code.values() if c is code or _resumes(c, code) for r in rs):
            if r.outcome == "compiled" or not r.reason:
                continue
            heading = "graph break" if r.outcome == "break" else "runs in CPython"
            console.print(break_text(f"{heading} in {r.code.co_qualname}", r.reason, r.user_stack,
                                     r.hint))
    return shown


def _resumes(code, original) -> bool:
    return is_resume(code) and code.co_filename == original.co_filename and \
        code.co_qualname.startswith(original.co_qualname + ".<resume at line")
