"""Bytecode of transformed frames, built with the `bytecode` package.

A transformed code object takes every argument slot of the original frame as a plain
positional parameter (the C hook passes them straight from the frame), keeps the
original's cells and free variables, calls the compiled graph, and rebuilds the
return value.  Differences between 3.11, 3.12 and 3.13 are in `CodeGen`'s emitters only
(and `call_slots`, what a call's two slots under its arguments hold).
"""
from __future__ import annotations

import builtins
import logging
import sys
import types
import weakref

from bytecode import Bytecode, CellVar, CompilerFlags, FreeVar, Instr, Label, TryBegin, TryEnd
import torch

from .exc import Unsupported, raised_before_input_writes
from . import _C
from .source import AttrSource, GetItemSource

PY312 = sys.version_info >= (3, 12)
PY313 = sys.version_info >= (3, 13)
_NO_ARG = object()


def call_slots(below, above):
    """(callable, NULL) from the two stack slots under a plain call's arguments:
    [NULL, callable] up to 3.12, [callable, NULL] from 3.13."""
    return (below, above) if PY313 else (above, below)


def truth_jump(name, label, **where) -> list:
    """A POP_JUMP_IF_FALSE/TRUE (or 3.11's directed one) on the truth of the value on
    top.  3.13's jumps read only an exact bool (anything else counts as true): TO_BOOL
    first, which leaves a bool as it is."""
    jump = Instr(name, label, **where)
    if PY313 and ("IF_FALSE" in name or "IF_TRUE" in name):
        return [Instr("TO_BOOL", **where), jump]
    return [jump]


def _chain_length(source) -> int:
    n = 0
    while hasattr(source, "base"):
        source, n = source.base, n + 1
    return n


def frame_arg_count(code) -> int:
    """Argument slots at the start of a frame's locals: positional, keyword-only,
    then *args and **kwargs."""
    return (code.co_argcount + code.co_kwonlyargcount
            + bool(code.co_flags & CompilerFlags.VARARGS)
            + bool(code.co_flags & CompilerFlags.VARKEYWORDS))


