"""Outputs that view a graph input through a dtype view are made again after the
compiled graph, by running their view ops on the real input.

AOTAutograd hands back an output that aliases an input by regenerating it from that
input.  Where it cannot replay the views (symbolic sizes), it falls back to
``as_strided`` with the output's sizes and strides, which count elements of the output's
dtype, over the input's dtype (torch.compile's answers are as wrong):
``x.view(torch.float64).flatten()`` of a float32 ``x`` of n rows came back with n
elements instead of 2n, ``x.view(torch.uint8)`` raised a storage error at every call,
and ``x.view(torch.int32).flatten()[:6]`` came back float32.  The view ops themselves,
run eagerly on the input, are what CPython computes, and they cost a few microseconds.

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

from . import config
from .view_ops import VIEWS, keeps_geometry, op_name

# Ops that return a view of their first argument, their other arguments plain values:
# view_ops.VIEWS, and those whose replay this module knows besides.
_VIEW_METHODS = VIEWS | {"detach", "view_as_real", "view_as_complex", "__getitem__", "T", "mT"}
_VIEW_FUNCTIONS = {operator.getitem: "__getitem__", torch.flatten: "flatten", torch.reshape: "reshape",
                   torch.t: "t", torch.transpose: "transpose", torch.permute: "permute",
                   torch.squeeze: "squeeze", torch.unsqueeze: "unsqueeze", torch.narrow: "narrow",
                   torch.select: "select", torch.movedim: "movedim", torch.moveaxis: "moveaxis",
                   torch.view_as_real: "view_as_real", torch.view_as_complex: "view_as_complex",
                   torch.swapaxes: "swapaxes", torch.swapdims: "swapdims", torch.detach: "detach",
                   torch.diagonal: "diagonal",
                   **{getattr(torch.Tensor, m): m for m in _VIEW_METHODS
                      if m not in ("T", "mT") and hasattr(torch.Tensor, m)}}
# Beside view_ops.GEOMETRY_WRITERS: in-place ops after which a view made before is not
# the one made after the graph.
_ALSO_WRITERS = frozenset({"detach_", "set_data"})
_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}
_REAL_OF = {c: r for r, c in _COMPLEX_OF.items()}


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

    def dtype_after(self, dtype):
        """The dtype of this step's result from one of `dtype`."""
        if self.method == "view":
            new = self.kwargs.get("dtype", self.args[0] if len(self.args) == 1 else None)
            return new if isinstance(new, torch.dtype) else dtype
        if self.method == "view_as_real":
            return _REAL_OF.get(dtype, dtype)
        if self.method == "view_as_complex":
            return _COMPLEX_OF.get(dtype, dtype)
        return dtype


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


def find(gm, example_inputs) -> list:
    """[(output index, input index, [steps])] for the outputs of `gm` to replay.  Read
    from the graph's code and the inputs alone (a cached graph comes back without its
    nodes' example values)."""
    if not config.replay_dtype_views:
        return []
    nodes = list(gm.graph.nodes)
    # (a view function named through torch.Tensor, `torch.Tensor.flatten(x)`, has no
    # module for keeps_geometry to tell torch's by: this table knows it)
    if not all((keeps_geometry(n) or n.op == "call_function" and n.target in _VIEW_FUNCTIONS)
               and op_name(n) not in _ALSO_WRITERS for n in nodes):
        return []
    inputs = [n for n in nodes if n.op == "placeholder"]
    out_node = next((n for n in reversed(nodes) if n.op == "output"), None)
    if out_node is None or not isinstance(out_node.args[0], (tuple, list)) or \
            len(inputs) != len(example_inputs):
        return []
    found = []
    for i, o in enumerate(out_node.args[0]):
        if not isinstance(o, fx.Node):
            continue
        chain, cur = [], o
        while cur.op in ("call_method", "call_function"):
            step = _step(cur)
            if step is None:
                break
            chain.append(step)
            cur = cur.args[0]
        if cur.op != "placeholder" or not chain:
            continue
        j = inputs.index(cur)
        base = example_inputs[j]
        if not isinstance(base, torch.Tensor):
            continue
        chain.reverse()
        dtypes = [base.dtype]
        for step in chain:
            dtypes.append(step.dtype_after(dtypes[-1]))
        if len(set(dtypes)) == 1:
            continue
        # A base that needs grad: only where the view cannot need grad (an integer or
        # bool result, or a `view(dtype)` of another element size on the way, which
        # autograd does not go through), so that the grad mode the graph ran its ops in
        # cannot matter.
        if base.requires_grad and (dtypes[-1].is_floating_point or dtypes[-1].is_complex) and \
                not any(step.method == "view" and a.itemsize != b.itemsize
                        for step, a, b in zip(chain, dtypes, dtypes[1:])):
            continue
        found.append((i, j, chain))
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

    def __getattr__(self, name):        # (source_code: the output-code log)
        if name.startswith("__") or name in ("fn", "replays"):
            raise AttributeError(name)  # (copy and pickle probe these before __init__)
        return getattr(self.fn, name)


def compile_graph(backend, gm, example_inputs):
    """`backend(gm, example_inputs)`, except that the outputs `find` names are made by
    their view ops on the real input after the compiled graph runs."""
    replays = find(gm, example_inputs)
    if not replays:
        return backend(gm, example_inputs)
    compiled = backend(_without(gm, {i for i, _, _ in replays}), example_inputs)
    return WithReplays(compiled, replays)
