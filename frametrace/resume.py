"""Resume functions: where a frame continues after a graph break.

A resume function is a new code object made from the original frame's bytecode.  It
takes the values left on the stack after the breaking instruction, then the frame's
bound locals, as positional parameters; its prologue pushes the stack values back and
jumps to the instruction the original frame would run next.  Cells and free variables of
the original become its free variables, so closures keep sharing them.  The hook catches
its frame like any other and compiles it in its turn.
"""
from __future__ import annotations

import dis
import sys
import types

import torch
import torch.utils.checkpoint as checkpoint
from bytecode import (Bytecode, CellVar, CompilerFlags, ConcreteBytecode, FreeVar, Instr,
                      Label, TryBegin, TryEnd)

from . import _C, config
from .bytecode_analysis import handler_for
from .codegen import call_slots, truth_jump
from .resume_codes import (_opaque, _origin, _private, opaque_locals,  # noqa: F401  (read from here)
                           original_code, original_position, private_lists)
from .variables.lazy import Lazy
from .variables.opaque import OpaqueVar
from .variables.base import NULL, unsupported
from .variables.builtins import BuiltinVar
from .variables.containers import IteratorVar
from .variables.contexts import check_exit_handover, exit_all
from .variables.with_blocks import check_break_at_with
from .variables.exceptions import UNKNOWN
from .variables.functions import PartialVar
from .variables.symbolic import SymNodeVar

PY312 = sys.version_info >= (3, 12)
PY313 = sys.version_info >= (3, 13)

_PROLOGUE = {"COPY_FREE_VARS", "MAKE_CELL", "RESUME"}

# (code, offset, n_stack, locals) -> resume code; cleared by reset()
_cache: dict[tuple, types.CodeType] = {}


def abstract_instructions(code):
    """The `bytecode` package's abstract form of `code`, and a map from dis offsets to
    its Instr objects."""
    concrete = ConcreteBytecode.from_code(code)
    abstract = concrete.to_bytecode(conserve_exception_block_stackdepth=True)
    offsets, pos = [], 0
    for ci in concrete:
        if ci.name != "CACHE":
            offsets.append(pos + ci.size - 2)   # dis reports the offset after EXTENDED_ARGs
        pos += ci.size
    instrs = [i for i in abstract if isinstance(i, Instr)]
    return abstract, dict(zip(offsets, instrs))


_resume_counts: dict[types.CodeType, int] = {}         # original code -> resume codes made


