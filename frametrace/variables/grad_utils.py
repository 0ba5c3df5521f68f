"""torch's gradient utilities traced as the user's own code: `clip_grad_norm_`,
`clip_grad_value_` and the foreach helpers they share with the optimizers
(torch.nn.utils.clip_grad and torch.utils._foreach_utils are traced packages, as
torch.compile inlines them).

What their code asks of a compiler beyond plain Python over tensors is one C helper,
`torch._C._group_tensors_by_device_and_dtype`, which buckets lists of tensors by
(device, dtype) for the foreach kernels.  It reads nothing but each tensor's device and
dtype, which the trace knows (and guards, for inputs): it is evaluated now on the
FakeTensors, and its answer (a dict in the C++ map's order, the same tensors regrouped)
is mapped back to the traced values, so the order of the groups is exactly eager's.
"""
from __future__ import annotations

import torch

from .base import unsupported
from .constant import ConstVar
from .containers import DictVar, ListVar, TupleVar
from .tensor import TensorVar


def group_by_device_and_dtype(tx, fn, args, kwargs):
    """The Var of `torch._C._group_tensors_by_device_and_dtype(lists, with_indices)`;
    None for any other function."""
    if fn is not torch._C._group_tensors_by_device_and_dtype:
        return None
    names = ("tensorlistlist", "with_indices")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            unsupported(f"{fn.__name__}() with keyword {k!r}")
        bound[k] = v
    flag = bound.get("with_indices", ConstVar(False))
    if "tensorlistlist" not in bound or not flag.is_const():
        unsupported(f"{fn.__name__}() with a non-constant argument")
    by_id = {}
    examples = []
    for inner in _items(bound["tensorlistlist"], tx):
        row = []
        for v in _items(inner, tx):
            if isinstance(v, TensorVar):
                by_id[id(v.example)] = v
                row.append(v.example)
            elif v.is_const() and v.as_const() is None:
                row.append(None)
            else:
                unsupported(f"{fn.__name__}() over a {v.noun()}")
        examples.append(row)
    # (raises as eager does, e.g. for a None in the first list)
    grouped = fn(examples, bool(flag.as_const()))
    out = {}
    for key, (lists, indices) in grouped.items():
        rows = [ListVar([ConstVar(None) if t is None else by_id[id(t)] for t in row]) for row in lists]
        out[key] = TupleVar([ListVar(rows), ListVar([ConstVar(i) for i in indices])])
    return DictVar(out)


def _items(v, tx):
    if not isinstance(v, (ListVar, TupleVar)):
        unsupported(f"torch._C._group_tensors_by_device_and_dtype() over a {v.noun()}")
    return v.unpack(tx)