class CodeGen:
    """Emits instructions into a transformed version of `code`."""

    def __init__(self, code, lineno: int | None = None):
        self.code = code
        self.lineno = lineno or code.co_firstlineno
        self.instrs: list[Instr] = []
        self.cellvars = set(code.co_cellvars)
        self.freevars = set(code.co_freevars)
        self.tensor_locals: dict[object, str] = {}  # graph output node -> local name
        self.rebuilt: dict[int, str] = {}          # id(NewObjectVar) -> local name
        self.source_locals: dict = {}              # Source -> local holding its value
        self.prefix_count = 0
        # While set: the source position (an InstrLocation) of what is emitted, so that
        # an original instruction run here keeps its columns (the ^^^ of a traceback).
        self.location = None

    def _where(self):
        return {"lineno": self.lineno} if self.location is None else {"location": self.location}

    def emit(self, name, arg=_NO_ARG):
        if arg is _NO_ARG:
            self.instrs.append(Instr(name, **self._where()))
        else:
            self.instrs.append(Instr(name, arg, **self._where()))

    # -- loads --
    def load_local(self, name):
        if name in self.cellvars:
            self.emit("LOAD_DEREF", CellVar(name))
        else:
            self.emit("LOAD_FAST", name)

    def load_source(self, source):
        """The value of `source`: a local that already holds it, else its expression."""
        name = self.source_locals.get(source)
        if name is not None:
            self.emit("LOAD_FAST", name)
        else:
            source.reconstruct(self)

    def hold_shared_prefixes(self, sources):
        """Evaluates once, into locals, each attribute or item prefix that several of
        `sources` read through (a model's parameters all sit under
        ``self._modules['h']._modules['0']...``): the loads before a graph call cost
        one attribute or item read per source, not one per link of its chain.  Only
        reads the guards check anyway, so reading them once gives the same values."""
        uses: dict = {}
        for source in sources:
            base = source.base if type(source) in (AttrSource, GetItemSource) else None
            while type(base) in (AttrSource, GetItemSource):
                uses[base] = uses.get(base, 0) + 1
                if uses[base] > 1:
                    break           # its own prefixes were counted with it
                base = base.base
        for prefix in sorted((p for p, n in uses.items() if n > 1), key=_chain_length):
            if prefix not in self.source_locals:
                self.load_source(prefix)
                name = f"___prefix_{self.prefix_count}"
                self.prefix_count += 1
                self.emit("STORE_FAST", name)
                self.source_locals[prefix] = name

    def load_deref(self, name):
        self.emit("LOAD_DEREF", FreeVar(name) if name in self.freevars else CellVar(name))

    def load_closure(self, name):
        # (3.13 loads the cell with LOAD_FAST: LOAD_CLOSURE is only the compiler's)
        op = "LOAD_FAST" if PY313 else "LOAD_CLOSURE"
        if name in self.cellvars:
            self.emit(op, CellVar(name))
        elif name in self.freevars:
            self.emit(op, FreeVar(name))
        else:
            raise Unsupported(f"closure over {name!r}, which is not a cell of the frame")

    def load_global(self, name, push_null=False):
        self.emit("LOAD_GLOBAL", (push_null, name))

    def load_attr(self, name):
        self.emit("LOAD_ATTR", (False, name) if PY312 else name)

    def load_const(self, value):
        self.emit("LOAD_CONST", value)

    def subscr(self):
        self.emit("BINARY_SUBSCR")

    def build(self, kind, n):
        self.emit({tuple: "BUILD_TUPLE", list: "BUILD_LIST", dict: "BUILD_MAP"}[kind], n)

    def call(self, nargs):
        if not PY312:
            self.emit("PRECALL", nargs)
        self.emit("CALL", nargs)

    def push_callable(self, emit_callable):
        """Push what `emit_callable` pushes, a callable, with the NULL a plain CALL
        expects beside it: below it up to 3.12, above it from 3.13."""
        if not PY313:
            self.emit("PUSH_NULL")
        emit_callable(self)
        if PY313:
            self.emit("PUSH_NULL")

    def jump_if(self, name, label):
        """A conditional jump `name` (the original's POP_JUMP_*) to a label emitted
        later: 3.11 spells the direction in the opcode, and ours points forward."""
        if not PY312:
            name = name.replace("_BACKWARD_", "_FORWARD_")
        self.instrs.extend(truth_jump(name, label, **self._where()))

    def make_function(self, flags):
        """MAKE_FUNCTION over the code on top and, under it, the parts `flags` names
        (defaults 0x01, kwdefaults 0x02, closure 0x08, pushed in that order).  3.13
        sets each part with its own SET_FUNCTION_ATTRIBUTE, the last pushed first."""
        if not PY313:
            self.emit("MAKE_FUNCTION", flags)
            return
        self.emit("MAKE_FUNCTION")
        for bit in (0x08, 0x04, 0x02, 0x01):
            if flags & bit:
                self.emit("SET_FUNCTION_ATTRIBUTE", bit)

    def store_attr(self, name):
        self.emit("STORE_ATTR", name)

    def call_kw(self, nargs, names: tuple):
        """CALL with the last len(names) arguments passed by keyword."""
        if names and PY313:
            self.load_const(names)
            self.emit("CALL_KW", nargs)
            return
        if names:
            self.emit("KW_NAMES", names)
        self.call(nargs)

    def load_constructor(self, cls):
        """Push `cls` and its NULL for a call that rebuilds an output: it runs unhooked,
        since constructing the result is CPython's work, not code to compile."""
        self.push_callable(lambda cg: cg.load_const(_C.Unhooked(cls)))

    def set_grad_mode(self, mode: bool):
        """torch._C._set_grad_enabled(mode), explicitly: the graph's grad-mode nodes may
        not survive the backend (AOTAutograd drops them)."""
        self.call_const(torch._C._set_grad_enabled, [lambda cg: cg.load_const(mode)])
        self.emit("POP_TOP")

    def set_deterministic(self, state):
        """torch.use_deterministic_algorithms as the trace left it (`state`: mode,
        warn_only; None where the frame did not call it)."""
        if state is None:
            return
        self.call_const(set_deterministic_algorithms, [lambda cg: cg.load_const(state[0]),
                                                       lambda cg: cg.load_const(state[1])])
        self.emit("POP_TOP")

    def load_rebuilt(self, var) -> bool:
        """Push an object already rebuilt by this code (keeps aliasing); False if not."""
        name = self.rebuilt.get(id(var))
        if name is None:
            return False
        self.emit("LOAD_FAST", name)
        return True

    def keep_rebuilt(self, var):
        """The object just built (on top of the stack) is kept for later references."""
        name = f"___rebuilt_{len(self.rebuilt)}"
        self.rebuilt[id(var)] = name
        self.emit("COPY", 1)
        self.emit("STORE_FAST", name)

    def call_const(self, fn, arg_emitters):
        """Call the object `fn` (held as a constant) on the values the emitters push."""
        self.push_callable(lambda cg: cg.load_const(fn))
        for emit in arg_emitters:
            emit(self)
        self.call(len(arg_emitters))

    def call_const_packed(self, fn, leading, args, kwargs):
        """Call the object `fn` (a constant) on what the `leading` emitters push, then a
        tuple of the Vars `args` and a dict of the Vars `kwargs`: how a call
        `g(*args, **kwargs)` is made again, through `fn(g, args, kwargs)`."""
        def push_args(cg):
            for v in args:
                v.reconstruct(cg)
            cg.build(tuple, len(args))

        def push_kwargs(cg):
            for k, v in kwargs.items():
                cg.load_const(k)
                v.reconstruct(cg)
            cg.build(dict, len(kwargs))
        self.call_const(fn, [*leading, push_args, push_kwargs])

    def load_tensor(self, var):
        name = self.tensor_locals.get(var.node)
        if name is not None:
            self.emit("LOAD_FAST", name)
        elif var.source is not None:
            var.source.reconstruct(self)
        else:
            raise Unsupported(f"returning {var}, which is neither a graph output nor an input")

    # -- whole programs --
    def call_graph(self, slot, input_sources, n_outputs: int, rerun_grad=None, restore_grad=None,
                   rerun_state=None, deferred_writes=False):
        """Call the compiled graph on its inputs and keep the outputs in locals.  The
        graph is a constant of the code (`slot`, replaced by `fill_graph_slot` once the
        backend compiled it), not a global: reset() in another thread, or anything
        else that edits the module's globals, cannot take it from a running frame.

        `rerun_grad` (the grad mode the frame was compiled for), when given, says the
        graph changes nothing outside itself before it returns: if it raises (for a
        reason only the data decide, an index out of range), nothing the frame did has
        happened yet, so the frame runs again in CPython from its start, and does in
        order what comes before the failing op.  Free when nothing raises.

        `rerun_state` (a RerunState), with `rerun_grad`: the graph changes what the
        state saves (random generators, autocast, inputs it writes); saved before each
        call, it is put back before the frame runs again.

        `deferred_writes`, with `rerun_grad`: the backend writes inputs after the rest of
        the graph; only an exception it marked as raised before (exc.py) runs the frame
        again, any other goes on (a rerun would write the inputs twice).

        `restore_grad`, when given instead, is the grad mode an exception out of the
        graph leaves: the graph's `with` blocks are left, as in CPython."""
        guarded = rerun_grad is not None or restore_grad is not None
        if rerun_state is not None:
            self.call_const(rerun_state.save, [lambda cg, s=src: cg.load_source(s)
                                               for src in rerun_state.sources])
            self.emit("STORE_FAST", "___rerun_state")
        if guarded:
            handler = Label()
            try_begin = TryBegin(handler, push_lasti=False, stack_depth=0)
            self.instrs.append(try_begin)
        self.hold_shared_prefixes(input_sources)
        self.push_callable(lambda cg: cg.load_const(slot))
        for source in input_sources:
            self.load_source(source)
        # (only for these loads: code after the graph call may see stores it replays)
        self.source_locals.clear()
        self.call(len(input_sources))
        if guarded:
            after = Label()
            self.instrs.append(TryEnd(try_begin))
            self.emit("JUMP_FORWARD", after)
            self.instrs.append(handler)
            if rerun_grad is not None:
                self._rerun_on_exception(rerun_grad, rerun_state is not None, deferred_writes)
            else:
                self.set_grad_mode(restore_grad)
                self.emit("RERAISE", 0)
            self.instrs.append(after)
        if n_outputs == 0:
            self.emit("POP_TOP")
            return []
        self.emit("UNPACK_SEQUENCE", n_outputs)
        names = [f"___graph_out_{i}" for i in range(n_outputs)]
        for name in names:
            self.emit("STORE_FAST", name)
        return names

    def _rerun_on_exception(self, grad: bool, saved: bool = False, deferred_writes: bool = False):
        """The handler: an Exception runs the original frame in CPython (outside the
        handler, so the graph's exception is no __context__), unless user code ran
        inside the graph (`graph_errors_rerun`); anything else (a KeyboardInterrupt),
        and those, go on unchanged, in the frame's entry grad mode.  `saved`: the
        local ___rerun_state holds what to put back first."""
        code = self.code
        rerun, reraise = Label(), Label()
        self.load_const(Exception)
        self.emit("CHECK_EXC_MATCH")
        self.instrs.extend(truth_jump("POP_JUMP_IF_FALSE" if PY312 else "POP_JUMP_FORWARD_IF_FALSE",
                                      reraise, lineno=self.lineno))
        # (the stack holds the exception under the callable and its NULL)
        self.call_const(graph_errors_rerun, [
            lambda cg: cg.emit("COPY", 3), lambda cg: cg.load_const(code),
            lambda cg: cg.emit("LOAD_FAST", "___rerun_state") if saved else cg.load_const(None),
            lambda cg: cg.load_const(deferred_writes)])
        self.instrs.extend(truth_jump("POP_JUMP_IF_TRUE" if PY312 else "POP_JUMP_FORWARD_IF_TRUE",
                                      rerun, lineno=self.lineno))
        self.instrs.append(reraise)
        self.set_grad_mode(grad)
        self.emit("RERAISE", 0)
        self.instrs.append(rerun)
        self.emit("POP_TOP")

        def closure(cg):
            if not code.co_freevars:
                cg.load_const(None)
                return
            for name in code.co_freevars:
                cg.load_closure(name)
            cg.build(tuple, len(code.co_freevars))

        def args(cg):
            names = code.co_varnames[:frame_arg_count(code)]
            for name in names:
                cg.load_local(name)
            cg.build(tuple, len(names))
        self.return_from(lambda cg: cg.call_const(
            rerun_frame, [lambda cg: cg.load_const(code),
                          lambda cg: cg.call_const(builtins.globals, []),
                          closure, args, lambda cg: cg.load_const(grad)]))

    def return_from(self, emit_call):
        """Return what the call `emit_call` emits returns: a call that goes on with the
        user's frame elsewhere (a resume function, the frame run again in CPython).
        What it raises leaves without this frame's traceback entry (and frametrace's
        helpers' in between): the user's frame shows once, at the line that raised,
        as in CPython.  (Stack empty at the call; free when nothing raises.)"""
        hide = Label()
        begin = TryBegin(hide, push_lasti=False, stack_depth=0)
        self.instrs.append(begin)
        emit_call(self)
        self.instrs.append(TryEnd(begin))
        self.emit("RETURN_VALUE")
        self.instrs.append(hide)
        self.push_callable(lambda cg: cg.load_const(hide_own_entries))
        self.emit("COPY", 3)
        self.call(1)
        self.emit("POP_TOP")
        self.emit("RERAISE", 0)

    def assemble(self):
        """The transformed code object."""
        code = self.code
        nargs = frame_arg_count(code)
        bc = Bytecode()
        bc.name = code.co_name
        bc.qualname = code.co_qualname
        bc.filename = code.co_filename
        bc.first_lineno = code.co_firstlineno
        bc.argcount = nargs
        bc.posonlyargcount = 0
        bc.kwonlyargcount = 0
        bc.argnames = list(code.co_varnames[:nargs])
        bc.cellvars = list(code.co_cellvars)
        bc.freevars = list(code.co_freevars)
        bc.flags = CompilerFlags(code.co_flags) & ~(CompilerFlags.VARARGS | CompilerFlags.VARKEYWORDS)
        prologue = []
        if code.co_freevars:
            prologue.append(Instr("COPY_FREE_VARS", len(code.co_freevars), lineno=code.co_firstlineno))
        for name in code.co_cellvars:
            prologue.append(Instr("MAKE_CELL", CellVar(name), lineno=code.co_firstlineno))
        prologue.append(Instr("RESUME", 0, lineno=code.co_firstlineno))
        bc.extend(prologue + self.instrs)
        return bc.to_code()


