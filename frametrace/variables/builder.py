"""`wrap`: from a real value found in the frame to a Var, with the guards the trace
relies on.  This is where every input-derived guard is made."""
from __future__ import annotations

import builtins
import types

import torch

from ..source import GetItemSource
from .base import unsupported
from .constant import ConstVar, is_constant_value
from .containers import DictVar, ListVar, TupleVar
from .objects import BuiltinVar, NNModuleVar, ObjectVar, TorchFnVar

_BUILTIN_IDS = {id(v) for v in vars(builtins).values() if callable(v)}


def wrap(tx, value, source, guard: bool = True):
    """Make a Var for `value`, read from `source`.  With ``guard=False`` (attributes of
    torch and the standard library) only tensors are guarded."""
    guards = tx.guards if (guard and source is not None) else None
    if isinstance(value, torch.Tensor):
        if source is None:
            unsupported("a tensor reached without a source (a constant tensor held by an object)")
        return tx.output.add_input(value, source)
    if is_constant_value(value):
        if guards is not None:
            guards.equals(source, value)
        return ConstVar(value, source)
    if type(value) in (tuple, list):
        if guards is not None:
            guards.length(source, value)
        items = [wrap(tx, v, GetItemSource(source, i) if source is not None else None, guard)
                 for i, v in enumerate(value)]
        return (TupleVar if type(value) is tuple else ListVar)(items, source)
    if type(value) is dict and all(type(k) in (str, int) for k in value):
        if guards is not None:
            guards.dict_keys(source, value)
        return DictVar({k: wrap(tx, v, GetItemSource(source, k) if source is not None else None,
                                guard) for k, v in value.items()}, source)
    if guards is not None:
        guards.identity(source, value)
    if isinstance(value, torch.nn.Module):
        return NNModuleVar(value, source)
    if is_torch_callable(value):
        return TorchFnVar(value, source)
    if id(value) in _BUILTIN_IDS and getattr(builtins, getattr(value, "__name__", ""), None) is value:
        return BuiltinVar(value, source)
    return ObjectVar(value, source)


def is_torch_callable(value) -> bool:
    """Functions whose calls become graph nodes: torch.*, torch.nn.functional.*, Tensor
    methods, torch.ops overloads."""
    if isinstance(value, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        return True
    if isinstance(value, type):
        return False
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType,
                          types.MethodDescriptorType, types.WrapperDescriptorType)):
        objclass = getattr(value, "__objclass__", None)
        if objclass is torch._C.TensorBase or objclass is torch.Tensor:
            return True
        module = getattr(value, "__module__", None) or ""
        if module == "torch" or module.startswith(("torch.nn.functional", "torch._C", "torch.functional",
                                                   "torch.linalg", "torch.fft", "torch.special",
                                                   "torch._tensor", "torch.nn.modules")):
            return True
        owner = getattr(value, "__self__", None)
        if isinstance(owner, types.ModuleType) and owner.__name__.startswith("torch"):
            return True
    return False
