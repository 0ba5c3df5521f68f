"""Outputs that view a graph input through a dtype view are made again after the
compiled graph, by running their view ops on the real input.

AOTAutograd hands back an output that aliases an input by regenerating it from that
input.  Where it cannot replay the views (symbolic sizes), it falls back to
``as_strided`` with the output's sizes and strides, which count elements of the output's
dtype, over the input's dtype (torch.compile's answers are as wrong):
``x.view(torch.float64).flatten()`` of a float32 ``x`` of n rows came back with n
elements instead of 2n, ``x.view(torch.uint8)`` raised a storage error at every call,
and ``x.view(torch.int32).flatten()[:6]`` came back float32.  The view ops themselves, run eagerly on the input, are
what CPython computes, and they cost a few microseconds.

Such an output is left out of the graph the backend compiles, and ``compile_graph``
puts it back into the backend's results.  ``frametrace.config.replay_dtype_views =
False`` hands every output to the backend.

    @frametrace.optimize(backend="aot_eager")
    def bits(x):
        return x.view(torch.float64).flatten()   # replayed on x after the graph
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from . import config

# Ops that return a view of their first argument, their other arguments plain values.
_VIEW_METHODS = frozenset({
    "view", "reshape", "flatten", "unflatten", "t", "transpose", "swapaxes", "swapdims",
    "permute", "movedim", "moveaxis", "squeeze", "unsqueeze", "expand", "narrow", "select",
    "diagonal", "unfold", "view_as_real", "view_as_complex", "__getitem__", "T", "mT"})
_VIEW_FUNCTIONS = {operator.getitem: "__getitem__", torch.flatten: "flatten", torch.reshape: "reshape",
                   torch.t: "t", torch.transpose: "transpose", torch.permute: "permute",
                   torch.squeeze: "squeeze", torch.unsqueeze: "unsqueeze", torch.narrow: "narrow",
                   torch.select: "select", torch.movedim: "movedim", torch.view_as_real: "view_as_real",
                   torch.view_as_complex: "view_as_complex", torch.swapaxes: "swapaxes",
                   torch.swapdims: "swapdims", torch.Tensor.view: "view"}
# In-place ops that change a tensor's sizes, strides or storage: a view made before one
# is not the view made after the graph.
_METADATA_WRITERS = frozenset({
    "t_", "transpose_", "swapaxes_", "swapdims_", "squeeze_", "unsqueeze_", "resize_",
    "resize_as_", "set_", "as_strided_", "detach_"})


class _Step:
    __slots__ = ("method", "args", "kwargs")

    def __init__(self, method, args, kwargs):
        self.method, self.args, self.kwargs = method, args, kwargs

    def __call__(self, value):
        if self.method in ("T", "mT"):
            return getattr(value, self.method)
        if self.method in ("view_as_real", "view_as_complex"):
            return getattr(torch, self.method)(value)
        return getattr(value, self.method)(*self.args, **self.kwargs)


def _step(node) -> _Step | None:
    """`node` as a view step of its first argument, or None."""
    if node.op == "call_method" and node.target in _VIEW_METHODS:
        method = node.target
    elif node.op == "call_function" and node.target in _VIEW_FUNCTIONS:
        method = _VIEW_FUNCTIONS[node.target]
    elif node.op == "call_function" and node.target is getattr and len(node.args) == 2 \
            and node.args[1] in ("T", "mT"):
        return _Step(node.args[1], (), {})
    else:
        return None
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    rest, kwargs = node.args[1:], dict(node.kwargs)
    found = []
    fx.node.map_arg((rest, kwargs), found.append)
    if found:       # (a size the graph computes, a tensor index: not replayed here)
        return None
    return _Step(method, rest, kwargs)


def _value(node):
    return node.meta.get("example_value", node.meta.get("val"))


def _changes_dtype(node) -> bool:
    out, src = _value(node), _value(node.args[0]) if node.args else None
    return isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor) and out.dtype != src.dtype


def _same_storage(a, b) -> bool:
    try:
        return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
    except Exception:
        return False


def find(gm) -> list:
    """[(output index, input index, [steps])] for the outputs of `gm` to replay."""
    if not config.replay_dtype_views:
        return []
    nodes = list(gm.graph.nodes)
    if any(n.op in ("call_method", "call_function") and
           (n.target if n.op == "call_method" else getattr(n.target, "__name__", "")) in _METADATA_WRITERS
           for n in nodes):
        return []
    inputs = [n for n in nodes if n.op == "placeholder"]
    out_node = next((n for n in reversed(nodes) if n.op == "output"), None)
    if out_node is None or not isinstance(out_node.args[0], (tuple, list)):
        return []
    found = []
    for i, o in enumerate(out_node.args[0]):
        if not isinstance(o, fx.Node):
            continue
        chain, cur, crosses = [], o, False
        while cur.op in ("call_method", "call_function"):
            step = _step(cur)
            if step is None:
                break
            crosses = crosses or _changes_dtype(cur)
            chain.append(step)
            cur = cur.args[0]
        if not (crosses and cur.op == "placeholder"):
            continue
        base, out = _value(cur), _value(o)
        if not (isinstance(base, torch.Tensor) and isinstance(out, torch.Tensor)) or \
                base.requires_grad or not _same_storage(base, out):
            continue
        found.append((i, inputs.index(cur), chain[::-1]))
    return found


def _without(gm, drop):
    """A copy of `gm` whose output leaves out the output indices `drop`."""
    graph = fx.Graph()
    mapping: dict = {}
    out = graph.graph_copy(gm.graph, mapping)
    kept = tuple(v for i, v in enumerate(out) if i not in drop)
    graph.output(kept)
    new = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    new.meta.update(gm.meta)
    return new


class WithReplays:
    """The backend's compiled function, with the replayed outputs put back in place."""

    def __init__(self, fn, replays):
        self.fn, self.replays = fn, replays

    def __call__(self, *args):
        out = list(self.fn(*args))
        for i, j, steps in self.replays:        # (in output order: each lands at its index)
            value = args[j]
            for step in steps:
                value = step(value)
            out.insert(i, value)
        return out

    def __frametrace_artifact__(self):
        # (what the backend stored is a graph with fewer outputs; the warm start compiles
        # the cached whole graph through compile_graph again)
        return None, "an output is a dtype view of an input, made again after the graph"

    def __getattr__(self, name):        # (source_code, __self__: the output-code log)
        return getattr(self.fn, name)


def compile_graph(backend, gm, example_inputs):
    """`backend(gm, example_inputs)`, except that the outputs `find` names are made by
    their view ops on the real input after the compiled graph runs."""
    replays = find(gm)
    if not replays:
        return backend(gm, example_inputs)
    compiled = backend(_without(gm, {i for i, _, _ in replays}), example_inputs)
    return WithReplays(compiled, replays)