def resume_code(code, offset: int, layout: tuple, local_names: tuple,
                opaque: frozenset = frozenset()) -> types.CodeType:
    """The code object that continues `code` at instruction `offset`, with a stack of
    `layout` ("v": a value passed in; "r": a value the breaking instruction produced;
    "i": a list passed in and iterated again; "n": a NULL; else a live iterator handed
    over, see IteratorVar.handover and _live_iterator)."""
    names = _stack_names(layout)
    key = (code, offset, layout, local_names, opaque)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    abstract, by_offset = abstract_instructions(code)
    target = by_offset[offset]
    body = list(abstract)
    # Drop the original prologue (cells are free variables here; RESUME is re-emitted).
    start = 0
    while start < len(body) and isinstance(body[start], Instr) and body[start].name in _PROLOGUE:
        start += 1
    body = body[start:]
    index = next(i for i, ins in enumerate(body) if ins is target)
    label = Label()
    body.insert(index, label)
    cells = set(code.co_cellvars)
    origins = {}        # id(new Instr) -> the original's Instr it stands for
    renamed = []
    for ins in body:
        if not isinstance(ins, Instr):
            renamed.append(ins)
        elif ins.name in _SUPERINSTRUCTIONS:
            # 3.13's pairs hold two slots of 4 bits each: the resume code numbers its
            # locals anew, so each pair is split into its two instructions.
            first, second = _SUPERINSTRUCTIONS[ins.name]
            for name, arg in ((first, ins.arg[0]), (second, ins.arg[1])):
                if arg in cells:
                    unsupported(f"{ins.name} of a cell")     # (3.13's compiler makes none)
                renamed.append(Instr(name, arg, location=ins.location))
                origins[id(renamed[-1])] = ins
        elif isinstance(ins.arg, CellVar) and ins.arg.name in cells:
            renamed.append(Instr(ins.name, FreeVar(ins.arg.name), location=ins.location))
            origins[id(renamed[-1])] = ins
        elif PY313 and ins.name == "LOAD_FAST" and isinstance(ins.arg, str) and ins.arg in cells:
            # 3.13 loads the cell of an argument that is a cell by its name (bytecode
            # gives it as a plain local): a free variable here too.  (A free variable's
            # cell, loaded to build a closure, comes as a FreeVar, unhashable: it stays.)
            renamed.append(Instr("LOAD_FAST", FreeVar(ins.arg), location=ins.location))
            origins[id(renamed[-1])] = ins
        else:
            renamed.append(ins)
    body, extra_stack = _explicit_super(renamed, code, origins)

    freevars = list(code.co_cellvars) + list(code.co_freevars)
    new = Bytecode()
    new.name = code.co_name
    base = code.co_qualname.split(".<resume at line")[0]
    # Numbered per original code (two may resume at one line: after the instruction,
    # and in its handler); the logs, explain() and the viewer all show this name.
    number = _resume_counts[code] = _resume_counts.get(code, 0) + 1
    new.qualname = f"{base}.<resume at line {_line_of(target, code)} #{number}>"
    new.filename = code.co_filename
    new.first_lineno = code.co_firstlineno
    lead, rest = split_locals(code, local_names)
    new.argnames = lead + names + rest
    new.argcount = len(new.argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    new.freevars = freevars
    new.cellvars = []
    flags = CompilerFlags(code.co_flags) & ~(CompilerFlags.VARARGS | CompilerFlags.VARKEYWORDS)
    if freevars:
        flags |= CompilerFlags.NESTED
    new.flags = flags
    line = code.co_firstlineno
    prologue = []
    if freevars:
        prologue.append(Instr("COPY_FREE_VARS", len(freevars), lineno=line))
    prologue.append(Instr("RESUME", 0, lineno=line))
    names_iter = iter(names)
    for kind in layout:
        if kind == "n":
            prologue.append(Instr("PUSH_NULL", lineno=line))
            continue
        prologue.append(Instr("LOAD_FAST", next(names_iter), lineno=line))
        if kind == "i":
            prologue.append(Instr("GET_ITER", lineno=line))
        elif kind != "v" and kind != "r":
            prologue.extend(_live_iterator(kind, line))     # see IteratorVar.handover
    # Once on the stack, the parameters are dead: deleted, so that locals() (in CPython
    # too, when this frame is not compiled) shows the user's names only.
    prologue.extend(Instr("DELETE_FAST", n, lineno=line) for n in names)
    prologue.append(Instr("JUMP_FORWARD", label, lineno=line))
    new.extend(prologue + body)
    # The body runs from states the original frame had (the prologue rebuilds its stack
    # at the target), so the original's stack size and exception-table depths hold.
    # Computing them anew would start inside a `with`/try region whose TryBegin the
    # jump skipped, and misjudge its handler (a `raise` there: a negative size).
    result = new.to_code(stacksize=max(code.co_stacksize + extra_stack, prologue_stacksize(prologue)),
                         compute_exception_stack_depths=False)
    _cache[key] = result
    _opaque[result] = opaque
    _private[result] = frozenset(n for n, kind in zip(names, (k for k in layout if k != "n"))
                                 if kind == "i")
    # Each Instr of the body is one of the original's (or stands for one, `origins`).
    body_instrs = [origins.get(id(i), i) for i in body if isinstance(i, Instr)]
    _, new_by_offset = abstract_instructions(result)
    new_offsets = sorted(new_by_offset)[sum(isinstance(i, Instr) for i in prologue):]
    orig_offset_of = {id(ins): off for off, ins in by_offset.items()}
    _origin[result] = (code, {n: orig_offset_of[id(o)] for n, o in zip(new_offsets, body_instrs)
                              if id(o) in orig_offset_of})
    return result


# 3.13's instructions on two locals, and the two instructions each stands for.
_SUPERINSTRUCTIONS = {"LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
                      "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
                      "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST")}


def _explicit_super(body, code, origins):
    """Zero-argument super() reads the frame's first local slot, which in a resume code
    is not the original's first argument when that argument is a cell (a closure
    captured `self`; the cell is a free variable here).  Each `super()` call becomes
    `super(__class__, self)` read from the cells, when `super` is still the builtin
    (anything else is called with no arguments, as before).  Returns (body, stack
    slots it may need beyond the original's)."""
    first = code.co_varnames[0] if code.co_argcount else None
    if first not in code.co_cellvars or "__class__" not in code.co_freevars:
        return body, 0
    names = ["CALL"] if PY312 else ["PRECALL", "CALL"]
    out, i, changed = [], 0, False
    while i < len(body):
        ins = body[i]
        out.append(ins)
        call = body[i + 1:i + 1 + len(names)]
        if isinstance(ins, Instr) and ins.name == "LOAD_GLOBAL" and ins.arg == (True, "super") \
                and all(isinstance(c, Instr) and c.arg == 0 for c in call) \
                and [c.name for c in call] == names:
            following = next((b for b in body[i + 1 + len(names):] if isinstance(b, Instr)), None)
            I = lambda name, arg=UNSET: Instr(name, arg, location=ins.location) \
                if arg is not UNSET else Instr(name, location=ins.location)  # noqa: E731
            plain, done = Label(), Label()
            jump = I("JUMP_FORWARD", done)
            if following is not None:
                # A break at the explicit call continues where the original's would.
                origins[id(jump)] = origins.get(id(following), following)
            # (3.13: `super` is under its NULL)
            out += [I("COPY", 2 if PY313 else 1), I("LOAD_CONST", super), I("IS_OP", 0),
                    I("POP_JUMP_IF_FALSE" if PY312 else "POP_JUMP_FORWARD_IF_FALSE", plain),
                    I("LOAD_DEREF", FreeVar("__class__")), I("LOAD_DEREF", FreeVar(first)),
                    *([] if PY312 else [I("PRECALL", 2)]), I("CALL", 2), jump, plain, *call, done]
            i += 1 + len(names)
            changed = True
            continue
        i += 1
    return out, 2 if changed else 0


