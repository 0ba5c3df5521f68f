"""Guards: the facts about a call's inputs and globals that a compiled entry relies on,
compiled into the check the C hook runs before reusing the entry.

The check takes the frame's argument slots positionally (named as in the frame), then
``___func``, the running function; it returns exactly ``True`` when the entry applies.
Each guard is a Python expression (`Guard.expr`: its meaning, and what logs and
first_failure evaluate) and, for the kinds with one, a C form (`Guard.spec`):
`compile` turns the C forms into a program for guards.c (every source loaded once,
in the order the guards first read it), and the remaining guards into one Python
function that runs after the program passes.  Both halves check exactly what the
expressions say; an exception while checking means the guard does not hold.

The soundness rule.  A compiled entry may rely only on facts that its check re-verifies
on every call, or on values it treats as opaque data.  Everything the trace read from
outside the frame (an argument, a global, a closure cell, an attribute of a function,
class, module or tensor, os.environ, the result of a read-only method of a real object,
global torch state, which inputs are the same object) becomes a guard on the *source*
it was read through, by value for constants and by identity for other objects.  An
identity guard says only "the same object": the object's mutable state (its attributes,
its contents, its `__code__` and `__defaults__`, a class's dict) is a separate fact,
guarded where it is read.  A value that cannot be guarded (computed in CPython at a
graph break) stays opaque: using its type guards the type, using its value breaks.
When a fact cannot be guarded, the tracer must graph-break rather than assume it.
Checks run on every call: prefer one cheap expression per fact (an attribute lookup
through the type's cache, a dict lookup) over scanning containers.
"""
from __future__ import annotations

import abc
import enum
import logging
import math
import sys
import types
import weakref

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy.printers import PythonPrinter
from torch.utils._sympy.value_ranges import bound_sympy
from torch.nn.modules import module as module_mod
from torch.overrides import _get_current_function_mode_stack

from . import _C, config, cxx_modules
from .source import (AttrSource, BuiltinSource, CallMethodSource, ClosureCellSource, ClosureSource,
                     ConstSource, ContainsSource, GetItemSource, GlobalSource, InstanceDictSource,
                     LocalSource, Source, const_sources, guard_local_name)
from .shapes import is_symbolic


def is_constant_value(value) -> bool:
    """Values that ConstVar holds and a guard compares by value (enum members by
    identity)."""
    if value is None or value is Ellipsis or value is NotImplemented:
        return True
    if isinstance(value, enum.Enum):
        return True
    if type(value) in (bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                       torch.Size, slice, range, torch.memory_format, torch.layout):
        return True
    return False



def _use_tensor_reads() -> bool:
    """Hand the C guard evaluator the C++ tensor reads (frametrace._tensor_reads), when
    they were built, against this very torch: the module reads torch's C++ structs, so
    headers of another version could misread them.  Without it tensors are read through
    their Python getters (same answers; a tensor check about 10x slower)."""
    reads = cxx_modules.load("_tensor_reads", logging.getLogger("frametrace.guards"),
                             "tensor guards read in Python")
    if reads is None:
        return False
    _C.set_tensor_reads(reads.api)
    return True


TENSOR_READS_IN_CXX = _use_tensor_reads()


# Names every check reads besides its constants (shape guards print torch.sym_float,
# math.inf).
def _unshared(written, others) -> bool:
    """The `written` tensors are distinct objects with storages of their own: none shares
    an object or (non-empty) memory with another of them or with one of `others`."""
    ids, ptrs = {id(t) for t in written}, set()
    if len(ids) != len(written):
        return False
    for t in written:
        p = t.untyped_storage().data_ptr()
        if p:
            if p in ptrs:
                return False
            ptrs.add(p)
    for t in others:
        if id(t) in ids or t.untyped_storage().data_ptr() in ptrs:  # (0 is never in ptrs)
            return False
    return True


def _instance_dict(obj):
    return object.__getattribute__(obj, "__dict__")


_CHECK_NAMES = {"___type": type, "___len": len, "___tuple": tuple, "___id": id, "math": math,
                "torch": torch, "___unshared": _unshared, "___odict": _instance_dict,
                # (keys and values by type and value, as guards.c compares them: 1, True
                # and 1.0 are different keys to a program that reads the key back)
                "___same_key": _C.same_key, "___same_keys": _C.same_keys}


class Guard:
    __slots__ = ("source", "kind", "expr", "text", "symbols", "spec", "was")

    def __init__(self, source, kind, expr, text, symbols=(), spec=None):
        self.source = source
        self.kind = kind
        self.expr = expr    # Python expression, True when the guard holds
        self.text = text    # for people: explain(), logs
        self.symbols = symbols  # the _Symbols a shape guard reads, for its "now:" text
        # The same facts for the C evaluator (guards.c): a tuple of checks, each
        # (source, op, a, b, n, other) as `_Program.check` takes them; None: the
        # guard runs as Python (`expr`), after the C checks.
        self.spec = spec
        self.was = None     # what the trace saw, where `spec` does not say (reasons)

    def __repr__(self):
        return f"Guard({self.text})"


# Marks the guard expression of a source the transformed code makes itself.
FRESH = "___fresh_"


