"""Log-sum-exp as one reduction.  `sum(exp(x - c))` over some dims, where the shift `c`
is a per-row value computed from the row's max `amax(x)` (the decompositions of softmax,
log_softmax, logsumexp and so of cross_entropy and nll_loss, or a user's own stable
softmax), lowers to an `ExpSum`: a row longer than a block is then read once, with an
online max, instead of once for the max and again for the sum.  The exp it sums is read
by nothing else, so the shifted row is not stored for it (`reads_all`).

A gather (or an index) from a value computed from reductions is realized beside those
reductions: a loss's `log_softmax(x)[row, target]` is evaluated in the kernel that
reduces the rows of x, which then reads the logits once; its consumers read one value
a row.
"""
from __future__ import annotations

import math
import operator

import torch

from . import indexing
from .ir import Buffer, Computed, ExpSum, Pointwise
from .lowering_base import bcast, val_of

aten = torch.ops.aten
_SHIFT_DEPTH = 3   # how many ops may lie between the max and the shift


def _arg(node, i, name, default=None):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _norm(dims, ndim) -> frozenset | None:
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        return None
    return frozenset(d % ndim for d in dims) if dims else frozenset(range(ndim))


def _shape(node):
    """The node's tensor shape as ints and sympy expressions (compared without guards), or None."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return tuple(indexing.sym(n) for n in val.shape)
    except ValueError:
        return None


def _is_row_max(node, x, dims) -> bool:
    """`node` is the max of x over `dims`, keeping them."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if node.target is operator.getitem and node.args[1] == 0:
        node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node.target is not aten.max.dim:
            return False
    elif node.target is not aten.amax.default:
        return False
    return node.args[0] is x and bool(_arg(node, 2, "keepdim", False)) and \
        _norm(_arg(node, 1, "dim", []), len(_shape(x))) == dims


def _row_max_of(shift, x, dims):
    """The max of x over `dims` that `shift` is computed from (within a few ops), or None."""
    frontier = [shift]
    for _ in range(_SHIFT_DEPTH + 1):
        nxt = []
        for n in frontier:
            if _is_row_max(n, x, dims):
                return n
            if isinstance(n, torch.fx.Node) and n.op == "call_function":
                nxt += n.all_input_nodes
        frontier = nxt
    return None


def _per_row(shift, xshape, dims) -> bool:
    """`shift` broadcasts against x and is constant along `dims`."""
    s = _shape(shift)
    if s is None or len(s) > len(xshape):
        return False
    lead = len(xshape) - len(s)
    return all(n == 1 or n == xshape[i + lead] for i, n in enumerate(s)) and \
        all(s[d - lead] == 1 for d in dims if d >= lead)


def match(node):
    """(x, shift, max, dims) when `node` sums exp(x - shift) over dims, the shift from
    the max of x over them; else None."""
    if node.op != "call_function" or node.target is not aten.sum.dim_IntList:
        return None
    if node.kwargs.get("dtype") is not None or not isinstance(node.args[0], torch.fx.Node):
        return None
    e = node.args[0]
    if e.target is not aten.exp.default or not isinstance(e.args[0], torch.fx.Node):
        return None
    sub = e.args[0]
    if sub.target is not aten.sub.Tensor or sub.kwargs.get("alpha", 1) != 1 or len(sub.args) != 2:
        return None
    x, shift = sub.args
    xshape = _shape(x)
    if not isinstance(shift, torch.fx.Node) or not xshape or xshape != _shape(e) or \
            not x.meta["val"].dtype.is_floating_point:
        return None
    dims = _norm(_arg(node, 1, "dim"), len(xshape))
    if dims is None or not _per_row(shift, xshape, dims):
        return None
    m = _row_max_of(shift, x, dims)
    return None if m is None else (x, shift, m, dims)


def _nodes(args) -> list:
    found = []
    torch.fx.node.map_arg(args, found.append)
    return found


_GATHERS = (aten.gather.default, aten.index.Tensor, aten.index_select.default)


def reads_all(node, user) -> bool:
    """Whether `user` reads every element of `node`'s value (so that, with another such
    user, storing the value beats computing it twice).  Not so: an exp that only
    log-sum-exp reductions read (it is never computed), a gather of at most half of it
    (it computes the elements it picks)."""
    if user.op != "call_function":
        return True
    if user.target is aten.exp.default:
        return not user.users or any(match(u) is None for u in user.users)
    if user.target in _GATHERS and user.args[0] is node and node not in _nodes(user.args[1:]):
        src, out = _shape(node), _shape(user)
        return src is None or out is None or not indexing.le(2 * math.prod(out), math.prod(src))
    return True


def lower_sum(L, node):
    """The ExpSum for a sum `node` that `match`es, with the dims summed kept (size 1),
    and those dims; or None."""
    found = match(node)
    if found is None:
        return None
    x, shift, m, dims = (found[0], found[1], found[2], sorted(found[3]))
    xv, cv, mv, summand = (L.env.get(n) for n in (x, shift, m, node.args[0]))
    if not all(isinstance(v, (Buffer, Computed, Pointwise)) for v in (xv, cv, summand)):
        return None
    _, out = val_of(node)
    if 0 in xv.shape:
        return None
    shape = [1 if d in dims else n for d, n in enumerate(xv.shape)]
    rshape = [xv.shape[d] for d in dims]

    def shift_fn(k, idx):  # in the summand's dtype
        return k.cast(cv.load(k, bcast(idx, cv.shape)), cv.dtype, summand.dtype)
    r = ExpSum(shape, out, rshape, _row_fn(summand, dims), summand.dtype, _row_fn(xv, dims),
               xv.dtype, shift_fn, mv if isinstance(mv, Computed) and mv.is_reduction else None)
    return L.computed(r), dims


def _row_fn(x, dims):
    """fn(k, index, rindex): x at row position `rindex` of the output `index` (the
    reduced dims kept, as 0)."""
    def fn(k, idx, ridx):
        inner = iter(ridx)
        return x.load(k, [next(inner) if d in dims else i for d, i in enumerate(idx)])
    return fn


def reads_reduction(L, node, depth=8) -> bool:
    """Whether the lowered value of FX `node` is computed (not stored) from a reduction's
    result, through at most `depth` inlined ops."""
    v = L.env.get(node) if isinstance(node, torch.fx.Node) else None
    if isinstance(v, Computed):
        return v.is_reduction
    if not isinstance(v, Pointwise) or v.realized is not None or depth == 0:
        return False
    return any(reads_reduction(L, n, depth - 1) for n in node.all_input_nodes)


def realize_gather(L, node, value):
    """Realize the gather `value` of FX `node` when its source is computed from reductions
    and it reads no more elements than the source has."""
    src = node.args[0]
    sv = L.env.get(src)
    if not isinstance(sv, (Computed, Pointwise)) or not indexing.le(value.numel, sv.numel):
        return value
    if reads_reduction(L, src):
        L.realize(value, wrapper=False)
    return value