class GraphSlot:
    """Stands for a compiled graph among a transformed code's constants until the
    backend has compiled it."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


def fill_graph_slot(code, slot, fn):
    """`code` with the graph `fn` in place of its `slot` constant."""
    consts = tuple(fn if c is slot else c for c in code.co_consts)
    return code.replace(co_consts=consts)


_unhooked_copies = weakref.WeakKeyDictionary()
_reran = weakref.WeakSet()   # codes whose graph raised (see graph_errors_rerun)


def graph_errors_rerun(exc, code, saved=None, deferred_writes=False) -> bool:
    """Whether `exc`, raised out of a graph of `code`, may be answered by running the
    frame again in CPython: not while saved-tensor hooks are set.  Their pack hooks are
    user code that ran inside the graph (activation checkpointing counts the tensors it saves, and its
    recomputation stops by raising from one): a second run would repeat them.  A rerun
    is logged: a graph that raised and ran in CPython must not pass for a compiled one.
    `saved` (a RerunState's save()): put back before the rerun; without a rerun, only
    autocast (the `with` blocks the graph entered are left, as in CPython).
    `deferred_writes`: see CodeGen.call_graph."""
    if torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
        if saved is not None:
            RerunState.restore(saved, autocast_only=True)
        _undecorate(exc)
        return False
    if deferred_writes and not raised_before_input_writes(exc):
        if saved is not None:
            RerunState.restore(saved, autocast_only=True)
        _undecorate(exc)
        logging.getLogger("frametrace").log(
            logging.INFO if code in _reran else logging.WARNING,
            "the compiled graph of %s (%s:%d) raised %s where its backend may have written its "
            "inputs: running the frame again in CPython could write them twice, so the "
            "exception goes on: %s", code.co_name, code.co_filename, code.co_firstlineno,
            type(exc).__name__, str(exc).split("\n")[0][:200])
        _reran.add(code)
        return False
    if saved is not None:
        RerunState.restore(saved)
    level = logging.INFO if code in _reran else logging.WARNING
    _reran.add(code)
    logging.getLogger("frametrace").log(
        level, "the compiled graph of %s (%s:%d) raised %s: %s; the frame runs in CPython",
        code.co_name, code.co_filename, code.co_firstlineno, type(exc).__name__,
        str(exc).split("\n")[0][:200])
    return True


def _undecorate(exc):
    """`exc` as the op raised it: torch.fx.Interpreter, which runs some higher-order
    ops' bodies (checkpoint's on torch 2.11), appends the node it was running to the
    message; the user's program, run by CPython, never had that node."""
    args = getattr(exc, "args", None)
    if args and isinstance(args[0], str):
        head, sep, tail = args[0].partition("\n\nWhile executing ")
        if sep and "\nOriginal traceback:\n" in tail:
            exc.args = (head,) + tuple(args[1:])


