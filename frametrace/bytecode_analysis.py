"""What frametrace reads off a code object without running it: its instructions, its
exception table, and whether a generator's body can be pulled ahead of time.

A leaf: it knows `dis` and nothing of Vars, graphs or frames, so the interpreter, the
resume-frame builder and the Vars that look at bytecode (`with` spans) all share it.
"""
from __future__ import annotations

import dis

_INSTRUCTION_CACHE: dict = {}
_EXCEPTION_TABLES: dict = {}


def instructions(code):
    """dis's instructions of a code object, cached: inlined functions run many times."""
    hit = _INSTRUCTION_CACHE.get(code)
    if hit is None or hit[0] is not code:
        hit = (code, list(dis.get_instructions(code)))
        if len(_INSTRUCTION_CACHE) > 4096:
            _INSTRUCTION_CACHE.clear()
        _INSTRUCTION_CACHE[code] = hit
    return hit[1]


def handler_for(code, offset):
    """The exception-table entry that covers `offset` (the innermost: entries do not
    overlap), or None."""
    hit = _EXCEPTION_TABLES.get(code)
    if hit is None or hit[0] is not code:
        hit = (code, dis._parse_exception_table(code))
        if len(_EXCEPTION_TABLES) > 4096:
            _EXCEPTION_TABLES.clear()
        _EXCEPTION_TABLES[code] = hit
    for entry in hit[1]:
        if entry.start <= offset < entry.end:
            return entry
    return None


# Opcodes whose effects stay inside a generator's frame (or are graph ops without side
# effects): a generator made of only these can be pulled ahead of time at a graph break.
# Calls, stores to anything but locals, and in-place operators are not among them;
# user dunders reached through them are inlined calls, counted on their own.
_PURE_OPS = frozenset("""RETURN_GENERATOR POP_TOP RESUME NOP CACHE EXTENDED_ARG COPY_FREE_VARS
    MAKE_CELL PUSH_NULL COPY SWAP LOAD_FAST LOAD_FAST_CHECK LOAD_FAST_AND_CLEAR STORE_FAST
    LOAD_CONST LOAD_DEREF LOAD_GLOBAL LOAD_ATTR FOR_ITER GET_ITER END_FOR JUMP_FORWARD
    JUMP_BACKWARD JUMP_BACKWARD_NO_INTERRUPT POP_JUMP_IF_FALSE POP_JUMP_IF_TRUE
    POP_JUMP_IF_NONE POP_JUMP_IF_NOT_NONE POP_JUMP_FORWARD_IF_FALSE POP_JUMP_FORWARD_IF_TRUE
    POP_JUMP_FORWARD_IF_NONE POP_JUMP_FORWARD_IF_NOT_NONE POP_JUMP_BACKWARD_IF_FALSE
    POP_JUMP_BACKWARD_IF_TRUE POP_JUMP_BACKWARD_IF_NONE POP_JUMP_BACKWARD_IF_NOT_NONE
    YIELD_VALUE RETURN_VALUE RETURN_CONST COMPARE_OP IS_OP CONTAINS_OP UNARY_NEGATIVE
    UNARY_NOT UNARY_INVERT BUILD_TUPLE BUILD_LIST BUILD_MAP BUILD_CONST_KEY_MAP BINARY_SUBSCR
    BUILD_SLICE BINARY_SLICE UNPACK_SEQUENCE UNPACK_EX LIST_APPEND LIST_EXTEND LIST_TO_TUPLE
    FORMAT_VALUE BUILD_STRING CALL_INTRINSIC_1 RERAISE
    LOAD_FAST_LOAD_FAST STORE_FAST_STORE_FAST STORE_FAST_LOAD_FAST TO_BOOL CONVERT_VALUE
    FORMAT_SIMPLE FORMAT_WITH_SPEC""".split())


def has_cleanup(code) -> bool:
    """Whether closing a generator suspended at one of its yields may run its code: a
    yield inside a try, with or except block (3.12 wraps every generator in a handler
    that turns StopIteration into RuntimeError: not a cleanup).  Handlers around code
    without yields run, as any, while the generator runs."""
    by_offset = {i.offset: i for i in instructions(code)}
    for inst in by_offset.values():
        if inst.opname != "YIELD_VALUE":
            continue
        entry = handler_for(code, inst.offset)
        if entry is None:
            continue
        handler = by_offset.get(entry.target)
        if handler is not None and handler.opname == "CLEANUP_THROW":
            continue        # 3.12: a throw() into a `yield from` (no code of the user's)
        if handler is None or handler.opname != "CALL_INTRINSIC_1" or \
                "STOPITERATION" not in handler.argrepr:
            return True
    return False


def pure_generator(code) -> bool:
    """Whether a generator's body is made only of _PURE_OPS (no in-place operator)."""
    for inst in instructions(code):
        if inst.opname == "BINARY_OP":
            if dis._nb_ops[inst.arg][1].endswith("="):
                return False
        elif inst.opname not in _PURE_OPS:
            return False
    return True
