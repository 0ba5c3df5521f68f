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
import os
import sys
import types

from . import _C, convert
from .explain import UNBOUNDED_WIDTH, is_terminal
from .resume import resume_codes_in

# Instructions after which the next one is not reached by falling through.
_NO_FALLTHROUGH = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
                   "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP",
                   "JUMP_NO_INTERRUPT"}
_JUMPS = {dis.opname[op] for op in (*dis.hasjrel, *getattr(dis, "hasjabs", ()))}
_WIDTH_OF = {"same": "  ", "removed": "- ", "inserted": "+ ", "folded": "  ", "note": ""}


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


def _text(inst, digits=5) -> str:
    marker = ">>" if inst.is_jump_target else "  "
    return f"{marker} {inst.offset:>{digits}} {inst.opname} {_arg_text(inst)}".rstrip()


def _reachable(code, instrs, exceptions=True) -> list[bool]:
    """Which instructions the code can reach from its start: falling through, jumps,
    and (with `exceptions`) the handlers of reached ranges of the exception table."""
    index = {inst.offset: i for i, inst in enumerate(instrs)}
    entries = list(getattr(dis.Bytecode(code), "exception_entries", ())) if exceptions else []
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


def _def_line(code) -> int:
    """The line of the `def` (or `class`) of `code`: co_firstlineno is its first
    decorator's line where it has decorators."""
    first = code.co_firstlineno
    for line in range(first, first + 64):
        text = linecache.getline(code.co_filename, line).lstrip()
        if not text:
            break
        if not text.startswith("@") and not text.startswith("#"):
            return line if text.startswith(("def ", "async def ", "class ")) else first
    return first


def _frametrace_helper(inst) -> str | None:
    """The name of the frametrace function an instruction loads, or None."""
    value = inst.argval if inst.opname == "LOAD_CONST" else None
    module = getattr(value, "__module__", None) or ""
    return getattr(value, "__name__", None) if module.startswith("frametrace") else None


def _users_code(inst) -> bool:
    """Whether an instruction loads something of the user's (a global, a function that
    is not frametrace's: a resume function where the user's handler goes on): a handler
    that does is shown, not folded."""
    if inst.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"):
        return True
    value = inst.argval if inst.opname == "LOAD_CONST" else None
    return isinstance(value, types.FunctionType) and \
        not (getattr(value, "__module__", None) or "").startswith("frametrace")


def _fold_text(run) -> str:
    helpers = {_frametrace_helper(i) for i in run}
    if "graph_errors_rerun" in helpers:
        what = "rerun guard of the graph call"      # (an error in the graph reruns the frame)
    else:
        what = "traceback cleanup"                  # (frametrace's frames leave the traceback)
    return f"   ... {what} ({len(run)} instructions)"


def _listing(code):
    """[(line, key, text)] of `code`: key is None on a folded row.  Folded are each run
    of unreachable instructions (a resume function's copy of the body before where it
    resumes) and each exception handler frametrace inserted (around a graph call, a
    resume call), with the jump over it: error handling no user wrote, one row each."""
    instrs = _instructions(code)
    reached = _reachable(code, instrs)
    normal = _reachable(code, instrs, exceptions=False)
    first, def_line = code.co_firstlineno, _def_line(code)
    digits = len(str(instrs[-1].offset)) if instrs else 1
    out, line = [], def_line
    i = 0
    while i < len(instrs):
        inst = instrs[i]
        if inst.positions is not None and inst.positions.lineno is not None:
            line = inst.positions.lineno
            if line == first:
                line = def_line      # (the function's own instructions: its def line)
        if not reached[i]:
            j = i
            while j < len(instrs) and not reached[j]:
                j += 1
            out.append((line, None, f"   ... {j - i} instructions never run (offsets "
                                    f"{inst.offset}-{instrs[j - 1].offset}) folded"))
            i = j
            continue
        handler = _inserted_handler(instrs, reached, normal, i)
        if handler:
            out.append((line, None, _fold_text(instrs[i:i + handler])))
            i += handler
            continue
        # (an instruction matches its like on the same source line only)
        out.append((line, _key(inst), _text(inst, digits)))
        i += 1
    return out


def _inserted_handler(instrs, reached, normal, i) -> int:
    """How many instructions from `i` on are a handler frametrace inserted (reached only
    through the exception table, loading one of frametrace's helpers), with the jump
    over it when `i` is that jump; 0 where `i` starts none."""
    start = i
    if instrs[i].opname in ("JUMP_FORWARD", "JUMP") and i + 1 < len(instrs) and \
            not normal[i + 1] and reached[i + 1]:
        i += 1
    j = i
    while j < len(instrs) and reached[j] and not normal[j]:
        j += 1
    if j == i or not any(_frametrace_helper(inst) for inst in instrs[i:j]) or \
            any(_users_code(inst) for inst in instrs[i:j]):
        return 0
    if start < i and (j >= len(instrs) or instrs[start].argval != instrs[j].offset):
        start = i            # (a jump elsewhere stays a row of its own)
        if instrs[start].opname in ("JUMP_FORWARD", "JUMP"):
            return 0
    return j - start