class RerunState:
    """What a graph changes outside itself before it could raise, saved before each
    call so that a failure can put it back and run the frame again in CPython, which
    then does, in order, exactly what comes before the failing op (the Python effects
    a trace replays after its graph included, and nothing after it): the random
    generators it draws from (the CPU one, the CUDA devices in `cuda`), autocast (the
    graph enters it), and the inputs it writes in place (`sources`, copied: a backend
    that writes as it goes).  Used only where a failure would otherwise lose effects
    (convert._rerun_state says when)."""
    __slots__ = ("rng", "cuda", "autocast", "sources")

    def __init__(self, rng: bool, cuda: tuple, autocast: bool, sources: list):
        self.rng, self.cuda, self.autocast, self.sources = rng, cuda, autocast, sources

    def save(self, *written):
        cpu = torch.default_generator.get_state() if self.rng else None
        cuda = [(i, torch.cuda.get_rng_state(i)) for i in self.cuda] if self.rng else ()
        modes = _autocast_state() if self.autocast else None
        copies = [(t, t.clone()) for t in written]
        return cpu, cuda, modes, copies

    @staticmethod
    def restore(saved, autocast_only=False):
        cpu, cuda, modes, copies = saved
        if modes is not None:
            _set_autocast_state(modes)
        if autocast_only:
            return
        if cpu is not None:
            torch.default_generator.set_state(cpu)
        for i, state in cuda:
            torch.cuda.set_rng_state(state, i)
        with torch.no_grad():
            for t, copy in copies:
                if t.is_inference():    # (written outside inference mode only inside it)
                    with torch.inference_mode():
                        t.copy_(copy)
                else:
                    t.copy_(copy)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_state():
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return ([(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES],
            torch.is_autocast_cache_enabled(), nesting)


def _set_autocast_state(state):
    devices, cache, nesting = state
    for device, enabled, dtype in devices:
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache)
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    while level > nesting:
        level = torch.autocast_decrement_nesting()
        if level == 0:
            torch.clear_autocast_cache()      # as the outermost autocast's exit does
    while level < nesting:
        level = torch.autocast_increment_nesting()


