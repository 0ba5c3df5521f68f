"""Speculating a callable into a subgraph: the body of a higher-order operator
(torch.cond's branches, while_loop's body, a checkpointed region, a vmapped function).

`speculate(tx, fn, args, what)` runs the traced callable `fn` (a user function, closure,
lambda, nn.Module, bound method ...) with the interpreter, recording its torch ops into
a graph of its own instead of the frame's.  Its tensor (and symbolic number) arguments
are the subgraph's first placeholders; tensors it reads from outside (closure cells,
globals, parameters, values computed earlier in the frame) become further placeholders
when first used, and the outer graph passes them (`Subgraph.lifted`).  Guards the body
relies on go to the frame's guards, as for inlined code.

What a subgraph cannot express is refused with Unsupported (the frame breaks its graph
at the operator's call, which then runs in CPython): a graph break or an exception in
the body, a change to Python state that outlives it (globals, cells, attributes, lists
and dicts that existed before it ran, iterators advanced), an in-place write to an
input tensor (unless the caller allows it), an output that is not tensors, numbers and
constants in tuples, lists and dicts (constant keys).

    sub = speculate(tx, fn_var, [x_var], "torch.cond true_fn")
    name = tx.output.install_subgraph("cond_true", sub.module())
    out = call_hop(tx, torch.ops.higher_order.cond, (pred, get_attr, ..., (*sub.inputs(),)))
    result = sub.rebuild(out_leaves)     # the body's return value, over outer Vars

`merge_inputs` gives several subgraphs (cond's two branches) one signature.
"""
from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx

from .exc import Unsupported
from .graph import OutputGraph, written_arg
from .variables.base import Var, ValueVar, unsupported
from .variables.constant import ConstVar
from .variables.containers import DictVar, ListVar, NamedTupleVar, TupleVar, has_var_keys
from .variables.lazy import Lazy
from .variables.symbolic import wrap_sym
from .variables.tensor import TensorVar
from .side_effects import SideEffects
from .variables.exceptions import TracedRaise
from .variables.fx_values import GRAPH_VARS as _GRAPH_VARS, map_graph_vars  # noqa: F401  (read from here)
from .variables.functions import Cell



class SubgraphOutput(OutputGraph):
    """The OutputGraph a body records into while it is speculated.  Shared state (fake
    mode, guards, inputs of the frame, Vars of outside objects) is the parent's; graph,
    size reads and placeholders are its own."""

    def __init__(self, parent: OutputGraph):
        self.parent = parent
        self.graph = fx.Graph()
        self.submodules = {}
        self._sizes = {}
        self._last_inplace = {}
        self._last_placeholder = None
        self.arg_vars: list[Var] = []           # outer Vars of the argument placeholders
        self.lifted: list[Var] = []             # parent-level Vars of lifted placeholders
        self._lifted_by_node = {}               # parent node -> Var in this graph
        self._outer_of = {}                     # placeholder -> parent-level Var
        # torch.func.functional_call's tensors, while its module's call is speculated:
        # {(id(module), name): (module, Var)} read instead of the module's own, and the
        # ids of the parameters and buffers they replace (read any other way: refused).
        self.reparametrized = getattr(parent, "reparametrized", None)

    def __getattr__(self, name):
        # Only reached for attributes not set above: the frame-wide state.
        return getattr(self.parent, name)

    # -- placeholders --
    def _new_placeholder(self, prefix, outer: Var) -> Var:
        node = self.new_placeholder(f"{prefix}{len(self._outer_of)}", outer.example)
        self._outer_of[node] = outer
        inner = copy.copy(outer)
        inner.node, inner.source = node, None
        return inner

    def add_arg(self, v: Var) -> Var:
        """The Var the body sees for argument `v`: tensors and symbolic numbers (also in
        tuples, lists and dicts) become placeholders; constants stay constants."""
        def arg(t):
            t = lift_into(self.parent, t)
            self.arg_vars.append(t)
            return self._new_placeholder("arg", t)
        return map_graph_vars(v, arg)

    def lift(self, v: Var) -> Var:
        """`v` as a Var of this graph: one made outside becomes a placeholder once."""
        if not isinstance(v, _GRAPH_VARS) or v.node.graph is self.graph:
            return v
        outer = lift_into(self.parent, v)
        known = self._lifted_by_node.get(outer.node)
        if known is None:
            known = self._lifted_by_node[outer.node] = self._new_placeholder("lifted", outer)
            self.lifted.append(outer)
        return known

    # -- what the interpreter asks --
    def add_input(self, value, source):
        # A frame input first read in the body: an input of the frame's graph (lifted
        # where used), so that Vars cached for outside objects stay outer Vars.
        if self.reparametrized is not None and id(value) in self.reparametrized[1]:
            unsupported("torch.func.functional_call's module reads a tensor it replaces "
                        "other than as its module's attribute")
        return self.parent.add_input(value, source)

    def add_number_input(self, value, source, data=False):
        return self.parent.add_number_input(value, source, data)

    def input_of(self, var):
        return self.parent.input_of(self._outer_of.get(var.node, var))

    def size_of(self, tensor):
        return super().size_of(self.lift(tensor))

    def call(self, kind, target, args, kwargs):
        lift = self.lift
        return super().call(kind, target, tuple(map_graph_vars(a, lift) for a in args),
                            {k: map_graph_vars(v, lift) for k, v in kwargs.items()})

    def aliased_outputs(self, leaves) -> list:
        """The output Vars sharing memory with a placeholder."""
        inputs = {_storage(p) for p in self._outer_of} - {None}
        return [v for v in leaves if _storage(v.node) in inputs]

    def written_placeholders(self) -> list:
        """Placeholders whose memory the body writes in place (directly or by a view)."""
        key = _storage
        written = set()
        for node in self.graph.nodes:
            if node.op in ("call_function", "call_method"):
                target = written_arg(node.op, node.target, node.args, node.kwargs)
                for t in (target if isinstance(target, (list, tuple)) else [target]):
                    if isinstance(t, fx.Node):
                        written.add(key(t))
        written.discard(None)
        return [p for p in self._outer_of if key(p) in written]