def split_locals(code, local_names) -> tuple[list, list]:
    """The resume function's parameters are (lead, stack values, rest): the original's
    first argument stays first, since zero-argument super() reads `self`/`cls` from
    the first local slot (the `__class__` cell is among the free variables)."""
    first = code.co_varnames[0] if code.co_argcount and code.co_varnames else None
    if first is not None and first in local_names and first not in code.co_cellvars:
        return [first], [n for n in local_names if n != first]
    return [], list(local_names)


def _live_iterator(kind: str, line) -> list:
    """The prologue that turns the tuple on top of the stack (containers and positions,
    from IteratorVar.handover) into the live iterator a break handed over.  Positions
    are values, not constants of the code: one resume code serves every iteration."""
    what, _, rest = kind.partition(":")
    I = lambda name, arg=UNSET: Instr(name, arg, lineno=line) if arg is not UNSET \
        else Instr(name, lineno=line)  # noqa: E731
    if what == "l":
        # (list, pos) -> iter(list), then it.__setstate__(pos)
        method, call = _method_call("__setstate__", 1, line)
        return [I("UNPACK_SEQUENCE", 2), I("GET_ITER"), I("COPY", 1), *method, I("COPY", 4),
                *call, I("POP_TOP"), I("SWAP", 2), I("POP_TOP")]
    if what == "d":
        # (dict, pos) -> iter(dict.VIEW()), then next() pos times
        out = [I("UNPACK_SEQUENCE", 2)]
        if rest != "keys":
            method, call = _method_call(rest, 0, line)
            out += method + call
        top, end = Label(), Label()
        method, call = _method_call("__next__", 0, line)
        return out + [I("GET_ITER"), I("SWAP", 2), top, I("COPY", 1),
                      *truth_jump("POP_JUMP_IF_FALSE" if PY312 else "POP_JUMP_FORWARD_IF_FALSE", end,
                                  lineno=line),
                      I("SWAP", 2), I("COPY", 1), *method, *call, I("POP_TOP"), I("SWAP", 2),
                      I("LOAD_CONST", 1), I("BINARY_OP", 10), I("JUMP_BACKWARD", top), end,
                      I("POP_TOP")]
    if what == "e":
        # (inner, count) -> enumerate(inner's iterator, count), called as a method call
        # would be: [enumerate, it, count]
        _, call = _method_call("", 1, line)
        return [I("UNPACK_SEQUENCE", 2), *_live_iterator(rest, line), I("LOAD_CONST", enumerate),
                I("SWAP", 2), I("COPY", 3), *call, I("SWAP", 2), I("POP_TOP")]
    if what == "z":
        # (inner1, ..., innerN) -> zip(it1, ..., itN): [zip, it1, ..., itN], the tuple
        # kept on top while the iterators are made
        out = [I("LOAD_CONST", zip), I("SWAP", 2)]
        inners = rest.split(";")
        for i, inner in enumerate(inners):
            out += [I("COPY", 1), I("LOAD_CONST", i), I("BINARY_SUBSCR"),
                    *_live_iterator(inner, line), I("SWAP", 2)]
        _, call = _method_call("", len(inners) - 1, line)
        return out + [I("POP_TOP"), *call]
    raise AssertionError(kind)


UNSET = object()


def prologue_stacksize(prologue) -> int:
    """The most stack a resume prologue uses: the stack values, plus the temporaries of
    the live iterators it makes (more than the original frame needed there).  A resume
    code given a fixed stack size must have at least this much."""
    body = [i for i in prologue if not (isinstance(i, Instr) and i.name == "JUMP_FORWARD")]
    code = Bytecode(body + [Instr("LOAD_CONST", None), Instr("RETURN_VALUE")])
    return code.compute_stacksize(check_pre_and_post=False)


def _method_call(name, nargs, line) -> list:
    """obj.name(...) with obj and then the arguments pushed in between."""
    method = [Instr("LOAD_ATTR", (True, name), lineno=line)] if PY312 else \
        [Instr("LOAD_METHOD", name, lineno=line)]
    call = [Instr("CALL", nargs, lineno=line)] if PY312 else \
        [Instr("PRECALL", nargs, lineno=line), Instr("CALL", nargs, lineno=line)]
    return method, call


def resume_codes_in(code) -> list:
    """The resume codes a transformed code object calls (held among its constants, as
    a function or a code object)."""
    found = []
    for const in code.co_consts:
        target = const.__code__ if isinstance(const, types.FunctionType) else const
        if isinstance(target, types.CodeType) and "<resume at line" in target.co_qualname:
            found.append(target)
    return found


