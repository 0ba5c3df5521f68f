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


# -- foreach ops with tensor scalars (the optimizers' steps) --
def _foreach_ops():
    f = {"_foreach_addcdiv_": ("_foreach_div_", True), "_foreach_addcdiv": ("_foreach_div_", False),
         "_foreach_addcmul_": ("_foreach_mul_", True), "_foreach_addcmul": ("_foreach_mul_", False)}
    return {getattr(torch, k): (getattr(torch, v[0]), v[1]) for k, v in f.items() if hasattr(torch, k)}


_FOREACH_SCALARS = _foreach_ops()


def foreach_tensor_scalars(tx, fn, args, kwargs):
    """`torch._foreach_addcdiv_(xs, t1s, t2s, scalars)` (addcmul too) whose scalars are
    one 1-d tensor (what the foreach Adam step passes when compiling) or a list of 0-d
    tensors (Adamax's): the op's arithmetic, xs + scalars[i] * t1s[i] / t2s[i], as
    foreach ops over the same lists, in the op's order.  ATen's kernel reads those
    scalars on the host (and FakeTensors cannot give them).  Else None."""
    spec = _FOREACH_SCALARS.get(fn)
    if spec is None or kwargs or len(args) != 4:
        return None
    combine_, inplace = spec
    call = tx.output.call
    scalars = args[3]
    if isinstance(scalars, TensorVar) and scalars.example.dim() == 1:
        scalars = ListVar(call("call_method", "unbind", (scalars,), {}).unpack(tx))
    elif not (isinstance(scalars, ListVar) and scalars.items and
              all(isinstance(s, TensorVar) and s.example.dim() == 0 for s in scalars.items)):
        return None
    # (t1 first: its device, where the scalars may be CPU tensors; a * b == b * a)
    term = call("call_function", torch._foreach_mul, (args[1], scalars), {})
    call("call_function", combine_, (term, args[2]), {})
    if inplace:
        call("call_function", torch._foreach_add_, (args[0], term), {})
        return ConstVar(None)
    return call("call_function", torch._foreach_add, (args[0], term), {})