def _storage(node):
    try:
        return node.meta["example_value"].untyped_storage()._cdata
    except Exception:
        return None


def lift_into(output, v):
    """`v` as a Var of `output`'s graph (the frame's graph needs no lifting)."""
    return output.lift(v) if isinstance(output, SubgraphOutput) else v


# ---------------------------------------------------------------- the result
class Subgraph:
    """A speculated body: its graph, the outer Vars to pass it (`inputs()`), and the
    structure of what it returned."""

    def __init__(self, output: SubgraphOutput, result: Var, leaves: list, spec, what: str):
        self.output = output
        self.graph = output.graph
        self.result = result
        self.leaves = leaves          # Vars of this graph, in output order
        self.spec = spec
        self.what = what

    @property
    def arg_count(self) -> int:
        return len(self.output.arg_vars)

    def inputs(self) -> list:
        """What the outer graph passes: the arguments' tensors, then the lifted ones."""
        return [*self.output.arg_vars, *self.output.lifted]

    def output_examples(self) -> list:
        return [leaf.example for leaf in self.leaves]

    def module(self) -> fx.GraphModule:
        root = torch.nn.Module()
        for name, gm in self.output.submodules.items():
            root.add_module(name, gm)
        self.graph.lint()
        return fx.GraphModule(root, self.graph, class_name="Subgraph")

    def rebuild(self, outer_leaves: list) -> Var:
        """The body's return value with its graph values replaced by `outer_leaves`."""
        return _unflatten(self.spec, iter(outer_leaves))


