"""Higher-order operators: torch.cond, torch.while_loop, torch._higher_order_ops.map and
torch.utils.checkpoint.checkpoint.  Each body is speculated into a subgraph
(subgraph.py), kept as a submodule of the frame's graph and called through torch's own
higher-order op (``torch.ops.higher_order.cond`` ...), so backends see what
torch.compile gives them.  A body that cannot be a subgraph breaks the graph at the
operator's call, which then runs in CPython."""
from __future__ import annotations

import torch

from ..subgraph import call_hop, merge_inputs, same_structure, speculate
from .base import unsupported
from .constant import ConstVar
from .containers import ListVar, TupleVar
from .objects import ObjectVar
from .symbolic import SymNodeVar
from .tensor import TensorVar


class HigherOrderVar(ObjectVar):
    """A higher-order operator (the Python function users call, or torch.ops.higher_order.*)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return _HANDLERS[self.value](tx, args, kwargs)


def higher_order_var(value, source):
    """The Var for `value` if it is a higher-order operator we trace, else None."""
    try:
        known = value in _HANDLERS
    except TypeError:       # unhashable
        return None
    return HigherOrderVar(value, source) if known else None


def _bind(what, names, args, kwargs, defaults=None):
    """Positional and keyword arguments to `names`, in order."""
    if len(args) > len(names):
        unsupported(f"{what}: too many arguments")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            unsupported(f"{what}: unexpected argument {k!r}")
        bound[k] = v
    for k, v in (defaults or {}).items():
        bound.setdefault(k, v)
    missing = [n for n in names if n not in bound]
    if missing:
        unsupported(f"{what}: missing argument {missing[0]!r}")
    return [bound[n] for n in names]


def _sequence(tx, v, what):
    if not isinstance(v, (TupleVar, ListVar)):
        unsupported(f"{what} must be a tuple or list, not {v}")
    return v.unpack(tx)


def _fresh_like(tx, examples: list, requires_grad: list) -> list:
    """New FakeTensors with the metadata of `examples` (a result is not any tensor the
    body saw, so it must not share identity or storage with one)."""
    out = []
    with tx.output.fake_mode:
        for ex, grad in zip(examples, requires_grad):
            if not isinstance(ex, torch.Tensor):
                out.append(ex)
                continue
            t = torch.empty_strided(ex.shape, ex.stride(), dtype=ex.dtype, device=ex.device)
            out.append(t.requires_grad_(True) if grad else t)
    return out


# ---------------------------------------------------------------- torch.cond
def _cond(tx, args, kwargs):
    pred, true_fn, false_fn, operands = _bind(
        "torch.cond", ("pred", "true_fn", "false_fn", "operands"), args, kwargs)
    ops = _sequence(tx, operands, "torch.cond's operands")
    if isinstance(pred, ConstVar):
        # As torch.cond on a Python constant: the one branch, traced in line.
        branch = true_fn if pred.value else false_fn
        return branch.call(tx, ops, {})
    if isinstance(pred, TensorVar):
        if not (type(pred.example.numel()) is int and pred.example.numel() == 1):
            unsupported("torch.cond's pred must be a tensor of one element")
    elif not (isinstance(pred, SymNodeVar) and isinstance(pred.example, torch.SymBool)):
        unsupported(f"torch.cond's pred must be a bool, a SymBool or a tensor, not {pred}")
    for op in ops:
        if not isinstance(op, (TensorVar, SymNodeVar, ConstVar)):
            unsupported(f"torch.cond's operands must be tensors, not {op}")
    branches = [speculate(tx, fn, ops, f"torch.cond {name}")
                for fn, name in ((true_fn, "true_fn"), (false_fn, "false_fn"))]
    t, f = branches
    if not same_structure(t, f):
        unsupported("torch.cond's branches return different structures")
    for a, b in zip(t.output_examples(), f.output_examples()):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            unsupported("torch.cond's branches must return tensors")
        if (a.dtype, a.device, tuple(a.shape)) != (b.dtype, b.device, tuple(b.shape)):
            unsupported(f"torch.cond's branches return tensors of different metadata "
                        f"({a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)})")
    lifted = merge_inputs(branches)
    true_node = tx.output.install_subgraph("cond_true", t.module())
    false_node = tx.output.install_subgraph("cond_false", f.module())
    examples = _fresh_like(tx, t.output_examples(),
                           [a.requires_grad or b.requires_grad
                            for a, b in zip(t.output_examples(), f.output_examples())])
    outs = call_hop(tx, torch.ops.higher_order.cond,
                    (pred, true_node, false_node, (*t.output.arg_vars, *lifted)), examples)
    return t.rebuild(outs)


_HANDLERS = {
    torch.cond: _cond,
    torch.ops.higher_order.cond: _cond,
}
