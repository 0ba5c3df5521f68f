"""The symbolic bytecode interpreter.

It runs a frame's bytecode the way ceval.c does, but over Vars: torch operations go
into the FX graph (through `OutputGraph.call`), Python logic on values known at trace
time is evaluated now and guarded, and anything else raises Unsupported.  Every opcode
has one handler, a method named after it; the few differences between 3.11 and 3.12
live in the table at the end of this file.
"""
from __future__ import annotations

import dis
import operator
import sys

import torch

from .exc import Unsupported, frame_summary
from .side_effects import SideEffects
from .source import (BuiltinSource, ClosureCellSource, ClosureSource, ConstSource, GetItemSource, GlobalSource,
                     LocalSource)
from .variables import (NULL, ConstVar, DictVar, IteratorVar, ListVar, ObjectVar, TensorVar,
                        TupleVar, Var, unsupported)
from .variables.builder import wrap
from .variables.constant import BINARY_FOLD
from .variables.functions import Cell, CellRefVar, NestedFunctionVar
from .variables.containers import SizeVar
from .variables.symbolic import SliceVar, SymNodeVar

PY312 = sys.version_info >= (3, 12)

# Symbols of BINARY_OP's argument (dis._nb_ops) to operator functions.
_BINARY_OPS = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_,
    "**": operator.pow, ">>": operator.rshift, "-": operator.sub, "/": operator.truediv,
    "^": operator.xor,
    "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv,
    "<<=": operator.ilshift, "@=": operator.imatmul, "*=": operator.imul,
    "%=": operator.imod, "|=": operator.ior, "**=": operator.ipow, ">>=": operator.irshift,
    "-=": operator.isub, "/=": operator.itruediv, "^=": operator.ixor,
}
_INPLACE_TO_PLAIN = {operator.iadd: operator.add, operator.iand: operator.and_,
                     operator.ifloordiv: operator.floordiv, operator.ilshift: operator.lshift,
                     operator.imatmul: operator.matmul, operator.imul: operator.mul,
                     operator.imod: operator.mod, operator.ior: operator.or_,
                     operator.ipow: operator.pow, operator.irshift: operator.rshift,
                     operator.isub: operator.sub, operator.itruediv: operator.truediv,
                     operator.ixor: operator.xor}
_SET_DUNDERS = {operator.or_: "__or__", operator.and_: "__and__", operator.sub: "__sub__",
                operator.xor: "__xor__", operator.eq: "__eq__", operator.ne: "__ne__",
                operator.le: "issubset", operator.ge: "issuperset"}
_COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
                ">": operator.gt, ">=": operator.ge}

# Unrolled loops are bounded: past this many instructions the frame is not traced.
MAX_INSTRUCTIONS = 200_000
# Inlining depth (bounded recursion of user functions).
MAX_INLINE_DEPTH = 48


class _Lazy:
    """A frame value not yet looked at: wrapped (and guarded) on first use, so unused
    arguments add no guards."""
    __slots__ = ("value", "source")

    def __init__(self, value, source):
        self.value = value
        self.source = source