def _stack_names(layout):
    """Parameter names for the stack slots: ___resultN for what the breaking instruction
    produced (data computed in CPython), ___stackN for the rest."""
    names = []
    for i, kind in enumerate(layout):
        if kind == "r":
            names.append(f"___result{i}")
        elif kind != "n":
            names.append(f"___stack{i}")
    return names


def _line_of(instr, code):
    loc = getattr(instr, "location", None)
    return getattr(loc, "lineno", None) or code.co_firstlineno


def clear():
    _cache.clear()
    _resume_counts.clear()
    _origin.clear()
    _opaque.clear()
    _private.clear()


# --------------------------------------------------------------------------- at a break
# Instructions a frame can break at: how many stack values each consumes.  The values
# below them are untouched by the instruction and passed to the resume function as they
# are (NULLs among them are re-pushed by its prologue).
def _consumed(inst) -> int | None:
    name = inst.opname
    if name == "CALL":
        return inst.arg + 2
    if name == "CALL_KW":
        return inst.arg + 3                     # (the names above the arguments)
    if name == "CALL_FUNCTION_EX":
        return 3 + (inst.arg & 1)
    if name.startswith("POP_JUMP") and ("IF_FALSE" in name or "IF_TRUE" in name):
        return 1
    if name in ("BINARY_OP", "COMPARE_OP", "BINARY_SUBSCR", "IS_OP", "CONTAINS_OP"):
        return 2
    if name == "STORE_SUBSCR":
        return 3
    if name in ("UNARY_NEGATIVE", "UNARY_NOT", "UNARY_INVERT", "GET_ITER", "BEFORE_WITH",
                "TO_BOOL", "CONVERT_VALUE", "FORMAT_SIMPLE"):
        return 1
    if name == "FORMAT_WITH_SPEC":
        return 2
    if name == "STORE_ATTR":
        return 2
    if name == "FORMAT_VALUE":
        return 2 if inst.arg & 0x04 else 1      # with a format spec on the stack
    if name in ("BUILD_STRING", "RAISE_VARARGS"):
        return inst.arg
    return _CONSUMED_PRODUCED.get(name, (None,))[0]


# Instructions of statements that break the graph as a whole (del, match): how many
# stack values each consumes and leaves.  (Match opcodes leave their subject.)
_CONSUMED_PRODUCED = {"DELETE_ATTR": (1, 0), "DELETE_SUBSCR": (2, 0), "DELETE_DEREF": (0, 0),
                      "MATCH_SEQUENCE": (1, 2), "MATCH_MAPPING": (1, 2), "GET_LEN": (1, 2),
                      "MATCH_KEYS": (2, 3), "MATCH_CLASS": (3, 1)}


def _produced(inst) -> int:
    """Values the instruction leaves on the stack (falling through)."""
    if inst.opname.startswith("POP_JUMP") or inst.opname in ("STORE_SUBSCR", "STORE_ATTR",
                                                              "RAISE_VARARGS"):
        return 0
    if inst.opname == "BEFORE_WITH":
        return 2            # __exit__ and what __enter__ returned
    if inst.opname in _CONSUMED_PRODUCED:
        return _CONSUMED_PRODUCED[inst.opname][1]
    return 1


def can_break_at(inst) -> bool:
    return _consumed(inst) is not None


def exception_cover(code, offset) -> tuple[str | None, list[int]]:
    """What catches an exception raised at `offset`: None (nothing), "with" (only the
    cleanups of `with` blocks) or "try" (a try statement of the user's); and the stack
    slots of the __exit__s of the `with` blocks it leaves first, innermost first."""
    instructions = {i.offset: i for i in dis.get_instructions(code)}
    names = lambda at, n: [getattr(instructions.get(at + 2 * k), "opname", None)  # noqa: E731
                           for k in range(n)]
    exits = []
    # A `with` cleanup re-raises (unless __exit__ swallows the exception), through the
    # cleanup that restores the exception state: whatever covers that catches it next.
    for _ in range(len(instructions)):
        entry = handler_for(code, offset)
        if entry is None:
            return ("with" if exits else None), exits
        if names(entry.target, 2) == ["PUSH_EXC_INFO", "WITH_EXCEPT_START"]:
            exits.append(entry.depth - 1)          # below it: lasti, the exception
            offset = entry.target
        elif names(entry.target, 3) == ["COPY", "POP_EXCEPT", "RERAISE"]:
            offset = entry.target + 4
        else:
            return "try", exits
    return "try", exits


def can_break(code, inst) -> bool:
    """Whether a frame can break its graph at `inst`: an instruction we know the stack
    effect of.  Inside a try statement, the transformed code catches what the
    instruction raises and goes on in a resume function at the user's handler; `with`
    cleanups it runs itself."""
    return can_break_at(inst)


