"""Index expressions: sympy expressions over a kernel's two flat iteration variables
`xindex` (the output row, or the element of a pointwise kernel) and `rindex` (the position
inside a reduction row), plus symbols standing for values loaded at run time (gather).

A view changes how an index is computed, never the data, so after a chain of reshapes a
load's index is a nest of `FloorDiv` and `ModIdx`.  The helpers below simplify with the
variables' ranges, so that a contiguous load prints as `xindex` again: Triton only emits
16-byte vector loads for offsets it can prove contiguous.
"""
from __future__ import annotations

import math

import sympy
import torch
from sympy import Add, Integer

from . import config, context
from .derived import DerivedSize, is_polynomial


class FloorDiv(sympy.Function):
    """Floor division of a non-negative index by a positive integer."""
    is_integer = True
    nargs = 2


class ModIdx(sympy.Function):
    """Remainder of a non-negative index by a positive integer."""
    is_integer = True
    nargs = 2


XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)
# the outer axis of a tiled pointwise kernel, whose elements are yindex * xnumel + xindex
YINDEX = sympy.Symbol("yindex", integer=True, nonnegative=True)

def ranges(xnumel, rnumel, ynumel=None) -> dict:
    """Exclusive upper bounds of a kernel's iteration variables, for its compile's
    `CompileContext.ranges` while it is generated (index expressions are built lazily
    during code generation, one kernel at a time)."""
    out = {XINDEX: xnumel, RINDEX: rnumel}
    if ynumel is not None:
        out[YINDEX] = ynumel
    return out


# -- symbolic sizes ---------------------------------------------------------------------------
# With dynamic shapes a size is a sympy expression of the ShapeEnv's symbols (positive
# integers): a polynomial with integer coefficients, or an int.  Kernels take the symbols
# as int arguments; the wrapper reads them from its inputs' sizes.

def hint(e, hints=None) -> int:
    """A size's value for `hints`, by default the compile running's (`CompileContext.hints`)."""
    if is_static(e):
        return int(e)
    return int(e.subs(context.current().hints if hints is None else hints))


def is_static(e) -> bool:
    return isinstance(e, int) or (isinstance(e, sympy.Basic) and e.is_Integer)


def sym(v):
    """A size (int, SymInt, sympy) as an int or a sympy polynomial of shape symbols and
    derived sizes (`config.derived_sizes`, within a compile); raises ValueError for
    anything else (a float, a size derived from one the data decides...)."""
    if isinstance(v, bool):
        raise ValueError(f"size {v!r}")
    if isinstance(v, int):
        return v
    env = None
    if isinstance(v, torch.SymInt):
        v, env = v.node.expr, v.node.shape_env
    if not isinstance(v, sympy.Basic):
        raise ValueError(f"size {v!r}")
    if v.is_Integer:
        return int(v)
    if is_polynomial(v):
        return v
    # a FloorDiv, Max...: its non-polynomial parts become derived sizes (derived.py) of
    # the compile running, where there is one
    ctx = context._ACTIVE.get()
    if ctx is None:
        raise ValueError(f"symbolic size {v}")
    return ctx.derived.replace(v, ctx.hints, env)


def symbols_of(*exprs) -> set:
    out = set()
    for e in exprs:
        if isinstance(e, (list, tuple)):
            out |= symbols_of(*e)
        elif isinstance(e, sympy.Basic):
            out |= {s for s in e.free_symbols if s not in (XINDEX, RINDEX, YINDEX)}
    return out


def pycode(e) -> str:
    """A size as Python source (the wrapper's symbols are local variables)."""
    if isinstance(e, (list, tuple)):
        inner = ", ".join(pycode(x) for x in e)
        return f"({inner}{',' if len(e) == 1 else ''})"
    return str(int(e)) if is_static(e) else f"({e})"


def _nonneg(e) -> bool:
    """Provably e >= 0 for all values >= 1 of its symbols."""
    if e in (math.inf, -math.inf):
        return e > 0
    e = sympy.sympify(e)
    if e.is_number:
        return bool(e >= 0)
    # (shape symbols are >= 1; a derived size not proved positive only >= 0)
    shifted = sympy.expand(e.subs({s: s + 1 for s in e.free_symbols
                                   if not (isinstance(s, DerivedSize) and not s.is_positive)},
                                  simultaneous=True))
    return all(c >= 0 for c in sympy.Poly(shifted, *sorted(shifted.free_symbols, key=str)).coeffs()) \
        if shifted.is_polynomial() else False


