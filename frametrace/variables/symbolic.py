"""Symbolic sizes while tracing: a SymInt (SymFloat, SymBool) of the compile's ShapeEnv
with the FX node that computes it at run time.

Arithmetic and comparisons on them stay symbolic (graph nodes; a comparison used as a
Python bool adds a guard on the relation, e.g. ``s0 > 16``).  Anything else that needs
the plain number asks `as_const()`, which specializes the symbol: a guard pins it to the
value seen, so the answer is right, at the price of a recompile for another value.

Floats are the exception to "arithmetic stays symbolic": sympy computes with real
numbers (``m * 0`` is 0, ``m - m`` is 0, ``(m + 1.0) - m`` is 1.0, ``m == m`` is True;
its float symbols are even assumed finite), which IEEE 754 does not (NaN, infinities,
-0.0, rounding).  So no Python operation on a float symbol is left to sympy
(`float_number_op`): +, -, *, abs, division by a constant and comparisons are float64
tensor ops in the graph, which compute as CPython's floats do; a comparison of the
symbol itself with a finite constant stays a relation (a guard, evaluated by Python on
the real number); anything else pins the value with a guard, or breaks the graph for a
float read from data.  A symbol pinned since (``str(m)`` guards its value) is that plain
number to every later operation, never sympy's number (``-1.5 * 0`` is 0 to sympy); and
where sympy folds an operation on floats computed from sizes to a constant (``-n * 0.0``,
``f - f``), the sizes are pinned and CPython's operator computes it.  In tensor ops (``x * lr``, ``p.add_(g, alpha=-lr)``) a symbolic
float is a scalar argument, which the kernel uses at run time.
"""
from __future__ import annotations

import builtins
import dataclasses
import math
import operator

import torch
from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode, free_unbacked_symbols,
                                                   guard_bool, guard_float, guard_int)

from torch.utils._sympy.symbol import SymT, symbol_is_type

from .base import Var, unsupported
from .constant import ConstVar
from ..shapes import SYM_TYPES, is_symbolic  # noqa: F401  (read here by variables/)
from .tensor import TensorVar

_PLAIN = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def mark_data(sym) -> None:
    """`sym` is a number computed in CPython at a graph break (``x.item()``): data that
    changes from call to call.  Arithmetic and torch ops on it, and on what is computed
    from it, stay in the graph; code that needs the plain number breaks the graph
    instead of pinning the value (which would recompile on every call)."""
    if not isinstance(sym, SYM_TYPES):
        return
    env = sym.node.shape_env
    data = getattr(env, "_frametrace_data", None)
    if data is None:
        data = env._frametrace_data = set()
    data |= sym.node.expr.free_symbols


def _from_data(value) -> bool:
    if not isinstance(value, SYM_TYPES):
        return False
    data = getattr(value.node.shape_env, "_frametrace_data", None)
    return bool(data) and not data.isdisjoint(value.node.expr.free_symbols)


def is_unbacked(value) -> bool:
    """A number the graph computes from a tensor's data (``t.item()``, a size of
    ``nonzero()``): the trace never knows it, and no guard may name it."""
    return isinstance(value, SYM_TYPES) and bool(free_unbacked_symbols(value))


def plain(value):
    """The number a Sym* value stands for, by specializing it (adds a guard)."""
    if is_unbacked(value):
        unsupported(f"using the value of {value}, a number the graph reads from a tensor's data")
    if _from_data(value):
        unsupported(f"using the value of a {_PLAIN[type(value)].__name__} computed at a "
                    "graph break (it changes between calls)")
    if isinstance(value, torch.SymBool):
        return guard_bool(value)
    if isinstance(value, torch.SymFloat):
        return guard_float(value)
    if isinstance(value, torch.SymInt):
        return guard_int(value)
    return value


def _symbolic_float(v) -> bool:
    """A SymNodeVar whose float is computed from a float symbol (a float input or a
    float read from data).  Floats computed from int symbols alone (``s * 0.5``,
    ``math.sqrt(d)`` of sizes) are not: no NaN, infinity or -0.0 comes from a size."""
    return isinstance(v, SymNodeVar) and isinstance(v.example, torch.SymFloat) and \
        is_symbolic(v.example) and \
        any(symbol_is_type(s, (SymT.FLOAT, SymT.UNBACKED_FLOAT)) for s in v.example.node.expr.free_symbols)


# The functions of Python numbers (as opposed to tensor ops, which take a symbolic float
# as a scalar argument and use its value at run time).
_NUMBER_MODULES = frozenset({"_operator", "operator", "math", "builtins", "cmath"})