class GuardSet:
    """Guards collected while tracing one frame, in the order they were made."""

    def __init__(self, code, func):
        self.code = code
        self.func = func
        self.guards: dict[tuple, Guard] = {}
        self.constants: dict[str, object] = {}
        self._ids: dict[int, str] = {}
        self._supers: dict = {}     # (cls, type) -> the super object guards read through
        self.check_ref = None   # weak reference to the compiled check, once built
        # Where each symbolic size is read: (label, expression, sympy expr at trace time,
        # (source, "shape" or "stride()", index) of a tensor guard checked in C, or None).
        self.sym_reads: list[tuple[str, str, object, tuple | None]] = []
        # (cls, classes) of each issubclass answer (False) that rests on the ABC token.
        self._abc_answers: list = []
        # True when a fact of the trace no longer held once the check was built (state
        # changed while compiling): the entry would be wrong for this very call.
        self.stale = False
        # Codes of the functions inlined into the trace: a cached entry must pin each
        # (warm_cache.py), or an edited helper would run its old code.
        self.inlined: list = []

    # -- naming objects the check compares against --
    def const(self, obj) -> str:
        name = self._ids.get(id(obj))
        if name is None:
            name = f"___k{len(self.constants)}"
            self.constants[name] = obj
            self._ids[id(obj)] = name
        return name

    def _add(self, source: Source | None, kind: str, expr: str, text: str, symbols=(), spec=None):
        if FRESH in expr:
            # About an object the transformed code makes anew on every call, in the
            # same way from guarded inputs (an nn.Parameter of an input): always true.
            return
        key = (source, kind)
        if key not in self.guards:
            self.guards[key] = Guard(source, kind, expr, text, symbols, spec)
            for anchor in const_sources(source):
                self.constants[anchor.guard_expr()] = anchor.obj

    # -- guard kinds --
    def type_match(self, source, value, kind=None):
        e = source.guard_expr()
        kind = type(value) if kind is None else kind
        self._add(source, "TYPE", f"___type({e}) is {self.const(kind)}",
                  f"type({source.name()}) is {kind.__qualname__}", spec=one_check(source, "TYPE", kind))

    def identity(self, source, value):
        e = source.guard_expr()
        if isinstance(value, (types.BuiltinMethodType, types.MethodWrapperType)) and \
                not isinstance(getattr(value, "__self__", None), types.ModuleType):
            # `d.get`, `dict.fromkeys`: a new object on every read, equal (same function,
            # same __self__) to the one traced.
            self._add(source, "ID", f"{e} == {self.const(value)}", f"{source.name()} is {_short(value)}",
                      spec=one_check(source, "EQ_ANY", value))
            return
        try:
            if isinstance(value, types.CodeType):
                raise TypeError     # held by its function anyway: a plain `is` is cheaper
            ref = weakref.ref(value, self._on_death)
        except TypeError:
            # Builtins and other long-lived objects without weak references.
            expr, spec = f"{e} is {self.const(value)}", one_check(source, "IS", value)
        else:
            # A weak reference, so an entry does not keep the user's objects alive; the
            # entry is dropped when the object dies (`_on_death`).
            expr, spec = f"{self.const(ref)}() is {e} is not None", one_check(source, "WEAK", ref)
        self._add(source, "ID", expr, f"{source.name()} is {_short(value)}", spec=spec)

    def equals(self, source, value):
        e = source.guard_expr()
        if value is None or type(value) is bool or value is Ellipsis or \
                isinstance(value, (torch.dtype, enum.Enum)):
            self._add(source, "EQ", f"{e} is {self.const(value)}", f"{source.name()} is {value!r}",
                      spec=one_check(source, "IS", value))
            return
        t = self.const(type(value))
        spec = None     # NaN and signed zeros: Python's own comparisons
        if isinstance(value, float) and value != value:
            # Any NaN, of the sign traced (math.copysign tells -nan apart; `inf - inf`
            # makes one on x86).
            expr = (f"___type({e}) is {t} and {e} != {e} and "
                    f"{self.const(math.copysign)}(1.0, {e}) == {math.copysign(1.0, value)}")
        elif isinstance(value, float) and value == 0.0:
            # 0.0 == -0.0, but 1 / x tells them apart.
            expr = (f"___type({e}) is {t} and {e} == 0.0 and "
                    f"{self.const(math.copysign)}(1.0, {e}) == {math.copysign(1.0, value)}")
        elif type(value) in (int, str, bytes, float):
            expr = f"___type({e}) is {t} and {e} == {self.const(value)}"
            spec = one_check(source, "EQ", value, type(value))
        else:
            # A slice's bounds and a complex's signed zeros: compared as a program
            # reads them (slice(True) == slice(1), complex(0, -0.0) == 0j).
            expr = f"___same_key({e}, {self.const(value)})"
            spec = one_check(source, "EQ", value, type(value))
        self._add(source, "EQ", expr, f"{source.name()} == {value!r}", spec=spec)

    def not_none(self, source):
        self._add(source, "NOT_NONE", f"{source.guard_expr()} is not None", f"{source.name()} is not None",
                  spec=one_check(source, "NOT_NONE"))

    def length(self, source, value):
        e = source.guard_expr()
        self._add(source, "LEN",
                  f"___type({e}) is {self.const(type(value))} and ___len({e}) == {len(value)}",
                  f"type({source.name()}) is {type(value).__name__} and len({source.name()}) == {len(value)}",
                  spec=one_check(source, "LEN", type(value), n=len(value)))

    def dict_keys(self, source, value):
        e = source.guard_expr()
        keys = tuple(value)
        # By type and value, key by key (guards.c's same_key): a key the trace reads
        # back (iteration, keys(), popitem) answers type(k), `k is True`, str(k).
        self._add(source, "KEYS",
                  f"___type({e}) is dict and ___same_keys({e}, {self.const(keys)})",
                  f"{source.name()} is a dict with keys {list(keys)}", spec=one_check(source, "KEYS", keys))

    def dict_lacks(self, source, key):
        """Key `key` is not in the dict at `source` (its type is guarded)."""
        e = source.guard_expr()
        self._add(source, f"LACKS {key!r}", f"{self.const(key)} not in {e}",
                  f"{key!r} not in {source.name()}", spec=one_check(source, "NOT_CONTAINS", key))

    def tensor(self, source, t: torch.Tensor, fake=None):
        e = source.guard_expr()
        shape, stride = tuple(t.shape), t.stride()
        first = e
        if not e.isidentifier():
            # Evaluate a longer source (self._parameters['w']) once.
            first = f"(___t{len(self.guards)} := {e})"
            e = f"___t{len(self.guards)}"
        parts = [f"___type({first}) is {self.const(type(t))}",
                 f"{e}.dtype is {self.const(t.dtype)}",
                 # (sparse COO and mkldnn tensors answer stride() too)
                 f"{e}.layout is {self.const(t.layout)}",
                 f"{e}.device == {self.const(t.device)}"]
        dtype = str(t.dtype).replace("torch.", "")
        spec = None     # (symbolic sizes with config.symbolic_tensor_guards_in_c off: Python)
        if fake is None or not any(map(is_symbolic, (*fake.shape, *fake.stride()))):
            parts += [f"{e}.shape == {self.const(shape)}", f"{e}.stride() == {self.const(stride)}"]
            sizes, strides = list(shape), list(stride)
            spec = one_check(source, "TENSOR", (type(t), t.dtype, t.device, shape, tuple(stride),
                                                t.requires_grad, t.is_conj() if t.is_complex() else None,
                                                t.is_neg(), t.layout))
        else:
            # Static sizes and strides are compared here; symbolic ones are read into
            # names that the shape guards (made at the end of the trace) check.
            n = len(self.guards)
            z, st = f"___z{n}", f"___st{n}"
            parts.append(f"___len({z} := {e}.shape) == {len(shape)}")
            parts.append(f"___len({st} := {e}.stride()) == {len(shape)}")
            shown = {"shape": [], "stride()": []}     # for the text: "*" where symbolic
            in_c = config.symbolic_tensor_guards_in_c
            for kind, read, values in (("shape", z, fake.shape), ("stride()", st, fake.stride())):
                for i, v in enumerate(values):
                    if is_symbolic(v):
                        # Where the C program checks the tensor, no Python binds ___z: the
                        # shape guards read the size themselves.
                        self.sym_reads.append((f"{source.name()}.{kind}[{i}]",
                                               f"{source.guard_expr()}.{kind}[{i}]" if in_c else f"{read}[{i}]",
                                               v.node.expr, (source, kind, i) if in_c else None))
                        shown[kind].append("*")
                    else:
                        parts.append(f"{read}[{i}] == {int(v)}")
                        shown[kind].append(int(v))
            sizes, strides = shown["shape"], shown["stride()"]
            if in_c:
                # None where symbolic: any value there, until shape_guards puts the
                # symbol's range in its place (_fold_range).
                spec = one_check(source, "TENSOR", (
                    type(t), t.dtype, t.device, tuple(None if d == "*" else d for d in sizes),
                    tuple(None if d == "*" else d for d in strides), t.requires_grad,
                    t.is_conj() if t.is_complex() else None, t.is_neg(), t.layout))
        parts.append(f"{e}.requires_grad is {t.requires_grad}")
        # The lazy conjugate and negative bits: the trace reads them (is_conj(), the
        # kernels AOTAutograd picks).  Only complex tensors have the conjugate bit;
        # a negative view of a real tensor comes from `z.conj().imag`.
        if t.is_complex():
            parts.append(f"{e}.is_conj() is {t.is_conj()}")
        parts.append(f"{e}.is_neg() is {t.is_neg()}")
        bits = "".join((" conj" if t.is_conj() else "", " neg" if t.is_neg() else ""))
        self._add(source, "TENSOR", " and ".join(parts),
                  f"{source.name()}: {type(t).__name__} {dtype}[{', '.join(map(str, sizes))}] "
                  f"stride=[{', '.join(map(str, strides))}] device={t.device} "
                  f"requires_grad={t.requires_grad}{bits}", spec=spec)
        guard = self.guards.get((source, "TENSOR"))
        if guard is not None and guard.was is None:
            guard.was = (type(t), t.dtype, t.device, t.layout, tuple(sizes), tuple(strides),
                         t.requires_grad)

    def storage_offset(self, source, t: torch.Tensor):
        """The trace read the tensor's storage offset (most graphs never do, so the
        tensor guard leaves it out: views at any offset share an entry)."""
        e = source.guard_expr()
        self._add(source, "OFFSET", f"{e}.storage_offset() == {t.storage_offset()}",
                  f"{source.name()}.storage_offset() == {t.storage_offset()}")

    def method_is(self, source, name: str, value: bool):
        """A tensor fact answered by a method (``is_inference()``), read by few traces:
        a Python check, so the C program keeps no op for it."""
        self._add(source, f"CALL {name}", f"{source.guard_expr()}.{name}() is {value}",
                  f"{source.name()}.{name}() is {value}")

    def symbolic_number(self, source, sym, kind):
        """An int or float that is a symbolic input of the graph."""
        e = source.guard_expr()
        self._add(source, "TYPE", f"___type({e}) is {kind.__name__}",
                  f"type({source.name()}) is {kind.__name__}", spec=one_check(source, "TYPE", kind))
        self.sym_reads.append((source.name(), e, sym.node.expr, None))

    def shape_guards(self, shape_env):
        """The facts the ShapeEnv learned while tracing (branches on sizes, broadcasts,
        divisibility of views), plus each symbol's range, as Python checks over the
        sizes read in the tensor guards.  Called once, at the end of the trace."""
        bound: dict = {}            # sympy Symbol -> _Symbol
        where: dict = {}            # sympy Symbol -> its first read's place in a C tensor check
        later = []
        hints = shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") \
            else shape_env.var_to_val
        for label, read, expr, at in self.sym_reads:
            now = shape_env.simplify(expr)
            if isinstance(now, sympy.Symbol) and now not in bound:
                bound[now] = _Symbol(f"___s{len(bound)}", label, read, hints.get(now))
                where[now] = at
            else:
                later.append((label, read, now))
        ranges = {s: r for s, r in shape_env.var_to_range.items() if s in bound}
        facts = []
        for g in shape_env.guards:
            expr = shape_env.simplify(g.expr)
            if expr == sympy.true or _implied_by_ranges(expr, ranges):
                continue
            if free_unbacked_symbols(expr):
                # A number read from data exists only inside the graph: the ShapeEnv
                # asserts facts about it at run time, it never guards them.
                raise AssertionError(f"shape guard {expr} names a number read from data")
            facts.append(expr)
        # A symbol no other shape guard names needs no Python name: its range can be
        # checked with the tensor's other sizes, in C.
        named = set().union(*(now.free_symbols for _, _, now in later), *(e.free_symbols for e in facts))
        names = _SymbolPrinter({s: b.name for s, b in bound.items()})
        labels = _SymbolPrinter({s: b.label for s, b in bound.items()})
        for sym, b in bound.items():
            r = shape_env.var_to_range.get(sym)
            lower = int(r.lower) if r is not None and isinstance(r.lower, sympy.Integer) else None
            upper = int(r.upper) if r is not None and isinstance(r.upper, sympy.Integer) else None
            # Binds the symbol's name for the checks after it (`is`: NaN != NaN).
            checks = [f"(({b.name} := {b.read}) is {b.name})"]
            checks += [f"{b.name} >= {lower}"] if lower is not None else []
            checks += [f"{b.name} <= {upper}"] if upper is not None else []
            text = (f"{lower} <= " if lower is not None else "") + b.label + \
                (f" <= {upper}" if upper is not None else "") + " (symbolic)"
            at = where[sym]
            spec = ((at[0], "IN_TENSOR", None, None, 0, None),) \
                if at is not None and sym not in named and self._fold_range(at, lower, upper) else None
            self._add(None, f"SYMBOL {b.label}", " and ".join(checks), text, (b,), spec)
        for label, read, now in later:
            own = _Symbol(None, label, read, _hint(now, hints))
            used = (own, *(bound[s] for s in now.free_symbols if s in bound))
            self._add(None, f"SIZE {label}", f"{read} == {names.doprint(now)}",
                      f"{label} == {labels.doprint(now)}", used)
        for expr in facts:
            used = tuple(bound[s] for s in expr.free_symbols if s in bound)
            self._add(None, f"SHAPE {expr}", names.doprint(expr), labels.doprint(expr), used)

    def _fold_range(self, at, lower, upper) -> bool:
        """Puts a symbol's range (bounds or None) in the C check of the tensor guard that
        reads it first, at `at` (source, "shape" or "stride()", index); False where that
        guard has no C form, or already a value there."""
        source, kind, i = at
        guard = self.guards.get((source, "TENSOR"))
        if guard is None or guard.spec is None or len(guard.spec) != 1:
            return False
        (src, op, a, b, n, other), = guard.spec
        field = 3 if kind == "shape" else 4
        if op != "TENSOR" or a[field][i] is not None:
            return False
        dims = list(a[field])
        # (a bound past a C integer's holds for every size there is)
        dims[i] = (None if lower is None or lower <= -sys.maxsize - 1 else lower,
                   None if upper is None or upper >= sys.maxsize else upper)
        guard.spec = ((src, op, (*a[:field], tuple(dims), *a[field + 1:]), b, n, other),)
        return True

    def not_shadowed(self, globals_source: Source | None, name: str):
        """A builtin was read: the module (the frame's own when `globals_source` is None)
        still defines no global of that name."""
        expr = "___G" if globals_source is None else globals_source.guard_expr()
        label = "globals()" if globals_source is None else globals_source.name()
        self._add(globals_source, f"NOT_GLOBAL {name}", f"{name!r} not in {expr}",
                  f"{name!r} is not a global of {label} (the builtin is used)",
                  spec=one_check(globals_source or _GLOBALS, "NOT_CONTAINS", name))

    def no_hooks(self, source, module):
        """The module still has no hooks of its own (they would change its call)."""
        e = source.guard_expr()
        names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        self._add(source, "NO_HOOKS", "not (" + " or ".join(f"{e}.{n}" for n in names) + ")",
                  f"{source.name()} has no hooks", spec=one_check(source, "NO_HOOKS", names))

    def no_global_hooks(self, names):
        """No global nn.Module hook is registered (one would change every module's call):
        each of torch's global hook tables `names` is empty.  Read as dict items of
        torch's module namespace, each falsy: the C program answers them from dict
        versions."""
        src = ConstSource(module_mod.__dict__, "torch.nn.modules.module.__dict__")
        e = src.guard_expr()
        self._add(src, "NO_GLOBAL_HOOKS", "not (" + " or ".join(f"{e}[{n!r}]" for n in names) + ")",
                  "no global nn.Module hooks are registered",
                  spec=tuple((GetItemSource(src, n), "FALSY", None, None, 0, None) for n in names))

    def hook_keys(self, source, module):
        e = source.guard_expr()
        keys = (tuple(module._forward_pre_hooks), tuple(module._forward_hooks))
        self._add(source, "HOOKS",
                  f"(___tuple({e}._forward_pre_hooks), ___tuple({e}._forward_hooks)) == "
                  f"{self.const(keys)} and not ({e}._backward_hooks or {e}._backward_pre_hooks)",
                  f"{source.name()} has hooks {keys}")

    def tensor_aliasing(self, a: Source, b: Source, shared: bool, ta=None, tb=None):
        """Two tensor inputs share memory, or do not, as when traced (the graph
        mutates one of them, so which it is changes the program)."""
        ea, eb = a.guard_expr(), b.guard_expr()
        sa, sb = f"{ea}.untyped_storage().data_ptr()", f"{eb}.untyped_storage().data_ptr()"
        if shared:
            # Sharing memory is not enough: the graph was traced for these two views'
            # exact geometry relative to each other (b[0] and b[1] are not alike).
            geometry = (tuple(ta.shape), ta.stride(), tuple(tb.shape), tb.stride(),
                        ta.storage_offset() - tb.storage_offset())
            self._add(None, f"ALIAS {a.name()} {b.name()}",
                      f"{sa} == {sb} and ({ea}.shape, {ea}.stride(), {eb}.shape, {eb}.stride(), "
                      f"{ea}.storage_offset() - {eb}.storage_offset()) == {self.const(geometry)}",
                      f"{a.name()} and {b.name()} share memory")
        else:
            self._add(None, f"NO_ALIAS {a.name()} {b.name()}",
                      f"{ea} is not {eb} and ({sa} != {sb} or {sa} == 0)",
                      f"{a.name()} and {b.name()} do not share memory")

    def unshared(self, written: list, others: list):
        """Written tensor inputs that shared memory with no other input when traced still
        do not: one pass over the inputs, where a guard per pair costs n**2 (an optimizer
        step writes every parameter and state tensor)."""
        ew = ", ".join(s.guard_expr() for s in written)
        eo = ", ".join(s.guard_expr() for s in others)
        names = ", ".join(s.name() for s in written)
        self._add(None, "NO_ALIAS", f"___unshared(({ew},), ({eo}{',' if others else ''}))",
                  f"no other tensor input shares memory with {names}",
                  spec=((None, "UNSHARED", tuple(written), tuple(others), 0, None),))

    def distinct(self, sources):
        """The objects at `sources` (mutable inputs guarded by type, not identity) are
        as many distinct objects as when traced: one set of ids instead of n**2 checks."""
        exprs = ", ".join(s.guard_expr() for s in sources)
        # In C: a pointer compare per pair while the pairs are few (a model's handful
        # of configs and registries), sorted ids beyond (an optimizer's parameters).
        spec = tuple((a, "IS_NOT_REG", None, None, 0, b) for i, a in enumerate(sources)
                     for b in sources[i + 1:]) if len(sources) <= _C_DISTINCT else \
            ((None, "DISTINCT", tuple(sources), None, 0, None),)
        self._add(None, "DISTINCT", f"___len({{*map(___id, ({exprs},))}}) == {len(sources)}",
                  f"{', '.join(s.name() for s in sources)} are distinct objects", spec=spec)

    def in_dict(self, source, name: str):
        """An instance attribute is present (whatever its value)."""
        e = source.guard_expr()
        self._add(source, f"IN_DICT {name}", f"{name!r} in {e}.__dict__",
                  f"{source.name()} has instance attribute {name!r}",
                  spec=one_check(AttrSource(source, "__dict__"), "CONTAINS", name))

    def not_in_dict(self, source, name: str, past_hook: bool = False, obj=None):
        """An instance attribute does not shadow what its class provides.  `past_hook`:
        the class has a __getattribute__ of its own, and the trace read the instance
        dict past it (object.__getattribute__'s dict), as the guard does.  Without
        such a hook (`obj`'s class) both reads are one: the guard takes the direct one
        (an nn.Module's __getattr__ is not on its path)."""
        if obj is not None and type(obj).__getattribute__ is object.__getattribute__:
            past_hook = True
        d = InstanceDictSource(source) if past_hook else AttrSource(source, "__dict__")
        self._add(source, f"NOT_IN_DICT {name}", f"{name!r} not in {d.guard_expr()}",
                  f"{source.name()} has no instance attribute {name!r}",
                  spec=one_check(d, "NOT_CONTAINS", name))

    def function_state(self, source, fn, fixed: bool):
        """An inlined function's `__code__`, `__defaults__` and `__kwdefaults__` are
        still what was traced (they can be assigned).  For a `fixed` function (one
        object, guarded by identity) the very objects; for a closure (a new function
        per call of its parent) the defaults' shape, each default being guarded
        through its own source.  One guard: it runs per inlined function per call."""
        e = source.guard_expr()
        d, kw = fn.__defaults__, fn.__kwdefaults__
        if fixed or (d is None and kw is None):
            self._add(source, "FUNCTION",
                      f"{e}.__code__ is {self.const(fn.__code__)} and {e}.__defaults__ is {self.const(d)} "
                      f"and {e}.__kwdefaults__ is {self.const(kw)}",
                      f"{source.name()} has the code and defaults traced",
                      spec=one_check(source, "FUNC", (fn.__code__, d, kw)))
            return
        # (a closure with a default: each one not None is checked by shape)
        parts = [f"{e}.__code__ is {self.const(fn.__code__)}"]
        spec = [(AttrSource(source, "__code__"), "IS", fn.__code__, None, 0, None)]
        if d is None:
            parts.append(f"{e}.__defaults__ is {self.const(d)}")
            spec.append((AttrSource(source, "__defaults__"), "IS", d, None, 0, None))
        else:
            parts.append(f"___len({e}.__defaults__) == {len(d)}")
            spec.append((AttrSource(source, "__defaults__"), "LEN_ANY", None, None, len(d), None))
        if kw is None:
            parts.append(f"{e}.__kwdefaults__ is {self.const(kw)}")
            spec.append((AttrSource(source, "__kwdefaults__"), "IS", kw, None, 0, None))
        else:
            parts.append(f"___tuple({e}.__kwdefaults__) == {self.const(tuple(kw))}")
            spec.append((AttrSource(source, "__kwdefaults__"), "TUPLE_EQ", tuple(kw), None, 0, None))
        self._add(source, "FUNCTION", " and ".join(parts),
                  f"{source.name()} has the code and defaults traced", spec=tuple(spec))

    def value(self, source, value):
        """`source` still gives `value`: by value for constants, else by identity."""
        if is_constant_value(value):
            self.equals(source, value)
        else:
            self.identity(source, value)

    def class_mro(self, cls):
        """What `cls` is a subclass of (isinstance, issubclass answered while tracing)
        holds: its MRO is the tuple traced (assigning ``__bases__``, of the class or a
        base, gives it a new one).  Builtin classes cannot be changed so, and torch's
        are not."""
        if not isinstance(cls, type) or cls.__flags__ & _IMMUTABLE_TYPE or \
                (getattr(cls, "__module__", None) or "").split(".")[0] == "torch":
            return
        src = AttrSource(ConstSource(cls, cls.__qualname__), "__mro__")
        self._add(src, "MRO", f"{src.guard_expr()} is {self.const(cls.__mro__)}",
                  f"{src.name()} is the MRO traced", spec=one_check(src, "IS", cls.__mro__))

    def mro_entry(self, cls, name: str, found, after=None):
        """What the MRO of `cls` (past `after`) holds for `name` is `found` (None: no
        class of it holds the name), read in the classes' dicts, as the instance
        attribute protocol reads it: no descriptor runs, and a metatype's attribute of
        the same name (``__class__``, ``__doc__``, a metaclass's own) does not answer."""
        mro = cls.__mro__
        self.class_mro(cls)
        for k in mro[mro.index(after) + 1 if after is not None else 0:]:
            d = AttrSource(ConstSource(k, getattr(k, "__qualname__", repr(k))), "__dict__")
            if name in k.__dict__:
                self.value(GetItemSource(d, name), found)
                return
            self.dict_lacks(d, name)

    def class_attr(self, cls, name: str, found, after=None):
        """The trace took what `cls` (an object's type, fixed by a type or identity
        guard) defines for `name`: `found` from its MRO's dicts, or None.  Guards what
        ``cls.name`` gives now (a class dict can be patched, in a base too); with
        `after`, what ``super(after, cls).name`` gives."""
        if after is None:
            holder, label = cls, cls.__qualname__
        else:
            holder = self._supers.get((after, cls))
            if holder is None:
                holder = self._supers[(after, cls)] = super(after, cls)
            label = f"super({after.__qualname__}, {cls.__qualname__})"
        if name == "__dict__" and found is not None:
            # The instances' __dict__ slot: ``cls.__dict__`` is the class's own mapping
            # (type's descriptor wins), and the slot cannot be assigned or deleted.
            return
        src = AttrSource(ConstSource(holder, label), name)
        if found is None:
            if _meta_runs_code(cls):
                # (hasattr of the class would run its metaclass's hook, here and in
                # every check)
                self.mro_entry(cls, name, None, after)
            elif not hasattr(holder, name):
                self._add(src, "ABSENT", f"not {self.const(hasattr)}({src.base.guard_expr()}, {name!r})",
                          f"{src.name()} is not defined", spec=one_check(src.base, "HASATTR", name, _MODULE_GETATTR, n=0))
            else:
                # ``cls.name`` answers from the metatype (`mro`, a metaclass's own
                # attribute), which an instance does not see: the MRO's lack of it.
                self.mro_entry(cls, name, None, after)
            return
        if _answered_by_code(cls, name, found):
            self.mro_entry(cls, name, found, after)
            return
        try:
            now = getattr(holder, name)
        except Exception:
            self.mro_entry(cls, name, found, after)
            return
        if isinstance(now, types.MethodType):      # a classmethod, bound anew on each read
            self.identity(AttrSource(src, "__func__"), now.__func__)
        else:
            self.value(src, now)

    def autocast_state(self):
        """Autocast entered outside the frame changes what ops compute (their dtypes,
        which the trace reads): the common case, autocast off, is one C call."""
        if not torch._C._is_any_autocast_enabled():
            self.global_state("autocast is off", torch._C._is_any_autocast_enabled, False,
                              text="autocast: off")
        else:
            state = _autocast_state()
            self._add(None, "AUTOCAST", f"{self.const(_autocast_state)}() == {self.const(state)}",
                      f"autocast state is {state}", spec=one_check(None, "CALL_EQ", _autocast_state, state))

    def function_modes(self):
        """The torch function modes active outside the frame (a TorchFunctionMode;
        torch.set_default_device and `with torch.device(...)` push one too) decide what
        each op does, and which device factories use: the stack is what it was."""
        if torch._C._len_torch_function_stack() == 0:
            self.global_state("no torch function mode", torch._C._len_torch_function_stack, 0,
                              text="torch function modes: none")
        else:
            stack = tuple(_get_current_function_mode_stack())
            self._add(None, "FUNCTION_MODES",
                      f"___tuple({self.const(_get_current_function_mode_stack)}()) == {self.const(stack)}",
                      f"the torch function modes are {[type(m).__name__ for m in stack]}")

    def distinct_objects(self, a: Source, b: Source):
        self._add(None, f"DISTINCT {a.name()} {b.name()}",
                  f"{a.guard_expr()} is not {b.guard_expr()}", f"{a.name()} is not {b.name()}",
                  spec=((a, "IS_NOT_REG", None, None, 0, b),))

    def same_object(self, source, other: Source):
        self._add(source, "ALIAS", f"{source.guard_expr()} is {other.guard_expr()}",
                  f"{source.name()} is {other.name()}", spec=((source, "IS_REG", None, None, 0, other),))

    def global_state(self, name: str, reader, value, text=None):
        """``reader()`` is still `value`; `text` says so for people where "name is value"
        would not read as a fact (a name that is itself a statement: "autocast is off")."""
        self._add(None, name, f"{self.const(reader)}() is {self.const(value)}",
                  text or f"{name} is {value!r}", spec=one_check(None, "CALL_IS", reader, value))

    def has_attr(self, source, name: str, found: bool):
        """``hasattr(source, name)`` is still `found`."""
        self._add(source, f"HASATTR {name}", f"{self.const(hasattr)}({source.guard_expr()}, {name!r}) is {found}",
                  f"hasattr({source.name()}, {name!r}) is {found}",
                  spec=one_check(source, "HASATTR", name, _MODULE_GETATTR, n=int(found))
                  if type(found) is bool else None)

    def abc_registry(self, cls, classes):
        """A False answer of ``issubclass(cls, classes)`` (some of them ABCs) holds until
        some ABC's register() (which CPython's ABC caches notice by this token).

        The token is any registration's, anywhere: compiling this frame or another one
        bumps it (torch's lazily imported modules register their classes with ABCs while a
        backend compiles), and so does a library registering its own classes on first use.
        Guarding the token alone recompiled every entry after any of those.  So the guard
        keeps the answers (`_AbcAnswers`): while the token is the one it saw, it holds at
        the cost of one call; when the token moved, it asks the answers again and, where
        they are all still False, holds and remembers the new token."""
        answers = self.guards.get((None, "ABC registry"))
        if answers is None or not config.refresh_abc_token:
            self._abc_answers.append((cls, classes))
            if answers is None:
                self._abc_token_guard()
            return
        answers.spec[0][2].add(cls, classes)

    def _abc_token_guard(self):
        token = abc.get_cache_token()
        if not config.refresh_abc_token:
            self.guards[(None, "ABC registry")] = Guard(
                None, "ABC registry", f"{self.const(abc.get_cache_token)}() == {token!r}",
                f"abc.get_cache_token() == {token!r}",
                spec=one_check(None, "CALL_EQ", abc.get_cache_token, token))
            return
        answers = _AbcAnswers(token)
        for cls, classes in self._abc_answers:
            answers.add(cls, classes)
        self._abc_answers = []
        self.guards[(None, "ABC registry")] = Guard(
            None, "ABC registry", f"{self.const(answers)}() is True",
            "ABC answers: no register() made a class the trace saw a subclass of an ABC",
            spec=one_check(None, "CALL_IS", answers, True))

    def _refresh_abc_token(self):
        """Once the check is built, after the trace and the backend compile: an ABC
        answer the trace relied on that changed meanwhile (a module imported while
        compiling registered a class) makes the trace wrong for the program as it is
        now: `stale` says so, and the caller installs nothing."""
        guard = self.guards.get((None, "ABC registry"))
        if guard is None or guard.spec[0][1] != "CALL_IS":
            return
        if guard.spec[0][2]() is not True:
            self.stale = True

    def grad_mode(self, enabled: bool):
        self.global_state("grad_mode", torch.is_grad_enabled, enabled,
                          text=f"grad mode: {'on' if enabled else 'off'}")

    def _on_death(self, _ref):
        try:
            check = self.check_ref() if self.check_ref is not None else None
            if check is not None:
                _C.remove_entry(self.code, check)
        except Exception:
            pass    # at interpreter exit, module globals are already gone

    # -- output --
    def texts(self) -> list[str]:
        return [g.text for g in self.guards.values()]

    def compile(self):
        """The check for the C hook: the guards that have a C form (`Guard.spec`) as a
        program for guards.c, the others as one Python function it calls after them."""
        self._refresh_abc_token()
        code = self.code
        nargs = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + \
            bool(code.co_flags & 0x08)
        params = [guard_local_name(n) for n in code.co_varnames[:nargs]] + ["___func"]
        guards = list(self.guards.values())
        _C.set_attr_memos(config.memoize_attr_guards)
        program = _Program(params, self.func, any("___G" in g.expr for g in guards))
        residual = [g for g in guards if g.spec is None or not program.add(g.spec)]
        python = self._python_check(params, residual) if residual else None
        check = GuardCheck(len(params), program.code, python, program.dispatch)
        check.guards = guards
        check.params = params
        self.check_ref = weakref.ref(check)
        # The entry lives in the code's extra, which the GC does not see: holding the
        # function here would keep it alive until reset().
        self.func = None
        return check

    def _python_check(self, params, guards):
        """The guards in `guards` as one Python function of the argument slots."""
        src = _python_source(params, guards)
        namespace = dict(self.constants)
        namespace.update(_CHECK_NAMES)
        if "___G" in src:
            namespace["___G"] = self.func.__globals__
        if "___B[" in src:
            namespace["___B"] = self.func.__builtins__
        exec(compile(src, f"<frametrace guards for {self.code.co_name}>", "exec"), namespace)
        check = namespace["___check"]
        check.source = src
        return check

    def first_failure(self, args, func) -> str | None:
        """Text of the first guard that fails for these argument slots (recompile logs)."""
        found = self._first_failing(args, func)
        if found is None:
            return None
        g, env = found
        return f"{g.text} (now: {self._describe_now(g, env)})"

    def failure_in_words(self, args, func) -> str | None:
        """The first guard that fails for these argument slots, in plain words (what the
        trace saw, an arrow, what there is now: ``x.size(0): 8 → 16``), then the guard
        itself and the value it reads now; None when every guard holds."""
        found = self._first_failing(args, func)
        if found is None:
            return None
        g, env = found
        detail = f"{g.text} (now: {self._describe_now(g, env)})"
        try:
            words = _in_words(g, env)
        except Exception:
            words = None
        return f"{words} (guard failed: {detail})" if words else f"guard failed: {detail}"

    def _first_failing(self, args, func):
        code = self.code
        params = [guard_local_name(n) for n in code.co_varnames[:len(args)]]
        env = dict(self.constants)
        env.update(zip(params, args))
        env.update(_CHECK_NAMES)
        env.update(___func=func, ___G=func.__globals__, ___B=func.__builtins__)
        for g in self.guards.values():
            try:
                ok = eval(g.expr, env) is True
            except Exception:
                ok = False
            if not ok:
                return g, env
        return None

    @staticmethod
    def _describe_now(g, env) -> str:
        if g.symbols:
            values = []
            for sym in g.symbols:
                try:
                    value = eval(sym.read, env)
                except Exception as e:
                    value = f"unreadable: {type(e).__name__}"
                values.append(f"{sym.label} = {value}, traced with {sym.hint}")
            return "; ".join(values)
        if g.source is None:
            return "changed"
        try:
            value = eval(g.source.guard_expr(), env)
        except Exception as e:
            return f"unreadable: {type(e).__name__}"
        if isinstance(value, torch.Tensor):
            return (f"{g.source.name()}: {type(value).__name__} {str(value.dtype).replace('torch.', '')}"
                    f"{list(value.shape)} stride={list(value.stride())} device={value.device} "
                    f"requires_grad={value.requires_grad}")
        if value is None or type(value) in (bool, int, float, str, torch.dtype, torch.device, tuple) \
                and len(repr(value)) < 80:
            return f"{g.source.name()} = {value!r}"
        if g.kind in ("LEN", "KEYS"):
            try:
                return f"{g.source.name()}: {type(value).__name__} of length {len(value)}"
            except TypeError:
                pass
        return f"{g.source.name()} is {_short(value)}"


