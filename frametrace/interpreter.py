"""The symbolic bytecode interpreter.

It runs a frame's bytecode the way ceval.c does, but over Vars: torch operations go
into the FX graph (through `OutputGraph.call`), Python logic on values known at trace
time is evaluated now and guarded, and anything else raises Unsupported.  Every opcode
has one handler, a method named after it; the differences between 3.11, 3.12 and 3.13
(and what 3.14 will change) are listed at the end of this file.
"""
from __future__ import annotations

import dis
import inspect
import math
import operator
import sys
import traceback

from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .bytecode_analysis import handler_for, has_cleanup, instructions, pure_generator
from .exc import Unsupported, Yield, frame_summary
from .resume_codes import opaque_locals, original_code
from .side_effects import SideEffects
from .source import (BuiltinSource, ClosureCellSource, ClosureSource, ConstSource, GetItemSource, GlobalSource,
                     LocalSource, fresh_arg_sources)
from .variables import (NULL, ConstVar, DictVar, IteratorVar, ListVar,
                        TupleVar, Var, unsupported)
from .variables.asserts import assert_in_graph
from .variables.attributes import plain_class_of
from .variables.builder import wrap
from .variables.builtins import SetVar, _class_value, _len, iter_of, mapping_items
from .variables.contexts import ExitVar, GeneratorFrameVar
from .variables.with_blocks import user_context
from .variables.exceptions import (UNKNOWN, CallerExceptionVar, ExceptionVar, TracebackVar, TracedRaise,
                                   chain, exception_of, is_exception, matches, throw)
from .variables.functions import Cell, CellRefVar, NestedFunctionVar, cell_full, make_function
from .variables.generators import InlinedGeneratorVar, freeze_returned_iterators, stop_iteration_error
from .variables.lazy import Lazy
from .variables.objects import SuperVar
from .variables.opaque import OpaqueVar, is_data, traced_after_break
from .variables.operators import (BINARY_OPS, COMPARE_OPS, binary_op, contains, delete_list_item, format_value,
                                  is_none, is_same, make_slice, unary_op)
from .variables.patterns import is_mapping_subject, is_sequence_subject, match_class, match_keys
from .variables.stdlib import DequeVar
from .variables.symbolic import FormattedVar, lazily_joined
from . import subgraph

PY312 = sys.version_info >= (3, 12)
# 3.13 pushes the NULL of a call above the callable, not below it (see the end of the file).
PY313 = sys.version_info >= (3, 13)
# Unrolled loops are bounded: past this many instructions the frame is not traced.
MAX_INSTRUCTIONS = 200_000
# Inlining depth (bounded recursion of user functions).
MAX_INLINE_DEPTH = 48


