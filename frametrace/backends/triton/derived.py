"""Derived sizes: a symbolic size that is no polynomial of shape symbols (`(s0 - 1)//2 + 1`
of a strided slice, `s0//2` of a view's -1, a pooling's or a strided convolution's output
size) has each of its non-polynomial parts stand for an opaque symbol of its own (a
`DerivedSize`, `ds0`, `ds1`...), which the wrapper computes from the shape symbols it read
from its inputs, once per call, right after binding them (`sources`); kernels take it as
one more int size argument.  Its hint is its value at the shape symbols' hints.

A part over a size the data decides (u0, bound midway through a call by the aten call
that makes it) is computed right after that binding (`late`), and kernels taking it
pick block sizes per power-of-two bucket, as for u0 itself.  The Python source
mirrors each function's exact semantics (floor division and Python's `%` for FloorDiv and
PythonMod, the C remainder for torch's Mod) and is checked against SymPy's own value at
the hints before it is used."""
from __future__ import annotations

import sympy
from sympy import Max as SympyMax
from sympy import Min as SympyMin
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy import functions as F

from . import config


class DerivedSize(sympy.Symbol):
    """A size computed from shape symbols by the wrapper.  Positive where the ShapeEnv's
    ranges prove it >= 1, else only non-negative (a slice that may be empty)."""


def c_mod(p, q):
    """The C remainder (sign of the dividend) of two ints: torch's `Mod`."""
    r = abs(p) % abs(q)
    return r if p >= 0 else -r


# what a derived size's Python source may call, beside builtins (the wrapper's namespace)
NAMESPACE = {"c_mod": c_mod}


def is_polynomial(e) -> bool:
    for a in sympy.preorder_traversal(e):
        if a.is_Symbol or a.is_Integer or a.is_Add or a.is_Mul:
            continue
        if a.is_Pow and a.exp.is_Integer and int(a.exp) > 0:
            continue
        return False
    return True


class Derived:
    """One compile's derived sizes: {expression: DerivedSize} and {DerivedSize: (Python
    source over the shape symbols, expression)}."""
    __slots__ = ("symbols", "sources", "env", "late")

    def __init__(self):
        self.symbols: dict = {}
        self.sources: dict = {}
        # those derived from sizes the data decides: {DerivedSize: those sizes}; the
        # wrapper computes each right after the aten call that binds the last of them
        self.late: dict = {}
        self.env = None     # the ShapeEnv of the SymInts seen (hints and ranges of symbols)

    def replace(self, e, hints, env=None):
        """`e` with each maximal non-polynomial part replaced by its DerivedSize; raises
        ValueError where a part cannot be one."""
        if not config.derived_sizes:
            raise ValueError(f"symbolic size {e} (backends.triton.config.derived_sizes is off)")
        if env is not None:
            self.env = env
        # (derived sizes inside: their expressions, so that each part is over shape symbols)
        e = e.xreplace({sym: expr for sym, (_, expr) in self.sources.items()})

        def walk(a):
            if a.is_Symbol or a.is_Integer:
                return a
            if a.is_Add or a.is_Mul or (a.is_Pow and a.exp.is_Integer and int(a.exp) > 0):
                return a.func(*map(walk, a.args))
            return self.symbol(a, hints)
        return walk(e)

    def symbol(self, a, hints):
        got = self.symbols.get(a)
        if got is not None:
            return got
        free = a.free_symbols
        if not free or a.is_integer is False:
            raise ValueError(f"symbolic size {a}")
        late = free_unbacked_symbols(a)
        env = self.env
        values = None if env is None else (getattr(env, "backed_var_to_val", None) or env.var_to_val)
        for s in free:
            if isinstance(s, DerivedSize) or not s.is_Symbol:
                raise ValueError(f"symbolic size {a}")
            if s in late and s not in hints:
                # (a size the data decides is hinted where the aten call that makes it is
                # lowered, before anything derived from it; otherwise not derived)
                raise ValueError(f"symbolic size {a} (derived from a size the data decides)")
            if s not in hints:
                if values is None or s not in values:
                    raise ValueError(f"symbolic size {a} (no hint for {s})")
                hints[s] = int(values[s])
        src = pysource(a)
        local = {s.name: hints[s] for s in free}
        value = eval(src, dict(NAMESPACE), local)  # noqa: S307  (our own source, ints only)
        exact = a.xreplace({s: sympy.Integer(hints[s]) for s in free})
        if not isinstance(value, int) or isinstance(value, bool) or not exact.is_Integer or int(exact) != value:
            raise ValueError(f"symbolic size {a} (its Python source {src} gives {value!r}, SymPy {exact})")
        # its range under the ShapeEnv's: a size that may be negative is no size (the
        # index helpers take derived sizes as >= 0), one >= 1 is positive to them
        try:
            lower = env.bound_sympy(a).lower
        except Exception as err:  # (no ShapeEnv, or a range it cannot bound)
            raise ValueError(f"symbolic size {a} (no range: {type(err).__name__})") from None
        if not lower >= 0 and (late or not _known_nonnegative(env, a)):
            raise ValueError(f"symbolic size {a} (may be negative)")
        positive = bool(lower >= 1)
        name = f"ds{len(self.symbols)}"
        sym = DerivedSize(name, integer=True, positive=True) if positive else \
            DerivedSize(name, integer=True, nonnegative=True)
        self.symbols[a] = sym
        self.sources[sym] = (src, a)
        if late:
            self.late[sym] = frozenset(late)
        # (block sizes are picked for the hint: an empty size would pick them for nothing)
        hints[sym] = max(value, 1)
        return sym


