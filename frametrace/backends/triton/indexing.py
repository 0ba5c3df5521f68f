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
from sympy import Add, Integer


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

# Exclusive upper bounds of the iteration variables of the kernel being generated.
# Index expressions are built lazily during code generation, one kernel at a time.
_ranges: dict = {}


def set_ranges(xnumel: int, rnumel: int) -> None:
    _ranges.clear()
    _ranges[XINDEX] = xnumel
    _ranges[RINDEX] = rnumel


def bounds(e) -> tuple:
    """Inclusive (lo, hi) of `e` over the current ranges; infinities when unknown."""
    if e.is_Integer:
        return int(e), int(e)
    if e.is_Symbol:
        hi = _ranges.get(e)
        return (0, hi - 1) if hi is not None else (-math.inf, math.inf)
    if e.is_Add:
        lo = hi = 0
        for a in e.args:
            a_lo, a_hi = bounds(a)
            lo, hi = lo + a_lo, hi + a_hi
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
    if isinstance(e, FloorDiv):
        lo, hi = bounds(e.args[0])
        d = int(e.args[1])
        return (lo if lo == -math.inf else lo // d), (hi if hi == math.inf else hi // d)
    if isinstance(e, ModIdx):
        return 0, int(e.args[1]) - 1
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
    return lo <= b_lo and b_hi <= hi


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


def floordiv(e, d: int):
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
        return base + floordiv(r.args[0], int(r.args[1]) * d)
    return base + FloorDiv(r, d)


def mod(e, d: int):
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
    one index into two when both halves are used with matching strides."""
    changed = True
    while changed and e.is_Add:
        changed = False
        terms = list(e.args)
        mods = [(i, _coef(t)) for i, t in enumerate(terms) if isinstance(_coef(t)[1], ModIdx)]
        for i, (k, m_expr) in mods:
            inner, m = m_expr.args
            m = int(m)
            if isinstance(inner, FloorDiv):
                u, n = inner.args[0], int(inner.args[1])
            else:
                u, n = inner, 1
            want = FloorDiv(u, n * m)
            for j, t in enumerate(terms):
                c, rest = _coef(t)
                if j != i and rest == want and c == k * m:
                    keep = [x for q, x in enumerate(terms) if q not in (i, j)]
                    e = Add(*keep, k * (FloorDiv(u, n) if n > 1 else u))
                    changed = True
                    break
            if changed:
                break
    return e


def simplify(e):
    return _join(sympy.expand(e))


def unflatten(flat, shape) -> list:
    """Per-dimension indices of a flat (row-major) index into `shape`."""
    out, stride = [], 1
    for size in reversed(shape):
        out.append(Integer(0) if size == 1 else mod(floordiv(flat, stride), size)
                   if stride * size < math.prod(shape) else floordiv(flat, stride))
        stride *= size
    return out[::-1]


def flatten(index, shape):
    """Flat (row-major) index of per-dimension indices into `shape`."""
    flat, stride = Integer(0), 1
    for i, size in zip(reversed(index), reversed(shape)):
        if size != 1:
            flat = flat + i * stride
        stride *= size
    return simplify(flat)


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
    if isinstance(e, FloorDiv):
        return f"({pexpr(e.args[0])} // {pexpr(e.args[1])})"
    if isinstance(e, ModIdx):
        return f"({pexpr(e.args[0])} % {pexpr(e.args[1])})"
    raise NotImplementedError(f"index expression {e!r}")