def _python_source(params, guards) -> str:
    guards = list(guards)
    if any("___G" in g.expr for g in guards):
        guards.insert(0, Guard(None, "GLOBALS", "___func.__globals__ is ___G", ""))
    body = "".join(f"        {line}\n" for line in _check_lines(guards))
    return (f"def ___check({', '.join(params)}):\n"
            f"    try:\n"
            f"{body}"
            f"        return True\n"
            f"    except Exception:\n"
            f"        return False\n")


class GuardCheck(_C.GuardCheck):
    """An entry's check (run by guards.c).  `guards` are all its guards; `source`, the
    same check written as one Python function (for people and tests)."""

    @property
    def source(self):
        src = self.__dict__.get("_source")
        if src is None:
            src = self.__dict__["_source"] = _python_source(self.params, self.guards)
        return src


class _AbcAnswers:
    """The negative issubclass answers an entry rests on, asked again only when CPython's
    ABC token has moved since they were last true (registrations only add subclasses, so
    these answers are all the trace can lose).  A class that died fails the guard."""
    __slots__ = ("token", "answers", "__weakref__")

    def __init__(self, token):
        self.token = token
        self.answers: list = []

    def add(self, cls, classes):
        self.answers.append((weakref.ref(cls), classes))

    def changed(self):
        """The first answer that no longer holds, as text, or None."""
        for ref, classes in self.answers:
            cls = ref()
            if cls is None:
                return "a class the trace saw died"
            try:
                if issubclass(cls, classes):
                    return f"issubclass({cls.__qualname__}, {_class_names(classes)}) is now True"
            except Exception as e:
                return f"issubclass({cls.__qualname__}, {_class_names(classes)}) raised {type(e).__name__}"
        return None

    def __call__(self):
        token = _abc_token()
        if token == self.token:
            return True
        if self.changed() is not None:
            return False
        self.token = token
        return True


