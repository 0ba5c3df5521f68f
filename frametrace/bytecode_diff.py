"""Two code objects' bytecode side by side as text, aligned as a diff aligns two texts
(an instruction both keep sits on one row), each row with its source line: what the
bytecode log prints (`plain_diff`) and what the viewer (viewer.py) lays out in a table.

A leaf: it reads code objects only, so the compile path can log a diff without importing
the viewer (a tool above it)."""
from __future__ import annotations

import difflib
import dis
import linecache
import types

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
_GENERIC = {"CALL", "PRECALL", "POP_TOP", "PUSH_NULL", "NOP", "COPY", "SWAP", "KW_NAMES", "TO_BOOL",
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


def _graph_name(inst):
    """The name of the compiled graph an instruction loads, or None."""
    if inst.opname == "LOAD_CONST":
        name = getattr(inst.argval, "__name__", None)
    elif inst.opname == "LOAD_GLOBAL":
        name = inst.argval
    else:
        return None
    return name if isinstance(name, str) and name.startswith("__compiled_fn_") else None