def _number_function(kind, target, args) -> bool:
    if kind == "call_method":
        return bool(args) and isinstance(args[0], SymNodeVar)
    if getattr(target, "__module__", None) in _NUMBER_MODULES or \
            any(target is f for f in vars(operator).values()) or \
            any(target is f for f in (builtins.abs, builtins.round, builtins.pow, builtins.divmod,
                                      builtins.min, builtins.max, math.floor, math.ceil, math.trunc)):
        return True
    name = getattr(target, "__name__", "")
    return getattr(target, "__module__", "").startswith("torch") and \
        (name.startswith("sym_") or name.startswith("_sym_"))


def float_number_op(graph, kind, target, args, kwargs):
    """A Python number operation (operator.*, math.*, torch.sym_*) on a symbolic float,
    done so that no sympy arithmetic decides its result (see the module's docstring);
    None for any other op, which the graph records as usual.

    +, -, *, abs, division by a constant and comparisons become float64 tensor ops with
    the result read back (``item()``, a number the trace does not know), which compute
    as CPython's floats do, IEEE 754 both; /, // and % run CPython's own operator at run
    time (`python_float_op`, raising its ZeroDivisionError).  Any other operation pins a float with a
    guardable value (an argument that became dynamic): it runs on the value, with a
    guard; on a float read from data (``t.item()``, a number from a graph break), which
    no guard can pin, it is a graph break."""
    values = (*args, *kwargs.values())
    if not any(isinstance(v, SymNodeVar) for v in values) or not _number_function(kind, target, args):
        return None
    if any(map(_settled, values)):
        # A symbol pinned since (``str(m)`` guarded its value): the operation runs on the
        # plain number, as CPython's (sympy's -1.5 * 0 is 0, CPython's -0.0).
        args = tuple(map(_unsettle, args))
        kwargs = {k: _unsettle(v) for k, v in kwargs.items()}
        values = (*args, *kwargs.values())
        if not any(isinstance(v, SymNodeVar) for v in values):
            return graph.call(kind, target, args, kwargs)
    if not any(map(_symbolic_float, values)):
        if _sympy_folds_a_float(kind, target, args, kwargs):
            # sympy decided a float result from symbols (``-s0 * 0.0`` is 0 to it, -0.0 to
            # CPython; ``f - f`` is 0, nan for an infinite f): no fold is trusted, the
            # symbols are pinned (a guard each) and CPython's operator runs on the values.
            def pin_any(v):
                return ConstVar(plain(v.example)) if isinstance(v, SymNodeVar) else v
            return graph.call(kind, target, tuple(map(pin_any, args)),
                              {k: pin_any(v) for k, v in kwargs.items()})
        return None
    if any(isinstance(v, TensorVar) for v in values):
        return None     # a tensor op: the float is its scalar argument, used at run time
    if _plain_relation(kind, target, args, kwargs) or _plain_conversion(kind, target, args, kwargs):
        return None
    fn = _TENSOR_FLOAT_OPS.get(target) if kind == "call_function" else None
    if kind == "call_function" and target in (operator.truediv, operator.itruediv) and \
            len(args) == 2 and isinstance(args[1], ConstVar) and args[1].value:
        fn = torch.div      # by a nonzero constant: CPython cannot raise ZeroDivisionError
    elif fn is None and kind == "call_function" and len(args) == 2:
        fn = _PYTHON_FLOAT_OPS.get(target)
    if fn is None or kwargs or not all(map(_exact_as_double, args)):
        if any(_from_data(v.example) or is_unbacked(v.example) for v in values if _symbolic_float(v)):
            unsupported(f"{getattr(target, '__name__', target)} on a float computed from data "
                        "(sympy's arithmetic is not IEEE 754's)")

        def pin(v):
            return ConstVar(plain(v.example)) if _symbolic_float(v) else v
        return graph.call(kind, target, tuple(map(pin, args)), {k: pin(v) for k, v in kwargs.items()})
    if fn is operator.pos or fn is torch.sym_float:
        return args[0]
    operands = [graph.call("call_function", torch.scalar_tensor, (a,), {"dtype": ConstVar(torch.float64)})
                for a in args]
    if isinstance(fn, str):
        result = graph.call("call_function", torch.ops.frametrace.python_float_op.default,
                            (ConstVar(fn), *operands), {})
    else:
        result = graph.call("call_function", fn, tuple(operands), {})
    # The ShapeEnv refuses item() without capture_scalar_outputs; here it reads a
    # number the graph computed itself.  It stays allowed for this compile: AOTAutograd
    # traces the graph again in this ShapeEnv.  (frametrace's own item() and friends
    # check the config, not the ShapeEnv.)
    env = graph.shape_env
    if not env.allow_scalar_outputs:
        env.settings = dataclasses.replace(env.settings, allow_scalar_outputs=True)
    return graph.call("call_method", "item", (result,), {})