_abc_token = abc.get_cache_token


def _class_names(classes):
    if isinstance(classes, tuple):
        return "(" + ", ".join(getattr(c, "__qualname__", repr(c)) for c in classes) + ")"
    return getattr(classes, "__qualname__", repr(classes))


def one_check(source, op, a=None, b=None, n=0):
    """A guard's spec made of one check."""
    return ((source, op, a, b, n, None),)


class _Marker(Source):
    """The running function (the check's last argument) or the frame's globals (a
    constant of the check), as sources the C program loads."""
    __slots__ = ("what",)

    def __init__(self, what):
        self.what = what

    def key(self):
        return self.what

    def guard_expr(self):
        return self.what

    def __reduce__(self):
        # The C program tells them by identity: an entry read from the on-disk cache
        # (warm_cache.py) names these very two.
        return _marker, (self.what,)


def _marker(what):
    return _FUNC if what == _FUNC.what else _GLOBALS


_FUNC, _GLOBALS = _Marker("___func"), _Marker("___G")
# guards.c answers hasattr() of an object whose class has this __getattr__ without
# calling it (it would format an AttributeError for each missing name).
_MODULE_GETATTR = torch.nn.Module.__getattr__
_OPS = _C.GUARD_OPS
_C_DISTINCT = 32    # distinct(): at most this many sources checked pairwise in C
_IMMUTABLE_TYPE = 1 << 8    # Py_TPFLAGS_IMMUTABLETYPE: a builtin class, whose bases are fixed