class _BreakPlan:
    """What the transformed code keeps in temporaries at a break (computed before side
    effects are replayed, as CPython had computed them before the breaking instruction)."""
    __slots__ = ("lower", "top", "layout", "bound", "locals_to_store", "cells_to_store", "temps")


def prepare_break(cg, tracer, inst) -> _BreakPlan:
    """Right after the graph call: every value the break hands to CPython goes into a
    temporary (stack values, changed locals and cells)."""
    code = tracer.code
    if tracer.exc_handled is not UNKNOWN:
        # Inside an except or finally block on the exceptional path: the exception being
        # handled (sys.exc_info(), a bare raise) cannot be handed to a resume function.
        unsupported_break("a graph break while handling an exception")
    stack = list(tracer.stack)
    if inst.opname == "BEFORE_WITH":
        check_break_at_with(stack[-1])
    consumed = _consumed(inst)
    plan = _BreakPlan()
    plan.lower, plan.top = stack[:len(stack) - consumed], stack[len(stack) - consumed:]
    # Per lower stack slot: "v" a value, "n" a NULL, "i" an iterator passed as the list of
    # what it has left (so the resume frame can guard and trace its items), "l:POS" a
    # list iterator passed as its (live) list, iterated again from POS.
    plan.layout = tuple(_layout_kind(v) for v in plan.lower)
    cells = set(code.co_cellvars) | set(code.co_freevars)
    # A resume frame's ___stackN parameters are dead once its prologue pushed them.
    plan.bound = [n for n in code.co_varnames if n in tracer.locals and n not in cells
                  and not n.startswith(("___stack", "___result"))]
    # Locals changed by the trace are stored back; untouched arguments are still there.
    plan.locals_to_store = [
        n for n in plan.bound
        if type(tracer.locals[n]) is not Lazy and not (
            tracer.locals[n].source is not None and getattr(tracer.locals[n].source, "local", None) == n)]
    plan.cells_to_store = cells_to_store(tracer)
    plan.temps = {}

    def keep(key, emit_value):
        emit_value()
        name = f"___break_{len(plan.temps)}"
        cg.emit("STORE_FAST", name)
        plan.temps[key] = name

    for i, v in enumerate(plan.lower):
        live = v.handover() if isinstance(v, IteratorVar) else None
        if live is not None:
            keep(("lower", i), lambda c=live[1]: c.reconstruct(cg))
        elif isinstance(v, IteratorVar):
            def build(v=v):
                for item in v.items[v.index:]:
                    item.reconstruct(cg)
                cg.build(list, len(v.items) - v.index)
            keep(("lower", i), build)
        elif v is not NULL:
            keep(("lower", i), lambda v=v: v.reconstruct(cg))
    for i, v in enumerate(plan.top):
        if v is not NULL:
            keep(("top", i), lambda v=v: v.reconstruct(cg))
    for n in plan.locals_to_store:
        keep(("local", n), lambda n=n: tracer.locals[n].reconstruct(cg))
    for n in plan.cells_to_store:
        keep(("cell", n), lambda n=n: tracer.cells[n].value.reconstruct(cg))
    return plan


def _is_opaque(v) -> bool:
    """A value computed in CPython at an earlier break (see OpaqueVar, mark_data)."""
    return isinstance(v, OpaqueVar) or isinstance(v, SymNodeVar) and not v.is_const() or \
        type(v) is Lazy and v.data


def _layout_kind(v) -> str:
    if v is NULL:
        return "n"
    if isinstance(v, IteratorVar):
        live = v.handover()
        return "i" if live is None else live[0]
    return "v"


def cells_to_store(tracer) -> list[str]:
    """The frame's own cells the trace filled: the transformed code stores them, since
    closures over them may outlive the trace (at a break, or returned)."""
    return [n for n, c in tracer.cells.items()
            if c.value is not None and type(c.value) is not Lazy and n in tracer.code.co_cellvars]


# What the rest of a statement may do in CPython right after its break (see
# `statement_rest`): load constants and locals, format, and call these builtins.
_REST_CALLEES = (print, round, str, repr, format, float, int, abs, bool)
_REST_OPS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_FAST_CHECK", "PUSH_NULL", "PRECALL", "CALL", "KW_NAMES",
                       "CALL_KW",
                       "FORMAT_VALUE", "CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC",
                       "BUILD_STRING", "BUILD_TUPLE", "POP_TOP"})


class _Rest:
    """The instructions after a break that run in CPython with it (`offsets`), the lower
    stack slots they leave untouched (`depth`), the values they leave above those
    (`produced`) and where the resume function starts (`next_offset`)."""
    __slots__ = ("offsets", "depth", "produced", "next_offset")


