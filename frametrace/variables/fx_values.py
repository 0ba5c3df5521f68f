"""What a Var stands for in an FX graph: the argument a node is given (`to_node_arg`),
the value it has while tracing (`to_fake`: FakeTensors, SymInts, constants), and whether
FX's generated code can name a torch callable (`fx_can_name`).  Here, among the values,
so that Vars recording a call do not import the graph builder (a layer above)."""
from __future__ import annotations

import builtins
import copy
import math

import torch
from torch.fx.graph import _is_from_torch
from torch.fx.node import _get_qualified_name

from .base import unsupported
from .constant import ConstVar
from .containers import DictVar, ListVar, NamedTupleVar, TupleVar
from .symbolic import SliceVar, SymNodeVar
from .tensor import TensorVar


class PassedAsIs:
    """The mark of a Var kind that stands for one Python object a torch operation
    gets as it is (objects.ObjectVar): its value while tracing is its `value`, and a
    dtype or device among them is a constant of the node.  A mixin, so that this
    module, under objects, need not import it."""
    __slots__ = ()


_FX_NAMEABLE: dict = {}


def fx_can_name(target) -> bool:
    """Whether the code FX generates can refer to `target`: FX writes torch objects as
    their dotted path from ``torch`` (other objects it keeps by reference), and that
    path must lead back to `target` (a staticmethod's does not)."""
    try:
        known = _FX_NAMEABLE.get(target)
    except TypeError:       # unhashable
        known = None
    if known is not None:
        return known
    ok = True
    if _is_from_torch(target) and target is not torch.device:
        try:
            path = _get_qualified_name(target).split(".")
            obj = torch if path[0] == "torch" else getattr(builtins, path[0])
            for part in path[1:]:
                obj = getattr(obj, part)
            ok = obj is target or obj == target
        except Exception:
            ok = False
    try:
        _FX_NAMEABLE[target] = ok
    except TypeError:
        pass
    return ok


def to_node_arg(v):
    if isinstance(v, (TensorVar, SymNodeVar)):
        return v.node
    if isinstance(v, SliceVar):
        return slice(*(to_node_arg(p) for p in v.parts))
    if isinstance(v, ConstVar):
        if type(v.value) is float and v.value != v.value and math.copysign(1.0, v.value) < 0:
            # (inf * 0 is such a NaN in CPython): the graph's code writes every NaN as
            # `nan`, which has no sign, and signbit()/copysign() read it
            unsupported("a NaN with its sign bit set as a constant of a torch operation")
        return v.value
    if isinstance(v, (TupleVar, ListVar)):
        items = [to_node_arg(x) for x in v.items]
        return tuple(items) if isinstance(v, TupleVar) else items
    if isinstance(v, DictVar):
        return {k: to_node_arg(x) for k, x in v.items.items()}
    if isinstance(v, PassedAsIs) and isinstance(v.value, (torch.dtype, torch.device)):
        return v.value
    unsupported(f"passing {v} to a torch operation")


def to_fake(v):
    """The value a Var stands for while tracing: FakeTensors, SymInts, constants."""
    if isinstance(v, (TensorVar, SymNodeVar)):
        return v.example
    if isinstance(v, SliceVar):
        return slice(*(to_fake(p) for p in v.parts))
    if isinstance(v, ConstVar):
        return v.value
    if isinstance(v, (TupleVar, ListVar)):
        items = [to_fake(x) for x in v.items]
        return tuple(items) if isinstance(v, TupleVar) else items
    if isinstance(v, DictVar):
        return {k: to_fake(x) for k, x in v.items.items()}
    if isinstance(v, PassedAsIs):
        return v.value
    unsupported(f"passing {v} to a torch operation")


# The Vars that stand for values of a graph (its nodes' results).
GRAPH_VARS = (TensorVar, SymNodeVar)


def map_graph_vars(v, f):
    """`v` with every TensorVar/SymNodeVar in it (through tuples, lists, dicts and
    slices) replaced by f(var); containers are copied only where something changed."""
    if isinstance(v, GRAPH_VARS):
        return f(v)
    if isinstance(v, (TupleVar, ListVar)) and type(v) in (TupleVar, ListVar, NamedTupleVar):
        items = [map_graph_vars(x, f) for x in v.items]
        if all(a is b for a, b in zip(items, v.items)):
            return v
        new = copy.copy(v)
        new.items, new.source = items, None
        return new
    if type(v) is DictVar:
        items = {k: map_graph_vars(x, f) for k, x in v.items.items()}
        return v if all(items[k] is x for k, x in v.items.items()) else DictVar(items)
    if isinstance(v, SliceVar):
        parts = [map_graph_vars(p, f) for p in v.parts]
        return v if all(a is b for a, b in zip(parts, v.parts)) else SliceVar(parts)
    return v
