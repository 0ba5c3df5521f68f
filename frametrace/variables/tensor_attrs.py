"""Attributes a tensor carries besides its data: Python attributes in its __dict__
(`t.tag = 1`) and its accumulated gradient `.grad`.

What the trace knows of a tensor's identity is its FakeTensor (an op that returns its
input, `x.to(x.dtype)`, returns the same fake), so writes are recorded in the side
effects keyed by that fake: later reads in the frame see them, and they are replayed
after the graph on the real tensor, an input's through its source, a computed one's
through the graph output it becomes (so the attribute leaves the frame with it).
Reads of what an input held when the frame started go through the input's source, so
the guards see the attribute (or its absence, or the grad's None-ness and metadata)."""
from __future__ import annotations

import torch

from ..source import AttrSource
from .base import DELETED, raise_builtin, unsupported, wrap
from .constant import ConstVar, is_constant_value
from .tensor_facts import input_for, is_leaf

_GRAD = "grad"

# `var` below is always the TensorVar whose attribute is read or written (tensor.py
# calls in here): the tensor kind is `type(var)`, a class without subclasses, which
# this module, imported by tensor.py, cannot import.


def owner(tx, var):
    """The Var whose reconstruction is the real tensor `var` stands for: the graph
    input with the same fake (an op may return its input), else `var` itself."""
    inp = input_for(tx, var)
    if inp is None:
        return var
    return var if var.source == inp.source else type(var)(inp.node, var.example, inp.source)


def _written(tx, var, name):
    got = tx.side_effects.load_attr(var.example, name)
    return got, got is DELETED


def python_attr(tx, var, name):
    """`t.name` for a name torch.Tensor does not define: the instance's own attribute,
    or AttributeError as CPython raises it."""
    got, deleted = _written(tx, var, name)
    if got is not None:
        return _no_attr(var, name) if deleted else got
    inp = input_for(tx, var)
    if inp is None:
        inner = _computed_subclass_attr(tx, var, name)
        if inner is not None:
            return inner
    _known_to_plain_attrs(var, inp, name)
    if inp is not None:
        d = inp.value.__dict__
        if name in d:
            return wrap(tx, d[name], AttrSource(inp.source, name))
        tx.guards.not_in_dict(inp.source, name)
    _no_attr(var, name)


def _computed_subclass_attr(tx, var, name):
    """An attribute a wrapper subclass's own code gave a tensor an op made (the
    dispatch ran on fakes while tracing and runs alike on the real inputs): an inner
    tensor is read in the graph, a constant (from the guarded flattening) as is."""
    cls = var.python_type()
    if cls in (torch.Tensor, torch.nn.Parameter) or hasattr(cls, name):
        return None
    value = var.example.__dict__.get(name, _ABSENT)
    if isinstance(value, torch.Tensor):
        return tx.output.call("call_function", getattr, (var, ConstVar(name)), {})
    if value is not _ABSENT and is_constant_value(value):
        return ConstVar(value)
    return None


_ABSENT = object()


def _known_to_plain_attrs(var, inp, name):
    """A wrapper subclass (torch's TwoTensor) has attributes of its class, and its
    instances made by ops have inner tensors the trace does not see as attributes:
    only an input's own __dict__ is known."""
    cls = var.python_type()
    if cls in (torch.Tensor, torch.nn.Parameter):
        return
    if inp is None or hasattr(cls, name):
        unsupported(f"attribute {name!r} of a {cls.__name__} tensor")


def _no_attr(var, name):
    raise_builtin(AttributeError, f"{var.python_type().__name__!r} object has no attribute {name!r}")


def has_python_attr(tx, var, name) -> bool:
    """hasattr(t, name), with a guard for an input's own attributes."""
    if name == _GRAD or hasattr(torch.Tensor, name):
        return True
    got, deleted = _written(tx, var, name)
    if got is not None:
        return not deleted
    inp = input_for(tx, var)
    cls = var.python_type()
    if inp is None and cls not in (torch.Tensor, torch.nn.Parameter) and not hasattr(cls, name):
        return name in var.example.__dict__     # what the subclass's dispatch gave it
    _known_to_plain_attrs(var, inp, name)
    if inp is None:
        return False            # a tensor made in the frame starts with no attributes
    if name in inp.value.__dict__:
        tx.guards.in_dict(inp.source, name)
        return True
    tx.guards.not_in_dict(inp.source, name)
    return False


def set_python_attr(tx, var, name, value):
    if name == _GRAD:
        return set_grad(tx, var, value)
    if hasattr(torch.Tensor, name):
        # A property of torch.Tensor (requires_grad, data, names ...) runs C code; a
        # method name would be shadowed by the instance's dict.
        unsupported(f"setting Tensor attribute {name!r}")
    _store(tx, var, name, value)


def del_python_attr(tx, var, name):
    if name == _GRAD:
        return set_grad(tx, var, ConstVar(None))    # `del t.grad` clears it
    if hasattr(torch.Tensor, name):
        unsupported(f"del of Tensor attribute {name!r}")
    if not has_python_attr(tx, var, name):
        _no_attr(var, name)
    _store(tx, var, name, DELETED)


def _store(tx, var, name, value):
    tx.side_effects.store_attr(owner(tx, var), var.example, name, value, plain=True)


# -- .grad --
def grad(tx, var):
    """`t.grad`: the last value the frame wrote, an input's current grad (guarded on
    None-ness, and as a tensor input by metadata), or None for a tensor made here."""
    got, deleted = _written(tx, var, _GRAD)
    if got is not None:
        return ConstVar(None) if deleted else got
    if var.example.requires_grad and not is_leaf(tx, var).as_const():
        # CPython warns that a non-leaf's .grad is not populated.
        unsupported("reading .grad of a non-leaf tensor (a warning)")
    inp = input_for(tx, var)
    if inp is not None:
        return wrap(tx, inp.value.grad, AttrSource(inp.source, _GRAD))
    return ConstVar(None)


def set_grad(tx, var, value):
    """`t.grad = value`, checked as the setter checks it (a mismatch raises there,
    in CPython), then replayed after the graph."""
    if value.is_const() and value.as_const() is None:
        _store(tx, var, _GRAD, ConstVar(None))
        return
    if not isinstance(value, type(var)):
        unsupported(f"assigning {value} to Tensor.grad")
    t, g = var.example, value.example
    if g is t:
        unsupported("RuntimeError: can't assign a tensor as its own gradient")
    if g.dtype != t.dtype or g.device != t.device or g.layout != t.layout or \
            not _same_sizes(g.shape, t.shape):
        unsupported("RuntimeError: assigned grad differs from the tensor in type, device or size")
    _store(tx, var, _GRAD, value)


def _same_sizes(a, b) -> bool:
    if len(a) != len(b):
        return False
    # Symbolic sizes compare to a SymBool that is guarded where it is decided.
    return all(bool(x == y) for x, y in zip(a, b))
