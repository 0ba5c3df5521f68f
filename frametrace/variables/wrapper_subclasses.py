"""Traceable wrapper tensor subclasses (``__torch_dispatch__`` with
``__tensor_flatten__`` / ``__tensor_unflatten__``, like torch's TwoTensor) as graph
inputs: their FakeTensors are subclass instances over fake inner tensors, so tracing
runs the subclass's dispatch on fakes, and the graph, run on the real subclass,
dispatches through it again.

Only subclasses whose behaviour lives wholly in ``__torch_dispatch__`` qualify: a
``__torch_function__`` of their own, or a Python override of anything torch.Tensor
defines, would run differently on the traced path, so such inputs stay refused (the
frame runs in CPython, which honours the override)."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..source import AttrSource, CallMethodSource

# What a wrapper subclass defines over torch.Tensor's names without changing how the
# trace sees it (construction, its dispatch, flattening, how it prints).
_ALLOWED = frozenset({"__new__", "__init__", "__repr__", "__torch_dispatch__", "__torch_function__",
                      "__tensor_flatten__", "__tensor_unflatten__", "__module__", "__doc__",
                      "__dict__", "__weakref__", "__qualname__", "__annotations__",
                      "__slots__", "__firstlineno__", "__static_attributes__",
                      # copyreg's cache, set on both classes once pickle or deepcopy met them
                      "__slotnames__"})


def is_traceable(value) -> bool:
    cls = type(value)
    if not is_traceable_wrapper_subclass(value) or \
            cls.__torch_function__ is not torch._C._disabled_torch_function_impl:
        return False
    for k in cls.__mro__[:cls.__mro__.index(torch.Tensor)]:
        if any(hasattr(torch.Tensor, n) and n not in _ALLOWED for n in vars(k)):
            return False
    attrs, _ = value.__tensor_flatten__()
    return all(type(getattr(value, a)) is torch.Tensor or is_traceable(getattr(value, a))
               for a in attrs)


def guard_inner(guards, source, value, fake):
    """The subclass's flattening (inner names and context) and each inner tensor's
    metadata: its dispatch reads them, not only the outer tensor's."""
    attrs, ctx = value.__tensor_flatten__()
    guards.equals(CallMethodSource(source, "__tensor_flatten__"), (attrs, ctx)) \
        if _plain_data(ctx) else guards.identity(source, value)
    fake_attrs, _ = fake.__tensor_flatten__()
    for a in attrs:
        inner, inner_fake = getattr(value, a), getattr(fake, a)
        guards.tensor(AttrSource(source, a), inner, inner_fake)
        if type(inner) is not torch.Tensor:
            guard_inner(guards, AttrSource(source, a), inner, inner_fake)


def _plain_data(ctx) -> bool:
    if ctx is None or type(ctx) in (bool, int, float, str, torch.dtype, torch.device):
        return True
    if type(ctx) in (tuple, list):
        return all(_plain_data(c) for c in ctx)
    if type(ctx) is dict:
        return all(type(k) is str and _plain_data(v) for k, v in ctx.items())
    return False
