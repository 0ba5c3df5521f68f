"""Triton source for one kernel: the realized nodes of a `KernelGroup`, evaluated over
`xnumel` elements (pointwise) or `xnumel` rows of `rnumel` (reduction).

Values are named by string-keyed CSE, so a node inlined into several consumers is
computed once.  A reduction whose rows fit in one block is *persistent*: the row stays
in registers and every reduction over it is a `tl.sum`/`tl.max` of the block.  Longer rows
are *looped*: each reduction gets its own loop over the row, and the stored outputs a
last one; values that only depend on the row (`level` 1) are hoisted out of the loops.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import re

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import autotune, config, context, contiguity, indexing
from .indexing import RINDEX, XINDEX, flatten, pexpr, unflatten
from .ir import contiguous_strides
from .ir import CentredSq, ExpSum
from .loader import load_kernel
from .lowering_base import compute_dtype

TL = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
      torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
      torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}
_NAMES = re.compile(r"\b(tmp\d+|acc\d+|xindex|rindex|xmask|rmask)\b")
_LEVEL = {"xindex": 1, "xmask": 1, "rindex": 2, "rmask": 2}


def _combine(name, body):
    return f"@triton.jit\ndef {name}(a, ai, b, bi):\n{body}\n\n\n" if "ai" in body else \
        f"@triton.jit\ndef {name}(a, b):\n{body}\n\n\n"


COMBINE = {
    "_sum": _combine("_sum", "    return a + b"),
    # NaN wins, as in torch's max/min/amax/amin (tl.maximum would drop it; `b != b` is
    # False for integers, so one body serves every dtype); a tie keeps the earlier `a`
    # (-0.0 then 0.0 gives -0.0, as eager's)
    "_max": _combine("_max", "    return tl.where((b > a) | ((b != b) & (a == a)), b, a)"),
    "_min": _combine("_min", "    return tl.where((b < a) | ((b != b) & (a == a)), b, a)"),
    # NaN is the extreme of argmax and argmin alike, two NaNs tie; ties go to the lower
    # index, as in torch
    "_argmax": _combine("_argmax", "    an = a != a\n    bn = b != b\n"
                        "    take = (a > b) | (an & ~bn) | (((a == b) | (an & bn)) & (ai < bi))\n"
                        "    return tl.where(take, a, b), tl.where(take, ai, bi)"),
    "_argmin": _combine("_argmin", "    an = a != a\n    bn = b != b\n"
                        "    take = (a < b) | (an & ~bn) | (((a == b) | (an & bn)) & (ai < bi))\n"
                        "    return tl.where(take, a, b), tl.where(take, ai, bi)"),
    "_prod": _combine("_prod", "    return a * b"),
    # torch's cummax/cummin: a later value that ties the running one, or is NaN, takes over
    # (its index is the latest); nothing takes over from NaN
    "_cummax": _combine("_cummax", "    take = (b != b) | ((a == a) & (b >= a))\n"
                        "    return tl.where(take, b, a), tl.where(take, bi, ai)"),
    "_cummin": _combine("_cummin", "    take = (b != b) | ((a == a) & (b <= a))\n"
                        "    return tl.where(take, b, a), tl.where(take, bi, ai)"),
    # log(exp(a) + exp(b)) without overflow; equal operands (two infinities of one sign)
    # give hi + log(2), not inf - inf; log1p as in the log1p lowering (no libdevice in
    # Triton's interpreter)
    "_logaddexp": "@triton.jit\ndef _logaddexp(a, b):\n"
                  "    hi = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)\n"
                  "    lo = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)\n"
                  "    e = tl.exp(tl.where(hi == lo, 0.0, lo - hi))\n"
                  "    u = 1.0 + e\n"
                  "    return hi + tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))\n\n\n",
    # (max, sum of exp(v - max)) pairs: the sum of the smaller max is scaled by
    # exp(-|difference|); equal maxes (-inf ones too, whose sums are 0) add as they are
    "_expsum": "@triton.jit\ndef _expsum(m1, s1, m2, s2):\n"
               "    d = m2 - m1\n"
               "    e = tl.where(m1 == m2, 1.0, tl.exp(-tl.abs(d)))\n"
               "    return (tl.maximum(m1, m2, propagate_nan=tl.PropagateNan.ALL),\n"
               "            tl.where(d > 0, s1 * e + s2, s1 + s2 * e))\n\n\n",
    # Welford's (mean, M2, count) of two lanes (Chan et al.): the mean moves towards b's
    # by b's share of the count, M2 gains the spread between the means.  A lane that
    # counted nothing (a row shorter than the block) weighs 0: max(n, 1) leaves n > 0
    # alone and makes 0 / 0 a 0, and its weight na * w comes first, so that its mean's
    # difference is never squared on its own (d * d overflowing to inf, times 0, is NaN)
    "_welford": "@triton.jit\ndef _welford(ma, m2a, na, mb, m2b, nb):\n"
                "    n = na + nb\n"
                "    d = mb - ma\n"
                "    w = nb / tl.maximum(n, 1.0)\n"
                "    return ma + d * w, m2a + m2b + na * w * d * d, n\n\n\n",
}


def _runtime_range_ok() -> bool:
    return _range_probe(autotune.interpreted())


@functools.cache
def _range_probe(interpreted) -> bool:
    """Whether `range` takes a kernel's int argument: always when compiled; Triton 3.6's
    interpreter gives it a one-element array, which NumPy 2 cannot make an int (then the
    loops over rows of a symbolic length are `while` loops, under the interpreter only)."""
    if not interpreted:
        return True
    src = ("@triton.jit\ndef _range_probe(out_ptr, n):\n    acc = 0\n"
           "    for i in range(0, n, 2):\n        acc += 1\n    tl.store(out_ptr, acc)\n")
    try:
        with unset_fake_temporarily():  # (compiles run under AOTAutograd's fake mode)
            out = torch.zeros(1, dtype=torch.int32)
            load_kernel("_range_probe", src)[(1,)](out, 5)
            return int(out) == 3
    except Exception:
        return False


class NotFusable(Exception):
    """The node reads a value this kernel computes at another position."""


class NeedReduction(Exception):
    """A looped kernel needs a reduction's result inside another loop: compute it first."""
    def __init__(self, computed):
        self.computed = computed


