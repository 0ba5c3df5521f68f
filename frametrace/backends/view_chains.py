"""Chains of view ops run as one `as_strided` (the eager backend's graph runner).

At batch 1 a model's graph is about a third view ops, and each costs a whole
dispatch: GPT-2's attention does ``addmm(...).view(1, 1, 192).split(64, 2)[1]
.view(1, 1, -1, 16).transpose(1, 2)`` for each of q, k and v.  What a chain of views
gives depends on its root's geometry alone (sizes, strides, storage offset), so for
a root of the geometry one run of the chain saw, the chain's end is one ``as_strided``
of the root.

The graph calls ``frametrace._views.reinterpret(root, plan)`` at the chain's end
(views.cpp).  It runs the chain the first time and remembers where it landed; later,
for a root of that same geometry, and when nothing could tell the shortcut from the
chain (autograd recording, a tangent, a torch function or dispatch mode, a tensor
subclass or wrapper), it is one ``as_strided``; otherwise the chain runs again.  The
answer is the chain's whatever the root turns out to be.  Here chains are found, and
replayed on a meta tensor of the root's traced geometry so that a step that copies
(``reshape`` of a transposed tensor) ends the chain before it.  Only
graphs where no op could change a tensor's geometry in place (``transpose_``,
``resize_``, ``set_``, ``out=``, a user's function let into the graph) are
rewritten: there the chain's steps see the geometry their inputs had when made.

A view is more than its geometry: autograd keeps its base and how it was made
(CreationMeta: in grad mode, in no_grad, in inference mode, one of several outputs of
split/unbind/chunk), and refuses an in-place op with grad on for all but the first.
The chain's end is made where its last step was, so its steps must all run where
nothing between them could tell: a chain never spans a node that may switch autograd's
mode (``torch.no_grad()``'s ``_set_grad_enabled``) or write a tensor (its values,
version or ``requires_grad``); such a node starts a new chain from the step before
it.  Only views, reads and pure ``operator`` calls may lie between a chain's steps.
A chain with a multi-output step is marked, and runs as its chain whenever grad is on
(views.cpp).  ``frametrace.config.view_chain_shortcut = False`` leaves every graph as
it is, to tell a wrong answer of the shortcut's from another.

>>> gm2 = collapse(gm)        # None: nothing to collapse, or the C++ module is missing
"""
from __future__ import annotations

import functools
import logging
import operator

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from .. import config, cxx_modules
from ..view_ops import (GEOMETRY_WRITERS as _GEOMETRY_WRITERS, MULTI_VIEWS as _MULTI_VIEWS,  # noqa: F401
                        VIEWS as _VIEWS, from_torch as _from_torch, keeps_geometry as _keeps_geometry,
                        op_name as _name)
from ..shapes import meta_like

log = logging.getLogger("frametrace.backends")

# What may lie between two steps of a chain besides views: calls that write nothing
# and switch no mode.
_WRITING_OPERATORS = frozenset({
    operator.setitem, operator.delitem, operator.iadd, operator.iand, operator.iconcat,
    operator.ifloordiv, operator.ilshift, operator.imatmul, operator.imod, operator.imul,
    operator.ior, operator.ipow, operator.irshift, operator.isub, operator.itruediv,
    operator.ixor,
})
_PURE_BUILTINS = frozenset({getattr, len, isinstance, int, float, bool, min, max, abs})
_READS = frozenset({"size", "stride", "dim", "ndimension", "numel", "nelement",
                    "storage_offset", "is_contiguous", "element_size", "__getitem__"})

@functools.cache
def _module():
    return cxx_modules.load("_views", log, "each view op runs")