def _meta_runs_code(cls) -> bool:
    """Reading an attribute of `cls` runs Python code of its metaclass (its own
    __getattribute__ or __getattr__)."""
    return any(isinstance(k.__dict__.get(h), types.FunctionType) for k in type(cls).__mro__
               for h in ("__getattribute__", "__getattr__"))


def _answered_by_code(cls, name, found) -> bool:
    """``cls.name`` is not what the MRO holds: a descriptor's Python __get__ (which a
    guard must not run: it may count or log), or a data descriptor of the metatype
    (``__class__``, ``__doc__``, a metaclass property) that wins over the class's own."""
    if isinstance(getattr(type(found), "__get__", None), types.FunctionType):
        return True
    for k in type(cls).__mro__:
        if name in k.__dict__:
            t = type(k.__dict__[name])
            return hasattr(t, "__set__") or hasattr(t, "__delete__")
    return False
_KEY_TYPES = (str, int)     # item keys written as their repr in the Python check


class _Program:
    """Builds the C program of a check: each source loaded once into a register, in
    the order the guards first need it, then the guard's checks on those registers."""

    def __init__(self, params, func, uses_globals):
        self.code = []
        self.regs: dict = {}     # source -> register (aliases share one)
        self.nregs = 0
        self.args = {p: i for i, p in enumerate(params)}
        self.globals = func.__globals__
        self.builtins = func.__builtins__
        self.dispatch = None
        if uses_globals:    # as the Python check: globals read through ___G are the function's
            self._emit("IS", self.load(AttrSource(_FUNC, "__globals__")), a=self.globals)

    def _emit(self, op, reg=-1, src=-1, n=0, a=None, b=None):
        self.code.append((_OPS[op], reg, src, n, a, b))

    def loadable(self, source) -> bool:
        while True:
            kind = type(source)
            if kind in (AttrSource, ContainsSource, InstanceDictSource):
                source = source.base
            elif kind is GetItemSource:
                if type(source.index) not in _KEY_TYPES:
                    return False
                source = source.base
            elif kind is CallMethodSource:
                if not (_dict_get(source) or _dict_view(source)):
                    return False
                source = source.base
            elif kind is LocalSource:
                return source.guard_expr() in self.args
            else:
                return kind in (_Marker, ConstSource, GlobalSource, BuiltinSource, ClosureSource,
                                ClosureCellSource)

    def load(self, source) -> int:
        reg = self.regs.get(source)
        if reg is not None:
            return reg
        kind = type(source)
        if kind is ClosureSource:
            reg = self.load(AttrSource(GetItemSource(AttrSource(_FUNC, "__closure__"), source.index),
                                       "cell_contents"))
        elif kind is ClosureCellSource:
            reg = self.load(GetItemSource(AttrSource(_FUNC, "__closure__"), source.index))
        elif kind is GlobalSource:
            reg = self.load(GetItemSource(_GLOBALS, source.global_name))
        elif kind is BuiltinSource:
            reg = self.load(GetItemSource(ConstSource(self.builtins, "builtins"), source.builtin))
        else:
            if kind is AttrSource:
                op, base, a = "ATTR", self.load(source.base), source.attr
            elif kind is InstanceDictSource:
                op, base, a = "ODICT", self.load(source.base), None
            elif kind is CallMethodSource:      # dict.get(base, key), or a keys/values list
                op, base, a = ("DGET", self.load(source.base), source.args[0]) if source.args else \
                    ("DVIEW", self.load(source.base), source.method)
            elif kind in (GetItemSource, ContainsSource):
                op, base, a = "ITEM" if kind is GetItemSource else "IN", self.load(source.base), source.index
            elif kind is ConstSource:
                op, base, a = "CONST", -1, source.obj
            elif source is _GLOBALS:
                op, base, a = "CONST", -1, self.globals
            else:       # an argument, or the function
                op, base, a = "ARG", -1, None
            reg, self.nregs = self.nregs, self.nregs + 1
            n = self.args["___func" if source is _FUNC else source.guard_expr()] if op == "ARG" else 0
            self._emit(op, reg, base, n, a)
        self.regs[source] = reg
        return reg

    def add(self, spec) -> bool:
        """Appends a guard's checks; False (nothing appended) when a source it reads
        has no C form (the guard then runs in Python)."""
        if not all(self.loadable(s) for c in spec for s in (c[0], c[5]) if s is not None):
            return False
        many = [(*c[2], *(c[3] or ())) for c in spec if c[1] in _MANY_SOURCES]
        if not all(self.loadable(s) for sources in many for s in sources):
            return False
        for source, op, a, b, n, other in spec:
            if op == "IN_TENSOR":
                # A symbol's range, checked by the TENSOR check of `source` (GuardSet.
                # _fold_range): that one is C too, its source being as loadable.
                continue
            if op in _MANY_SOURCES:     # (a, b: sources, as registers)
                a, b = tuple(map(self.load, a)), b and tuple(map(self.load, b))
            reg = self.load(source) if source is not None else -1
            self._emit(op, reg, self.load(other) if other is not None else -1, n, a, b)
            if self.dispatch is None and type(source) is LocalSource:
                self._dispatch_on(self.args[source.guard_expr()], op, a, b)
        return True

    def _dispatch_on(self, arg, op, a, b):
        """The entry's key for guards.c's dispatch: an argument's dtype and sizes, or
        its value (an int or str compared by ==)."""
        if op == "TENSOR" and a[0] in (torch.Tensor, torch.nn.Parameter) and \
                all(type(d) is int for d in a[3]):    # (not where symbolic: any size passes)
            self.dispatch = (arg, "tensor", a[0], a[1], tuple(a[3]))
        elif op == "EQ" and type(a) in _KEY_TYPES and b is type(a):
            self.dispatch = (arg, "value", b, a)