class KernelGroup:
    """Realized nodes one kernel evaluates, in program order.  `outer`: whether a
    reduction's memory accesses are contiguous along x (see contiguity.py), found when
    the kernel is first generated (None before).  `columns`: a reduction kernel's
    full-size members sit at `rindex * xnumel + xindex` (where a sum over the leading
    dimension, a bias gradient, reads them), not row-major.  `ctx`: the CompileContext of
    the compile it belongs to (by default the one running), which its code generators use.
    `generated`: (code generator, kernel name, source) of its kernel storing every
    member, once the scheduler generated it (`KernelCodegen.joined`), else None.
    `gather`: whether a pointwise kernel's full-size loads are all strided or gathered (none
    contiguous along x; contiguity.gathers_only), found at its first generation."""
    __slots__ = ("members", "xnumel", "rnumel", "reduction", "outer", "columns", "ctx", "generated",
                 "gather")

    def __init__(self, members, xnumel, rnumel, reduction, columns=False, ctx=None):
        self.members, self.xnumel, self.rnumel, self.reduction = members, xnumel, rnumel, reduction
        self.outer, self.columns, self.gather = None, columns, None
        self.ctx = context.current() if ctx is None else ctx
        self.generated = None


def space_of(c) -> tuple:
    """A realized node's kernel iteration space: (xnumel, rnumel, reduction)."""
    if c.is_reduction:
        return c.numel, c.node.rnumel, True
    if c.is_scan:  # a row kernel whose output is full-size
        return c.node.xnumel, c.node.rnumel, True
    return c.numel, 1, False


class Kernel:
    """One launch: the group, which members it stores, and its source."""
    __slots__ = ("group", "stores", "name", "source", "args", "symbols", "tile")

    def __init__(self, group, stores, name, source, args, symbols=(), tile=None):
        self.group, self.stores, self.name, self.source, self.args = group, stores, name, source, args
        self.symbols = list(symbols)  # shape symbols passed after the pointers
        self.tile = tile  # a tiling.Tile: a 2-D grid of [YBLOCK, XBLOCK] blocks

    def __repr__(self):
        return f"Kernel({self.name}, stores={[c.name for c in self.stores]})"


def _identity(rtype, dtype):
    if rtype in ("sum", "any"):
        return "0"
    big = rtype in ("min", "argmin")
    if dtype.is_floating_point:
        return 'float("inf")' if big else 'float("-inf")'
    info = torch.iinfo(dtype)
    return str(info.max if big else info.min)


# the combine function of the (value, index) scans of cummax/cummin, by scan type
_PAIRED = {"max": "cummax", "argmax": "cummax", "min": "cummin", "argmin": "cummin"}


def _scan_identity(kind, dtype) -> tuple:
    """What a running total starts from, per scanned value."""
    if kind == "sum":
        return ("-0.0" if dtype.is_floating_point else "0",)  # -0.0 + x is x, -0.0 too
    if kind in ("cummax", "cummin"):
        return _identity(kind[3:], dtype), "0"
    return {"prod": ("1",), "logaddexp": ('float("-inf")',)}[kind]


def _acc_dtype(rtype, src):
    cd = compute_dtype(src)
    if rtype == "sum":
        return cd if cd.is_floating_point else torch.int64
    if rtype == "any" or cd == torch.bool:
        return torch.int32
    return cd


def _outer_scan(group) -> bool:
    """A scan along a dimension that is not the innermost one: its rows are strided, so
    its blocks hold many rows and a short stretch of each (contiguous across the rows)."""
    return any(c.is_scan and math.prod(c.shape[c.node.dim + 1:]) != 1 for c in group.members)


def _looped_scan(group) -> bool:
    r = group.rnumel
    return _outer_scan(group) and not (indexing.is_static(r) and autotune.is_persistent(r)
                                       and autotune.next_pow2(r) <= autotune.OUTER_SCAN_RBLOCK)


def configs_for(group) -> list:
    """Block-size candidates, for the size hints when extents are symbolic; as many as
    config.autotune_candidates keeps (autotune.few)."""
    x, r = group.xnumel, group.rnumel
    hints = group.ctx.hints
    xh, rh = indexing.hint(x, hints), indexing.hint(r, hints)
    if group.gather:
        return autotune.few(autotune.gather_candidates(xh), xh, "pointwise")
    return autotune.few(_all_configs(group, xh, rh), xh * max(1, rh),
                        "reduction" if group.reduction else "pointwise")


def _all_configs(group, x, r) -> list:
    if _looped_scan(group):
        return autotune.outer_scan_candidates(x, r)
    if group.reduction and group.outer:
        return autotune.outer_candidates(x, r, looped=not indexing.is_static(group.rnumel))
    return autotune.candidates(x, r, group.reduction,
                               looped=group.reduction and not indexing.is_static(group.rnumel))