def _runs(listing):
    """The listing cut into runs of one source line each: [(line, [items])]."""
    runs = []
    for item in listing:
        if runs and runs[-1][0] == item[0]:
            runs[-1][1].append(item)
        else:
            runs.append((item[0], [item]))
    return runs


# Instructions that say nothing by themselves: two equal runs of only these are no
# evidence that the two listings do the same thing there (a CALL 1 of one call beside
# the CALL 1 of another).
_GENERIC = {"CALL", "PRECALL", "POP_TOP", "PUSH_NULL", "NOP", "COPY", "SWAP", "KW_NAMES",
            "RETURN_VALUE", "CACHE", "EXTENDED_ARG"}


def _generic(items) -> bool:
    return all(k is None or k.split(" ", 1)[0] in _GENERIC for _, k, _ in items)


def _align(ls, rs, rows):
    """Rows of two runs of one source line, aligned as difflib aligns two texts."""
    matcher = difflib.SequenceMatcher(None, [k for _, k, _ in ls], [k for _, k, _ in rs],
                                      autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal" and not _generic(ls[i1:i2]):
            for a, b in zip(ls[i1:i2], rs[j1:j2]):
                rows.append((a[0], (a[2], "same"), (b[2], "same")))
            continue
        # Side by side, each marked removed or inserted: a row pairs what is at the
        # same place of the line, not what is the same.
        left, right = ls[i1:i2], rs[j1:j2]
        for k in range(max(len(left), len(right))):
            a = left[k] if k < len(left) else None
            b = right[k] if k < len(right) else None
            rows.append(((a or b)[0], a and (a[2], "folded" if a[1] is None else "removed"),
                         b and (b[2], "folded" if b[1] is None else "inserted")))


def _rows(original, transformed):
    """[(line, (text, status) | None, (text, status) | None)]: the two listings aligned
    by source line (the runs of instructions of each line, in order, as difflib aligns
    two texts), then within a line instruction by instruction; status is "same",
    "removed" (left only), "inserted" (right only) or "folded"."""
    left, right = _runs(_listing(original)), _runs(_listing(transformed))
    matcher = difflib.SequenceMatcher(None, [line for line, _ in left],
                                      [line for line, _ in right], autojunk=False)
    rows = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for (_, ls), (_, rs) in zip(left[i1:i2], right[j1:j2]):
                _align(ls, rs, rows)
            continue
        # Lines only one side has: merged by line number, each side in its own order.
        ls, rs = list(left[i1:i2]), list(right[j1:j2])
        while ls or rs:
            if ls and (not rs or ls[0][0] <= rs[0][0]):
                _align(ls.pop(0)[1], [], rows)
            else:
                _align([], rs.pop(0)[1], rows)
    return rows


def _source(code, line) -> str:
    return linecache.getline(code.co_filename, line).strip()


def _numbered(rows, notes=None):
    """Rows with the line number on the first row of each line, and after that row the
    notes for the line (`notes`: {line: [text]}, each once, as a row of status "note")."""
    last, noted = None, set()
    for line, left, right in rows:
        first = line is not None and line != last
        yield (line if first else None), left, right
        if first and notes and line in notes and line not in noted:
            noted.add(line)
            for text in notes[line]:
                yield None, None, (text, "note")
        if line is not None:
            last = line


def plain_diff(original, transformed) -> str:
    """The side-by-side diff as plain text (for logs): no source line is cut, each
    stands on the row of the line's first instruction, the columns after it aligned."""
    rows = list(_numbered(_rows(original, transformed)))
    texts = [_source(original, line) if line is not None else "" for line, _, _ in rows]
    src = max([len("source"), *map(len, texts)])
    width = max([len("original"), *(len(_mark(left)) for _, left, _ in rows)])
    out = [f"{'line':>5}  {'source':<{src}}  {'original':<{width}}  transformed"]
    for (line, left, right), text in zip(rows, texts):
        out.append(f"{line if line is not None else '':>5}  {text:<{src}}  "
                   f"{_mark(left):<{width}}  {_mark(right)}".rstrip())
    return "\n".join(out)


def _mark(item):
    if item is None:
        return ""
    text, status = item
    return _WIDTH_OF[status] + text


def _table(original, transformed, title, notes=None, wide=False):
    """The side-by-side table.  On a console of some width (a terminal), each line's
    source is a row of its own, with the line's graph breaks beside it, over the rows of
    its instructions, which wrap where they are too long.  `wide`: for output no
    terminal shows (a pipe, a file): the source in a column of its own, every column as
    wide as its longest cell, nothing wrapped or cut."""
    from rich.table import Table
    from rich.text import Text
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


def frame_renderables(code, seen=None, notes=None, wide=False):
    """Rich renderables for every compiled entry of `code` and its resume functions.
    `notes`: {code: {line: [text]}}, shown at their line (the graph breaks); `wide`:
    see `_table`."""
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text
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
    """A console for `file`: colored on a terminal (or with color=True), as wide as the
    terminal there; elsewhere (a pipe, a file) wide enough that no line is cut."""
    from rich.console import Console
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
    from .explain import break_text
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