def _dict_get(source) -> bool:
    """`source` is ``dict.get(base, key)`` (a dict subclass's get, or super().get) with
    one key the C program can hold."""
    return source.through is not None and source.through.obj is dict.get and \
        len(source.args) == 1 and type(source.args[0]) in _KEY_TYPES and not source.as_list


# Checks over many sources (spec's a and b: tuples of them)
_MANY_SOURCES = ("UNSHARED", "DISTINCT")


def _dict_view(source) -> bool:
    """`source` is ``[*base.keys()]`` or ``[*base.values()]``."""
    return source.as_list and source.through is None and not source.args and \
        source.method in ("keys", "values")


def _autocast_state():
    devices = [d for d in ("cpu", "cuda", "xpu", "mps") if hasattr(torch._C, "_is_autocast_available")
               and torch._C._is_autocast_available(d)] or ["cpu", "cuda"]
    return tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices) + \
        (torch.is_autocast_cache_enabled(),)


def _word(c) -> bool:
    return c.isalnum() or c == "_"      # (re's \w, for str)


def _replace_whole(expr, text, repl) -> str:
    r"""`expr` with each occurrence of `text` not preceded by a word character, a dot or
    a quote, and not followed by a word character, replaced by `repl`: what
    re.sub(r"(?<![\w.'\"])" + re.escape(text) + r"(?!\w)", repl, expr) gives, without
    compiling a pattern for each text (a model's hundreds of guards: ~50 patterns, a few
    ms of a warm start)."""
    out, start, i, n = [], 0, 0, len(text)
    while True:
        j = expr.find(text, i)
        if j < 0:
            break
        end = j + n
        if (j and (_word(expr[j - 1]) or expr[j - 1] in ".'\"")) or \
                (end < len(expr) and _word(expr[end])):
            i = j + 1
            continue
        out += (expr[start:j], repl)
        start = i = end
    out.append(expr[start:])
    return "".join(out)