def le(a, b) -> bool:
    """Provably a <= b."""
    if a == -math.inf or b == math.inf:
        return True
    if a == math.inf or b == -math.inf:
        return False
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return _nonneg(sympy.expand(sympy.sympify(b) - a))


def bounds(e) -> tuple:
    """Inclusive (lo, hi) of `e` over the current ranges; infinities when unknown."""
    if e.is_Integer:
        return int(e), int(e)
    if e.is_Symbol:
        hi = context.current().ranges.get(e)
        if hi is not None:
            return 0, hi - 1
        if e.is_positive and e.is_integer:  # a shape symbol
            return 1, math.inf
        if isinstance(e, DerivedSize):  # (a derived size that may be 0)
            return 0, math.inf
        return -math.inf, math.inf
    if e.is_Add:
        lo = hi = 0
        for a in e.args:
            a_lo, a_hi = bounds(a)
            lo = -math.inf if -math.inf in (lo, a_lo) else lo + a_lo
            hi = math.inf if math.inf in (hi, a_hi) else hi + a_hi
        return lo, hi
    if e.is_Mul and any(not (is_static(b) or b in (math.inf, -math.inf))
                        for a in e.args for b in bounds(a)):
        # symbolic bounds: only products of non-negative factors
        lo = hi = 1
        for a in e.args:
            a_lo, a_hi = bounds(a)
            if not le(0, a_lo):
                return -math.inf, math.inf
            lo = lo * a_lo
            hi = math.inf if math.inf in (hi, a_hi) else hi * a_hi
        return lo, hi
    if e.is_Mul:
        lo = hi = 1
        for a in e.args:
            a_lo, a_hi = bounds(a)
            if math.inf in (abs(lo), abs(hi), abs(a_lo), abs(a_hi)):
                return -math.inf, math.inf
            cands = (lo * a_lo, lo * a_hi, hi * a_lo, hi * a_hi)
            lo, hi = min(cands), max(cands)
        return lo, hi
    if isinstance(e, FloorDiv) and not e.args[1].is_Integer:
        lo, _ = bounds(e.args[0])
        return (0 if le(0, lo) else -math.inf), math.inf
    if isinstance(e, FloorDiv):
        lo, hi = bounds(e.args[0])
        d = int(e.args[1])
        if not (is_static(lo) or lo == -math.inf) or not (is_static(hi) or hi == math.inf):
            return (lo // d if is_static(lo) else 0 if le(0, lo) else -math.inf), math.inf
        return (lo if lo == -math.inf else lo // d), (hi if hi == math.inf else hi // d)
    if isinstance(e, ModIdx):
        return 0, e.args[1] - 1
    return -math.inf, math.inf


def _coef(term) -> tuple[int, object]:
    c, rest = term.as_coeff_Mul()
    return int(c), rest


def _split(e, d):
    """Terms of `e` whose coefficient `d` divides, and the others."""
    exact, rest = [], []
    for t in Add.make_args(e):
        (exact if _coef(t)[0] % d == 0 else rest).append(t)
    return exact, rest


def _in(e, lo, hi) -> bool:
    b_lo, b_hi = bounds(e)
    return le(lo, b_lo) and le(b_hi, hi)


def _common_factor(rest, d):
    """A factor g of d, with the terms g divides and the sum of the others, that sum
    lying in [0, g): then e // d == (big / g) // (d / g).  Tries the largest terms first."""
    terms = sorted(rest, key=lambda t: -abs(_coef(t)[0]))
    for k in range(1, len(terms)):
        g = math.gcd(d, *[_coef(t)[0] for t in terms[:k]])
        small = Add(*terms[k:])
        if g > 1 and _in(small, 0, g - 1):
            return g, Add(*terms[:k]), small
    return None


def _decompose(e, d):
    """(terms d divides, the sum of the others, how to divide that sum): "small" when it
    lies in [0, d), else a `_common_factor` or None."""
    exact, rest = _split(e, d)
    r = Add(*rest)
    if not rest or _in(r, 0, d - 1):
        return exact, r, "small"
    return exact, r, _common_factor(rest, d)


def _sym_split(e, d):
    """Terms of `e` that the symbolic `d` divides (as quotients), and the others."""
    exact, rest = [], []
    for t in Add.make_args(e):
        q = sympy.expand(t / d)
        if q.as_numer_denom()[1] == 1:
            exact.append(q)
        else:
            rest.append(t)
    return exact, Add(*rest)


def floordiv(e, d):
    if not is_static(d):
        c, rest = d.as_coeff_Mul()
        if c != 1 and c.is_Integer:
            return floordiv(floordiv(e, int(c)), rest)
        exact, r = _sym_split(e, d)
        base = Add(*exact)
        if r == 0 or _in(r, 0, d - 1):
            return base
        return base + FloorDiv(r, d)
    d = int(d)
    if d == 1:
        return e
    exact, r, how = _decompose(e, d)
    base = Add(*[t / d for t in exact])
    if how == "small":
        return base
    if how is not None:
        g, big, _ = how
        return base + floordiv(sympy.expand(big / g), d // g)
    if isinstance(r, FloorDiv):  # (a // m) // d == a // (m * d)
        return base + floordiv(r.args[0], r.args[1] * d)
    return base + FloorDiv(r, d)


def mod(e, d):
    if not is_static(d):
        _, r = _sym_split(e, d)
        if r == 0 or _in(r, 0, d - 1):
            return r
        return ModIdx(r, d)
    d = int(d)
    if d == 1:
        return Integer(0)
    _, r, how = _decompose(e, d)
    if how == "small":
        return r
    if how is not None:
        g, big, small = how
        return g * mod(sympy.expand(big / g), d // g) + small
    return ModIdx(r, d)


def _join(e):
    """k*m*((u // n) // m) + k*((u // n) % m) == k*(u // n): undoes a reshape's split of
    one index into two when both halves are used with matching strides (and the same with
    the outer half itself taken modulo b, leaving (u // n) % (m*b))."""
    changed = True
    while changed and e.is_Add:
        changed = False
        terms = list(e.args)
        mods = [(i, _coef(t)) for i, t in enumerate(terms) if isinstance(_coef(t)[1], ModIdx)]
        for i, (k, m_expr) in mods:
            inner, m = m_expr.args
            if not m.is_Integer or (isinstance(inner, FloorDiv) and not inner.args[1].is_Integer):
                continue
            m = int(m)
            if isinstance(inner, FloorDiv):
                u, n = inner.args[0], int(inner.args[1])
            else:
                u, n = inner, 1
            want = FloorDiv(u, n * m)
            for j, t in enumerate(terms):
                c, rest = _coef(t)
                if j == i or c != k * m:
                    continue
                inner = FloorDiv(u, n) if n > 1 else u
                if rest == want:
                    joined = inner
                elif isinstance(rest, ModIdx) and rest.args[0] == want and rest.args[1].is_Integer:
                    # k*m*((u // n // m) % b) + k*((u // n) % m) == k*((u // n) % (m*b))
                    joined = mod(inner, m * int(rest.args[1]))
                else:
                    continue
                keep = [x for q, x in enumerate(terms) if q not in (i, j)]
                e = Add(*keep, k * joined)
                changed = True
                break
            if changed:
                break
    return e


def _join_symbolic(e):
    """c*m*(a // m) + c*(a % m) == c*a for a symbolic m."""
    changed = True
    while changed and e.is_Add:
        changed = False
        for t in e.args:
            for m_expr in [a for a in t.atoms(ModIdx) if not a.args[1].is_Integer]:
                c = sympy.expand(t / m_expr)
                if c.has(ModIdx):
                    continue
                a, m = m_expr.args
                partner = sympy.expand(c * m * FloorDiv(a, m))
                if partner in e.args:
                    e = sympy.expand(e - t - partner + c * a)
                    changed = True
                    break
            if changed:
                break
    return e


def _join_digits(e):
    """c*(u % m) + c*m*((u // m) % k) == c*(u % (m*k)): two digits of an index (w and h
    of an H*W plane) used with matching strides are one; Triton then sees the whole run
    as contiguous, and the index costs one remainder instead of three operations."""
    changed = True
    while changed and e.is_Add:
        changed = False
        terms = list(e.args)
        for i, t in enumerate(terms):
            c, hi = _coef(t)
            if not (isinstance(hi, ModIdx) and hi.args[1].is_Integer and isinstance(hi.args[0], FloorDiv)
                    and hi.args[0].args[1].is_Integer):
                continue
            (u, m), k = hi.args[0].args, int(hi.args[1])
            m = int(m)
            for j, t2 in enumerate(terms):
                c2, lo = _coef(t2)
                if j != i and c2 * m == c and lo == ModIdx(u, m):
                    keep = [x for q, x in enumerate(terms) if q not in (i, j)]
                    e = Add(*keep, c2 * ModIdx(u, m * k))
                    changed = True
                    break
            if changed:
                break
    return e


def _typed(args) -> tuple:
    """A memo key's part for the arguments: each with its type, a list or tuple (a shape,
    an index) as a tuple of its items and their types.  (2 and Integer(2) are equal and
    hash alike, but what the helpers return for them may differ in type.)"""
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.append((tuple(a), tuple(map(type, a))))
        else:
            out.append((a, type(a)))
    return tuple(out)


def memoized(fn):
    """`fn(*args)` remembered in the running compile's `CompileContext.memo`, keyed on
    `fn`, the arguments (with their types) and the iteration ranges (what `bounds`
    reads: the helpers are pure functions of these).  A list result is copied out, so
    that a caller's changes to it are its own.  Off: `config.memo_indexing = False`."""
    def cached(*args):
        ctx = context._ACTIVE.get()
        if ctx is None or not config.memo_indexing:
            return fn(*args)
        key = (fn, _typed(args), tuple(ctx.ranges.items()))
        try:
            out = ctx.memo[key]
        except KeyError:
            out = ctx.memo[key] = fn(*args)
        except TypeError:  # an unhashable argument
            return fn(*args)
        return list(out) if isinstance(out, list) else out
    cached.__name__, cached.__doc__, cached.__wrapped__ = fn.__name__, fn.__doc__, fn
    return cached


def _expand(e):
    """sympy.expand(e), with an Add's terms each expanded once in a compile (its memo,
    under config.memo_indexing): the loads of a cat's parts (DenseNet's, up to 48 of them)
    share the terms of every dimension but the cat's, and expanding a sum is expanding its
    terms (Add is canonical: the same expression either way)."""
    ctx = context._ACTIVE.get()
    if not e.is_Add or ctx is None or not config.memo_indexing:
        return sympy.expand(e)
    memo, out = ctx.memo, []
    for t in e.args:
        key = (_expand, t)
        try:
            out.append(memo[key])
        except KeyError:
            out.append(memo.setdefault(key, sympy.expand(t)))
    return Add(*out)


@memoized
def simplify(e):
    e = _join_digits(_join(_expand(e)))
    return _join_symbolic(e) if any(not a.args[1].is_Integer for a in e.atoms(ModIdx)) else e


@memoized
def unflatten(flat, shape) -> list:
    """Per-dimension indices of a flat (row-major) index into `shape`."""
    out, stride = [], 1
    for d in reversed(range(len(shape))):
        size = shape[d]
        outer = all(n == 1 for n in shape[:d])  # no dimension outside this one
        out.append(Integer(0) if size == 1 else floordiv(flat, stride) if outer
                   else mod(floordiv(flat, stride), size))
        stride *= size
    return out[::-1]


@memoized
def flatten(index, shape):
    """Flat (row-major) index of per-dimension indices into `shape`."""
    flat, stride = Integer(0), 1
    for i, size in zip(reversed(index), reversed(shape)):
        if size != 1:
            flat = flat + i * stride
        stride *= size
    return simplify(flat)


def _operand(e) -> str:
    """A divisor: a product of sizes (s0*s1, s0**2) parenthesized, as `//` and `%` bind
    as tightly as `*`."""
    return pexpr(e) if e.is_Integer or e.is_Symbol else f"({pexpr(e)})"


def pexpr(e) -> str:
    """Print an index expression as Triton source (all operands are non-negative)."""
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        terms = sorted(e.args, key=sympy.default_sort_key)
        return "(" + " + ".join(pexpr(t) for t in terms) + ")"
    if e.is_Mul:
        return "*".join(pexpr(a) for a in e.args)
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "*".join([pexpr(e.base)] * int(e.exp))
    if isinstance(e, FloorDiv):
        return f"({pexpr(e.args[0])} // {_operand(e.args[1])})"
    if isinstance(e, ModIdx):
        return f"({pexpr(e.args[0])} % {_operand(e.args[1])})"
    raise NotImplementedError(f"index expression {e!r}")
