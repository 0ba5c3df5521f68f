"""Facts about a tensor that its tensor guard leaves out.

The tensor guard (guards.py) covers type, dtype, device, sizes, strides, requires_grad
and the conjugate and negative bits: what nearly every trace reads.  Tensors that pass
it can still differ in whether they are leaves of autograd (a requires_grad tensor may
have a grad_fn), views (a _base), inference tensors, or in shared or pinned memory.
A FakeTensor made from an input mirrors some of these and not others, so its answer is
never taken as it stands.  Of an input, each fact is guarded where the trace reads it
(only the frames that read one pay for it).  Of a tensor the graph computes, leafness
and view-ness follow from the op and the guarded facts of its inputs, so the fake's
answer holds; the storage's facts (inference, shared, pinned) it shares with an input
whose memory it views, so they are guarded on that input.  Which inputs are one object,
and layouts, are facts too (below)."""
from __future__ import annotations

import contextlib
import weakref

import torch

from ..source import AttrSource
from .base import Unsupported, unsupported
from .constant import ConstVar

# Methods answering a fact of this kind.  `graph.OutputGraph.call` refuses to fold
# them (their function forms too: torch.is_inference(x)), whatever the caller.
STORAGE_FACTS = frozenset({"is_inference", "is_shared", "is_pinned"})
UNGUARDED = STORAGE_FACTS | {"_is_view", "is_set_to", "_is_alias_of", "_overlaps", "_storage_id",
                             "const_data_ptr", "mutable_data_ptr", "_use_count"}


# The FakeTensors the trace hashed (set members, dict keys: equal when the same
# tensor).  Which inputs are one object is a fact too: where one was hashed, the
# frame's tensor inputs stay as many distinct objects as traced (convert.py guards
# it).  Fakes are made per frame, so one of another frame never matches.
# (by id: weak references to tensors compare by the tensors' ==)
_HASHED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def input_for(tx, var):
    """The graph input whose fake `var` holds (an op may return its input), or None."""
    for inp in tx.output.inputs:
        if inp.node.meta.get("example_value") is var.example and inp.source is not None \
                and isinstance(inp.value, torch.Tensor):
            return inp
    return None


def hashed(fake):
    _HASHED[id(fake)] = fake
    return fake


def any_hashed(fakes) -> bool:
    return bool(_HASHED) and any(_HASHED.get(id(f)) is f for f in fakes)


# The tensor guard compares the layout (a sparse COO or mkldnn tensor answers
# stride() too): `is_sparse` of an input needs no guard of its own (an optimizer reads
# it of every grad); these are guarded where the tensor is one the graph computes.
LAYOUT_ATTRS = frozenset({"layout", "is_mkldnn"})


@contextlib.contextmanager
def guarding_input_kind(guards, source, value):
    """Around the checks that refuse an input: when one refuses, the frame's entry
    (run in CPython) is guarded on the facts that made it refuse, the input's type and
    layouts, and not on everything that reaches the frame."""
    try:
        yield
    except Unsupported:
        guards.type_match(source, value)
        guards.equals(AttrSource(source, "layout"), value.layout)
        guards.equals(AttrSource(source, "is_nested"), value.is_nested)
        if value.is_leaf:
            grad = AttrSource(source, "_grad")
            if value._grad is None:
                guards.equals(grad, None)
            else:
                guards.equals(AttrSource(grad, "layout"), value._grad.layout)
        raise


def check_input_layout(value):
    """Inputs are dense strided tensors (a sparse, mkldnn, nested or quantized one has
    no fake, or no strides, to trace with)."""
    # (the fake of a tensor carries a fake of its grad; a non-leaf's warns when read)
    grad = value._grad if value.is_leaf or value.retains_grad else None
    for t, what in ((value, "a tensor input"), (grad, "the grad of a tensor input")):
        if t is not None and (t.layout is not torch.strided or t.is_nested or t.is_quantized):
            unsupported(f"{what} of layout {t.layout}"
                        f"{' (nested)' if t.is_nested else ' (quantized)' if t.is_quantized else ''}")


def layout_attr(tx, var, name):
    """``t.layout``, ``t.is_mkldnn``: guarded on the input read, or, for a tensor the
    graph computes (whose layout follows its inputs'), on every tensor input so far."""
    inp = input_for(tx, var)
    for i in [inp] if inp is not None else tx.output.frame.inputs:
        if i.source is not None and isinstance(i.value, torch.Tensor):
            tx.guards.equals(AttrSource(i.source, "layout"), i.value.layout)
    return ConstVar(getattr(var.example, name))


def is_leaf(tx, var):
    """``t.is_leaf``: a tensor that needs no grad is a leaf; an input that needs one is
    a leaf while it has no grad_fn (guarded); the fake follows the ops of the frame."""
    _guard_input(tx, var, "is_leaf")
    return ConstVar(var.example.is_leaf)


def is_view(tx, var):
    """``t._is_view()``: of an input, guarded by whether it has a _base."""
    _guard_input(tx, var, "_base")
    return ConstVar(var.example._is_view())


def storage_fact(tx, var, name):
    """``t.is_inference()``, ``t.is_shared()``, ``t.is_pinned()``: of an input, or of a
    tensor sharing an input's memory (a view: these facts are its storage's), guarded
    on that input.  A new tensor's inference-ness follows the inference mode it was
    made in (the fake's answer); whether one is shared or pinned is not known."""
    inputs = [input_for(tx, var)]
    if inputs[0] is None:
        inputs = _sharing_memory(tx, var)
    for inp in inputs:
        tx.guards.method_is(inp.source, name, getattr(inp.value, name)())
    if name == "is_inference":
        return ConstVar(var.example.is_inference())
    if not inputs:
        unsupported(f"Tensor.{name}() of a tensor computed in the frame")
    return ConstVar(getattr(inputs[0].value, name)())


def _sharing_memory(tx, var):
    """The tensor inputs whose (fake) storage `var` shares."""
    key = _storage(var.example)
    return [i for i in tx.output.inputs if key is not None and i.source is not None and
            isinstance(i.value, torch.Tensor) and _storage(i.node.meta.get("example_value")) == key]


def _storage(fake):
    try:
        return fake.untyped_storage()._cdata
    except Exception:
        return None


def _guard_input(tx, var, attr):
    inp = input_for(tx, var)
    if inp is None:
        return
    value = inp.value
    if attr == "is_leaf":
        if value.requires_grad:     # (else a leaf: requires_grad is guarded)
            tx.guards.equals(AttrSource(inp.source, "is_leaf"), value.is_leaf)
    elif value._base is None:
        tx.guards.equals(AttrSource(inp.source, "_base"), None)
    else:
        tx.guards.not_none(AttrSource(inp.source, "_base"))