class KernelCodegen:
    BLOCK = "[XBLOCK]"  # a pointwise kernel's block shape
    other = "0"         # what masked-off lanes load (`masked`)

    def __init__(self, group: KernelGroup, stores):
        self.group, self.stores = group, stores
        self.ctx = group.ctx
        self.members = {c.name: c for c in group.members}
        self.first = min(c.order for c in group.members)
        self._start()

    def _start(self):
        """The choices that follow from the group (`group.outer` among them) and no code
        generated yet: run again when a reduction turns out to be an outer one."""
        group = self.group
        self.xnumel, self.rnumel = group.xnumel, group.rnumel
        # symbolic extents: int arguments, masks always on, rows of a symbolic length
        # looped (correct for any length), int64 indices
        xstatic, rstatic = indexing.is_static(self.xnumel), indexing.is_static(self.rnumel)
        self.symbolic = not (xstatic and rstatic)
        self.configs = configs_for(group)
        self.persistent = not group.reduction or (
            rstatic and autotune.is_persistent(group.rnumel, bool(group.outer)) and not _looped_scan(group))
        self.looped = not self.persistent
        # (one reduction: the row is read twice, once from L2; each further one chained
        # would read it again, which measured slower: softmax's max and sum, var_mean)
        self.reload = config.persistent_reload and group.reduction and self.persistent and \
            sum(c.is_reduction for c in group.members) == 1 and not any(c.is_scan for c in group.members)
        self.has_xmask = not xstatic or any(self.xnumel % c.xblock for c in self.configs)
        self.has_rmask = group.reduction and (
            not rstatic or any(self.rnumel % c.rblock for c in self.configs))
        self.outer: list[str] = []
        self.body = None
        self.cache, self.body_cache, self.memo, self.levels = {}, {}, {}, {}
        self.masks: list[str] = []
        self.args: dict[str, str] = {}
        self.reads: set[str] = set()
        self.helpers: set[str] = set()
        self.wide = self.symbolic or group.xnumel * group.rnumel >= 2 ** 31
        self.symbols: list[str] = []  # the shape symbols the kernel takes, after its pointers
        self.load_indices: list = []  # of memory loads, to tell outer reductions (contiguity.py)
        self.touched: set[str] = set()  # names of the computed values and buffers it read
        self.accesses: list = []  # (buffer, index) of each load and store, in order (tiling.py)
        self._partners()
        self._n = 0

    def _partners(self):
        """Members a looped kernel computes in the loop of another member: a row max that
        an ExpSum computes with its sum, a sum of x that a CentredSq computes with its M2
        (by the partner's name: the ExpSum, the CentredSq)."""
        members = self.group.members
        self.online = {c.node.max.name: c for c in members if isinstance(c.node, ExpSum) and c.node.max is not None}
        self.welford = {c.node.mean.name: c for c in members if isinstance(c.node, CentredSq)}

    # -- values ----------------------------------------------------------------------------
    def level(self, expr: str) -> int:
        return max((_LEVEL.get(n, self.levels.get(n, 0)) for n in _NAMES.findall(expr)), default=0)

    def op(self, expr: str, level=None) -> str:
        level = self.level(expr) if level is None else level
        in_body = self.looped and level == 2
        if in_body and self.body is None:
            raise AssertionError("a row-varying value outside a loop")
        cache, lines = (self.body_cache, self.body) if in_body else (self.cache, self.outer)
        var = cache.get(expr)
        if var is None:
            var = self.newvar()
            lines.append(f"{var} = {expr}")
            cache[expr], self.levels[var] = var, level
        return var

    def newvar(self, prefix="tmp") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    @staticmethod
    def tl(dtype) -> str:
        return TL[dtype]

    def literal(self, value, dtype) -> str:
        cd = compute_dtype(dtype)
        if cd == torch.bool:
            # (a Python bool: Triton's int 1 would make `1 & mask` an int32 and a
            # `tl.where` on it "a non-boolean condition")
            return "True" if value else "False"
        if cd.is_floating_point:
            v = float(value)
            return repr(v) if math.isfinite(v) else f'float("{v}")'
        return str(int(value))

    def cast(self, v: str, src, dst) -> str:
        cs, cd = compute_dtype(src), compute_dtype(dst)
        if cs == cd:
            return v
        if v not in self.levels:  # a literal
            return self.literal(eval(v, {"float": float}), dst)
        if cd == torch.bool:
            return self.op(f"{v} != 0")
        return self.op(f"{v}.to({TL[cd]})")

    def index(self, expr) -> str:
        expr = sympy.sympify(expr)
        return str(int(expr)) if expr.is_Integer else self.op(pexpr(expr))

    def indirect(self, var: str):
        return sympy.Symbol(var, integer=True)

    def check(self, cond: str, msg: str):
        """A run-time check of each lane's `cond`, which eager makes too (an index in
        range, an integer divisor not zero): `tl.device_assert`, as Inductor's.  Lanes the
        kernel does not compute (masked off: their loads gave 0) are not checked.  The
        wrapper compiles a kernel with checks in debug mode (Triton drops them otherwise)."""
        if cond in ("True", "1"):
            return
        level = self.level(" ".join([cond] + self.masks))
        mask = self._mask(level)[2:]
        full = f"({cond}) | ~({mask})" if mask else cond
        line = f"tl.device_assert({full}, {msg!r})"
        in_body = self.looped and self.level(full) == 2
        cache, lines = (self.body_cache, self.body) if in_body else (self.cache, self.outer)
        if line not in cache:
            lines.append(line)
            cache[line] = line

    @contextlib.contextmanager
    def masked(self, cond, other=None):
        """Loads under `cond` too; `other`: what masked-off lanes load (a literal; default 0),
        so that a pooling's padding taps read its identity and need no select."""
        if cond is not None:
            self.masks.append(cond)
        saved = self.other
        if other is not None:
            self.other = other
        try:
            yield
        finally:
            self.other = saved
            if cond is not None:
                self.masks.pop()

    @contextlib.contextmanager
    def unmasked(self):
        masks, self.masks = self.masks, []
        try:
            yield
        finally:
            self.masks = masks

    def _mask(self, level) -> str:
        parts = (["xmask"] if level >= 1 and self.has_xmask else []) + \
                (["rmask"] if level == 2 and self.has_rmask else []) + self.masks
        return ", " + " & ".join(parts) if parts else ""

    def lanes(self, text):
        """A load's address and mask, the address with the mask's shape."""
        mask = self._mask(self.level(text))
        if mask and self.level(text) == 0:  # one address for all lanes, masked per lane
            return f"{text} + xindex * 0", self._mask(1)
        return text, mask

    def arg(self, name, prefix) -> str:
        arg = self.args.get(name)
        if arg is None:
            arg = self.args[name] = f"{prefix}{sum(a.startswith(prefix) for a in self.args.values())}"
        return arg

    def load(self, buf, index) -> str:
        self.touched.add(buf.name)
        self.accesses.append((buf, index))
        if buf.name in self.members and not self._own_old_value(self.members[buf.name], index):
            raise NotFusable(f"{buf.name} is written by this kernel")
        if buf.symbolic:
            self.wide = True
        else:
            span = buf.offset + sum((n - 1) * s for n, s in zip(buf.shape, buf.stride))
            self.wide |= span >= 2 ** 31
        self.load_indices.append(index)
        self.reads.add(buf.name)  # (a view of a computed value is read as a Buffer)
        text = pexpr(index)
        text, mask = self.lanes(text)
        other = f", other={self.other}" if mask else ""
        v = self.op(f"tl.load({self.arg(buf.name, 'in_ptr')} + ({text}){mask}{other})")
        cd = compute_dtype(buf.dtype)
        return v if cd == buf.dtype else self.op(f"{v}.to({TL[cd]})")

    def _own_old_value(self, c, index) -> bool:
        """An input's old value at the element this kernel's write to it (an InputWrite)
        stores: the same lane loads it first."""
        return getattr(c, "in_place", False) and \
            self._pinned(sympy.expand(index - c.buffer.index(self.own_index(c)))) == 0

    # -- realized nodes ---------------------------------------------------------------------
    def _pinned(self, e):
        """`e` with an iteration variable of extent 1 replaced by 0 (a single row, as in
        batch-1 decoding, is read at `rindex` and computed at `xindex * rnumel + rindex`)."""
        pins = {v: 0 for v, n in ((XINDEX, self.xnumel), (RINDEX, self.rnumel)) if n == 1}
        return sympy.expand(e.subs(pins)) if pins and e != 0 else e

    def own_flat(self, c):
        """The flat position of member `c`'s element that this kernel computes."""
        if c.is_scan:
            return self.scan_flat(c)
        if not self.group.reduction or c.is_reduction or c.numel != self.xnumel * self.rnumel:
            return XINDEX
        return self.row_flat()

    def own_index(self, c) -> list:
        """Member `c`'s index of that element: a pointwise kernel walks a member stored in
        another dense layout (channels-last, say) in its memory order."""
        if self.group.reduction or c.fill is None:
            return unflatten(self.own_flat(c), c.shape)
        idx = [sympy.Integer(0)] * len(c.shape)
        for d, i in zip(c.fill, unflatten(XINDEX, [c.shape[d] for d in c.fill])):
            idx[d] = i
        return idx

    def _own_position(self, c, idx):
        if self.group.reduction or c.fill is None:
            return flatten(idx, c.shape)
        return flatten([idx[d] for d in c.fill], [c.shape[d] for d in c.fill])

    def computed(self, c, idx) -> str:
        self.touched.add(c.name)
        if c.name in self.members:
            if self._pinned(sympy.expand(self._own_position(c, idx) - self.own_flat(c))) != 0:
                raise NotFusable(f"{c.name} is read at another position")
            return self.value(c)
        if c.order > self.first and not (c.is_reduction or c.is_scan):
            # realized only after this kernel's nodes were built (an output, say): inline
            return c.node.fn(self, idx)
        self.reads.add(c.name)
        return self.load(c.buffer, c.buffer.index(idx))

    def value(self, c) -> str:
        if c.is_reduction or c.is_scan:
            # A row's result is the same for every lane that reads it, and memoized for
            # all of them: the mask of a branch reading it (a cat's input, a where's side)
            # is about the reader's position, so none of its loads may take that mask.  A
            # persistent reduction whose row is the kernel's own r range (a 4-element
            # norm fused with the stack of it) would otherwise sum only the lanes where
            # that branch is taken.
            with self.unmasked():
                return self.reduce(c) if c.is_reduction else self.scan(c)
        key = ("pw", c.name)
        if key not in self.memo:
            # (likewise a pointwise member's value at its own element, which this kernel
            # stores for every lane: a first read under a branch's mask (the source of a
            # slice_scatter of it) loaded its inputs only where that branch is taken, and
            # the memoized value was 0 elsewhere, where the other branch read it)
            with self.unmasked():
                self.memo[key] = c.node.fn(self, self.own_index(c))
        return self.memo[key]

    def _block(self, v, dtype) -> str:
        """`v` as a full [XBLOCK, RBLOCK] block (it may be constant along the row)."""
        if self.level(v) == 2:
            return v
        return self.op(f"tl.full([XBLOCK, RBLOCK], 0, {TL[dtype]}) + {v}")

    def _where_r(self, v, ident) -> str:
        return self.op(f"tl.where(rmask, {v}, {ident})") if self.has_rmask else v

    def reduce(self, c) -> str:
        key = ("red", c.name)
        if key in self.memo:
            return self.memo[key]
        r = c.node
        if self.looped and (isinstance(r, ExpSum) or c.name in self.online):
            if self.body is not None:
                raise NeedReduction(c)
            self._online_expsum(self.online.get(c.name, c))
            return self.memo[key]
        if self.looped and config.welford and (isinstance(r, CentredSq) or c.name in self.welford):
            if self.body is not None:
                raise NeedReduction(c)
            self._welford(self.welford.get(c.name, c))
            return self.memo[key]
        acc = _acc_dtype(r.rtype, r.src_dtype)
        ident = _identity(r.rtype, acc)
        if self.persistent:
            v = self._where_r(self._row(r, acc), ident)
            if r.rtype.startswith("arg"):
                i = self.op("tl.full([XBLOCK, RBLOCK], 0, tl.int32) + rindex")
                res = self.op(f"tl.reduce(({v}, {i}), 1, {self.combine(r.rtype)})[1][:, None]", level=1)
            else:
                res = self.op(f"tl.reduce({v}, 1, {self.combine(r.rtype)})[:, None]", level=1)
            if self.reload:
                self._forget_rows()
        else:
            if self.body is not None:
                raise NeedReduction(c)
            res = self._looped_reduction(r, acc, ident)
        if r.rtype == "any":
            res = self.op(f"{res} != 0", level=1)
        out = torch.int32 if r.rtype.startswith("arg") else (torch.bool if r.rtype == "any" else acc)
        res = self.cast(res, out, r.dtype)
        self.memo[key] = res
        return res

    def _row(self, r, acc) -> str:
        """Reduction `r`'s summand at (xindex, rindex) in `acc`, as a full block."""
        v = r.fn(self, unflatten(XINDEX, r.shape), unflatten(RINDEX, r.rshape))
        src = r.src_dtype
        if r.rtype == "any":
            v, src = self.cast(v, src, torch.bool), torch.bool
        return self._block(self.cast(v, src, acc), acc)

    def _looped_reduction(self, r, acc, ident) -> str:
        a = self.newvar("acc")
        self.levels[a] = 2
        inits = [f"{a} = tl.full([XBLOCK, RBLOCK], {ident}, {TL[acc]})"]
        if r.rtype.startswith("arg"):
            ai = self.newvar("acc")
            self.levels[ai] = 2
            inits.append(f"{ai} = tl.full([XBLOCK, RBLOCK], 0, tl.int32)")

        def body():
            v = self._row(r, acc)
            if r.rtype == "sum":
                self.body.append(f"{a} = {a} + {self._where_r(v, '0')}")
            elif r.rtype in ("max", "any", "min"):
                # NaN wins (the combine function's rule, per lane)
                cmp = "<" if r.rtype == "min" else ">"
                v = self._where_r(v, ident)
                nan = f" | ({v} != {v})" if acc.is_floating_point else ""
                self.body.append(f"{a} = tl.where(({v} {cmp} {a}){nan}, {v}, {a})")
            else:
                # a lane keeps its first NaN; rows run in ascending rindex along a lane
                cmp = ">" if r.rtype == "argmax" else "<"
                nan = f" | (({v} != {v}) & ({a} == {a}))" if acc.is_floating_point else ""
                take = self.op(f"(({v} {cmp} {a}){nan})" + (" & rmask" if self.has_rmask else ""), level=2)
                self.body.append(f"{ai} = tl.where({take}, rindex, {ai})")
                self.body.append(f"{a} = tl.where({take}, {v}, {a})")
        self.loop(body, inits)
        if r.rtype.startswith("arg"):
            return self.op(f"tl.reduce(({a}, {ai}), 1, {self.combine(r.rtype)})[1][:, None]", level=1)
        return self.op(f"tl.reduce({a}, 1, {self.combine(r.rtype)})[:, None]", level=1)

    def _welford(self, c):
        """CentredSq `c` over looped rows: one pass keeps each lane's Welford mean and M2
        of the row of x (its mean's Reduction's summand), masked lanes keeping theirs,
        and the lanes' (mean, M2, count) combine with `_welford`.  When this kernel
        computes the sum of x for the mean too, that sum is Welford's mean times the
        row's length (config.welford_mean), or else a fourth accumulator in the same
        loop, with a looped sum's combine (the same mean, bit for bit); both memoized.

        A lane's count is no accumulator: masks only cut a row's last block, so a lane
        in this block was in every block before, and counts the blocks so far; its mean
        moves by the difference times their reciprocal, one division a block, not one an
        element.  Each lane runs on its elements less its first one `k`, and its mean is
        moved to the frame of lane 0's first (the row's first element) before the lanes
        combine: the running means are then as small as the spread, not as the values,
        whose rounding (half an ulp of 1e4 is 5e-4 in fp32) would enter M2 at first order,
        as the two-pass form's error in the mean does not (x = 1e4 + 0.1 * noise: 2.6e-3
        relative error unshifted, 3.4e-4 two-pass).  A NaN, or an infinity (whose term is
        inf * (inf - inf), or inf - inf as a first element), in a row makes M2 NaN."""
        r, mean = c.node, c.node.mean
        acc = _acc_dtype("sum", mean.node.src_dtype)
        with_sum = mean.name in self.members and ("red", mean.name) not in self.memo
        k, wm, wm2 = (self.newvar("acc") for _ in range(3))
        s = self.newvar("acc") if with_sum and not config.welford_mean else None
        self.levels.update((a, 2) for a in (k, wm, wm2, s) if a)
        inits = [f"{a} = tl.full([XBLOCK, RBLOCK], 0, {TL[acc]})" for a in (k, wm, wm2, s) if a]

        def body():
            v = self._row(mean.node, acc)
            if s:
                self.body.append(f"{s} = {s} + {self._where_r(v, '0')}")
            rc, u, d, m = self.newvar(), self.newvar(), self.newvar(), self.newvar()
            self.body += [f"{rc} = tl.full([1, 1], 1, {TL[acc]}) / (roffset // RBLOCK + 1)",
                          f"{k} = tl.where(roffset == 0, {v}, {k})", f"{u} = {v} - {k}",
                          f"{d} = {u} - {wm}", f"{m} = {wm} + {d} * {rc}"]
            updates = [(wm2, f"{wm2} + {d} * ({u} - {m})"), (wm, m)]
            # (masked lanes keep theirs: what they loaded is no element)
            self.body += [f"{a} = tl.where(rmask, {new}, {a})" if self.has_rmask else f"{a} = {new}"
                          for a, new in updates]
        self.loop(body, inits)
        first = self.op(f"tl.reduce(tl.where(rbase == 0, {k}, 0.0), 1, {self.combine('sum')})[:, None]", level=1)
        # (each lane's count: the blocks it was in)
        n = f"(tl.full([XBLOCK, RBLOCK], 0, {TL[acc]}) + (rnumel - rbase + RBLOCK - 1) // RBLOCK)"
        # (a lane that counted nothing has mean 0, whatever its `k` loaded)
        moved = f"tl.where(rbase < rnumel, {wm} + ({k} - {first}), 0.0)"
        triple = self.op(f"tl.reduce(({moved}, {wm2}, {n}), 1, {self.combine('welford')})", level=1)
        m2 = self.op(f"{triple}[1][:, None]", level=1)
        self.memo[("red", c.name)] = self.cast(m2, acc, r.dtype)
        if s:
            total = self.op(f"tl.reduce({s}, 1, {self.combine('sum')})[:, None]", level=1)
            self.memo[("red", mean.name)] = self.cast(total, acc, mean.dtype)
        elif with_sum:
            # (config.welford_mean: the row's mean, back from lane 0's frame, times its length)
            total = self.op(f"({triple}[0][:, None] + {first}) * rnumel", level=1)
            self.memo[("red", mean.name)] = self.cast(total, acc, mean.dtype)

    # -- scans ------------------------------------------------------------------------------
    def scan_index(self, c) -> list:
        """Scan `c`'s output index at (xindex, rindex): xindex runs over the other dims."""
        shape, dim = c.shape, c.node.dim
        idx = unflatten(XINDEX, shape[:dim] + shape[dim + 1:])
        return idx[:dim] + [RINDEX] + idx[dim:]

    def scan_flat(self, c):
        key = ("flat", c.name)
        if key not in self.memo:
            self.memo[key] = flatten(self.scan_index(c), c.shape)
        return self.memo[key]

    def row_flat(self):
        """Where full-size pointwise members sit: along the first scan's rows when the
        kernel has a scan (an epilogue then reads it in place), else row-major (or
        column-major: `KernelGroup.columns`)."""
        for c in self.group.members:
            if c.is_scan:
                return self.scan_flat(c)
        if getattr(self.group, "columns", False):
            return RINDEX * self.xnumel + XINDEX
        return XINDEX * self.rnumel + RINDEX

    def scan(self, c) -> str:
        key = ("scan", c.name)
        if key in self.memo:
            return self.memo[key]
        s = c.node
        vdt = compute_dtype(s.src_dtype)
        inputs, dtypes = [self._block(s.fn(self, self.scan_index(c)), vdt)], [vdt]
        kind = s.stype
        if kind in _PAIRED:  # cummax/cummin: (value, index) pairs, the index of the latest
            kind = _PAIRED[kind]
            inputs.append(self.op("tl.full([XBLOCK, RBLOCK], 0, tl.int64) + rindex", level=2))
            dtypes.append(torch.int64)
        combine = self.combine(kind)
        parts = self._unpack(f"tl.associative_scan({self._tuple(inputs)}, 1, {combine})", len(inputs))
        if not self.persistent:
            parts = self._carried(parts, combine, kind, dtypes)
        res = parts[-1] if s.stype.startswith("arg") else parts[0]
        self.memo[key] = res
        return res

    def _carried(self, parts, combine, kind, dtypes) -> list:
        """Rows in chunks, in order: the running total of the chunks before carries on
        (one per chunk scan: cummax's values and indices share it)."""
        keys = [("carried", tuple(parts), i) for i in range(len(parts))]
        if keys[0] not in self.memo:
            carries = [self.newvar("acc") for _ in parts]
            for carry, dt, ident in zip(carries, dtypes, _scan_identity(kind, dtypes[0])):
                self.levels[carry] = 2
                self.outer.append(f"{carry} = tl.full([XBLOCK, 1], {ident}, {TL[dt]})")
            full = self._unpack(f"{combine}({', '.join(carries + parts)})", len(parts))
            lasts = [self.op(f"tl.reduce(tl.where(rbase == RBLOCK - 1, {p}, 0), 1, "
                             f"{self.combine('sum')})[:, None]", level=2) for p in full]
            self.body += [f"{carry} = {last}" for carry, last in zip(carries, lasts)]
            self.memo.update(zip(keys, full))
        return [self.memo[k] for k in keys]

    @staticmethod
    def _tuple(values) -> str:
        return values[0] if len(values) == 1 else f"({', '.join(values)})"

    def _unpack(self, expr, n) -> list:
        t = self.op(expr, level=2)
        return [t] if n == 1 else [self.op(f"{t}[{i}]", level=2) for i in range(n)]
    def _online_expsum(self, c):
        """ExpSum `c` over looped rows: one pass keeps each lane's running max `m` and
        sum `s` of exp(v - m), rescaling s when m grows (by exp(-|v - m|), the only exp
        an element costs); the lanes' pairs combine with `_expsum`.  Its max is memoized
        too.  Then sum(exp(v - shift)) = exp(m - shift) * s, where an infinite max gives
        what the two-pass form gives (each exp(v - shift) is then exp(m - shift) or 0)."""
        r = c.node
        acc = compute_dtype(r.src_dtype)
        m, s = self.newvar("acc"), self.newvar("acc")
        self.levels[m] = self.levels[s] = 2
        inits = [f'{m} = tl.full([XBLOCK, RBLOCK], float("-inf"), {TL[acc]})',
                 f"{s} = tl.full([XBLOCK, RBLOCK], 0, {TL[acc]})"]

        def body():
            v = self.cast(r.row(self, unflatten(XINDEX, r.shape), unflatten(RINDEX, r.rshape)),
                          r.row_dtype, acc)
            v = self._where_r(self._block(v, acc), 'float("-inf")')
            d, e = self.newvar(), self.newvar()
            # v == -inf adds nothing (and -inf - -inf is no difference)
            self.body.extend([
                f"{d} = {v} - {m}",
                f'{e} = tl.where({v} == float("-inf"), 0.0, tl.exp(-tl.abs({d})))',
                f"{s} = tl.where({d} > 0, {s} * {e} + 1.0, {s} + {e})",
                f"{m} = tl.maximum({m}, {v}, propagate_nan=tl.PropagateNan.ALL)"])
        self.loop(body, inits)
        pair = self.op(f"tl.reduce(({m}, {s}), 1, {self.combine('expsum')})", level=1)
        rmax = self.op(f"{pair}[0][:, None]", level=1)
        if r.max is not None:
            self.memo.setdefault(("red", r.max.name), self.cast(rmax, acc, r.max.dtype))
        shift = self.cast(r.shift(self, unflatten(XINDEX, r.shape)), r.src_dtype, acc)
        # exp(m - m) is NaN for an infinite max: so is the two-pass form's sum then
        inf = f'tl.where(tl.abs({rmax}) == float("inf"), {{}}, {pair}[1][:, None])'
        if shift == rmax:
            total = self.op(inf.format('float("nan")'), level=1)
        else:
            total = self.op(f"tl.exp({rmax} - {shift}) * {self.op(inf.format('1.0'), level=1)}", level=1)
        self.memo[("red", c.name)] = self.cast(total, acc, r.dtype)

    def combine(self, rtype) -> str:
        """The combine function of a reduction, emitted with the kernel: Triton's own
        (tl.sum, tl.argmax) are jit functions its interpreter cannot call when
        TRITON_INTERPRET was set after Triton was imported."""
        name = "_" + ("max" if rtype == "any" else rtype)
        self.helpers.add(name)
        return name

    def loop(self, body, inits):
        """One loop over the row running `body`; reductions it needs are emitted first."""
        while True:
            self.body, self.body_cache = [], {}
            try:
                body()
                break
            except NeedReduction as e:
                self.body = None
                self._forget_row_values()
                self.reduce(e.computed)
        lines, self.body = self.body, None
        self._forget_row_values()
        head = ["for roffset in range(0, rnumel, RBLOCK):", "    rindex = roffset + rbase"]
        tail = []
        if not indexing.is_static(self.rnumel) and not _runtime_range_ok():
            head[0:1] = ["roffset = 0", "while roffset < rnumel:"]
            tail = ["    roffset += RBLOCK"]
        if self.has_rmask:
            head.append("    rmask = rindex < rnumel")
        self.outer += inits + head + ["    " + line for line in lines] + tail

    def _forget_rows(self):
        """config.persistent_reload: after the persistent kernel's one reduction, what the
        row held is loaded (and computed) again where it is used next, instead of kept in
        registers across the reduction; the first load keeps the row in L2 (`evict_last`).
        (Every value is computed before an in-place store: `store`.)"""
        self.cache = {k: v for k, v in self.cache.items() if self.levels.get(v, 0) != 2}
        self._forget_row_values()

    def _forget_row_values(self):
        self.body_cache = {}
        self.memo = {k: v for k, v in self.memo.items() if self.levels.get(v, 0) != 2}

    # -- stores and the whole kernel -----------------------------------------------------------
    def store_index(self, c):
        """Where member `c`'s element lies in its buffer (whose layout may not be row-major)."""
        if c.buffer.stride == contiguous_strides(c.shape):
            index = self.own_flat(c)
        else:
            index = c.buffer.index(self.own_index(c))
        self.accesses.append((c.buffer, index))
        return index

    def store(self, c):
        if getattr(c, "in_place", False) and not self.looped:
            for s in self.stores:  # every old value this kernel reads, before it is overwritten
                self.value(s)
        v = self.value(c)
        text = pexpr(self.store_index(c))
        level = self.level(text)
        if v not in self.levels:  # a constant (a zero gradient), made in the stored dtype
            # (in a reduction kernel, a block of the store's shape: one per row, or full)
            shape = ("[XBLOCK, RBLOCK]" if level == 2 else "[XBLOCK, 1]") if self.group.reduction else self.BLOCK
            v = self.op(f"tl.full({shape}, {v}, {TL[c.dtype]})")
        elif compute_dtype(c.dtype) != c.dtype:
            v = self.op(f"{v}.to({TL[c.dtype]})")
        line = f"tl.store({self.arg(c.name, 'out_ptr')} + ({text}), {v}{self._mask(level)})"
        (self.body if self.looped and level == 2 else self.outer).append(line)

    def generate(self) -> tuple[str, str]:
        """(kernel name, source).  A reduction's first generation also finds whether it is
        an outer one, a pointwise kernel's whether its loads are all strided; if so it is
        generated again with outer (gather) block sizes."""
        with self.ctx.active():  # (a blamed kernel is generated again after its compile)
            if self.group.reduction and self.group.outer is None:
                attr, test = "outer", contiguity.is_outer
            elif self._gather_unknown():
                attr, test = "gather", contiguity.gathers_only
            else:
                return self._generate()
            setattr(self.group, attr, False)
            out = self._generate()
            if not test(self):
                return out
            setattr(self.group, attr, True)
            self._start()
            return self._generate()

    def _gather_unknown(self) -> bool:
        """A pointwise kernel (1-D blocks) whose loads were not yet classified."""
        return (type(self) is KernelCodegen and not self.group.reduction and self.group.gather is None
                and config.gather_blocks)

    # -- a kernel one member larger --------------------------------------------------------------
    _STATE_COPIED = ("outer", "cache", "body_cache", "memo", "levels", "masks", "args", "reads",
                     "helpers", "symbols", "load_indices", "touched", "accesses")

    def _extends_to(self, group, c) -> bool:
        """Whether generating `group` (this one's members and `c` after them, every member
        stored) runs as this generation did up to the store of `c`: the same iteration
        space, layout and block sizes (so the same masks and loops), this generation stored
        every member and found its reduction inner (the first pass `generate` keeps), a
        persistent kernel (one whose stores are not moved into a loop after), no member
        storing an input in place (whose store first computes every stored value, `c`'s
        too), `c` no scan (a scan changes where full-size members sit) and never read
        here (in `group` a read of it is a member's read, checked and not inlined), and
        `c` no reduction that makes or ends a kernel that reloads its row (`reload`)."""
        old = self.group
        return (type(self) is KernelCodegen and group.ctx is old.ctx and self.body is None
                and not self.looped and old.outer is not True and old.gather is not True
                and (group.xnumel, group.rnumel, group.reduction, group.columns)
                == (old.xnumel, old.rnumel, old.reduction, old.columns)
                and len(self.stores) == len(old.members)
                and all(a is b for a, b in zip(self.stores, old.members))
                and group.members[:-1] == old.members and group.members[-1] is c
                and not c.is_scan and c.order > self.first and c.name not in self.touched
                and not (c.is_reduction and config.persistent_reload
                         and (self.reload or not any(m.is_reduction for m in old.members)))
                and not any(getattr(m, "in_place", False) for m in old.members))

    def joined(self, group, c) -> tuple:
        """(code generator, kernel name, source) of `group`, this generation's group with
        `c` added, every member stored: as `KernelCodegen(group, group.members).generate()`
        makes them (the same source, arguments and reads), but from a copy of this one's
        state where that would repeat this generation (`_extends_to`), storing `c` alone.
        Raises NotFusable as that generation would."""
        if not (config.reuse_generations and self._extends_to(group, c)):
            cg = KernelCodegen(group, group.members)
            return (cg, *cg.generate())
        cg = object.__new__(KernelCodegen)
        cg.__dict__.update(self.__dict__)
        for name in self._STATE_COPIED:
            setattr(cg, name, type(getattr(self, name))(getattr(self, name)))
        cg.group, cg.stores, cg.ctx = group, group.members, group.ctx
        cg.members = {m.name: m for m in group.members}
        cg._partners()
        with cg.ctx.active():
            if group.reduction and group.outer is None:
                group.outer = False
            cg.ctx.ranges = indexing.ranges(cg.xnumel, cg.rnumel)
            unknown = cg._gather_unknown()
            if unknown:
                group.gather = False
            cg.store(c)
            out = cg._source()
            if not (group.reduction and contiguity.is_outer(cg) or unknown and contiguity.gathers_only(cg)):
                return (cg, *out)
        if not group.reduction:
            # strided or gathered loads only: generated again with gather block sizes
            group.gather = True
            cg = KernelCodegen(group, group.members)
            return (cg, *cg.generate())
        # an outer reduction: generated again with outer block sizes, as `generate` does
        group.outer = True
        cg = KernelCodegen(group, group.members)
        return (cg, *cg.generate())

    def _generate(self) -> tuple[str, str]:
        self.ctx.ranges = indexing.ranges(self.xnumel, self.rnumel)
        rows = [c for c in self.stores if self.own_flat(c) is XINDEX]
        full = [c for c in self.stores if self.own_flat(c) is not XINDEX]
        if self.reload:
            # the reduction first, forgetting the row after it: the stored members then load
            # the row after the reduction they read (`_forget_rows`)
            for c in self.group.members:
                if c.is_reduction:
                    self.value(c)
        for c in rows if self.looped else self.stores:
            self.store(c)
        if self.looped and full:
            self.loop(lambda: [self.store(c) for c in full], [])
        return self._source()

    def _numel(self, name, n) -> str:
        if indexing.is_static(n):
            # constexpr: Triton 3.6's interpreter makes a plain `n = 5` a one-element array,
            # which `range` cannot take (NumPy 2 refuses int() of it)
            return f"{name}: tl.constexpr = {int(n)}"
        return f"{name} = {pexpr(n)}"

    def _source(self):
        red = self.group.reduction
        head = [self._numel("xnumel", self.xnumel)] + ([self._numel("rnumel", self.rnumel)] if red else [])
        if self.ctx.hints:
            names = {s.name for s in self.ctx.hints}
            used = set(re.findall(r"\b[A-Za-z_]\w*\b", "\n".join(head + self.outer)))
            self.symbols = sorted(names & used, key=lambda n: (len(n), n))
        params = list(self.args.values()) + self.symbols + ["XBLOCK: tl.constexpr"] + \
            (["RBLOCK: tl.constexpr"] if red else [])
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        offset = f"xoffset = {pid} * XBLOCK"
        if self.symbols:
            # the sizes as int64 (xoffset is), so that products of them cannot overflow
            head = [offset] + [f"{n} = {n} + xoffset * 0" for n in self.symbols] + head
        else:
            head.append(offset)
        head.append("xindex = xoffset + tl.arange(0, XBLOCK)" + ("[:, None]" if red else ""))
        if self.has_xmask:
            head.append("xmask = xindex < xnumel")
        if red:
            head.append("rbase = tl.arange(0, RBLOCK)[None, :]")
            if self.persistent:
                head.append("rindex = rbase")
                if self.has_rmask:
                    head.append("rmask = rindex < rnumel")
        lines = self.outer
        if self.looped and config.eviction_hints:
            lines = eviction_hints(lines)
        elif self.reload:   # (its one reduction forgot the row: `_generate`)
            lines = eviction_hints(lines, persistent=True)
        body = "\n".join("    " + line for line in head + lines)
        helpers = "".join(COMBINE[h] for h in sorted(self.helpers))
        src = f"@triton.jit\ndef KERNEL({', '.join(params)}):\n{body}\n"
        if config.canonical_symbols:
            # (the kernel's own text: a helper's names are its own, `_expsum`'s s1 and s2
            # no shape symbols, and renamed they would part kernels taking s1 from those
            # taking s5)
            src = canonical_symbols(src, self.symbols)
        src = helpers + src
        kind = ("per" if self.persistent else "red") if red else "poi"
        name = f"triton_{kind}_{hashlib.sha256(src.encode()).hexdigest()[:12]}"
        return name, src.replace("def KERNEL(", f"def {name}(", 1)