def _check_lines(guards) -> list[str]:
    """The check's statements: each guard as ``if not (...): return False``, with every
    source that several guards read (``self._modules['h']._modules['0']``, a config
    attribute compared by type and value) evaluated once into a local, just before
    the first guard that needs it.  A model's hundreds of guards share long prefixes;
    evaluating each once makes the check several times cheaper.  (Evaluating a
    prefix early cannot make a passing check fail: every guard evaluates its whole
    source when the check passes.)"""
    uses: dict[str, int] = {}
    chains = []
    for g in guards:
        chain = []
        source = g.source
        while source is not None and not isinstance(source, ConstSource):
            text = source.guard_expr()
            if not text.isidentifier():
                chain.append(text)
                uses[text] = uses.get(text, 0) + (g.expr.count(text) if source is g.source else 1)
            source = getattr(source, "base", None)
        chains.append(chain[::-1])                  # the root's prefix first
    temps = {text: f"___v{i}" for i, text in enumerate(t for t, n in uses.items() if n > 1)}
    # Longest first, so a chain is replaced before its prefixes.
    ordered = sorted(temps, key=len, reverse=True)

    lines, assigned = [], set()

    def substitute(expr, skip=None):
        # Only locals already assigned: a guard may name a source (an alias guard's
        # other tensor) whose chain is first walked by a later guard.
        for text in ordered:
            if text != skip and text in assigned and text in expr:
                expr = _replace_whole(expr, text, temps[text])
        return expr

    for g, chain in zip(guards, chains):
        for text in chain:
            if text in temps and text not in assigned:
                lines.append(f"{temps[text]} = {substitute(text, skip=text)}")
                assigned.add(text)
        lines.append(f"if not ({substitute(g.expr)}): return False")
    return lines


