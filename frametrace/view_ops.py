"""Which torch-level FX nodes are views, and which may move a tensor's geometry in place:
one table for the passes that reason about view chains in a traced graph (the eager
backend's chain shortcut, backends/view_chains.py; the outputs replayed after a graph,
replayed_views.py).

    op_name(node) in VIEWS            # x.view(...), torch.flatten(x), aten.t.default(x)
    keeps_geometry(node)              # False for x.t_(), aten.set_, a user's function
"""
from __future__ import annotations

import torch

# Ops that return one view of their first argument, placed by that argument's
# geometry and constant arguments alone.  (reshape may copy: a replay tells.)
VIEWS = frozenset({
    "view", "reshape", "transpose", "swapaxes", "swapdims", "permute", "unsqueeze",
    "squeeze", "expand", "t", "narrow", "select", "flatten", "unflatten", "movedim",
    "moveaxis", "diagonal", "unfold",
})
# Ops that return a tuple of views; ``[k]`` of one is a step.
MULTI_VIEWS = frozenset({"split", "chunk", "unbind", "tensor_split", "split_with_sizes",
                         "hsplit", "vsplit", "dsplit"})
# In-place ops that move a tensor's geometry rather than its values.
GEOMETRY_WRITERS = frozenset({
    "resize_", "resize_as_", "set_", "as_strided_", "transpose_", "t_", "squeeze_",
    "unsqueeze_", "swapdims_", "swapaxes_", "_set_data", "sparse_resize_",
    "sparse_resize_and_clear_", "rename_", "_coalesced_",
})
PLAIN_MODULES = ("_operator", "operator", "builtins", "math")


def op_name(n) -> str:
    """A call's bare op name: `t_` for x.t_(), torch.Tensor.t_ and aten.t_.default
    alike; "" for anything not torch's."""
    if n.op == "call_method":
        return n.target
    if n.op == "call_function":
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            return t._schema.name.split("::")[-1]
        return getattr(t, "__name__", "") if from_torch(t) else ""
    return ""


def from_torch(fn) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


def keeps_geometry(n) -> bool:
    """`n` cannot change a tensor's geometry in place."""
    if n.op in ("placeholder", "output", "get_attr"):
        return True
    if n.op != "call_method" and n.op != "call_function" or "out" in n.kwargs:
        return False
    t = n.target
    if n.op == "call_function":
        if isinstance(t, torch._ops.HigherOrderOperator):
            return False
        if not from_torch(t) and (getattr(t, "__module__", None) or "") not in PLAIN_MODULES:
            return False                  # a user's function let into the graph
    return op_name(n) not in GEOMETRY_WRITERS