def statement_rest(tracer, inst, plan: _BreakPlan):
    """The rest of the breaking statement that runs in CPython after the breaking call,
    or None.  A value the break computed in CPython (``t.item()``) is data to the trace:
    where the statement goes on to call print(), round(), str(), format() ... on it, the
    resume function would break again at once, one break per call, with an empty graph
    in between (``print(round(t.mean().item(), 3))`` was three breaks).  Those calls run
    here instead, with the break's own call: as far as they only load constants and
    locals, format, and call those builtins (found on the stack at the break, as the
    trace guarded them: no other code runs), on the break's line, outside any try or
    with block; the resume function starts after the last such call (or at the next
    statement).  config.break_runs_statement_rest = False: the break runs its call only."""
    if inst.opname != "CALL" or not config.break_runs_statement_rest or \
            inst.positions is None or inst.positions.lineno is None:
        return None
    new, new_null = object(), object()
    stack = list(plan.lower) + [new]
    low = len(plan.lower)
    best, offsets = None, []

    def pop(n):
        nonlocal low
        del stack[len(stack) - n:]
        low = min(low, len(stack))

    for i in tracer.instructions[tracer.index_of[inst.offset] + 1:]:
        name = i.opname
        if name not in _REST_OPS or i.positions is None or \
                i.positions.lineno != inst.positions.lineno or \
                exception_cover(tracer.code, i.offset)[0] is not None:
            break
        if name in ("LOAD_CONST", "LOAD_FAST", "LOAD_FAST_CHECK"):
            stack.append(new)
        elif name == "PUSH_NULL":
            stack.append(new_null)
        elif name in ("CALL", "CALL_KW"):
            names = name == "CALL_KW"           # (3.13: the keywords' names on top)
            if len(stack) < i.arg + 2 + names:
                break
            fn, head = call_slots(stack[-i.arg - 2 - names], stack[-i.arg - 1 - names])
            if not (head is NULL or head is new_null) or not isinstance(fn, BuiltinVar) or \
                    not any(fn.value is f for f in _REST_CALLEES):
                break
            pop(i.arg + 2 + names)
            stack.append(new)
        elif name in ("FORMAT_VALUE", "CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC"):
            k = 2 if name == "FORMAT_WITH_SPEC" or name == "FORMAT_VALUE" and i.arg & 0x04 else 1
            if len(stack) < k:
                break
            pop(k)
            stack.append(new)
        elif name in ("BUILD_STRING", "BUILD_TUPLE"):
            if len(stack) < i.arg:
                break
            pop(i.arg)
            stack.append(new)
        elif name == "POP_TOP":
            pop(1)
        offsets.append(i.offset)
        if name in ("CALL", "CALL_KW", "POP_TOP"):
            best = (list(offsets), low, len(stack) - low, i.offset)
        if name == "POP_TOP":
            break                          # (the statement's end)
    if best is None or not any(tracer.instructions[tracer.index_of[o]].opname in ("CALL", "CALL_KW")
                               for o in best[0]):
        return None
    rest = _Rest()
    rest.offsets, rest.depth, rest.produced, last = best
    if any(plan.layout[k] not in ("v", "n") for k in range(rest.depth, len(plan.lower))):
        return None
    rest.next_offset = tracer.instructions[tracer.index_of[last] + 1].offset
    return rest


class _BreakSite:
    """The break being emitted: the transformed code's builder, the trace stopped at
    `inst`, the user's function (whose globals and cells the resume function shares),
    and what `prepare_break` put in temporaries."""
    __slots__ = ("cg", "tracer", "code", "inst", "func", "plan")

    def __init__(self, cg, tracer, inst, func, plan):
        self.cg, self.tracer, self.code = cg, tracer, tracer.code
        self.inst, self.func, self.plan = inst, func, plan


def emit_break(cg, tracer, inst, func, plan: _BreakPlan, entry_grad: bool):
    """After the graph call and side effects: set grad mode as the trace had it, store
    the changed locals, push the stack as the original frame has it before `inst`, run
    `inst` in CPython, and return what the resume function(s) return."""
    site = _BreakSite(cg, tracer, inst, func, plan)
    _store_frame_state(site, entry_grad)
    cover, slots = exception_cover(site.code, inst.offset)
    exits = _with_exits(site, slots) if cover == "with" else None
    # What the instruction raises goes to the user's handler, in a resume function
    # that starts there with the stack the exception table gives it.
    catch = _try_begin(cg) if cover == "try" else None
    protect = _try_begin(cg) if exits is not None else None
    rest = statement_rest(tracer, inst, plan) if cover is None else None
    _push_stack(site, rest)
    jump_label = _run_instruction(site, rest)
    if protect is not None:
        _run_exits_on_raise(site, protect, exits)
    after_catch = None
    if catch is not None:
        cg.instrs.append(TryEnd(catch[1]))
        if inst.opname != "RAISE_VARARGS":
            after_catch = Label()
            cg.emit("JUMP_FORWARD", after_catch)
    opaque = _opaque_names(site)
    if catch is not None:
        entry = handler_for(site.code, inst.offset)
        if entry.depth > len(plan.lower):
            unsupported_break("a handler deeper than the stack at the break")
        cg.instrs.append(catch[0])
        _continue_at(site, opaque, entry.target, 1, depth=entry.depth,
                     lasti=inst.offset if entry.lasti else None)
        if inst.opname == "RAISE_VARARGS":
            return
        cg.instrs.append(after_catch)
    elif inst.opname == "RAISE_VARARGS":
        return
    if rest is not None:
        _continue_at(site, opaque, rest.next_offset, rest.produced, depth=rest.depth)
        return
    index = tracer.index_of[inst.offset]
    next_offset = tracer.instructions[index + 1].offset
    _continue_at(site, opaque, next_offset, _produced(inst))
    if jump_label is not None:
        cg.instrs.append(jump_label)
        _continue_at(site, opaque, inst.argval, 0)