class InstructionTranslator:
    """Traces one frame: `run()` interprets its bytecode to the return."""

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
        self.side_effects = SideEffects(_fresh_arg_sources(code)) if parent is None \
            else parent.side_effects
        self.instructions = _instructions(code)
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
        self.take_generator_frame = False   # the next generator called here is driven by
        #                                     its caller (contexts.GeneratorContextVar)
        if parent is None:
            from .resume import opaque_locals
            opaque = opaque_locals(code)
            for name, value in zip(code.co_varnames, args):
                if (name.startswith("___result") or name in opaque) and _is_data(value):
                    # Computed in CPython at a graph break (x.item(), open(...)): data,
                    # not a constant to specialize on.
                    self.locals[name] = OpaqueVar(value, LocalSource(name), guards=guards)
                else:
                    self.locals[name] = _Lazy(value, LocalSource(name))
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
        traced = Cell(_Lazy(cell.cell_contents, source) if _cell_full(cell) else None, source)
        traced.cell_source = ClosureCellSource(name, index)
        self.output.object_vars[id(cell)] = (cell, traced)
        return traced

    # ------------------------------------------------------------ running
    def run(self) -> Var | None:
        """Interpret to the return (its Var), or to `stop_at` (None)."""
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
            except Unsupported as e:
                # Innermost frame first to be seen; each caller goes in front of it.
                e.user_stack.insert(0, frame_summary(self.code, self.lineno))
                if self.parent is None:
                    e.break_index = self.ip - 1
                raise
            steps += 1
            if steps > MAX_INSTRUCTIONS:
                unsupported(f"more than {MAX_INSTRUCTIONS} instructions traced (a very long loop?)")
        return self.return_value

    def user_location(self):
        return frame_summary(self.code, self.lineno)

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
        if type(v) is _Lazy:
            return wrap(self, v.value, v.source)
        return v

    def _local(self, name):
        try:
            v = self.locals[name]
        except KeyError:
            unsupported(f"local variable {name!r} referenced before assignment")
        if type(v) is _Lazy:
            v = self.locals[name] = wrap(self, v.value, v.source)
        return v

    def frame_locals(self) -> Var:
        """What locals() returns here: a new dict of the bound locals, cells and free
        variables in CPython's order (the slots of the frame).  A resume frame answers
        with its original's names: its ___stackN/___resultN parameters are ours."""
        from .resume import original_code
        code = original_code(self.code)
        names = list(code.co_varnames)
        names += [n for n in code.co_cellvars if n not in names]
        names += list(code.co_freevars)
        items = {}
        for name in names:
            if name in self.cells:
                v = self.cells[name].value
                if type(v) is _Lazy:
                    v = self.cells[name].value = wrap(self, v.value, v.source)
            else:
                v = self._local(name) if name in self.locals else None
            if v is not None and v is not NULL:
                items[name] = v
        return DictVar(items)

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
        self.push(self._local(inst.argval))

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, inst):
        # 3.12 inlined comprehensions save the outer binding and restore it after.
        v = self.locals.pop(inst.argval, None)
        self.push(NULL if v is None else self.realize(v))

    def STORE_FAST(self, inst):
        v = self.pop()
        if v is NULL:
            self.locals.pop(inst.argval, None)
        else:
            self.locals[inst.argval] = v

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
        if type(v) is _Lazy:
            v = cell.value = wrap(self, v.value, v.source)
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
        if inst.arg & 1:
            self.push(NULL)
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
        flags = inst.arg
        cells = [ref.cell for ref in self.pop().items] if flags & 0x08 else []
        if flags & 0x04:
            self.pop()                                  # annotations: unused
        kwdefaults = dict(self.pop().items) if flags & 0x02 else {}
        defaults = self.pop().items if flags & 0x01 else []
        self.push(NestedFunctionVar(code, self.f_globals, list(defaults), kwdefaults, cells,
                                    code.co_qualname, in_root=self.parent is None))

    # ------------------------------------------------------------ inlining
    def inline_call(self, code, f_globals, bound: dict, closure: list, qualname: str) -> Var:
        """Run a function's bytecode in a child interpreter over the same graph."""
        if self.depth >= MAX_INLINE_DEPTH:
            unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} calls (recursion?)")
        if code.co_flags & (0x80 | 0x200 | 0x100):
            unsupported(f"calling coroutine function {qualname}")
        child = InstructionTranslator(code, _FunctionShim(f_globals, self.f_builtins), (),
                                      self.output, self.guards, parent=self)
        for name, v in bound.items():
            child.locals[name] = v
        child.closure = list(closure)
        if code.co_flags & 0x20 and self.take_generator_frame:
            from .variables.contexts import GeneratorFrameVar
            self.take_generator_frame = False
            child.generator = True
            return GeneratorFrameVar(child)
        if code.co_flags & 0x20:
            # A generator's body runs lazily, as CPython's: up to the next yield on each
            # next(), so no item is computed that the caller does not consume.
            from .variables.builtins import LazyIteratorVar
            if _has_cleanup(code):
                # CPython runs its finally/with exits when the generator is closed or
                # collected, which a trace cannot place.
                unsupported(f"generator {qualname} with try/finally or with")
            child.generator = True
            return LazyIteratorVar(_generator_items(child, _pure_generator(code)), _GENERATOR)
        self.root.code_runs += 1
        return child.run()

    # ------------------------------------------------------------ attributes
    def _getattr(self, obj, name):
        if name == "__class__":
            return wrap(self, obj.python_type(), None, guard=False)
        return obj.getattr(self, name)

    def LOAD_ATTR(self, inst):
        obj = self.pop()
        if PY312 and inst.arg & 1:
            self.push(NULL)
        self.push(self._getattr(obj, inst.argval))

    def STORE_ATTR(self, inst):
        obj = self.pop()
        value = self.pop()
        obj.setattr(self, inst.argval, value)

    def LOAD_SUPER_ATTR(self, inst):  # 3.12
        obj = self.pop()
        cls = self.pop()
        self.pop()                                      # the global `super`
        from .variables.objects import SuperVar
        attr = SuperVar(cls, obj).getattr(self, inst.argval)
        if inst.arg & 1:
            self.push(NULL)
        self.push(attr)

    def zero_arg_super(self):
        """super() inside a method: the __class__ cell and the first argument."""
        from .variables.objects import SuperVar
        cell = self.cells.get("__class__")
        if cell is None or not self.code.co_argcount:
            unsupported("super() without __class__ cell")
        first = self.code.co_varnames[0]
        obj = self.cells[first].value if first in self.cells else self._local(first)
        cls = cell.value
        if type(cls) is _Lazy:
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
        args = self.popn(inst.arg)
        self_or_fn = self.pop()
        fn_or_null = self.pop()
        if fn_or_null is NULL:
            fn = self_or_fn
        else:
            fn, args = fn_or_null, [self_or_fn, *args]
        kw, self.kw_names = self.kw_names, ()
        kwargs = {}
        if kw:
            kwargs = dict(zip(kw, args[-len(kw):]))
            args = args[:-len(kw)]
        self.push(fn.call(self, list(args), kwargs))

    def CALL_FUNCTION_EX(self, inst):
        kwargs = self.pop() if inst.arg & 1 else None
        args = self.pop()
        fn = self.pop()
        null = self.pop()
        if null is not NULL:
            unsupported("CALL_FUNCTION_EX without NULL")
        kw = {}
        if kwargs is not None:
            if not isinstance(kwargs, DictVar):
                unsupported(f"**{kwargs}")
            kw = dict(kwargs.items)
        self.push(fn.call(self, args.unpack(self), kw))

    # ------------------------------------------------------------ operators
    def BINARY_OP(self, inst):
        b = self.pop()
        a = self.pop()
        symbol = dis._nb_ops[inst.arg][1]
        self.push(binary_op(self, _BINARY_OPS[symbol], a, b))

    def COMPARE_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(binary_op(self, _COMPARE_OPS[inst.argval], a, b))

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
        delitem = getattr(container, "delitem", None)
        if delitem is None:
            unsupported(f"del on {container}")
        delitem(self, key)

    def BINARY_SLICE(self, inst):  # 3.12
        end = self.pop()
        start = self.pop()
        container = self.pop()
        self.push(container.getitem(self, _make_slice([start, end])))

    def STORE_SLICE(self, inst):  # 3.12
        end = self.pop()
        start = self.pop()
        container = self.pop()
        value = self.pop()
        container.setitem(self, _make_slice([start, end]), value)

    def BUILD_SLICE(self, inst):
        self.push(_make_slice(self.popn(inst.arg)))

    # ------------------------------------------------------------ building
    def BUILD_TUPLE(self, inst):
        self.push(TupleVar(self.popn(inst.arg)))

    def BUILD_LIST(self, inst):
        self.push(ListVar(self.popn(inst.arg)))

    def BUILD_MAP(self, inst):
        flat = self.popn(2 * inst.arg)
        keys, values = flat[0::2], flat[1::2]
        self.push(DictVar({_const_key(k): v for k, v in zip(keys, values)}))

    def BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop().as_const()
        values = self.popn(inst.arg)
        self.push(DictVar(dict(zip(keys, values))))

    def BUILD_STRING(self, inst):
        parts = self.popn(inst.arg)
        self.push(ConstVar("".join(p.as_const() for p in parts)))

    def BUILD_SET(self, inst):
        from .variables.builtins import SetVar
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
        if not isinstance(v, DictVar):
            unsupported(f"dict update with {v}")
        target = self.stack[-inst.arg]
        target._mutating(self)
        target.items.update(v.items)

    DICT_MERGE = DICT_UPDATE

    def MAP_ADD(self, inst):
        value = self.pop()
        key = self.pop()
        target = self.stack[-inst.arg]
        target._mutating(self)
        target.items[_const_key(key)] = value

    def CALL_INTRINSIC_1(self, inst):  # 3.12
        name = inst.argrepr
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(TupleVar(self.pop().unpack(self)))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            self.push(unary_op(self, operator.pos, self.pop()))
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

    def FORMAT_VALUE(self, inst):
        spec = self.pop().as_const() if inst.arg & 0x04 else ""
        value = self.pop()
        if not value.is_const():
            unsupported(f"formatting {value} into a string")
        v = value.as_const()
        conv = inst.arg & 0x03
        v = {0: v, 1: str(v) if conv == 1 else v, 2: repr(v), 3: ascii(v)}[conv] if conv else v
        self.push(ConstVar(format(v, spec)))

    # ------------------------------------------------------------ control flow
    def JUMP_FORWARD(self, inst):
        self.jump(inst)

    JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = JUMP = JUMP_FORWARD

    def POP_JUMP_IF_FALSE(self, inst):
        if not self.pop().truth(self):
            self.jump(inst)

    def POP_JUMP_IF_TRUE(self, inst):
        if self.pop().truth(self):
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
        from .variables.builtins import iter_of
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
        # 3.12 jumps to END_FOR and skips it.
        if PY312 and self.instructions[self.ip].opname == "END_FOR":
            self.ip += 1

    def END_FOR(self, inst):  # 3.12
        self.popn(2)

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
        enter = getattr(ctx, "enter", None)
        if enter is None:
            from .variables.contexts import user_context
            user = user_context(self, ctx)
            if user is None:
                unsupported(f"'with' over {ctx}")
            ctx, enter = user, user.enter
        self.push(_ExitVar(ctx))
        self.push(enter(self))

    def RETURN_GENERATOR(self, inst):
        self.push(ConstVar(None))     # what the generator is first resumed with

    def YIELD_VALUE(self, inst):
        if not self.generator:
            unsupported("yield outside an inlined generator")
        value = self.pop()
        self.push(ConstVar(None))     # the value sent back: next() sends None
        raise _Yield(value)

    def RETURN_VALUE(self, inst):
        self.return_value = self.pop()

    def LOAD_ASSERTION_ERROR(self, inst):
        self.push(ObjectVar(AssertionError))

    def RAISE_VARARGS(self, inst):
        unsupported("raising an exception")


