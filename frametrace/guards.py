"""Guards: the facts about a call's inputs and globals that a compiled entry relies on,
compiled into one Python function the C hook calls before reusing the entry.

The check takes the frame's argument slots positionally (named as in the frame), then
``___func``, the running function; it returns exactly ``True`` when the entry applies.

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

import enum
import math
import re
import types
import weakref

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy.printers import PythonPrinter
from torch.utils._sympy.value_ranges import bound_sympy

from . import _C
from .source import AttrSource, ConstSource, Source, const_sources, guard_local_name
from .variables.symbolic import is_symbolic


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


_CHECK_NAMES = {"___type": type, "___len": len, "___tuple": tuple, "___id": id, "math": math,
                "torch": torch, "___unshared": _unshared}


class Guard:
    __slots__ = ("source", "kind", "expr", "text", "symbols")

    def __init__(self, source, kind, expr, text, symbols=()):
        self.source = source
        self.kind = kind
        self.expr = expr    # Python expression, True when the guard holds
        self.text = text    # for people: explain(), logs
        self.symbols = symbols  # the _Symbols a shape guard reads, for its "now:" text

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
        # Where each symbolic size is read: (label, expression, sympy expr at trace time).
        self.sym_reads: list[tuple[str, str, object]] = []

    # -- naming objects the check compares against --
    def const(self, obj) -> str:
        name = self._ids.get(id(obj))
        if name is None:
            name = f"___k{len(self.constants)}"
            self.constants[name] = obj
            self._ids[id(obj)] = name
        return name

    def _add(self, source: Source | None, kind: str, expr: str, text: str, symbols=()):
        if FRESH in expr:
            # About an object the transformed code makes anew on every call, in the
            # same way from guarded inputs (an nn.Parameter of an input): always true.
            return
        key = (source, kind)
        if key not in self.guards:
            self.guards[key] = Guard(source, kind, expr, text, symbols)
            for anchor in const_sources(source):
                self.constants[anchor.guard_expr()] = anchor.obj

    # -- guard kinds --
    def type_match(self, source, value, kind=None):
        e = source.guard_expr()
        kind = type(value) if kind is None else kind
        self._add(source, "TYPE", f"___type({e}) is {self.const(kind)}",
                  f"type({source.name()}) is {kind.__qualname__}")

    def identity(self, source, value):
        e = source.guard_expr()
        if isinstance(value, (types.BuiltinMethodType, types.MethodWrapperType)) and \
                not isinstance(getattr(value, "__self__", None), types.ModuleType):
            # `d.get`, `dict.fromkeys`: a new object on every read, equal (same function,
            # same __self__) to the one traced.
            self._add(source, "ID", f"{e} == {self.const(value)}", f"{source.name()} is {_short(value)}")
            return
        try:
            if isinstance(value, types.CodeType):
                raise TypeError     # held by its function anyway: a plain `is` is cheaper
            ref = weakref.ref(value, self._on_death)
        except TypeError:
            # Builtins and other long-lived objects without weak references.
            expr = f"{e} is {self.const(value)}"
        else:
            # A weak reference, so an entry does not keep the user's objects alive; the
            # entry is dropped when the object dies (`_on_death`).
            expr = f"{self.const(ref)}() is {e} is not None"
        self._add(source, "ID", expr, f"{source.name()} is {_short(value)}")

    def equals(self, source, value):
        e = source.guard_expr()
        if value is None or type(value) is bool or value is Ellipsis or \
                isinstance(value, (torch.dtype, enum.Enum)):
            self._add(source, "EQ", f"{e} is {self.const(value)}", f"{source.name()} is {value!r}")
            return
        t = self.const(type(value))
        if isinstance(value, float) and value != value:
            expr = f"___type({e}) is {t} and {e} != {e}"
        elif isinstance(value, float) and value == 0.0:
            # 0.0 == -0.0, but 1 / x tells them apart.
            expr = (f"___type({e}) is {t} and {e} == 0.0 and "
                    f"{self.const(math.copysign)}(1.0, {e}) == {math.copysign(1.0, value)}")
        else:
            expr = f"___type({e}) is {t} and {e} == {self.const(value)}"
        self._add(source, "EQ", expr, f"{source.name()} == {value!r}")

    def not_none(self, source):
        self._add(source, "NOT_NONE", f"{source.guard_expr()} is not None", f"{source.name()} is not None")

    def length(self, source, value):
        e = source.guard_expr()
        self._add(source, "LEN",
                  f"___type({e}) is {self.const(type(value))} and ___len({e}) == {len(value)}",
                  f"type({source.name()}) is {type(value).__name__} and len({source.name()}) == {len(value)}")

    def dict_keys(self, source, value):
        e = source.guard_expr()
        keys = tuple(value)
        self._add(source, "KEYS",
                  f"___type({e}) is dict and ___tuple({e}) == {self.const(keys)}",
                  f"{source.name()} is a dict with keys {list(keys)}")

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
                 f"{e}.device == {self.const(t.device)}"]
        dtype = str(t.dtype).replace("torch.", "")
        if fake is None or not any(map(is_symbolic, (*fake.shape, *fake.stride()))):
            parts += [f"{e}.shape == {self.const(shape)}", f"{e}.stride() == {self.const(stride)}"]
            sizes, strides = list(shape), list(stride)
        else:
            # Static sizes and strides are compared here; symbolic ones are read into
            # names that the shape guards (made at the end of the trace) check.
            n = len(self.guards)
            z, st = f"___z{n}", f"___st{n}"
            parts.append(f"___len({z} := {e}.shape) == {len(shape)}")
            parts.append(f"___len({st} := {e}.stride()) == {len(shape)}")
            shown = {"shape": [], "stride()": []}     # for the text: "*" where symbolic
            for kind, read, values in (("shape", z, fake.shape), ("stride()", st, fake.stride())):
                for i, v in enumerate(values):
                    if is_symbolic(v):
                        self.sym_reads.append((f"{source.name()}.{kind}[{i}]", f"{read}[{i}]",
                                               v.node.expr))
                        shown[kind].append("*")
                    else:
                        parts.append(f"{read}[{i}] == {int(v)}")
                        shown[kind].append(int(v))
            sizes, strides = shown["shape"], shown["stride()"]
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
                  f"requires_grad={t.requires_grad}{bits}")

    def storage_offset(self, source, t: torch.Tensor):
        """The trace read the tensor's storage offset (most graphs never do, so the
        tensor guard leaves it out: views at any offset share an entry)."""
        e = source.guard_expr()
        self._add(source, "OFFSET", f"{e}.storage_offset() == {t.storage_offset()}",
                  f"{source.name()}.storage_offset() == {t.storage_offset()}")

    def symbolic_number(self, source, sym, kind):
        """An int or float that is a symbolic input of the graph."""
        e = source.guard_expr()
        self._add(source, "TYPE", f"___type({e}) is {kind.__name__}",
                  f"type({source.name()}) is {kind.__name__}")
        self.sym_reads.append((source.name(), e, sym.node.expr))

    def shape_guards(self, shape_env):
        """The facts the ShapeEnv learned while tracing (branches on sizes, broadcasts,
        divisibility of views), plus each symbol's range, as Python checks over the
        sizes read in the tensor guards.  Called once, at the end of the trace."""
        bound: dict = {}            # sympy Symbol -> _Symbol
        later = []
        hints = shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") \
            else shape_env.var_to_val
        for label, read, expr in self.sym_reads:
            now = shape_env.simplify(expr)
            if isinstance(now, sympy.Symbol) and now not in bound:
                bound[now] = _Symbol(f"___s{len(bound)}", label, read, hints.get(now))
            else:
                later.append((label, read, now))
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
            self._add(None, f"SYMBOL {b.label}", " and ".join(checks), text, (b,))
        for label, read, now in later:
            own = _Symbol(None, label, read, _hint(now, hints))
            used = (own, *(bound[s] for s in now.free_symbols if s in bound))
            self._add(None, f"SIZE {label}", f"{read} == {names.doprint(now)}",
                      f"{label} == {labels.doprint(now)}", used)
        ranges = {s: r for s, r in shape_env.var_to_range.items() if s in bound}
        for g in shape_env.guards:
            expr = shape_env.simplify(g.expr)
            if expr == sympy.true or _implied_by_ranges(expr, ranges):
                continue
            if free_unbacked_symbols(expr):
                # A number read from data exists only inside the graph: the ShapeEnv
                # asserts facts about it at run time, it never guards them.
                raise AssertionError(f"shape guard {expr} names a number read from data")
            used = tuple(bound[s] for s in expr.free_symbols if s in bound)
            self._add(None, f"SHAPE {expr}", names.doprint(expr), labels.doprint(expr), used)

    def not_shadowed(self, globals_source: Source | None, name: str):
        """A builtin was read: the module (the frame's own when `globals_source` is None)
        still defines no global of that name."""
        expr = "___G" if globals_source is None else globals_source.guard_expr()
        label = "globals()" if globals_source is None else globals_source.name()
        self._add(globals_source, f"NOT_GLOBAL {name}", f"{name!r} not in {expr}",
                  f"{name!r} is not a global of {label} (the builtin is used)")

    def no_hooks(self, source, module):
        """The module still has no hooks of its own (they would change its call)."""
        e = source.guard_expr()
        self._add(source, "NO_HOOKS",
                  f"not ({e}._forward_hooks or {e}._forward_pre_hooks or {e}._backward_hooks "
                  f"or {e}._backward_pre_hooks)", f"{source.name()} has no hooks")

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
                  f"{names} share memory with no other tensor input")

    def distinct(self, sources):
        """The objects at `sources` (mutable inputs guarded by type, not identity) are
        as many distinct objects as when traced: one set of ids instead of n**2 checks."""
        exprs = ", ".join(s.guard_expr() for s in sources)
        self._add(None, "DISTINCT", f"___len({{*map(___id, ({exprs},))}}) == {len(sources)}",
                  f"{', '.join(s.name() for s in sources)} are distinct objects")

    def in_dict(self, source, name: str):
        """An instance attribute is present (whatever its value)."""
        e = source.guard_expr()
        self._add(source, f"IN_DICT {name}", f"{name!r} in {e}.__dict__",
                  f"{source.name()} has instance attribute {name!r}")

    def not_in_dict(self, source, name: str):
        """An instance attribute does not shadow what its class provides."""
        e = source.guard_expr()
        self._add(source, f"NOT_IN_DICT {name}", f"{name!r} not in {e}.__dict__",
                  f"{source.name()} has no instance attribute {name!r}")

    def function_state(self, source, fn, fixed: bool):
        """An inlined function's `__code__`, `__defaults__` and `__kwdefaults__` are
        still what was traced (they can be assigned).  For a `fixed` function (one
        object, guarded by identity) the very objects; for a closure (a new function
        per call of its parent) the defaults' shape, each default being guarded
        through its own source.  One guard: it runs per inlined function per call."""
        e = source.guard_expr()
        d, kw = fn.__defaults__, fn.__kwdefaults__
        parts = [f"{e}.__code__ is {self.const(fn.__code__)}"]
        if fixed or d is None:
            parts.append(f"{e}.__defaults__ is {self.const(d)}")
        else:
            parts.append(f"___len({e}.__defaults__) == {len(d)}")
        if fixed or kw is None:
            parts.append(f"{e}.__kwdefaults__ is {self.const(kw)}")
        else:
            parts.append(f"___tuple({e}.__kwdefaults__) == {self.const(tuple(kw))}")
        self._add(source, "FUNCTION", " and ".join(parts),
                  f"{source.name()} has the code and defaults traced")

    def value(self, source, value):
        """`source` still gives `value`: by value for constants, else by identity."""
        from .variables.constant import is_constant_value
        if is_constant_value(value):
            self.equals(source, value)
        else:
            self.identity(source, value)

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
            if not hasattr(holder, name):
                self._add(src, "ABSENT", f"not {self.const(hasattr)}({src.base.guard_expr()}, {name!r})",
                          f"{src.name()} is not defined")
            return
        try:
            now = getattr(holder, name)
        except Exception:
            return
        if isinstance(now, types.MethodType):      # a classmethod, bound anew on each read
            self.identity(AttrSource(src, "__func__"), now.__func__)
        else:
            self.value(src, now)

    def autocast_state(self):
        """Autocast entered outside the frame changes what ops compute (their dtypes,
        which the trace reads): the common case, autocast off, is one C call."""
        if not torch._C._is_any_autocast_enabled():
            self.global_state("autocast is off", torch._C._is_any_autocast_enabled, False)
        else:
            state = _autocast_state()
            self._add(None, "AUTOCAST", f"{self.const(_autocast_state)}() == {self.const(state)}",
                      f"autocast state is {state}")

    def function_modes(self):
        """The torch function modes active outside the frame (a TorchFunctionMode;
        torch.set_default_device and `with torch.device(...)` push one too) decide what
        each op does, and which device factories use: the stack is what it was."""
        if torch._C._len_torch_function_stack() == 0:
            self.global_state("no torch function mode", torch._C._len_torch_function_stack, 0)
        else:
            from torch.overrides import _get_current_function_mode_stack
            stack = tuple(_get_current_function_mode_stack())
            self._add(None, "FUNCTION_MODES",
                      f"___tuple({self.const(_get_current_function_mode_stack)}()) == {self.const(stack)}",
                      f"the torch function modes are {[type(m).__name__ for m in stack]}")

    def distinct_objects(self, a: Source, b: Source):
        self._add(None, f"DISTINCT {a.name()} {b.name()}",
                  f"{a.guard_expr()} is not {b.guard_expr()}", f"{a.name()} is not {b.name()}")

    def same_object(self, source, other: Source):
        self._add(source, "ALIAS", f"{source.guard_expr()} is {other.guard_expr()}",
                  f"{source.name()} is {other.name()}")

    def global_state(self, name: str, reader, value):
        self._add(None, name, f"{self.const(reader)}() is {self.const(value)}",
                  f"{name} is {value!r}")

    def abc_registry(self):
        """An answer of an ABC's isinstance/issubclass holds until some ABC's register()
        (which CPython's ABC caches notice by this token)."""
        import abc
        token = abc.get_cache_token()
        self._add(None, "ABC registry", f"{self.const(abc.get_cache_token)}() == {token!r}",
                  f"abc.get_cache_token() == {token!r}")

    def grad_mode(self, enabled: bool):
        self.global_state("grad_mode", torch.is_grad_enabled, enabled)

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
        """The check function for the C hook."""
        code = self.code
        nargs = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + \
            bool(code.co_flags & 0x08)
        params = [guard_local_name(n) for n in code.co_varnames[:nargs]] + ["___func"]
        guards = list(self.guards.values())
        uses_globals = any("___G" in g.expr for g in guards)
        uses_builtins = any("___B[" in g.expr for g in guards)
        if uses_globals:
            guards.insert(0, Guard(None, "GLOBALS", "___func.__globals__ is ___G", ""))
        body = "".join(f"        {line}\n" for line in _check_lines(guards))
        src = (f"def ___check({', '.join(params)}):\n"
               f"    try:\n"
               f"{body}"
               f"        return True\n"
               f"    except Exception:\n"
               f"        return False\n")
        namespace = dict(self.constants)
        namespace.update(_CHECK_NAMES)
        if uses_globals:
            namespace["___G"] = self.func.__globals__
        if uses_builtins:
            namespace["___B"] = self.func.__builtins__
        exec(compile(src, f"<frametrace guards for {code.co_name}>", "exec"), namespace)
        check = namespace["___check"]
        check.source = src
        check.guards = list(self.guards.values())
        self.check_ref = weakref.ref(check)
        # The entry lives in the code's extra, which the GC does not see: holding the
        # function here would keep it alive until reset().
        self.func = None
        return check

    def first_failure(self, args, func) -> str | None:
        """Text of the first guard that fails for these argument slots (recompile logs)."""
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
                return f"{g.text} (now: {self._describe_now(g, env)})"
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


def _autocast_state():
    devices = [d for d in ("cpu", "cuda", "xpu", "mps") if hasattr(torch._C, "_is_autocast_available")
               and torch._C._is_autocast_available(d)] or ["cpu", "cuda"]
    return tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices) + \
        (torch.is_autocast_cache_enabled(),)


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
    patterns = [(re.compile(r"(?<![\w.'\"])" + re.escape(text) + r"(?!\w)"), text)
                for text in sorted(temps, key=len, reverse=True)]

    lines, assigned = [], set()

    def substitute(expr, skip=None):
        # Only locals already assigned: a guard may name a source (an alias guard's
        # other tensor) whose chain is first walked by a later guard.
        for pattern, text in patterns:
            if text != skip and text in assigned and text in expr:
                expr = pattern.sub(temps[text], expr)
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


