"""torch functions called on symbolic numbers (``x.item()`` in the graph, a number from
a graph break): ``torch._check`` facts, which the ShapeEnv keeps, and ``torch.tensor``
of such numbers, built in the graph.  `objects.TorchFnVar` calls in here."""
from __future__ import annotations

import dis

import torch

from .base import ValueVar, unsupported
from .constant import ConstVar
from .containers import ListVar, TupleVar
from .symbolic import SymNodeVar
from .tensor import TensorVar


# -- torch._check --

_CHECKS = frozenset({torch._check, torch._check_index, torch._check_value, torch._check_type,
                     torch._check_not_implemented, torch._check_is_size})


def is_check(fn) -> bool:
    return fn in _CHECKS


def call_check(tx, fn, args, kwargs):
    """``torch._check(cond[, message])``: a constant condition is decided now (a false
    one raises in CPython, after a break); a symbolic one becomes a fact of the ShapeEnv
    (guarded when it is about input sizes, asserted at run time when it is about
    unbacked numbers).  The message function is only called when the check fails, so
    it is not traced."""
    params = ("i", "message") if fn is torch._check_is_size else ("cond", "message")
    bound = dict(zip(params, args))
    for k, v in kwargs.items():
        if k not in params and not (fn is torch._check_is_size and k == "max") or k in bound:
            unsupported(f"torch.{fn.__name__}() with argument {k!r}")
        bound[k] = v
    cond = bound.get(params[0])
    if cond is None:
        unsupported(f"torch.{fn.__name__}() without a condition")
    if isinstance(cond, TensorVar):
        unsupported(f"torch.{fn.__name__}() of a tensor (TypeError)")
    if fn is torch._check_is_size:
        rest = {"max": bound["max"]} if "max" in bound else {}
        return tx.output.call("call_function", torch._check_is_size, (cond,), rest)
    if cond.is_const():
        if cond.as_const() is True:
            return ConstVar(None)
        unsupported(f"torch.{fn.__name__}() of {cond} fails (or is not a bool)")
    # The trace records the fact; the graph's runtime asserts check it.
    deferred = tx.output.shape_env.deferred_runtime_asserts
    before = {k: len(v) for k, v in deferred.items()}
    out = tx.output.call("call_function", fn, (cond,), {})
    if fn is torch._check:
        node = next(iter(reversed(tx.output.graph.nodes)), None)    # (torch 2.11: no iterator)
        if node is not None and node.target is torch._check:
            # What the graph's assert says when it fails (graph.insert_runtime_asserts):
            # torch's own message, the user's when it is a constant, else the pass's.
            node.meta["check_message"] = _static_message(bound["message"]) \
                if "message" in bound else CHECK_MESSAGE
            # The facts this check added: torch 2.11's pass asserts them where their
            # symbols are bound, ahead of this node, with a message of its own.
            node.meta["check_exprs"] = [ra.expr for k, v in deferred.items()
                                        for ra in v[before.get(k, 0):]]
    return out


CHECK_MESSAGE = ("Expected cond to be True, but got False. (Could this error message be "
                 "improved? If so, please report an enhancement request to PyTorch.)")


def _static_message(var):
    """The string a message function always returns (``lambda: "n must be even"``),
    read from its code without running it; None for any other message."""
    fn = getattr(var, "value", None)
    code = getattr(var, "code", None) or getattr(fn, "__code__", None)
    if code is None:
        return None
    ops = [i for i in dis.get_instructions(code)
           if i.opname not in ("RESUME", "NOP", "CACHE", "COPY_FREE_VARS", "EXTENDED_ARG")]
    if len(ops) == 1 and ops[0].opname == "RETURN_CONST" and isinstance(ops[0].argval, str):
        return ops[0].argval
    if len(ops) == 2 and ops[0].opname == "LOAD_CONST" and isinstance(ops[0].argval, str) and \
            ops[1].opname == "RETURN_VALUE":
        return ops[0].argval
    return None


# -- torch.tensor([n, ...]) of symbolic numbers --

def is_tensor_of_numbers(fn, args) -> bool:
    """``torch.tensor(data)`` whose data holds symbolic numbers (``x.item()`` in the graph,
    a number from a graph break): FakeTensor's torch.tensor would read (and pin) them."""
    return fn in (torch.tensor, torch.as_tensor) and len(args) == 1 and _has_symbolic(args[0])


def _has_symbolic(v) -> bool:
    if isinstance(v, SymNodeVar):
        return True
    return isinstance(v, (ListVar, TupleVar)) and any(map(_has_symbolic, v.items))


def tensor_of_numbers(tx, fn, args, kwargs):
    """The tensor as a stack of 0-d tensors made from each number in the graph."""
    if set(kwargs) - {"dtype", "device"}:
        unsupported(f"torch.{fn.__name__}() of symbolic numbers with {sorted(kwargs)}")
    shape, leaves = _flatten(args[0])
    given = kwargs.get("dtype")
    if given is None or given.is_const() and given.as_const() is None:
        dtype = _inferred_dtype(leaves)
    else:
        dtype = _const_of(given)
    extra = {"device": kwargs["device"]} if "device" in kwargs else {}
    parts = [tx.output.call("call_function", torch.scalar_tensor, (v,),
                            {"dtype": ConstVar(dtype), **extra}) for v in leaves]
    t = tx.output.call("call_function", torch.stack, (ListVar(parts),), {})
    if len(shape) != 1:
        t = tx.output.call("call_method", "reshape", (t, TupleVar([ConstVar(s) for s in shape])), {})
    return t


def _flatten(v):
    """(shape, leaves) of nested lists of numbers; ragged data is left to CPython."""
    if not isinstance(v, (ListVar, TupleVar)):
        kind = v.python_type()
        if kind not in (bool, int, float):
            unsupported(f"torch.tensor() of a {kind.__name__} with symbolic numbers")
        return [], [v]
    parts = [_flatten(item) for item in v.items]
    shapes = {tuple(s) for s, _ in parts}
    if len(shapes) > 1:
        unsupported("torch.tensor() of ragged nested sequences (ValueError)")
    inner = list(shapes.pop()) if parts else []
    return [len(parts), *inner], [leaf for _, ls in parts for leaf in ls]


def _inferred_dtype(leaves):
    kinds = {leaf.python_type() for leaf in leaves}
    if float in kinds:
        return torch.get_default_dtype()     # guarded in every compiled frame
    return torch.int64 if int in kinds else torch.bool


def _const_of(v):
    if isinstance(v, ValueVar) and isinstance(v.value, torch.dtype):
        return v.value
    if v.is_const() and isinstance(v.as_const(), torch.dtype):
        return v.as_const()
    unsupported(f"torch.tensor(dtype={v})")