class _Yield(Exception):
    """An inlined generator's frame suspends at a yield: run() unwinds with the value,
    and the next pull calls run() again, at the instruction after the yield."""
    def __init__(self, value):
        super().__init__()
        self.value = value


_GENERATOR = type((lambda: (yield))())


def _generator_items(child, pure: bool):
    while True:
        if not pure:
            child.root.code_runs += 1
        try:
            child.run()
        except _Yield as y:
            yield y.value
            continue
        return


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
    FORMAT_VALUE BUILD_STRING CALL_INTRINSIC_1 RERAISE""".split())


def _has_cleanup(code) -> bool:
    """Whether a generator has handlers of its own (3.12 wraps every generator in one
    that turns StopIteration into RuntimeError: not a cleanup)."""
    instructions = {i.offset: i for i in _instructions(code)}
    for entry in dis._parse_exception_table(code):
        handler = instructions.get(entry.target)
        if handler is None or handler.opname != "CALL_INTRINSIC_1" or \
                "STOPITERATION" not in handler.argrepr:
            return True
    return False


def _pure_generator(code) -> bool:
    for inst in _instructions(code):
        if inst.opname == "BINARY_OP":
            if dis._nb_ops[inst.arg][1].endswith("="):
                return False
        elif inst.opname not in _PURE_OPS:
            return False
    return True


def _is_data(value) -> bool:
    """Values computed in CPython that a resume frame passes on without guarding:
    everything but tensors, containers (whose items are guarded one by one) and None."""
    import torch
    return not isinstance(value, (torch.Tensor, list, tuple, dict, type(None)))


class OpaqueVar(Var):
    """A Python value that is data: passed along unguarded; using its value stops the
    trace there (a graph break).  Its attributes are opaque too, so `obj.method(...)`
    breaks at the call, where CPython can take over.  Its type is known, but may
    differ on the next call: asking for it (isinstance, type()) guards it."""
    __slots__ = ("kind", "base", "attr", "guards")

    def __init__(self, value, source, base=None, attr=None, guards=None):
        super().__init__(source)
        self.kind = type(value) if value is not None else object
        self.base = base
        self.attr = attr
        self.guards = guards

    def python_type(self):
        if self.base is not None or self.guards is None or self.source is None:
            unsupported("the type of a value computed after a graph break")
        self.guards.type_match(self.source, None, kind=self.kind)
        return self.kind

    def getattr(self, tx, name):
        return OpaqueVar(None, None, base=self, attr=name)

    def truth(self, tx):
        unsupported(f"branching on a {self.kind.__name__} computed after a graph break")

    def reconstruct(self, cg):
        if self.base is not None:
            self.base.reconstruct(cg)
            cg.load_attr(self.attr)
        else:
            super().reconstruct(cg)

    def __repr__(self):
        return f"OpaqueVar({self.kind.__name__})" if self.base is None else \
            f"OpaqueVar({self.base!r}.{self.attr})"


class _ExitVar(Var):
    """The __exit__ that BEFORE_WITH leaves on the stack: called with three Nones at
    the block's end (or with an exception, for a context that takes one)."""
    __slots__ = ("ctx",)

    def __init__(self, ctx):
        super().__init__(None)
        self.ctx = ctx

    def call(self, tx, args, kwargs):
        with_exception = getattr(self.ctx, "exit_with", None)
        if with_exception is not None:
            return with_exception(tx, args)
        self.ctx.exit(tx)         # (the others restore state, and never swallow one)
        return ConstVar(None)

    def reconstruct(self, cg):
        from .variables.contexts import GradModeRestore, GradModeVar, NullContextVar, no_op_exit
        handover = getattr(self.ctx, "reconstruct_exit", None)
        if handover is not None:
            handover(cg)
        elif isinstance(self.ctx, GradModeVar) and self.ctx.prev is not None:
            cg.load_const(GradModeRestore(self.ctx.prev))
        elif isinstance(self.ctx, NullContextVar):
            cg.load_const(no_op_exit)
        else:
            unsupported(f"a graph break inside 'with {self.ctx}'")