def _settled(v) -> bool:
    """A SymNodeVar whose symbols have all been pinned by guards: its expression is a
    number now."""
    return isinstance(v, SymNodeVar) and isinstance(v.example, SYM_TYPES) and v.example.node.expr.is_number


def _unsettle(v):
    return ConstVar(plain(v.example)) if _settled(v) else v


def _sympy_folds_a_float(kind, target, args, kwargs) -> bool:
    """Whether sympy answers this number operation with a constant although an operand
    is symbolic, where the result is a float or compares one: sympy's algebra (x * 0 is
    0, x - x is 0, x == x is True) holds for real numbers, not for IEEE 754's -0.0,
    infinities and NaN.  Tried on the operands' symbolic values, as the graph would."""
    values = (*args, *kwargs.values())
    if not all(isinstance(v, (SymNodeVar, ConstVar)) for v in values):
        return False
    examples = [v.example if isinstance(v, SymNodeVar) else v.value for v in args]
    kw = {k: v.example if isinstance(v, SymNodeVar) else v.value for k, v in kwargs.items()}
    if not any(isinstance(e, torch.SymFloat) or type(e) is float for e in (*examples, *kw.values())):
        return False        # ints: exact to sympy too (s0 / s0 is 1.0 for a size)
    try:
        out = getattr(examples[0], target)(*examples[1:], **kw) if kind == "call_method" \
            else target(*examples, **kw)
    except Exception:
        return False        # the graph's own call says what happens
    if isinstance(out, torch.SymFloat):
        return out.node.expr.is_number
    if isinstance(out, torch.SymBool):
        return out.node.expr.is_number
    return type(out) in (float, bool)


# Operations whose float64 tensor op gives what CPython's float operation gives, for
# every pair of doubles (division only by a nonzero constant: CPython raises on a zero
# divisor, the tensor op does not).
_TENSOR_FLOAT_OPS = {
    operator.add: torch.add, operator.iadd: torch.add, operator.sub: torch.sub,
    operator.isub: torch.sub, operator.mul: torch.mul, operator.imul: torch.mul,
    operator.neg: torch.neg, operator.abs: torch.abs, builtins.abs: torch.abs,
    operator.pos: operator.pos, torch.sym_float: torch.sym_float,
    operator.eq: torch.eq, operator.ne: torch.ne, operator.lt: torch.lt, operator.le: torch.le,
    operator.gt: torch.gt, operator.ge: torch.ge,
}


# Operations no tensor op computes as CPython does (its ZeroDivisionError, the sign
# rules of // and %): CPython's own, at run time, in an op the backends keep opaque.
_PYTHON_FLOAT_OPS = {operator.truediv: "truediv", operator.itruediv: "truediv",
                     operator.floordiv: "floordiv", operator.ifloordiv: "floordiv",
                     operator.mod: "mod", operator.imod: "mod"}