_LOAD = re.compile(r"tl\.load\((in_ptr\d+) ")
_LOOP = ("for roffset ", "while roffset ")


def eviction_hints(lines: list, persistent=False) -> list:
    """A looped kernel's `lines` with cache hints on the loads of inputs read in more than
    one loop over the row (config.eviction_hints): `evict_last` in all but the last such
    loop (the row is read again: keep it in L2), `evict_first` in the last (its final read
    should not push out what is still to be read).  Loads outside the loops, and of inputs
    read in one loop only, keep the default.  `persistent`: a persistent kernel that loads
    its row again after its reduction (config.persistent_reload): the reduction parts the
    two passes as a loop's end does."""
    loop_of, loops = [], {}     # each line's pass (None: outside the loops); each input's passes
    n, inside = (0, True) if persistent else (-1, False)
    for line in lines:
        if persistent:
            loop_of.append(n)
            n += "tl.reduce(" in line
        else:
            if line.startswith(_LOOP):
                n, inside = n + 1, True
            elif not line.startswith("    "):
                inside = False
            loop_of.append(n if inside else None)
        if loop_of[-1] is not None:
            for ptr in _LOAD.findall(line):
                loops.setdefault(ptr, set()).add(loop_of[-1])
    out = []
    for line, n in zip(lines, loop_of):
        if n is not None and "tl.load(" in line:
            def hint(m, n=n):
                seen = loops[m.group(1)]
                if len(seen) < 2:
                    return m.group(0)
                policy = "evict_first" if n == max(seen) else "evict_last"
                return f"{m.group(0)}<{policy}>"
            line = _LOAD.sub(hint, line)
            line = _with_policies(line)
        out.append(line)
    return out