class _Symbol:
    """A symbolic size as the guards see it: its local name in the check, the
    expression that reads it, and the value it was traced with."""
    __slots__ = ("name", "label", "read", "hint")

    def __init__(self, name, label, read, hint):
        self.name, self.label, self.read, self.hint = name, label, read, hint


def _hint(expr, hints):
    """The value `expr` had while tracing."""
    try:
        return int(expr.xreplace(hints))
    except (TypeError, ValueError):
        return "?"


def _implied_by_ranges(expr, ranges) -> bool:
    """True when the symbols' range checks (emitted above) already make `expr` hold."""
    try:
        r = bound_sympy(expr, ranges)
    except Exception:
        return False
    return r.is_singleton() and bool(r.lower) is True


class _SymbolPrinter(PythonPrinter):
    """sympy expressions of the ShapeEnv as Python, with symbols renamed."""

    def __init__(self, names):
        super().__init__()
        self._names = names

    def _print_Symbol(self, expr):
        try:
            return self._names[expr]
        except KeyError:
            raise ValueError(f"shape guard on {expr}, which no input size defines") from None


def _short(value) -> str:
    # Never the user's __repr__: it may run on a half-built object, or be slow.
    name = getattr(type(value), "__qualname__", type(value).__name__)
    if isinstance(value, (type, types.FunctionType, types.ModuleType, types.BuiltinFunctionType)):
        return f"<{type(value).__name__} {getattr(value, '__qualname__', value.__name__)}>"
    return f"<{name} object at {id(value):#x}>"




# ---------------------------------------------------------------- reasons in words
# The global state guards, named for people: reader -> what it reads.
_STATE_NAMES = {torch.is_grad_enabled: "grad mode enabled",
                torch._C._is_any_autocast_enabled: "autocast enabled",
                torch._C._len_torch_function_stack: "torch function modes",
                torch.get_default_dtype: "default dtype"}


def _plain(value) -> str:
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value).replace("torch.", "")
    if isinstance(value, type):
        return value.__qualname__
    if value is None or type(value) in (bool, int, float, str, complex) or \
            isinstance(value, enum.Enum) or (type(value) in (tuple, list) and len(repr(value)) < 80):
        return repr(value)
    return _short(value)


def _in_words(g, env) -> str | None:
    """What changed for a failing guard `g`, as ``what: traced → now``; None where
    the guard's kind has no such reading (its text and value now say it then)."""
    spec = g.spec[0] if g.spec is not None and len(g.spec) == 1 else None
    op = spec[1] if spec is not None else None

    def now():
        return eval(g.source.guard_expr(), env)

    if g.kind == "TENSOR" and g.was is not None:
        return _tensor_change(g.source.name(), g.was, now())
    if g.symbols:
        values = ", ".join(f"{sym.label} = {_read(sym, env)} (traced with {sym.hint})"
                           for sym in g.symbols)
        return f"{values}: outside what the entry was traced for, {g.text}"
    if g.source is None and spec is not None and op in ("CALL_IS", "CALL_EQ"):
        reader, was = spec[2], spec[3]
        name = getattr(reader, "__qualname__", "")
        if isinstance(reader, _AbcAnswers):
            return f"an ABC's register() changed an answer the trace relied on: {reader.changed()}"
        if name == "get_cache_token":
            return (f"abc.get_cache_token(): {was} → {reader()} (an ABC's register() ran "
                    f"since the trace: isinstance answers may differ)")
        return f"{_STATE_NAMES.get(reader, g.kind)}: {_plain(was)} → {_plain(reader())}"
    if g.source is None:
        return None
    name = g.source.name()
    if g.kind == "EQ" and op in ("EQ", "IS"):
        value = now()
        if op == "EQ" and type(value) is not spec[3]:
            return f"{name}: {_plain(spec[2])} → {_plain(value)} (a {type(value).__name__})"
        return f"{name}: {_plain(spec[2])} → {_plain(value)}"
    if g.kind == "TYPE" and op == "TYPE":
        return f"type({name}): {_plain(spec[2])} → {_plain(type(now()))}"
    if g.kind == "LEN" and op == "LEN":
        value = now()
        if type(value) is not spec[2]:
            return f"type({name}): {_plain(spec[2])} → {_plain(type(value))}"
        return f"len({name}): {spec[4]} → {len(value)}"
    if g.kind == "KEYS" and op == "KEYS":
        value = now()
        if type(value) is not dict:
            return f"type({name}): dict → {_plain(type(value))}"
        return f"keys of {name}: {list(spec[2])} → {list(value)}"
    if g.kind == "ID":
        return f"{name}: another object than the one traced (now {_short(now())})"
    return None


def _read(sym, env):
    try:
        return eval(sym.read, env)
    except Exception as e:
        return f"unreadable ({type(e).__name__})"


def _tensor_change(name, was, t) -> str:
    """The first fact of a tensor guard that differs now: ``x.size(0): 8 → 16``."""
    kind, dtype, device, layout, sizes, strides, requires_grad = was
    if not isinstance(t, torch.Tensor):
        return f"{name}: a Tensor → {_plain(type(t))}"
    if type(t) is not kind:
        return f"type({name}): {kind.__qualname__} → {type(t).__qualname__}"
    if t.dtype != dtype:
        return f"{name}.dtype: {_plain(dtype)} → {_plain(t.dtype)}"
    if t.device != device:
        return f"{name}.device: {device} → {t.device}"
    if t.layout != layout:
        return f"{name}.layout: {_plain(layout)} → {_plain(t.layout)}"
    if t.dim() != len(sizes):
        return f"{name}.dim(): {len(sizes)} → {t.dim()} (size {list(sizes)} → {list(t.shape)})"
    changed = [f"{name}.size({i}): {a} → {b}" for i, (a, b) in enumerate(zip(sizes, t.shape))
               if a != "*" and a != b]
    if changed:
        return ", ".join(changed)
    if any(a != "*" and a != b for a, b in zip(strides, t.stride())):
        return f"{name}.stride(): {tuple(strides)} → {tuple(t.stride())}"
    if t.requires_grad != requires_grad:
        return f"{name}.requires_grad: {requires_grad} → {t.requires_grad}"
    return None
