"""Row partials: a reduction over a tensor's rows and more (a full sum, a batchmean loss,
a sum over the leading dims) whose summand reads per-row values of a row reduction over
the same rows (a log_softmax's max and log-sum-exp, a row's mean) is reduced per row
first, then over the rows.

Reduced at once (rows × row length elements, one flat reduction, split into chunks by
`splits.py`), its kernel cannot share the row kernel's iteration space: it reads the
tensors again in a kernel of its own and loads each element's row statistics through
`index // row length`, computing every per-row expression of them (the `log` of a sum)
per element.  Reduced per row, the partial reduction has the row statistics' shape
(rows, row length), so it joins the kernel that computes them (the scheduler fuses
reductions of one iteration space): a further loop over the row in the same program,
while the row is still in cache (a persistent row: the same registers), the statistics
read from the kernel's own values with every per-row expression computed once per row.
A small reduction of the partials follows (split when the rows are many).

Sums, maxes and mins (reassociation: a float sum adds in another order, as any split
does; partial sums of half inputs are float32).  Found by generating the reduction's
kernel once (as `splits._is_outer`) and looking for a row reduction among its reads."""
from __future__ import annotations

import math

from . import config, indexing
from .indexing import RINDEX, XINDEX, pexpr
from .ir import Computed, Pointwise, Reduction
from .kernel_source import KernelCodegen, KernelGroup
from .lowering_base import compute_dtype

KINDS = ("sum", "max", "min")


def row_dims(L, x, dims, r: Reduction) -> int:
    """How many trailing dims of x form the rows whose partials `r` should reduce first
    (0: none).  Those dims are reduced by `r`, and so is at least one leading dim; a row
    reduction with x's leading dims as its outputs and the trailing ones as its rows is
    among what `r`'s kernel reads."""
    if not config.row_partials or r.rtype not in KINDS or L.ctx.hints:
        return 0
    if not isinstance(x, Pointwise) or x.realized is not None:
        return 0  # (memory, or a value stored by its own kernel: it reads no reduction here)
    shape = list(x.shape)
    n = len(shape)
    if n < 2 or not all(indexing.is_static(s) for s in shape):
        return 0
    options = []
    for k in range(1, n):
        lead = n - k
        if not set(range(lead, n)) <= set(dims) or not any(d < lead for d in dims):
            continue
        rows, length = math.prod(shape[:lead]), math.prod(shape[lead:])
        if rows > 1 and length > 1:
            options.append((k, rows, length))
    if not options:
        return 0
    reads, cg = _reduction_reads(L, r)
    for k, rows, length in options:
        if any(c.numel == rows and c.node.rnumel == length and _per_row(cg, c, length, r.rnumel // length)
               for c in reads):
            return k
    return 0


def _reduction_reads(L, r) -> tuple:
    """(the row reductions (Computed) that `r`'s kernel alone loads, that kernel's
    code generator)."""
    probe = Computed("row_probe", r, L.device, len(L.items))  # not one of L.items
    group = KernelGroup([probe], math.prod(r.shape), r.rnumel, True, ctx=L.ctx)
    cg = KernelCodegen(group, [probe])
    cg.generate()
    found = (L.computed_names.get(name) for name in cg.reads)
    return [c for c in found if c is not None and c.is_reduction], cg


def _per_row(cg, c, length, rows) -> bool:
    """Whether every load of `c` in `cg` (the probe of a reduction whose flat r index
    runs over `rows` rows of `length`, the rows innermost) reads one element a row: a
    statistic of these rows, not of others of the same count (a square matrix's column
    max has as many values as it has rows, and reduced per row its partials could not
    join the kernel that computes it: one kernel more)."""
    xs = sorted({0, max(indexing.hint(cg.xnumel, {}) - 1, 0)})
    found = False
    for buf, index in cg.accesses:
        if buf.name != c.name:
            continue
        found = True
        free = getattr(index, "free_symbols", set())
        if free - {XINDEX, RINDEX}:
            return False
        at = eval(f"lambda xindex, rindex: {pexpr(index)}")
        for x in xs:
            for row in sorted({0, rows - 1}):
                if len({at(x, row * length + j) for j in sorted({0, 1, length - 1})}) > 1:
                    return False
    return found


def partial_dtype(r):
    """The partials' dtype: a sum's accumulator (float32 for half inputs), else r's."""
    return compute_dtype(r.dtype) if r.rtype == "sum" else r.dtype


def over_rows(r: Reduction, part: Computed, lead_shape, dims, keepdim) -> Reduction:
    """`r`'s result as a reduction of the per-row partials `part` (shape `lead_shape`: x's
    leading dims) over the leading dims among `dims`; `r`'s output shape, keepdim or not
    (every trailing dim is reduced, so the kept dims are all leading ones)."""
    lead = len(lead_shape)
    kept = [d for d in range(lead) if d not in dims]

    def fn(k, oidx, ridx):
        outer = iter([oidx[d] for d in kept] if keepdim else oidx)
        inner = iter(ridx)
        return part.load(k, [next(inner) if d in dims else next(outer) for d in range(lead)])
    return Reduction(r.shape, r.dtype, [lead_shape[d] for d in dims if d < lead], r.rtype, fn,
                     part.dtype)