class InstructionTranslator:
    """Traces one frame: `run()` interprets its bytecode to the return."""

    # Higher-order ops' Vars speculate their bodies through the `tx` they are given
    # (tx.subgraphs.speculate, call_hop ...): values sit below graph building.
    subgraphs = subgraph

    def __init__(self, code, func, args, output, guards, parent=None):
        self.code = code
        self.func = func
        self.parent = parent
        # Children keep the root; the root does not refer to itself, so that a compile's
        # objects are freed when it ends instead of at the next GC pass.
        self._root = None if parent is None else parent.root
        self.depth = 0 if parent is None else parent.depth + 1
        self.f_globals = func.__globals__
        self.f_builtins = func.__builtins__
        if not isinstance(self.f_builtins, dict):
            self.f_builtins = vars(self.f_builtins)
        self.output = output
        self.guards = guards
        self.side_effects = SideEffects(fresh_arg_sources(code)) if parent is None \
            else parent.side_effects
        self.instructions = instructions(code)
        self.index_of = {inst.offset: i for i, inst in enumerate(self.instructions)}
        self.stack: list[Var] = []
        self.locals: dict[str, object] = {}
        self.cells: dict[str, Cell] = {}
        self.closure: list[Cell] = []
        self.kw_names: tuple = ()
        self.ip = 0
        self.lineno = code.co_firstlineno
        self.return_value: Var | None = None
        self.generator = False              # an inlined generator's frame: yields suspend it
        self.code_runs = 0                  # root only: see builtins.call_item_fn
        self.live_reads: list | None = None  # root only: see containers.note_live_read
        self.stop_at: int | None = None     # root only: stop before this instruction
        # root only: the exception being handled (sys.exc_info()); at entry, the caller's
        self.exc_handled = UNKNOWN
        self.take_generator_frame = False   # the next generator called here is driven by
        #                                     its caller (contexts.GeneratorContextVar)
        if parent is None:
            opaque = opaque_locals(code)
            for name, value in zip(code.co_varnames, args):
                made_at_break = name.startswith("___result") or name in opaque
                if made_at_break:
                    # Modules in it (or it) are not pinned to their identity (see
                    # OutputGraph.unspecialized_roots).
                    output.unspecialized_roots.add(name)
                if not made_at_break or not is_data(value):
                    self.locals[name] = Lazy(value, LocalSource(name))
                elif type(value) in (int, float) and (type(value) is int or math.isfinite(value)) \
                        and output.policy.data_numbers():
                    # A number computed in CPython at a graph break (x.item()): an input
                    # of the graph that is never pinned to its value.
                    self.locals[name] = Lazy(value, LocalSource(name), data=True)
                elif traced_after_break(value):
                    # A module made at a break (copy.deepcopy(model)): traced all the same.
                    self.locals[name] = Lazy(value, LocalSource(name))
                elif type(value) is bool:
                    # bool(t) at a break: two values at most, so a constant (guarded)
                    # costs at most one more compile, where opaque data would break again.
                    self.locals[name] = Lazy(value, LocalSource(name))
                else:
                    # Other data (open(...), a string): passed along, not specialized on.
                    self.locals[name] = OpaqueVar(value, LocalSource(name), guards=guards)
            self.closure = [self._root_cell(n, i, c)
                            for i, (n, c) in enumerate(zip(code.co_freevars, func.__closure__ or ()))]

    @property
    def root(self):
        """The tracer of the frame being compiled (self, for that frame)."""
        return self if self._root is None else self._root

    def _root_cell(self, name, index, cell):
        """A free variable's cell of the traced frame: the one Cell of the trace for
        that cell object (inlined closures over it share it)."""
        source = ClosureSource(name, index)
        traced = Cell(Lazy(cell.cell_contents, source) if cell_full(cell) else None, source)
        traced.cell_source = ClosureCellSource(name, index)
        self.output.object_vars[id(cell)] = (cell, traced)
        return traced

    # ------------------------------------------------------------ running
    def run(self) -> Var | None:
        """Interpret to the return (its Var), or to `stop_at` (None)."""
        graph = self.output.graph
        outer, graph.tracer = getattr(graph, "tracer", None), self     # (see LocatedGraph)
        try:
            return self._run()
        finally:
            graph.tracer = outer

    def stack_key(self) -> tuple:
        key, tx = [], self
        while tx is not None:
            key.append((id(tx.code), tx.lineno))
            tx = tx.parent
        return tuple(key)

    def stack_text(self) -> str:
        """The user's call stack at the instruction being traced, as a traceback prints it."""
        frames, tx = [], self
        while tx is not None:
            frames.append(frame_summary(tx.code, tx.lineno))
            tx = tx.parent
        return "".join(traceback.format_list(frames[::-1]))

    def _run(self) -> Var | None:
        instructions = self.instructions
        steps = 0
        while self.return_value is None:
            if self.ip == self.stop_at:
                return None
            inst = instructions[self.ip]
            self.ip += 1
            if inst.positions is not None and inst.positions.lineno is not None:
                self.lineno = inst.positions.lineno
            handler = _DISPATCH.get(inst.opname)
            try:
                if handler is None:
                    unsupported(f"bytecode {inst.opname}")
                handler(self, inst)
            except TracedRaise as r:
                if r.fresh:
                    chain(self.root, r.exc)
                    r.fresh = False
                if not self._unwind(r, inst):
                    if self.parent is not None:
                        raise
                    self._uncaught(r, inst)
            except Unsupported as e:
                self._note_break(e)
                raise
            except GuardOnDataDependentSymNode as e:
                # A decision that needs a number read from data (an unbacked size,
                # compared deep inside torch): a graph break here, never a guess.
                cause = str(e).splitlines()[0] if str(e) else type(e).__name__
                err = Unsupported(f"a decision on a value read from data ({cause})")
                self._note_break(err)
                raise err from None
            steps += 1
            if steps > MAX_INSTRUCTIONS:
                unsupported(f"more than {MAX_INSTRUCTIONS} instructions traced (a very long loop?)")
        return self.return_value

    def _note_break(self, e: Unsupported):
        # Innermost frame first to be seen; each caller goes in front of it.
        e.user_stack.insert(0, frame_summary(self.code, self.lineno))
        if self.parent is None and not e.whole_frame:
            e.break_index = self.ip - 1

    def user_location(self):
        return frame_summary(self.code, self.lineno)

    # ------------------------------------------------------------ exceptions
    def _unwind(self, r: TracedRaise, inst) -> bool:
        """CPython's exception unwinding in this frame: the stack cut to the handler's
        depth, the instruction's offset pushed if the entry asks, then the exception.
        False if no handler covers `inst` (the caller's frame gets it)."""
        if self.parent is None and inst.opname != "RERAISE" and isinstance(r.exc, ExceptionVar):
            # Where the exception entered this frame (RERAISE passes on one that did).
            r.exc.root_origin = self.ip - 1
        entry = handler_for(self.code, inst.offset)
        if entry is None:
            return False
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(ConstVar(inst.offset))
        self.push(r.exc)
        self.ip = self.index_of[entry.target]
        return True

    def _uncaught(self, r: TracedRaise, inst):
        """An exception leaves the frame being compiled: the graph breaks at the
        instruction it came from, where CPython raises it (with its handlers)."""
        e = Unsupported(r.reason)
        e.user_stack.insert(0, frame_summary(self.code, self.lineno))
        origin = getattr(r.exc, "root_origin", None)
        e.break_index = self.ip - 1 if origin is None else origin
        raise e from None

    # ------------------------------------------------------------ helpers
    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, inst):
        self.ip = self.index_of[inst.argval]

    def realize(self, v):
        if type(v) is Lazy:
            return v.wrap(self)
        return v

    def _local(self, name):
        try:
            v = self.locals[name]
        except KeyError:
            unsupported(f"local variable {name!r} referenced before assignment")
        if type(v) is Lazy:
            v = self.locals[name] = v.wrap(self)
        return v

    # ------------------------------------------------------------ no-ops
    def NOP(self, inst):
        pass

    RESUME = PRECALL = CACHE = EXTENDED_ARG = NOP

    # ------------------------------------------------------------ stack
    def POP_TOP(self, inst):
        self.pop()

    def PUSH_NULL(self, inst):
        self.push(NULL)

    def COPY(self, inst):
        self.push(self.stack[-inst.arg])

    def SWAP(self, inst):
        i = inst.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    # ------------------------------------------------------------ locals, cells
    def LOAD_CONST(self, inst):
        if inst.argval is enumerate or inst.argval is zip:   # a resume function's prologue
            self.push(wrap(self, inst.argval, None, guard=False))
            return
        self.push(ConstVar(inst.argval))

    def RETURN_CONST(self, inst):
        self.return_value = ConstVar(inst.argval)

    def LOAD_FAST(self, inst):
        self.push(self._load_fast(inst.argval))

    def _load_fast(self, name):
        if PY313 and name in self.cells and name not in self.locals:
            # 3.13 loads a cell for a closure with LOAD_FAST (LOAD_CLOSURE is gone)
            return CellRefVar(self.cells[name])
        return self._local(name)

    LOAD_FAST_CHECK = LOAD_FAST

    # 3.13's superinstructions: argval is the pair of names, the first one's slot in
    # the high bits (STORE_FAST_STORE_FAST stores the top of the stack to it).
    def LOAD_FAST_LOAD_FAST(self, inst):
        first, second = inst.argval
        self.push(self._load_fast(first))
        self.push(self._load_fast(second))

    def STORE_FAST_STORE_FAST(self, inst):
        first, second = inst.argval
        self._store_fast(first, self.pop())
        self._store_fast(second, self.pop())

    def STORE_FAST_LOAD_FAST(self, inst):
        store, load = inst.argval
        self._store_fast(store, self.pop())
        self.push(self._load_fast(load))

    def LOAD_FAST_AND_CLEAR(self, inst):
        # 3.12 inlined comprehensions save the outer binding and restore it after.
        v = self.locals.pop(inst.argval, None)
        self.push(NULL if v is None else self.realize(v))

    def STORE_FAST(self, inst):
        self._store_fast(inst.argval, self.pop())

    def _store_fast(self, name, v):
        if v is NULL:
            self.locals.pop(name, None)
        else:
            self.locals[name] = v

    def DELETE_FAST(self, inst):
        self.locals.pop(inst.argval, None)

    def MAKE_CELL(self, inst):
        name = inst.argval
        self.cells[name] = Cell(self.locals.pop(name, None))

    def COPY_FREE_VARS(self, inst):
        for name, cell in zip(self.code.co_freevars, self.closure):
            self.cells[name] = cell

    def _cell(self, name) -> Cell:
        try:
            return self.cells[name]
        except KeyError:
            unsupported(f"closure variable {name!r} is not available")

    def LOAD_DEREF(self, inst):
        cell = self._cell(inst.argval)
        v = cell.value
        if v is None:
            unsupported(f"free variable {inst.argval!r} referenced before assignment")
        if type(v) is Lazy:
            v = cell.value = v.wrap(self)
        self.push(v)

    def STORE_DEREF(self, inst):
        cell = self._cell(inst.argval)
        cell.value = self.pop()
        if cell.source is not None:
            self.side_effects.store_cell(cell, cell.value)

    def LOAD_CLOSURE(self, inst):
        self.push(CellRefVar(self._cell(inst.argval)))

    def _globals_anchor(self):
        """None for the frame's own globals (guards read them as ___G); a ConstSource
        for the globals of a function from another module, inlined here."""
        if self.f_globals is self.root.f_globals:
            return None
        return ConstSource(self.f_globals, f"{self.f_globals.get('__name__', '?')}.globals()")

    def _global_source(self, name):
        anchor = self._globals_anchor()
        return GlobalSource(name) if anchor is None else GetItemSource(anchor, name)

    def LOAD_GLOBAL(self, inst):
        name = inst.argval
        if inst.arg & 1 and not PY313:
            self.push(NULL)
        self._load_global(name)
        if inst.arg & 1 and PY313:
            self.push(NULL)

    def _load_global(self, name):
        written = self.side_effects.load_global(self.f_globals, name)
        if written is not None:
            self.push(written)
        elif name in self.f_globals:
            self.push(wrap(self, self.f_globals[name], self._global_source(name)))
        elif name in self.f_builtins:
            # That no global shadows it, and the builtin itself (`builtins.abs = ...`
            # is legal); for the frame's own builtins, an `is` on a dict lookup.
            self.guards.not_shadowed(self._globals_anchor(), name)
            guard = self.f_builtins is self.root.f_builtins
            self.push(wrap(self, self.f_builtins[name], BuiltinSource(name), guard=guard))
        else:
            unsupported(f"name {name!r} is not defined")

    def STORE_GLOBAL(self, inst):
        self.side_effects.store_global(self.f_globals, inst.argval, self.pop(),
                                       self.f_globals is self.root.f_globals)

    def MAKE_FUNCTION(self, inst):
        code = self.pop().as_const()
        if PY313:
            # (3.13: the parts come after, one SET_FUNCTION_ATTRIBUTE each)
            self.push(make_function(self, code, [], {}, []))
            return
        flags = inst.arg
        cells = [ref.cell for ref in self.pop().items] if flags & 0x08 else []
        annotations = self.pop().unpack(self) if flags & 0x04 else None
        kwdefaults = dict(self.pop().items) if flags & 0x02 else {}
        # Defaults all constants are one folded constant tuple (LOAD_CONST (None,)).
        defaults = self.pop().unpack(self) if flags & 0x01 else []
        self.push(make_function(self, code, defaults, kwdefaults, cells, annotations))

    def SET_FUNCTION_ATTRIBUTE(self, inst):  # 3.13
        fn = self.pop()
        value = self.pop()
        if not isinstance(fn, NestedFunctionVar) or set(fn.attrs) - {"__annotations__"}:
            unsupported(f"setting function attribute {inst.arg:#x} of {fn}")
        defaults, kwdefaults, cells = fn.defaults, fn.kwdefaults, fn.cells
        annotations = fn.attrs.get("__annotations__")
        if inst.arg == 0x08:
            cells = [ref.cell for ref in value.items]
        elif inst.arg == 0x02:
            kwdefaults = dict(value.items)
        elif inst.arg == 0x01:
            defaults = value.unpack(self)
        elif inst.arg == 0x04:
            annotations = value.unpack(self)
        else:
            unsupported(f"function attribute {inst.arg:#x}")
        # (the function is still only on the stack: a new Var for it is the same object)
        self.push(make_function(self, fn.code, defaults, kwdefaults, cells, annotations))

    # ------------------------------------------------------------ inlining
    def inline_call(self, code, f_globals, bound: dict, closure: list, qualname: str) -> Var:
        """Run a function's bytecode in a child interpreter over the same graph."""
        if self.depth >= MAX_INLINE_DEPTH:
            unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} calls (recursion?)")
        if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE):
            unsupported(f"calling coroutine function {qualname}")
        self.guards.inlined.append(code)
        child = InstructionTranslator(code, _FunctionShim(f_globals, self.f_builtins), (),
                                      self.output, self.guards, parent=self)
        for name, v in bound.items():
            child.locals[name] = v
        child.closure = list(closure)
        if code.co_flags & inspect.CO_GENERATOR and self.take_generator_frame:
            self.take_generator_frame = False
            child.generator = True
            return GeneratorFrameVar(child)
        if code.co_flags & inspect.CO_GENERATOR:
            # A generator's body runs lazily, as CPython's: up to the next yield on each
            # next(), so no item is computed that the caller does not consume.
            if has_cleanup(code):
                # CPython runs its finally/with exits when the generator is closed or
                # collected, which a trace cannot place.
                unsupported(f"generator {qualname} with try/finally or with")
            child.generator = True
            return InlinedGeneratorVar(child, pure_generator(code))
        self.root.code_runs += 1
        return child.run()

    # ------------------------------------------------------------ attributes
    def _getattr(self, obj, name):
        if name == "__class__":
            cls = plain_class_of(self, obj)
            if cls is not None:
                return cls
        return obj.getattr(self, name)

    def LOAD_ATTR(self, inst):
        obj = self.pop()
        # (a method is pushed bound, with the NULL a plain call has)
        if PY312 and not PY313 and inst.arg & 1:
            self.push(NULL)
        self.push(self._getattr(obj, inst.argval))
        if PY313 and inst.arg & 1:
            self.push(NULL)

    def STORE_ATTR(self, inst):
        obj = self.pop()
        value = self.pop()
        obj.setattr(self, inst.argval, value)

    def LOAD_SUPER_ATTR(self, inst):  # 3.12
        obj = self.pop()
        cls = self.pop()
        self.pop()                                      # the global `super`
        attr = SuperVar(cls, obj).getattr(self, inst.argval)
        if inst.arg & 1 and not PY313:
            self.push(NULL)
        self.push(attr)
        if inst.arg & 1 and PY313:
            self.push(NULL)

    def zero_arg_super(self):
        """super() inside a method: the __class__ cell and the first argument."""
        cell = self.cells.get("__class__")
        # (In a resume code, the original's first argument: a cell, or its first local.)
        original = original_code(self.code)
        if cell is None or not original.co_argcount:
            unsupported("super() without __class__ cell")
        first = original.co_varnames[0]
        obj = self.cells[first].value if first in self.cells else self._local(first)
        cls = cell.value
        if type(cls) is Lazy:
            cls = cell.value = wrap(self, cls.value, cls.source)
        return SuperVar(cls, self.realize(obj))

    def LOAD_METHOD(self, inst):  # 3.11
        obj = self.pop()
        self.push(NULL)
        self.push(self._getattr(obj, inst.argval))

    # ------------------------------------------------------------ calls
    def KW_NAMES(self, inst):
        # 3.11's dis does not resolve this constant.
        self.kw_names = self.code.co_consts[inst.arg]

    def CALL(self, inst):
        kw, self.kw_names = self.kw_names, ()
        self._call(inst.arg, kw)

    def CALL_KW(self, inst):  # 3.13: the names are a constant tuple on the stack
        names = self.pop()
        if not names.is_const():
            unsupported(f"keyword names {names}")
        self._call(inst.arg, names.as_const())

    def _call(self, nargs, kw):
        args = self.popn(nargs)
        upper = self.pop()
        lower = self.pop()
        # [NULL, fn] up to 3.12, [fn, NULL] from 3.13; [method, self] on both.
        if lower is NULL:
            fn = upper
        elif upper is NULL:
            fn = lower
        else:
            fn, args = lower, [upper, *args]
        kwargs = {}
        if kw:
            kwargs = dict(zip(kw, args[-len(kw):]))
            args = args[:-len(kw)]
        self.push(fn.call(self, list(args), kwargs))

    def CALL_FUNCTION_EX(self, inst):
        kwargs = self.pop() if inst.arg & 1 else None
        args = self.pop()
        if PY313:
            null = self.pop()
            fn = self.pop()
        else:
            fn = self.pop()
            null = self.pop()
        if null is not NULL:
            unsupported("CALL_FUNCTION_EX without NULL")
        kw = {}
        if kwargs is not None:
            kw = mapping_items(self, kwargs)
            if kw is None:
                unsupported(f"**{kwargs}")
        self.push(fn.call(self, args.unpack(self), kw))

    # ------------------------------------------------------------ operators
    def BINARY_OP(self, inst):
        b = self.pop()
        a = self.pop()
        symbol = dis._nb_ops[inst.arg][1]
        if symbol not in BINARY_OPS:
            unsupported(f"binary operator {symbol}")
        self.push(binary_op(self, BINARY_OPS[symbol], a, b))

    def COMPARE_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(binary_op(self, COMPARE_OPS[inst.argval], a, b))

    def IS_OP(self, inst):
        b = self.pop()
        a = self.pop()
        same = is_same(a, b, self)
        self.push(ConstVar(same != bool(inst.arg)))

    def CONTAINS_OP(self, inst):
        container = self.pop()
        item = self.pop()
        self.push(ConstVar(contains(self, container, item) != bool(inst.arg)))

    def UNARY_NEGATIVE(self, inst):
        self.push(unary_op(self, operator.neg, self.pop()))

    def UNARY_POSITIVE(self, inst):
        self.push(unary_op(self, operator.pos, self.pop()))

    def UNARY_INVERT(self, inst):
        self.push(unary_op(self, operator.invert, self.pop()))

    def UNARY_NOT(self, inst):
        self.push(ConstVar(not self.pop().truth(self)))

    def TO_BOOL(self, inst):  # 3.13
        # What it pushes is only ever read by the next instruction (a conditional
        # jump, or UNARY_NOT), which takes the truth of the value it is given: the
        # value stays, its truth is taken once, there.  (codegen's jumps emit TO_BOOL
        # again where CPython runs that instruction at a break.)
        pass

    # ------------------------------------------------------------ subscripts
    def BINARY_SUBSCR(self, inst):
        key = self.pop()
        container = self.pop()
        self.push(container.getitem(self, key))

    def STORE_SUBSCR(self, inst):
        key = self.pop()
        container = self.pop()
        value = self.pop()
        container.setitem(self, key, value)

    def DELETE_SUBSCR(self, inst):
        key = self.pop()
        container = self.pop()
        delitem = container.delitem
        if delitem is not None:
            delitem(self, key)
        elif isinstance(container, ListVar) and type(container).call_method is ListVar.call_method \
                or isinstance(container, DequeVar):
            delete_list_item(self, container, key)
        else:
            unsupported(f"del on {container}")

    def BINARY_SLICE(self, inst):  # 3.12
        end = self.pop()
        start = self.pop()
        container = self.pop()
        self.push(container.getitem(self, make_slice([start, end], self)))

    def STORE_SLICE(self, inst):  # 3.12
        end = self.pop()
        start = self.pop()
        container = self.pop()
        value = self.pop()
        container.setitem(self, make_slice([start, end], self), value)

    def BUILD_SLICE(self, inst):
        self.push(make_slice(self.popn(inst.arg), self))

    # ------------------------------------------------------------ building
    def BUILD_TUPLE(self, inst):
        self.push(TupleVar(self.popn(inst.arg)))

    def BUILD_LIST(self, inst):
        self.push(ListVar(self.popn(inst.arg)))

    def BUILD_MAP(self, inst):
        flat = self.popn(2 * inst.arg)
        d = DictVar({})
        for k, v in zip(flat[0::2], flat[1::2]):
            d.store_key(k, v)
        self.push(d)

    def BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop().as_const()
        values = self.popn(inst.arg)
        self.push(DictVar(dict(zip(keys, values))))

    def BUILD_STRING(self, inst):
        parts = self.popn(inst.arg)
        lazy = lazily_joined(parts)
        self.push(lazy if lazy is not None else ConstVar("".join(p.as_const() for p in parts)))

    def BUILD_SET(self, inst):
        self.push(SetVar.of_vars(self, self.popn(inst.arg)))

    def SET_ADD(self, inst):
        v = self.pop()
        self.stack[-inst.arg].call_method(self, "add", [v], {})

    def SET_UPDATE(self, inst):
        v = self.pop()
        self.stack[-inst.arg].call_method(self, "update", [v], {})

    # The list or dict a display builds is the frame's own, except in a resume
    # function, which gets it as an argument (a break inside `[*a, *f()]`): then
    # the change is a side effect on it, written back.
    def LIST_APPEND(self, inst):
        v = self.pop()
        target = self.stack[-inst.arg]
        target._check_mutable(self)
        target.items.append(v)

    def LIST_EXTEND(self, inst):
        v = self.pop()
        target = self.stack[-inst.arg]
        target._check_mutable(self)
        target.items.extend(v.unpack(self))

    def LIST_TO_TUPLE(self, inst):  # 3.11
        self.push(TupleVar(self.pop().unpack(self)))

    def DICT_UPDATE(self, inst):
        v = self.pop()
        items = mapping_items(self, v)
        if items is None:
            unsupported(f"dict update with {v}")
        target = self.stack[-inst.arg]
        target._mutating(self)
        target.items.update(items)

    DICT_MERGE = DICT_UPDATE

    def MAP_ADD(self, inst):
        value = self.pop()
        key = self.pop()
        target = self.stack[-inst.arg]
        target._mutating(self)
        target.store_key(key, value)

    def CALL_INTRINSIC_1(self, inst):  # 3.12
        name = inst.argrepr
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(TupleVar(self.pop().unpack(self)))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            self.push(unary_op(self, operator.pos, self.pop()))
        elif name == "INTRINSIC_STOPITERATION_ERROR":
            exc = self.pop()
            if isinstance(exc, ExceptionVar) and issubclass(exc.cls, StopIteration):
                stop_iteration_error(self, exc)
            self.push(exc)
        else:
            unsupported(f"{name}")

    def UNPACK_SEQUENCE(self, inst):
        items = self.pop().unpack(self)
        if len(items) != inst.arg:
            unsupported(f"unpacking {len(items)} values into {inst.arg}")
        self.stack.extend(reversed(items))

    def UNPACK_EX(self, inst):
        items = self.pop().unpack(self)
        before, after = inst.arg & 0xFF, inst.arg >> 8
        if len(items) < before + after:
            unsupported("not enough values to unpack")
        middle = items[before:len(items) - after]
        self.stack.extend(reversed(items[len(items) - after:]))
        self.push(ListVar(middle))
        self.stack.extend(reversed(items[:before]))

    def FORMAT_VALUE(self, inst):  # 3.11, 3.12
        spec = self.pop().as_const() if inst.arg & 0x04 else ""
        value = self.pop()
        self.push(format_value(self, value, inst.arg & 0x03, spec))

    # 3.13 splits FORMAT_VALUE: CONVERT_VALUE (str, repr, ascii), then FORMAT_SIMPLE or
    # FORMAT_WITH_SPEC.  A converted value is a str, formatted with '' as itself.
    def CONVERT_VALUE(self, inst):
        self.push(format_value(self, self.pop(), inst.arg, ""))

    def FORMAT_SIMPLE(self, inst):
        value = self.pop()
        self.push(value if isinstance(value, FormattedVar) else format_value(self, value, 0, ""))

    def FORMAT_WITH_SPEC(self, inst):
        spec = self.pop().as_const()
        value = self.pop()
        if isinstance(value, FormattedVar) and len(value.pieces) == 1 and \
                not isinstance(value.pieces[0], str) and value.pieces[0][2] == "":
            # format(conv(x), spec), as 3.12's FORMAT_VALUE makes it in one piece
            number, conv, _ = value.pieces[0]
            self.push(FormattedVar([(number, conv, spec)]))
            return
        self.push(format_value(self, value, 0, spec))

    # ------------------------------------------------------------ control flow
    def JUMP_FORWARD(self, inst):
        self.jump(inst)

    JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = JUMP = JUMP_FORWARD

    def POP_JUMP_IF_FALSE(self, inst):
        cond = self.pop()
        if assert_in_graph(self, cond, negate=True) or not cond.truth(self):
            self.jump(inst)

    def POP_JUMP_IF_TRUE(self, inst):
        cond = self.pop()
        # (`assert t, "msg"` on a tensor: a check in the graph, variables/asserts.py)
        if assert_in_graph(self, cond, negate=False) or cond.truth(self):
            self.jump(inst)

    def POP_JUMP_IF_NONE(self, inst):
        if self._is_none(self.pop()):
            self.jump(inst)

    def POP_JUMP_IF_NOT_NONE(self, inst):
        if not self._is_none(self.pop()):
            self.jump(inst)

    def _is_none(self, v: Var) -> bool:
        if isinstance(v, OpaqueVar):
            # Data from CPython is never None when traced, but may be on a later call.
            if v.source is None:
                unsupported(f"testing a {v.kind.__name__} computed after a graph break for None")
            self.guards.not_none(v.source)
            return False
        return is_none(v)

    def JUMP_IF_FALSE_OR_POP(self, inst):  # 3.11
        if not self.stack[-1].truth(self):
            self.jump(inst)
        else:
            self.pop()

    def JUMP_IF_TRUE_OR_POP(self, inst):  # 3.11
        if self.stack[-1].truth(self):
            self.jump(inst)
        else:
            self.pop()

    def GET_ITER(self, inst):
        self.push(iter_of(self, self.pop()))

    def FOR_ITER(self, inst):
        it = self.stack[-1]
        if not isinstance(it, IteratorVar):
            unsupported(f"iterating over {it}")
        v = it.next()
        if v is not None:
            self.push(v)
            return
        self.pop()
        self.jump(inst)
        # 3.12 jumps to END_FOR and skips it; 3.13 skips END_FOR and the POP_TOP after.
        if PY312 and self.instructions[self.ip].opname == "END_FOR":
            self.ip += 1
            if PY313 and self.instructions[self.ip].opname == "POP_TOP":
                self.ip += 1

    def END_FOR(self, inst):  # 3.12 (two values); 3.13 (one, a POP_TOP follows)
        self.popn(1 if PY313 else 2)

    def IMPORT_NAME(self, inst):
        fromlist = self.pop().as_const()
        level = self.pop().as_const()
        # Importing runs for real: the module is normally loaded already, and either
        # way the program's state afterwards is what CPython would leave.
        try:
            module = __import__(inst.argval, self.f_globals, None, fromlist, level)
        except Exception as e:
            # CPython raises it at this point of the frame (an optional dependency's
            # ImportError, say): the frame runs there.
            unsupported(f"import {inst.argval} raised {type(e).__name__}: {e}")
        self.push(wrap(self, module, None, guard=False))

    def IMPORT_FROM(self, inst):
        self.push(self.stack[-1].getattr(self, inst.argval))

    def BEFORE_WITH(self, inst):
        ctx = self.pop()
        enter = ctx.enter
        if enter is None:
            user = user_context(self, ctx)
            if user is None:
                unsupported(f"'with' over {ctx}")
            ctx, enter = user, user.enter
        self.push(ExitVar(ctx))
        self.push(enter(self))

    def RETURN_GENERATOR(self, inst):
        self.push(ConstVar(None))     # what the generator is first resumed with

    def YIELD_VALUE(self, inst):
        if not self.generator:
            unsupported("yield outside an inlined generator")
        value = self.pop()
        self.push(ConstVar(None))     # the value sent back: next() sends None
        raise Yield(value)

    def RETURN_VALUE(self, inst):
        value = self.pop()
        if self.parent is None:
            freeze_returned_iterators(self, value)
        self.return_value = value

    def LOAD_ASSERTION_ERROR(self, inst):
        self.push(wrap(self, AssertionError, None, guard=False))

    def RAISE_VARARGS(self, inst):
        if inst.arg == 0:
            handled = self.root.exc_handled
            if handled is UNKNOWN:
                unsupported("bare raise of the exception the caller was handling")
            if not is_exception(handled):
                unsupported("bare raise with no active exception (RuntimeError)")
            raise TracedRaise(handled, fresh=False)
        cause = self.pop() if inst.arg == 2 else None
        exc = exception_of(self, self.pop())
        if cause is not None:
            if not is_none(cause):
                cause = exception_of(self, cause)
            exc.setattr(self, "__cause__", cause)
        throw(exc)

    def RERAISE(self, inst):
        exc = self.pop()
        if not is_exception(exc):
            unsupported(f"re-raising {exc}")
        raise TracedRaise(exc, fresh=False)

    def PUSH_EXC_INFO(self, inst):
        exc = self.pop()
        root = self.root
        if root.exc_handled is UNKNOWN:
            # What POP_EXCEPT puts back: the caller's exception, never read by the trace.
            self.push(CallerExceptionVar())
        else:
            self.push(root.exc_handled)
        root.exc_handled = exc
        self.push(exc)

    def POP_EXCEPT(self, inst):
        prev = self.pop()
        self.root.exc_handled = UNKNOWN if isinstance(prev, CallerExceptionVar) else prev

    def CHECK_EXC_MATCH(self, inst):
        classes = _class_value(self.pop())
        self.push(ConstVar(matches(self.stack[-1], classes)))

    def WITH_EXCEPT_START(self, inst):
        exc = self.stack[-1]
        exit_fn = self.stack[-4]
        cls = wrap(self, exc.python_type(), None, guard=False)
        self.push(exit_fn.call(self, [cls, exc, TracebackVar()], {}))

    # ------------------------------------------------------------ deleting
    def DELETE_ATTR(self, inst):
        obj = self.pop()
        delattr_ = obj.delattr
        if delattr_ is None:
            unsupported(f"del of attribute {inst.argval!r} of {obj}")
        delattr_(self, inst.argval)

    def DELETE_DEREF(self, inst):
        cell = self._cell(inst.argval)
        if cell.value is None:
            unsupported(f"free variable {inst.argval!r} referenced before assignment (NameError)")
        if cell.source is not None or self.parent is None:
            # The compiled frame's own cells are set by its transformed code, which
            # only stores values: CPython deletes it, at a graph break.
            unsupported(f"del of closure variable {inst.argval!r}")
        cell.value = None

    def DELETE_GLOBAL(self, inst):
        unsupported(f"del of global {inst.argval!r}")

    # ------------------------------------------------------------ match statements
    # Each leaves the subject on the stack, as CPython's; which patterns match is
    # decided on the types the trace knows (guarded where they came from).
    def GET_LEN(self, inst):
        self.push(_len(self, [self.stack[-1]], {}))

    def MATCH_SEQUENCE(self, inst):
        self.push(ConstVar(is_sequence_subject(self.stack[-1])))

    def MATCH_MAPPING(self, inst):
        self.push(ConstVar(is_mapping_subject(self.stack[-1])))

    def MATCH_KEYS(self, inst):
        self.push(match_keys(self, self.stack[-2], self.stack[-1]))

    def MATCH_CLASS(self, inst):
        names = self.pop().as_const()
        cls_var = self.pop()
        subject = self.pop()
        self.push(match_class(self, subject, cls_var, inst.arg, names))

    # ------------------------------------------------------------ yield from
    def GET_YIELD_FROM_ITER(self, inst):
        v = self.stack[-1]
        if not isinstance(v, InlinedGeneratorVar):
            self.stack[-1] = iter_of(self, v)

    def SEND(self, inst):
        sent = self.pop()
        receiver = self.stack[-1]
        if isinstance(receiver, InlinedGeneratorVar):
            value = receiver.resume(self, sent)
            returned = receiver.returned
        elif isinstance(receiver, IteratorVar) and is_none(sent):
            value, returned = receiver.next(), ConstVar(None)
        else:
            unsupported(f"send() to {receiver}")
        if value is not None:
            self.push(value)
            return
        # Exhausted: the generator's return value is what `yield from` gives.
        if PY312:
            self.push(returned)         # END_SEND, at the target, drops the receiver
        else:
            self.stack[-1] = returned
        self.jump(inst)

    def END_SEND(self, inst):  # 3.12
        value = self.pop()
        self.stack[-1] = value

    def CLEANUP_THROW(self, inst):  # 3.12: a throw() into a `yield from`
        unsupported("an exception thrown into a generator")

    # ------------------------------------------------------------ stopping there
    # Opcodes a function body can hold that the trace does not follow: the frame
    # stops there (they make classes, or belong to coroutines, which are not inlined).
    def LOAD_BUILD_CLASS(self, inst):
        unsupported("a class statement")

    def _coroutine_op(self, inst):
        unsupported(f"{inst.opname} (coroutines are not traced)")

    GET_AWAITABLE = GET_AITER = GET_ANEXT = END_ASYNC_FOR = BEFORE_ASYNC_WITH = \
        ASYNC_GEN_WRAP = _coroutine_op

    def CALL_INTRINSIC_2(self, inst):  # 3.12: except* and generic type parameters
        unsupported(f"{inst.argrepr}")