def rerun_frame(code, f_globals, closure, args, grad: bool):
    """Run `code` in CPython on the frame's arguments `args` (its first slots, as the
    hook passed them), starting in grad mode `grad` as the compiled graph did.  A copy
    of the code runs, marked skip, so the hook does not find the entry that failed;
    frames it calls are hooked as usual."""
    torch._C._set_grad_enabled(grad)
    copy = _unhooked_copies.get(code)
    if copy is None:
        copy = _unhooked_copies[code] = code.replace(co_name=code.co_name)
    _C.mark_skip(copy)          # (again: reset() forgets marks)
    fn = types.FunctionType(copy, f_globals, code.co_name, None, closure)
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    pos = list(args[:npos])
    kw = dict(zip(code.co_varnames[npos:npos + nkw], args[npos:npos + nkw]))
    i = npos + nkw
    if code.co_flags & CompilerFlags.VARARGS:
        pos.extend(args[i])
        i += 1
    if code.co_flags & CompilerFlags.VARKEYWORDS:
        kw.update(args[i])
    return fn(*pos, **kw)


def hide_own_entries(exc):
    """Drop the traceback entries that lead from a transformed frame to the code that
    goes on with the user's frame (see CodeGen.return_from): the transformed frame's
    own, and those of frametrace's helpers."""
    frame = sys._getframe(1)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and \
            (tb.tb_frame is frame or tb.tb_frame.f_code in _HELPER_CODES):
        tb = tb.tb_next
    exc.__traceback__ = tb


_HELPER_CODES = frozenset([rerun_frame.__code__])


def set_deterministic_algorithms(mode, warn_only):
    torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)