def collapse(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of `gm` whose view chains of two or more steps are one
    `reinterpret` each, or None where there is nothing to collapse (or the C++
    module was not built).  `gm` itself is left as it is."""
    if not config.view_chain_shortcut:
        return None
    views = _module()
    if views is None or not all(_keeps_geometry(n) for n in gm.graph.nodes):
        return None
    # A node's epoch: how many nodes before it may have switched a mode or written a
    # tensor.  Every step of a chain, from where its first op ran to its end, is in one.
    epoch: dict = {}
    count = 0
    for n in gm.graph.nodes:
        epoch[n] = count
        count += not _inert(n)
    steps: dict = {}       # node -> _step(node)
    chains: dict = {}      # step node -> (root, the steps from the root, their epoch, multi)
    multi = set()
    for n in gm.graph.nodes:
        step = _step(n)
        if step is not None:
            source, fns, first, is_multi = step
            if epoch[first] != epoch[n]:      # split, a write, then [k]: not one step
                step = None
        if step is None:
            if _name(n) in _MULTI_VIEWS:
                multi.add(n)
            continue
        steps[n] = step
        root, before, at, was_multi = chains.get(source, (source, [], epoch[n], False))
        if at != epoch[n]:                    # a switch or a write since: start anew
            root, before, was_multi = source, [], False
        chains[n] = (root, before + fns, epoch[n], was_multi or is_multi)
    plans = {}
    for n, (root, fns, _, is_multi) in chains.items():
        if len(fns) >= 2:                     # two steps or more from the root
            plan = _plan(views, root, fns, is_multi)
            if plan is not None:
                plans[n] = (root, plan)
    if not plans:
        return None

    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen      # a pytree signature (concrete_args) stays
    env: dict = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    attrs = {n.target: _attr(gm, n.target) for n in gm.graph.nodes
             if n.op in ("get_attr", "call_module")}
    # Every step of two or more gets its shortcut; those whose only users were
    # later steps are then dead, as are the views that fed them.
    removable = {env[n] for n in (*steps, *multi)}
    for i, (n, (root, plan)) in enumerate(plans.items()):
        name = f"_view_plan_{i}"
        attrs[name] = plan
        new = env[n]
        with graph.inserting_before(new):
            plan_node = graph.get_attr(name)
            short = graph.call_function(views.reinterpret, (env[root], plan_node))
        short.meta = dict(new.meta)
        new.replace_all_uses_with(short)
        removable |= {plan_node, short}
    for node in reversed(list(graph.nodes)):
        if node in removable and not node.users:
            graph.erase_node(node)
            attrs.pop(node.target, None) if node.op == "get_attr" else None
    return torch.fx.GraphModule(attrs, graph, gm.__class__.__name__)


def _attr(gm, qualname):
    obj = gm
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj




def _inert(n) -> bool:
    """`n` writes no tensor and switches no mode: a view made before it and one made
    after it are alike.  Anything not known to be so is not (an in-place op, grad
    mode's switch, a torch function that may write its arguments, like batch_norm's
    running statistics)."""
    if n.op in ("placeholder", "output", "get_attr"):
        return True
    if n.op not in ("call_method", "call_function") or "out" in n.kwargs:
        return False
    if n.target is operator.getitem or _name(n) in _VIEWS or _name(n) in _MULTI_VIEWS:
        return True                   # a view (or an item of a tuple), whatever its arguments
    if n.op == "call_method":
        return n.target in _READS
    t = n.target
    module = getattr(t, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return t not in _WRITING_OPERATORS
    if module == "math":
        return True
    return module == "builtins" and t in _PURE_BUILTINS


def _constant(value) -> bool:
    """No graph value inside `value` (an op's other arguments)."""
    if isinstance(value, torch.fx.Node):
        return False
    if isinstance(value, (tuple, list)):
        return all(_constant(v) for v in value)
    if isinstance(value, dict):
        return all(_constant(v) for v in value.values())
    if isinstance(value, slice):
        return _constant((value.start, value.stop, value.step))
    return not isinstance(value, torch.Tensor)


def _tensor_node(v) -> bool:
    return isinstance(v, torch.fx.Node) and isinstance(v.meta.get("example_value"), torch.Tensor)


def _call(n, tensor_first_args, kwargs):
    """`n`'s op as a callable of its tensor argument."""
    if n.op == "call_method":
        return operator.methodcaller(n.target, *tensor_first_args, **kwargs)
    fn = n.target
    return lambda x: fn(x, *tensor_first_args, **kwargs)


def _on_a_tensor(n) -> bool:
    """`n` calls a torch op (or Tensor method) on a tensor, its other arguments
    constants."""
    return n.op in ("call_method", "call_function") and bool(n.args) and \
        _tensor_node(n.args[0]) and _constant(n.args[1:]) and _constant(n.kwargs) and \
        (n.op == "call_method" or n.target is operator.getitem or _from_torch(n.target))


def _step(n):
    """(source node, steps, the node where the step's first op runs, whether it is one
    of several outputs) when `n` is one view of `source`, else None."""
    if n.op == "call_function" and n.target is operator.getitem and len(n.args) == 2 and \
            isinstance(n.args[0], torch.fx.Node) and not _tensor_node(n.args[0]):
        return _multi_item(n)
    if not _on_a_tensor(n):
        return None
    if n.target is operator.getitem:
        key = n.args[1]
        return n.args[0], [lambda x: x[key]], n, False
    if _name(n) in _VIEWS:
        return n.args[0], [_call(n, n.args[1:], n.kwargs)], n, False
    return None


def _multi_item(n):
    """``split(x, ...)[k]`` and the like: one view of x (made where the split ran)."""
    tup, k = n.args
    if type(k) is not int or _name(tup) not in _MULTI_VIEWS or not _on_a_tensor(tup):
        return None
    views = _call(tup, tup.args[1:], tup.kwargs)
    return tup.args[0], [lambda x: views(x)[k]], tup, True


def _plan(views, root, fns, multi_output=False):
    """The reinterpret plan of the chain `fns` from `root`, or None when, replayed on a
    meta tensor of the root's traced geometry, some step is not a view of the root
    (``reshape`` that copies, ``view(dtype)``)."""
    value = root.meta.get("example_value")
    if not isinstance(value, torch.Tensor) or value.is_nested or value.is_quantized:
        return None
    try:
        with _disable_current_modes(), torch.no_grad():
            base = meta_like(value)
            if base is None:
                return None
            x = base
            made = [base]
            for fn in fns:
                x = fn(x)
                if not isinstance(x, torch.Tensor) or x.dtype != base.dtype or \
                        not torch._C._is_alias_of(x, base):
                    return None
                made.append(x)
            # flatten of a 1-d tensor gives the tensor itself: a chain ending so gives its
            # root, or one of its steps, not the new view as_strided would make.
            if any(x is y for y in made[:-1]):
                return None
    except Exception:                # the replay is a check, not the user's program
        return None
    return views.plan(_chain(fns), multi_output)


def _chain(fns):
    def chain(x):
        for fn in fns:
            x = fn(x)
        return x
    return chain