def _store_frame_state(site, entry_grad):
    """The frame's state as the trace left it at the break, before the instruction runs
    in CPython: grad mode, the locals and cells the trace changed (the graph and the
    replayed side effects do not write the frame's own variables)."""
    cg, plan = site.cg, site.plan
    # The mode the code after the break expects: the trace's, at the break.  Where it
    # is the mode at entry (guarded) the graph left it so, whatever the backend kept of
    # its grad-mode nodes; the call is not made then, since it is not free (under a
    # torch function mode it dispatches to the mode: make_fx's setup code crashed in it).
    if torch.is_grad_enabled() != entry_grad:
        cg.set_grad_mode(torch.is_grad_enabled())
    for n in plan.locals_to_store:
        cg.emit("LOAD_FAST", plan.temps[("local", n)])
        cg.emit("STORE_FAST", n)
    for n in plan.cells_to_store:
        cg.emit("LOAD_FAST", plan.temps[("cell", n)])
        cg.emit("STORE_DEREF", CellVar(n))


def _with_exits(site, slots) -> list[str]:
    """Inside `with` blocks, an exception from the instruction must run their exits, as
    the original frame's cleanup handlers would: a handler of our own does that, with
    the temporaries holding each block's __exit__ (innermost first).  Refused where an
    __exit__ is not where the exception table says, or cannot be handed over."""
    plan = site.plan
    if any(i >= len(plan.lower) or plan.lower[i] is NULL for i in slots):
        unsupported_break("a with block's __exit__ is not where the exception table says")
    for i in slots:
        check_exit_handover(plan.lower[i])
    return [plan.temps[("lower", i)] for i in slots]


def _try_begin(cg) -> tuple:
    """A handler around the instruction: (its label, the try block's start)."""
    label = Label()
    begin = TryBegin(label, push_lasti=False, stack_depth=0)
    cg.instrs.append(begin)
    return label, begin


def _push_stack(site, rest):
    """The stack as the original frame has it just before the instruction: its
    operands, and below them the slots the rest of the statement (`statement_rest`)
    calls with, where that runs here too.  The slots further down go to the resume
    function as parameters instead."""
    cg, inst, plan = site.cg, site.inst, site.plan
    if rest is not None:
        # (below the call's operands: what the rest of the statement calls, with)
        for i in range(rest.depth, len(plan.lower)):
            if plan.lower[i] is NULL:
                cg.emit("PUSH_NULL")
            else:
                cg.emit("LOAD_FAST", plan.temps[("lower", i)])
    callee = (1 if plan.top[0] is NULL else 0) if inst.opname in ("CALL", "CALL_KW", "CALL_FUNCTION_EX") \
        else None
    for i, v in enumerate(plan.top):
        if v is NULL:
            cg.emit("PUSH_NULL")
        elif i == callee and _runs_unhooked(v):
            # (what the frame calls now, as the trace guarded it: wrapped on each call)
            cg.call_const(_C.Unhooked, [lambda c, i=i: c.emit("LOAD_FAST", plan.temps[("top", i)])])
        else:
            cg.emit("LOAD_FAST", plan.temps[("top", i)])


def _run_instruction(site, rest):
    """The breaking instruction (and the rest of its statement), run by CPython as the
    user wrote it: at its own position, so that a traceback through it shows its line
    and columns.  Returns the label a conditional jump goes to, else None."""
    cg, tracer, inst = site.cg, site.tracer, site.inst
    _, by_offset = abstract_instructions(site.code)
    original = by_offset[inst.offset]
    cg.location = original.location
    if tracer.kw_names:
        cg.emit("KW_NAMES", tracer.kw_names)
    if inst.opname == "CALL" and not PY312:
        cg.emit("PRECALL", inst.arg)
    jump_label = Label() if inst.opname.startswith("POP_JUMP") else None
    if jump_label is not None:
        cg.jump_if(original.name, jump_label)
    elif inst.opname == "UNARY_NOT" and PY313:
        # (3.13's reads only an exact bool; the trace left its TO_BOOL's operand as it was)
        cg.emit("TO_BOOL")
        cg.emit("UNARY_NOT")
    else:
        cg.emit(original.name, original.arg)
    for offset in rest.offsets if rest is not None else ():
        done = by_offset[offset]
        cg.location = done.location
        cg.emit(done.name) if done.name == "POP_TOP" else cg.emit(done.name, done.arg)
    cg.location = None
    return jump_label