class _FunctionShim:
    """What InstructionTranslator reads of a function, for inlined code."""
    __slots__ = ("__globals__", "__builtins__", "__closure__")

    def __init__(self, f_globals, f_builtins):
        self.__globals__ = f_globals
        self.__builtins__ = f_globals.get("__builtins__", f_builtins)
        self.__closure__ = None


# --------------------------------------------------------------------------- versions
# What differs between the versions, by opcode (the handlers above test PY312/PY313):
#
# 3.11: PRECALL before CALL, KW_NAMES before it; LOAD_METHOD; jumps spelt with a
#   direction (mapped below); JUMP_IF_*_OR_POP; LIST_TO_TUPLE.
# 3.12: [NULL, callable] under a call's arguments (LOAD_GLOBAL, LOAD_ATTR's low bit,
#   LOAD_SUPER_ATTR push the NULL first); END_FOR pops two; BINARY_SLICE, STORE_SLICE,
#   RETURN_CONST, LOAD_FAST_AND_CLEAR (inlined comprehensions), CALL_INTRINSIC_1/2,
#   END_SEND, CLEANUP_THROW.
# 3.13: [callable, NULL]: the NULL goes above (LOAD_GLOBAL, LOAD_ATTR, LOAD_SUPER_ATTR,
#   PUSH_NULL after the callable; CALL and CALL_FUNCTION_EX read it there);
#   CALL_KW (the names a constant on the stack) replaces KW_NAMES;
#   LOAD_FAST_LOAD_FAST, STORE_FAST_STORE_FAST, STORE_FAST_LOAD_FAST (pairs of names);
#   TO_BOOL before conditional jumps and UNARY_NOT, which need an exact bool (COMPARE_OP's
#   bit 16 makes its result a bool; argval stays the operator); CONVERT_VALUE,
#   FORMAT_SIMPLE, FORMAT_WITH_SPEC replace FORMAT_VALUE; MAKE_FUNCTION takes only the
#   code, SET_FUNCTION_ATTRIBUTE sets defaults, kwdefaults, annotations, closure;
#   FOR_ITER's exit skips END_FOR and the POP_TOP after it (END_FOR pops one);
#   locals() is a FrameLocalsProxy in a function (PEP 667): frame_locals breaks.
# 3.14 (not supported: the C hook refuses to build, see _C/evalframe.c):
#   frames hold _PyStackRef (tagged) slots, not PyObject*, so the hook cannot pass them
#   to a vectorcall as they are; LOAD_SMALL_INT (small ints no longer LOAD_CONST);
#   LOAD_FAST_BORROW / LOAD_FAST_BORROW_LOAD_FAST_BORROW (LOAD_FAST for our purposes);
#   LOAD_SPECIAL (__enter__/__exit__ looked up as methods) replaces BEFORE_WITH, and
#   WITH_EXCEPT_START finds exit function and self under the exception;
#   BINARY_SUBSCR becomes BINARY_OP with NB_SUBSCR; RETURN_CONST and BUILD_CONST_KEY_MAP
#   are gone (LOAD_CONST + RETURN_VALUE, BUILD_MAP); CALL_FUNCTION_EX always takes a
#   kwargs slot (NULL when none); LOAD_CONST_IMMORTAL/LOAD_CONST_MORTAL in the
#   specialized forms; POP_ITER ends a for loop; annotations are lazy (__annotate__,
#   SET_FUNCTION_ATTRIBUTE 0x10).  The hook refusing 3.14, none of this runs there; the
#   handlers that would misread a 3.14 stack (CALL_FUNCTION_EX, WITH_EXCEPT_START,
#   BINARY_OP's new operator) are what the port must change, and a new opcode has no
#   handler: an Unsupported, the frame runs in CPython.

# --------------------------------------------------------------------------- dispatch
# One handler per opcode name.  3.11 spells its conditional jumps with a direction;
# they behave as 3.12's (dis resolves the target offsets).
_DISPATCH = {name: getattr(InstructionTranslator, name) for name in dir(InstructionTranslator)
             if name.isupper()}
if not PY312:
    for _direction in ("FORWARD", "BACKWARD"):
        for _cond in ("FALSE", "TRUE", "NONE", "NOT_NONE"):
            _DISPATCH[f"POP_JUMP_{_direction}_IF_{_cond}"] = _DISPATCH[f"POP_JUMP_IF_{_cond}"]