class _FunctionShim:
    """What InstructionTranslator reads of a function, for inlined code."""
    __slots__ = ("__globals__", "__builtins__", "__closure__")

    def __init__(self, f_globals, f_builtins):
        self.__globals__ = f_globals
        self.__builtins__ = f_globals.get("__builtins__", f_builtins)
        self.__closure__ = None


def _fresh_arg_sources(code):
    """*args and **kwargs of a frame: new objects on every call."""
    n = code.co_argcount + code.co_kwonlyargcount
    fresh = []
    if code.co_flags & 0x04:
        fresh.append(LocalSource(code.co_varnames[n]))
        n += 1
    if code.co_flags & 0x08:
        fresh.append(LocalSource(code.co_varnames[n]))
    return fresh


def _cell_full(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


_INSTRUCTION_CACHE: dict = {}


def _instructions(code):
    """dis's instructions of a code object, cached: inlined functions run many times."""
    hit = _INSTRUCTION_CACHE.get(code)
    if hit is None or hit[0] is not code:
        hit = (code, list(dis.get_instructions(code)))
        if len(_INSTRUCTION_CACHE) > 4096:
            _INSTRUCTION_CACHE.clear()
        _INSTRUCTION_CACHE[code] = hit
    return hit[1]


# --------------------------------------------------------------------------- semantics
def binary_op(tx, fn, a: Var, b: Var) -> Var:
    """``fn(a, b)`` for a BINARY_OP or COMPARE_OP."""
    plain = _INPLACE_TO_PLAIN.get(fn, fn)
    if isinstance(a, TensorVar):
        return tx.output.call("call_function", fn, (a, b), {})
    if isinstance(b, TensorVar) and not (isinstance(a, ListVar) and fn is operator.iadd):
        # Only a tensor has in-place operators here: `x += t` on a number rebinds x to
        # `x + t` (int has no __iadd__), and the graph must record it that way.
        return tx.output.call("call_function", plain, (a, b), {})
    if isinstance(a, ListVar) and fn in (operator.iadd, operator.imul):
        a._check_mutable(tx)
        if fn is operator.iadd:
            a.items.extend(b.unpack(tx))
        else:
            a.items[:] = a.items * b.as_const()
        return a
    from .variables.builtins import SetVar
    if isinstance(a, SetVar) and plain in _SET_DUNDERS:
        return a.call_method(tx, _SET_DUNDERS[plain], [b], {})
    seq = (TupleVar, ListVar)
    if plain is operator.add and isinstance(a, seq) and type(a) is type(b):
        return type(a)(a.items + b.items)
    if plain is operator.mul and isinstance(a, seq) and isinstance(b, (ConstVar, SymNodeVar)):
        return type(a)(a.items * b.as_const())
    if plain is operator.mul and isinstance(b, seq) and isinstance(a, (ConstVar, SymNodeVar)):
        return type(b)(b.items * a.as_const())
    if _symbolic(a) or _symbolic(b):
        return _symbolic_op(tx, plain, a, b)
    if a.is_const() and b.is_const() and not isinstance(a, ListVar) and not isinstance(b, ListVar) \
            and plain in BINARY_FOLD:
        try:
            return ConstVar(plain(a.as_const(), b.as_const()))
        except Exception as e:
            unsupported(f"{plain.__name__} on constants raised {type(e).__name__}: {e}")
    if plain in (operator.eq, operator.ne) and isinstance(a, ObjectVar) and isinstance(b, ObjectVar):
        same = a.value == b.value
        return ConstVar(same if plain is operator.eq else not same)
    unsupported(f"{plain.__name__} on {a} and {b}")


def _symbolic(v: Var) -> bool:
    if isinstance(v, SymNodeVar):
        return True
    return isinstance(v, TupleVar) and any(isinstance(i, SymNodeVar) for i in v.items)


def _symbolic_op(tx, fn, a: Var, b: Var) -> Var:
    """An operator on symbolic sizes: numbers become graph nodes with a symbolic result;
    sequences (shapes) are compared item by item, each comparison a guard."""
    if not isinstance(a, TupleVar) and not isinstance(b, TupleVar):
        if not a.is_const() or not b.is_const():
            unsupported(f"{fn.__name__} on {a} and {b}")
        return tx.output.call("call_function", fn, (a, b), {})
    if fn is operator.add:
        seqs = [v if isinstance(v, TupleVar) else TupleVar([ConstVar(i) for i in v.value])
                if isinstance(v, ConstVar) and isinstance(v.value, tuple) else None for v in (a, b)]
        if None not in seqs:
            # torch.Size wins on either side (Size.__radd__), as in CPython.
            kind = SizeVar if any(isinstance(v, SizeVar) or isinstance(v, ConstVar) and
                                  isinstance(v.value, torch.Size) for v in (a, b)) else TupleVar
            return kind(seqs[0].items + seqs[1].items)
    if fn in (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge):
        from .graph import to_fake
        return ConstVar(bool(fn(to_fake(a), to_fake(b))))
    unsupported(f"{fn.__name__} on {a} and {b}")


def unary_op(tx, fn, v: Var) -> Var:
    if isinstance(v, (TensorVar, SymNodeVar)):
        return tx.output.call("call_function", fn, (v,), {})
    if isinstance(v, ConstVar):
        return ConstVar(fn(v.value))
    unsupported(f"{fn.__name__} on {v}")


def _real_identity(v: Var):
    """The real object a Var stands for, when there is exactly one."""
    for attr in ("value", "fn", "module"):
        if attr in getattr(type(v), "__slots__", ()) or hasattr(v, attr):
            obj = getattr(v, attr, _MISSING)
            if obj is not _MISSING and not isinstance(obj, Var):
                return obj
    return _MISSING


_MISSING = object()


def is_same(a: Var, b: Var, tx=None) -> bool:
    if a is b:
        return True
    if isinstance(a, ConstVar) and isinstance(b, ConstVar):
        return a.value is b.value
    ra, rb = _real_identity(a), _real_identity(b)
    if ra is not _MISSING and rb is not _MISSING and not isinstance(a, TensorVar):
        return ra is rb
    if isinstance(a, TensorVar) and isinstance(b, TensorVar):
        if a.example is b.example:      # one FakeTensor per real tensor
            return True
        ia, ib = (tx.output.input_of(a), tx.output.input_of(b)) if tx is not None else (None, None)
        if ia is not None and ib is not None:
            # Two inputs, distinct objects now: the answer holds while they stay so.
            tx.guards.distinct_objects(*sorted((ia.source, ib.source), key=lambda s: s.name()))
        return False
    if isinstance(a, ConstVar) or isinstance(b, ConstVar):
        const, other = (a, b) if isinstance(a, ConstVar) else (b, a)
        if isinstance(other, (TensorVar, TupleVar, ListVar, DictVar, SymNodeVar)):
            return False
    unsupported(f"'is' between {a} and {b}")


def is_none(v: Var) -> bool:
    if isinstance(v, ConstVar):
        return v.value is None
    if isinstance(v, ObjectVar):
        return v.value is None
    return False          # OpaqueVar: see InstructionTranslator._is_none


def contains(tx, container: Var, item: Var) -> bool:
    if hasattr(container, "contains"):
        return container.contains(tx, item)
    dunder = getattr(container, "_dunder", None)
    if dunder is not None:
        return dunder(tx, "__contains__", [item]).truth(tx)
    if isinstance(container, DictVar):
        return _const_key(item) in container.items
    if isinstance(container, ConstVar) and item.is_const():
        # The container's own __contains__: substrings of str and bytes, ranges ...
        try:
            return item.as_const() in container.value
        except Exception as e:
            unsupported(f"'in' {container.value!r} raised {type(e).__name__}: {e}")
    if isinstance(container, (TupleVar, ListVar)) and item.is_const():
        members = container.unpack(tx)
        if all(m.is_const() for m in members):
            return item.as_const() in [m.as_const() for m in members]
    if isinstance(item, ObjectVar) and isinstance(container, (TupleVar, ListVar)):
        return any(isinstance(m, ObjectVar) and m.value is item.value for m in container.items)
    unsupported(f"'in' with {item} and {container}")


def _make_slice(parts) -> Var:
    if any(isinstance(p, SymNodeVar) for p in parts):
        return SliceVar(parts)
    if not all(p.is_const() for p in parts):
        unsupported(f"slice with non-constant bounds {parts}")
    return ConstVar(slice(*(p.as_const() for p in parts)))


def _const_key(v: Var):
    if not v.is_const():
        unsupported(f"dict key {v} is not a constant")
    return v.as_const()


# --------------------------------------------------------------------------- dispatch
# One handler per opcode name.  3.11 spells its conditional jumps with a direction;
# they behave as 3.12's (dis resolves the target offsets).
_DISPATCH = {name: getattr(InstructionTranslator, name) for name in dir(InstructionTranslator)
             if name.isupper()}
if not PY312:
    for _direction in ("FORWARD", "BACKWARD"):
        for _cond in ("FALSE", "TRUE", "NONE", "NOT_NONE"):
            _DISPATCH[f"POP_JUMP_{_direction}_IF_{_cond}"] = _DISPATCH[f"POP_JUMP_IF_{_cond}"]