@torch.library.custom_op("frametrace::python_float_op", mutates_args=())
def python_float_op(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a op b`` on the two floats, as CPython computes it (raising what it raises), as a
    0-d float64 tensor (which holds any Python float exactly)."""
    return torch.tensor(getattr(operator, op)(a.item(), b.item()), dtype=torch.float64)


@python_float_op.register_fake
def _(op, a, b):
    return torch.empty((), dtype=torch.float64)


_RELATIONS = frozenset({operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge})


def _plain_relation(kind, target, args, kwargs) -> bool:
    """A comparison of an input's float symbol with a finite constant or another such
    symbol: the relation stays symbolic, a guard when branched on, which Python evaluates
    on the real numbers (``L['m'] > 0`` is False for NaN, as in the program).  Nothing
    to simplify there, unlike ``m == m`` (True to sympy) or ``m < inf`` (its symbols
    are finite)."""
    if kind != "call_function" or target not in _RELATIONS or kwargs or len(args) != 2:
        return False
    symbols = set()
    for v in args:
        if isinstance(v, SymNodeVar):
            expr = v.example.node.expr
            if not isinstance(v.example, torch.SymFloat) or not expr.is_Symbol or is_unbacked(v.example):
                return False
            symbols.add(expr)
        elif not (isinstance(v, ConstVar) and type(v.value) in (int, float) and math.isfinite(v.value)):
            return False
    return len(symbols) == sum(isinstance(v, SymNodeVar) for v in args)


def _plain_conversion(kind, target, args, kwargs) -> bool:
    """``int(m)``, ``math.floor(m)`` ... of a float symbol itself: nothing to simplify, and
    at run time the graph (or a guard on the int) computes it from the real number,
    raising as CPython does on NaN and infinities (a guard that raises does not hold)."""
    return kind == "call_function" and target in _CONVERSIONS and len(args) == 1 and \
        not kwargs and _symbolic_float(args[0]) and args[0].example.node.expr.is_Symbol


_CONVERSIONS = frozenset({torch.sym_int, math.floor, math.ceil, math.trunc})


def _exact_as_double(v) -> bool:
    """A float, or a bool or int a double holds exactly (CPython compares a float with
    an int exactly, and converts it exactly within 2**53).  A float the graph computes
    from sizes (``math.cos(math.pi * epoch / T)`` in an LR scheduler, an int that became
    symbolic) is a double at run time too, computed by CPython's own operations."""
    if _symbolic_float(v) or isinstance(v, SymNodeVar) and isinstance(v.example, torch.SymFloat):
        return True
    if isinstance(v, ConstVar):
        return type(v.value) is float or type(v.value) in (bool, int) and abs(v.value) <= 2 ** 53
    return False


class SymNodeVar(Var):
    __slots__ = ("node", "example")

    def __init__(self, node, example, source=None):
        super().__init__(source)
        self.node = node
        self.example = example

    def python_type(self):
        return _PLAIN[type(self.example)]

    # A size is a constant to any code that needs one: asking specializes it.  Not so
    # for numbers computed from data (see `mark_data`): those break the graph instead.
    def is_const(self):
        return not _from_data(self.example) and not is_unbacked(self.example)

    def as_const(self):
        return plain(self.example)

    def truth(self, tx):
        # bool(SymBool) guards on the relation; bool(SymInt) on "!= 0".  About a
        # number read from data, only what the ShapeEnv can prove is answered (a guard
        # cannot read it): anything else is a graph break.
        if _symbolic_float(self):
            # bool(m) is m != 0 for every float (NaN true, -0.0 false); torch's bool
            # of a float symbol would pin its value.
            return tx.output.call("call_function", operator.ne, (self, ConstVar(0.0)), {}).truth(tx)
        try:
            return bool(self.example)
        except GuardOnDataDependentSymNode:
            unsupported(f"branching on {self.example}, which depends on a tensor's data")

    def getattr(self, tx, name):
        return ConstVar(self.as_const()).getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        return ConstVar(self.as_const()).call_method(tx, name, args, kwargs)

    def getitem(self, tx, key):
        unsupported(f"indexing {self}")

    def reconstruct(self, cg):
        if not is_symbolic(self.example):
            cg.load_const(plain(self.example))
        else:
            cg.load_tensor(self)    # a graph output (or the int input itself)

    def noun(self):
        kind = _PLAIN.get(type(self.example), type(self.example)).__name__
        return f"{'an' if kind == 'int' else 'a'} {kind} computed in the graph (symbolic)"

    def __repr__(self):
        return f"SymNodeVar({self.node.name}: {self.example})"


class FormattedVar(Var):
    """A string made by an f-string with symbolic numbers in it (``f"step {i}"``),
    formatted when read.  Read as a constant (a dict key, a string method, a comparison),
    it pins the numbers, a guard on each value, as formatting them at once did; passed
    on untouched (to a print() at a graph break, a log call replayed after the graph, a
    return value, a store) CPython formats it from the numbers' values at run time, and
    they stay symbolic.  A step counter printed every step recompiled every step.
    `pieces`: constant strings, and (SymNodeVar, conversion, format spec) fields."""
    __slots__ = ("pieces",)

    def __init__(self, pieces):
        super().__init__()
        self.pieces = tuple(pieces)

    def python_type(self):
        return str

    def is_const(self):
        return True

    def as_const(self):
        return "".join(p if isinstance(p, str) else formatted(p[0].as_const(), p[1], p[2])
                       for p in self.pieces)

    def getattr(self, tx, name):
        return ConstVar(self.as_const()).getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        return ConstVar(self.as_const()).call_method(tx, name, args, kwargs)

    def getitem(self, tx, key):
        return ConstVar(self.as_const()).getitem(tx, key)

    def reconstruct(self, cg):
        template = tuple(p if isinstance(p, str) else p[1:] for p in self.pieces)
        cg.call_const(format_pieces, [lambda cg: cg.load_const(template)] +
                      [p[0].reconstruct for p in self.pieces if not isinstance(p, str)])

    def __repr__(self):
        return f"FormattedVar({self.pieces!r})"


def formatted(value, conv: int, spec: str) -> str:
    """What FORMAT_VALUE makes of `value` (`conv`: its low bits, 1 str, 2 repr, 3 ascii)."""
    value = {0: value, 1: str, 2: repr, 3: ascii}[conv](value) if conv else value
    return format(value, spec)


def format_pieces(template, *numbers) -> str:
    """A FormattedVar's string from its numbers' run-time values."""
    it = iter(numbers)
    return "".join(p if isinstance(p, str) else formatted(next(it), *p) for p in template)


def lazily_formatted(value: Var, conv: int, spec: str):
    """FORMAT_VALUE of a symbolic int or float: a FormattedVar; else None."""
    if isinstance(value, SymNodeVar) and is_symbolic(value.example) and value.is_const() and \
            isinstance(value.example, (torch.SymInt, torch.SymFloat)):
        return FormattedVar([(value, conv, spec)])
    return None


def lazily_joined(parts):
    """BUILD_STRING of constant strings and FormattedVars (at least one): a FormattedVar;
    else None."""
    if not any(isinstance(p, FormattedVar) for p in parts) or \
            not all(isinstance(p, FormattedVar) or (p.is_const() and isinstance(p.as_const(), str))
                    for p in parts):
        return None
    pieces = []
    for p in parts:
        pieces.extend(p.pieces if isinstance(p, FormattedVar) else [p.as_const()])
    return FormattedVar(pieces)


class SliceVar(Var):
    """A slice with a symbolic bound (``x[:, :n]``), passed to the graph as is."""
    __slots__ = ("parts",)

    def __init__(self, parts):
        super().__init__()
        self.parts = list(parts)

    def python_type(self):
        return slice

    def is_const(self):
        return True

    def as_const(self):
        return slice(*(p.as_const() for p in self.parts))

    def reconstruct(self, cg):
        cg.load_const(self.as_const())


def wrap_sym(node, value) -> Var:
    """The Var for an op result that is a Sym* value (or a plain number)."""
    if is_symbolic(value):
        node.meta["example_value"] = node.meta["val"] = value
        return SymNodeVar(node, value)
    return ConstVar(plain(value))


# torch's own helpers that ask the ShapeEnv about a size expression.  On a plain
# number or bool (what CPython passes them) each answers from its value.
_SHAPE_QUERY_NAMES = ("guard_size_oblivious", "statically_known_true", "statically_known_false",
                      "guard_or_true", "guard_or_false", "is_concrete_int", "is_concrete_bool",
                      "is_concrete_float", "definitely_true", "definitely_false", "guard_int",
                      "guard_bool", "guard_float", "expect_true")
SHAPE_QUERIES = frozenset(
    getattr(torch.fx.experimental.symbolic_shapes, n) for n in _SHAPE_QUERY_NAMES
    if hasattr(torch.fx.experimental.symbolic_shapes, n))


def shape_query(tx, fn, args, kwargs):
    """``guard_size_oblivious(x.shape[0] == 1)`` and its kind, on a traced size or a
    constant, answered as CPython answers it, from the value: a symbolic argument is
    decided first, with the ShapeEnv guard that takes (none where the trace's facts
    prove it; a symbolic size is specialised for `is_concrete_int`).  Asked on the
    symbol itself, `statically_known_true(s0 == 3)` would say False where CPython says
    True.  A question about a number read from data is a graph break, as branching on
    it is."""
    if kwargs or len(args) != 1 or not isinstance(args[0], (SymNodeVar, ConstVar)):
        return None
    arg = args[0]
    if isinstance(arg, SymNodeVar) and _symbolic_float(arg):
        return None
    value = arg.as_const() if isinstance(arg, ConstVar) else arg.example
    if isinstance(value, SYM_TYPES):
        if _from_data(value):
            return None
        try:
            value = {torch.SymBool: bool, torch.SymInt: int}[type(value)](value)
        except GuardOnDataDependentSymNode:
            unsupported(f"{fn.__name__}() of {value}, which depends on a tensor's data")
    out = fn(value)
    return ConstVar(out) if type(out) in (bool, int, float) else None