def _known_nonnegative(env, a) -> bool:
    """Whether the ShapeEnv proves `a >= 0` from what it was told (its guards, as axioms),
    where its ranges alone cannot: `(H - k) // 2` of a stride-2 convolution whose kernel
    size is a shape symbol, the op having checked `H >= k` (a floor division by a positive
    number is as signed as what it divides), or `(H - k) // 2 + 1 > 0` (an integer's
    `a + 1 > 0` is `a >= 0`).  Never adds a guard.  Asked only of sizes of backed symbols:
    their facts are guards, checked before the graph runs, where a runtime assert on a
    size the data decides runs only partway through it."""
    facts = [sympy.Ge(a, 0), sympy.Gt(a + 1, 0)]
    if isinstance(a, F.FloorDiv) and a.args[1].is_Integer and int(a.args[1]) > 0:
        facts.append(sympy.Ge(a.args[0], 0))
    for fact in facts:
        try:
            got = env._maybe_evaluate_static(fact)
        except Exception:   # (an older ShapeEnv's signature, or a form it cannot simplify)
            continue
        if got is not None and bool(got == sympy.true):
            return True
    return False


def pysource(a) -> str:
    """`a` as Python over the shape symbols' names; ValueError for what it cannot print
    exactly (floats, unknown functions)."""
    if a.is_Integer:
        return str(int(a))
    if a.is_Symbol:
        return a.name
    args = a.args
    if a.is_Add:
        return "(" + " + ".join(map(pysource, args)) + ")"
    if a.is_Mul:
        return "(" + " * ".join(map(pysource, args)) + ")"
    if a.is_Pow and a.exp.is_Integer and int(a.exp) >= 0:
        return f"({pysource(args[0])} ** {int(a.exp)})"
    if isinstance(a, F.PowByNatural):
        return f"({pysource(args[0])} ** {pysource(args[1])})"
    if isinstance(a, F.FloorDiv):   # (CleanDiv too: a division known exact)
        return f"({pysource(args[0])} // {pysource(args[1])})"
    if isinstance(a, F.PythonMod):
        return f"({pysource(args[0])} % {pysource(args[1])})"
    if isinstance(a, F.Mod):
        return f"c_mod({pysource(args[0])}, {pysource(args[1])})"
    if isinstance(a, F.ModularIndexing):
        return f"c_mod(({pysource(args[0])} // {pysource(args[1])}), {pysource(args[2])})"
    if isinstance(a, (F.Max, SympyMax)):
        return "max(" + ", ".join(map(pysource, args)) + ")"
    if isinstance(a, (F.Min, SympyMin)):
        return "min(" + ", ".join(map(pysource, args)) + ")"
    if isinstance(a, F.Identity):
        return pysource(args[0])
    if isinstance(a, (F.CeilToInt, F.FloorToInt)) and isinstance(args[0], F.IntTrueDiv):
        p, q = map(pysource, args[0].args)
        return f"({p} // {q})" if isinstance(a, F.FloorToInt) else f"(-((-{p}) // {q}))"
    raise ValueError(f"symbolic size {a}")