def speculate(tx, fn: Var, args: list, what: str, kwargs: dict | None = None, *,
              allow_input_mutation: bool = False, allow_aliasing: bool = False,
              finish: bool = True, single_output: bool = False,
              reparametrized=None) -> Subgraph:
    """Trace `fn(*args, **kwargs)` into a new graph (see the module docstring).  `what`
    names the body in refusals ("torch.cond true_fn").  With ``finish=False`` the
    graph gets no output node yet (the caller adds outputs of its own first; then
    `finish_outputs`); with ``single_output`` the graph returns its one output bare,
    not in a tuple (while_loop's cond_fn).  Outputs that share memory with an input are refused unless
    `allow_aliasing` (torch's control-flow ops raise on them)."""
    outer = tx.output
    sub = SubgraphOutput(outer)
    if reparametrized is not None:
        sub.reparametrized = reparametrized
    inner_args = [sub.add_arg(a) for a in args]
    inner_kwargs = {k: sub.add_arg(v) for k, v in (kwargs or {}).items()}
    before = StateSnapshot(tx, [fn, *args, *(kwargs or {}).values()])
    tx.output = sub
    try:
        result = fn.call(tx, inner_args, inner_kwargs)
    except TracedRaise as r:
        unsupported(f"{what} raises ({r.reason}): not expressible in a subgraph")
    except Unsupported as e:
        e.reason = f"{what} cannot be traced into a subgraph: {e.reason}"
        e.args = (e.reason,)
        raise
    finally:
        tx.output = outer
    changed = before.changed()
    if changed is not None:
        unsupported(f"{what} has a side effect outside it ({changed}): not expressible in a subgraph")
    if not allow_input_mutation and sub.written_placeholders():
        unsupported(f"{what} writes in place to an input tensor")
    leaves: list = []
    spec = _flatten(result, leaves, what)
    leaves = [sub.lift(leaf) for leaf in leaves]
    if not allow_aliasing and sub.aliased_outputs(leaves):
        unsupported(f"{what} returns an input tensor or a view of one (an alias)")
    sg = Subgraph(sub, result, leaves, spec, what)
    if single_output and len(leaves) != 1:
        unsupported(f"{what} must return one tensor")
    if finish:
        finish_outputs(sg, single=single_output)
    return sg


def finish_outputs(sg: Subgraph, extra: list = (), single: bool = False):
    """The output node: the body's graph values, then `extra` (Vars of the subgraph);
    `single`: the one value itself, not a tuple."""
    sg.leaves = [*sg.leaves, *(sg.output.lift(v) for v in extra)]
    nodes = tuple(leaf.node for leaf in sg.leaves)
    sg.graph.output(nodes[0] if single else nodes)


def _flatten(v, leaves: list, what: str):
    if isinstance(v, _GRAPH_VARS):
        leaves.append(v)
        return ("leaf",)
    if isinstance(v, ConstVar):
        return ("const", v)
    if type(v) in (TupleVar, ListVar):
        return (type(v), [_flatten(x, leaves, what) for x in v.items])
    if type(v) is NamedTupleVar:
        return (v, [_flatten(x, leaves, what) for x in v.items])
    if type(v) is DictVar and not has_var_keys(v.items):
        return (DictVar, [_flatten(x, leaves, what) for x in v.items.values()], tuple(v.items))
    unsupported(f"{what} returns {v}, which a subgraph cannot return")


def _unflatten(spec, leaves):
    kind = spec[0]
    if kind == "leaf":
        return next(leaves)
    if kind == "const":
        return spec[1]
    items = [_unflatten(s, leaves) for s in spec[1]]
    if kind is DictVar:
        return DictVar(dict(zip(spec[2], items)))
    if kind in (TupleVar, ListVar):
        return kind(items)
    new = copy.copy(kind)
    new.items, new.source = items, None
    return new


def same_structure(a: Subgraph, b: Subgraph) -> bool:
    """Whether two bodies return the same structure with equal constants."""
    def norm(spec):
        kind = spec[0]
        if kind == "leaf":
            return kind
        if kind == "const":
            return (kind, type(spec[1].value), spec[1].value)
        head = kind if isinstance(kind, type) else (NamedTupleVar, getattr(kind, "fields", None))
        return (head, spec[2:], tuple(norm(s) for s in spec[1]))      # spec[2]: a dict's keys
    return norm(a.spec) == norm(b.spec)


def merge_inputs(subgraphs: list[Subgraph]) -> list:
    """Give bodies traced over the same arguments one signature: each gets a
    placeholder for every Var any of them lifted (unused where it did not read it),
    in one order.  Returns the outer Vars to pass after the arguments."""
    order, seen = [], {}
    for sg in subgraphs:
        for v in sg.output.lifted:
            if v.node not in seen:
                seen[v.node] = v
                order.append(v)
    for sg in subgraphs:
        out = sg.output
        for v in order:
            out.lift(v)                       # adds the placeholders it lacks
        by_outer = {outer.node: p for p, outer in out._outer_of.items()}
        placeholders = [p for p in out.graph.nodes if p.op == "placeholder"]
        wanted = placeholders[:sg.arg_count] + [by_outer[v.node] for v in order]
        assert len(wanted) == len(placeholders)
        anchor = wanted[0] if wanted else None
        for p in wanted[1:]:
            anchor.append(p)
            anchor = p
        out.lifted = list(order)
    return order