def _run_exits_on_raise(site, protect, exits):
    """Close the handler `_with_exits` asked for: what the instruction raises runs the
    `with` blocks' exits (exit_all(exc, *exits)) and is raised on, as the original
    frame's cleanup handlers would do."""
    cg, inst = site.cg, site.inst
    handler, try_begin = protect
    after = Label()
    cg.instrs.append(TryEnd(try_begin))
    if inst.opname != "RAISE_VARARGS":      # (which never falls through)
        cg.emit("JUMP_FORWARD", after)
    cg.instrs.append(handler)
    # exit_all(exc, *exits), innermost first
    cg.push_callable(lambda cg: cg.load_const(exit_all))
    cg.emit("COPY", 3)
    for temp in exits:
        cg.emit("LOAD_FAST", temp)
    cg.call(1 + len(exits))
    cg.emit("POP_TOP")
    cg.emit("RERAISE", 0)
    if inst.opname != "RAISE_VARARGS":
        cg.instrs.append(after)


def _opaque_names(site) -> frozenset:
    """Data computed at earlier breaks stays data in the resume frame (not specialized
    on): the locals and stack values that hold it."""
    plan, tracer = site.plan, site.tracer
    return frozenset([n for n in plan.bound if _is_opaque(tracer.locals[n])] +
                     [f"___stack{i}" for i, v in enumerate(plan.lower)
                      if plan.layout[i] == "v" and _is_opaque(v)])


def _continue_at(site, opaque, offset, produced, depth=None, lasti=None):
    """Call the resume function at `offset` with the lower stack (its first `depth`
    slots, for a handler, then the handler's lasti if it takes one) and the
    `produced` values on top of the stack, then return what it returns."""
    cg, code, inst, plan = site.cg, site.code, site.inst, site.plan
    lower = plan.lower if depth is None else plan.lower[:depth]
    # What the instruction produced is data computed in CPython ("r"), except the
    # __exit__ a BEFORE_WITH leaves: the resume frame guards and calls it (inlined
    # at the block's end; handed over again at a break inside it).
    made = ("v", "r") if inst.opname == "BEFORE_WITH" and produced == 2 else ("r",) * produced
    layout = plan.layout[:len(lower)] + ("v",) * (lasti is not None) + made
    results = [f"___result_{i}" for i in range(produced)]
    for t in reversed(results):
        cg.emit("STORE_FAST", t)
    original, original_offset = original_position(code, offset)
    resume = resume_code(original, original_offset, layout, tuple(plan.bound), opaque)
    cg.return_from(lambda cg: _call_resume(cg, site, resume, original, lower, lasti, results))


def _call_resume(cg, site, resume, original, lower, lasti, results):
    """The call of the resume function: the arguments in the order of its parameters
    (the bound locals it takes first, the stack slots, the handler's lasti, what the
    instruction produced, the other locals)."""
    code, plan = site.code, site.plan
    cg.push_callable(lambda cg: _load_function(cg, resume, site.func, code))
    lead, rest = split_locals(original, plan.bound)
    for name in lead:
        cg.emit("LOAD_FAST", name)
    n = 0
    for i, v in enumerate(lower):
        if v is not NULL:
            cg.emit("LOAD_FAST", plan.temps[("lower", i)])
            n += 1
    if lasti is not None:
        # In code units of the resume code (RERAISE sets the frame's position,
        # for the traceback, from it).
        _, lasti_original = original_position(code, lasti)
        here = [o for o, orig in _origin[resume][1].items() if orig == lasti_original]
        cg.load_const(here[0] // 2 if here else 0)
        n += 1
    for t in results:
        cg.emit("LOAD_FAST", t)
    for name in rest:
        cg.emit("LOAD_FAST", name)
    cg.call(n + len(results) + len(plan.bound))


def unsupported_break(reason):
    unsupported(reason)


def _unhooked_functions():
    """Functions that call user code twice and need the same code both times: the
    whole call runs in CPython.  (Activation checkpointing reruns its function in
    backward, outside any compiled region, and checks it saved the same tensors.)"""
    return (checkpoint.checkpoint, checkpoint.checkpoint_sequential)


def _runs_unhooked(v) -> bool:
    """Whether the call of `v` at a break runs with the hook off: one of those functions,
    or a functools.partial of one (HF's `_gradient_checkpointing_func`)."""
    while isinstance(v, PartialVar):
        v = v.fn
    value = getattr(v, "value", None)
    return value is not None and any(value is f for f in _unhooked_functions())


def _load_function(cg, resume, func, code):
    freevars = list(code.co_cellvars) + list(code.co_freevars)
    if not freevars:
        cg.load_const(types.FunctionType(resume, func.__globals__, resume.co_name))
        return
    for name in freevars:
        cg.load_closure(name)
    cg.emit("BUILD_TUPLE", len(freevars))
    cg.load_const(resume)
    cg.make_function(0x08)