def _with_policies(line: str) -> str:
    """Moves each `tl.load(ptr <policy>...` marker to the load's own keyword argument, at
    its closing parenthesis (the address may hold calls and brackets of its own)."""
    while "<evict_" in line:
        at = line.index("<evict_")
        end = line.index(">", at)
        policy = line[at + 1:end]
        line = line[:at] + line[end + 1:]
        depth, i = 1, at
        while depth:
            depth += {"(": 1, ")": -1}.get(line[i], 0)
            i += 1
        line = f"{line[:i - 1]}, eviction_policy='{policy}'{line[i - 1:]}"
    return line


# a string literal (left as it is) or an identifier
_TOKENS = re.compile(r"""('[^'\\\n]*(?:\\.[^'\\\n]*)*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*")|\b([A-Za-z_]\w*)\b""")


def canonical_symbols(src: str, symbols: list) -> str:
    """`src` with its shape symbols renamed by position (`sym0`, `sym1`, ... in the order
    of the kernel's parameters), so that kernels differing only in which size they take
    share one source, one name, one Triton compile and one autotuning: a Mixtral expert
    loop makes the same gather, SiLU and scaling kernels for each expert's token count u0,
    u1, ..., which compiled and tuned once each (52 tunings, 13 s of a 25 s first call on
    the H200).  The launch passes the sizes by position, so the wrapper is unchanged."""
    if not symbols:
        return src
    names = {s: f"sym{i}" for i, s in enumerate(symbols)}

    def sub(m):
        return m.group(0) if m.group(1) else names.get(m.group(2), m.group(2))
    return _TOKENS.sub(sub, src)