# ---------------------------------------------------------------- side effects
_SCALARS = (int, float, str, bool, type(None), bytes, complex)


class StateSnapshot:
    """The traced Python state a body could change: every Var, cell, container and
    frame reachable from the tracers' frames, the Vars of outside objects, the recorded
    side effects and the callable and arguments, with what each holds.  `changed()`
    names the first one that holds something else afterwards (Vars made by the body
    are not in it, so the body may change those freely)."""

    def __init__(self, tx, extra: list):
        self._lazy = Lazy
        # The tracers' frames are walked too: their class is the given tx's (the
        # interpreter is a layer above, not imported here).
        self._frame = type(tx)
        roots = [*extra, tx.side_effects]
        t = tx
        while t is not None:
            roots.append(t)
            t = t.parent
        roots += [var for _, var in tx.output.object_vars.values()]
        self.state: dict[int, tuple] = {}
        todo = list(roots)
        while todo:
            obj = todo.pop()
            if id(obj) in self.state or not self._walks(obj):
                continue
            children = self._children(obj)
            self.state[id(obj)] = (obj, children)
            todo.extend(children)

    def _walks(self, obj) -> bool:
        return isinstance(obj, (Var, Cell, list, tuple, dict, set, self._frame, SideEffects))

    def _children(self, obj) -> tuple:
        if isinstance(obj, (list, tuple, set)):
            return tuple(obj)
        if isinstance(obj, dict):
            return (*obj.keys(), *obj.values())
        if isinstance(obj, Cell):
            return (obj.value,)
        if isinstance(obj, self._frame):
            return (obj.ip, obj.locals, obj.stack, obj.cells, obj.closure, obj.return_value)
        if isinstance(obj, Var):
            out = []
            for cls in type(obj).__mro__:
                for slot in cls.__dict__.get("__slots__", ()):
                    if slot in ("source", "node", "example", "_lazy", "_key_vars") or \
                            (slot == "value" and isinstance(obj, ValueVar)):
                        # immutable facts, or a real object; a lazy dict's pending
                        # items (its `items`, read here, wraps them all); which object
                        # each of a dict's keys is (filled in as its items are read:
                        # a key the body adds changes `items` too)
                        continue
                    out.append(getattr(obj, slot, _MISSING))
            out.extend(getattr(obj, "__dict__", {}).values())
            return tuple(out)
        return tuple(vars(obj).values())

    def _same(self, a, b) -> bool:
        if a is b:
            return True
        if type(a) in _SCALARS and type(b) is type(a):
            return a == b
        # A lazily wrapped value of the frame, wrapped now: the same value.
        return type(a) is self._lazy and isinstance(b, Var) and b.source == a.source

    def changed(self):
        """None, or a description of the first thing that changed."""
        for obj, children in self.state.values():
            now = self._children(obj)
            if len(now) != len(children) or not all(map(self._same, children, now)):
                return _describe(obj, self._frame)
        return None


_MISSING = object()


def _describe(obj, frame_type) -> str:
    if isinstance(obj, frame_type):
        return f"a variable of {obj.code.co_name}"
    if isinstance(obj, Var):
        return repr(obj)
    return type(obj).__name__


def call_hop(tx, target, args: tuple, examples: list, kwargs: dict | None = None) -> list:
    """Record `target(*args, **kwargs)` in the frame's graph (a higher-order op whose
    results are described by `examples`), and return one outer Var per result."""
    out = tx.output
    node_args = tuple(_node_arg(out, a) for a in args)
    node = out.graph.create_node("call_function", target, node_args, dict(kwargs or {}))
    node.meta["example_value"] = tuple(examples)
    results = []
    for i, ex in enumerate(examples):
        item = out.graph.create_node("call_function", operator.getitem, (node, i))
        if isinstance(ex, torch.Tensor):
            item.meta["example_value"] = item.meta["val"] = ex
            results.append(TensorVar(item, ex))
        else:
            results.append(wrap_sym(item, ex))
    return results


def _node_arg(output, a):
    if isinstance(a, _GRAPH_VARS):
        return lift_into(output, a).node
    if isinstance(a, (list, tuple)):
        return type(a)(_node_arg(output, x) for x in a)
    if isinstance(a, ConstVar):
        return a.value
    return a        # fx nodes (get_attr), Python constants
