"""Higher-order operators: torch.cond, torch.while_loop,
torch.utils.checkpoint.checkpoint, torch.func.functional_call and
torch._higher_order_ops' wrap, map and hints_wrapper.  Each body is speculated into a subgraph
(subgraph.py), kept as a submodule of the frame's graph and called through torch's own
higher-order op (``torch.ops.higher_order.cond`` ...), so backends see what
torch.compile gives them.  A body that cannot be a subgraph breaks the graph at the
operator's call, which then runs in CPython.

The ops' signatures used here are the same on torch 2.11 and 2.13: cond(pred, true_gm,
false_gm, operands), while_loop(cond_gm, body_gm, carried, additional) (2.13 adds a
keyword-only argument we leave at its default), tag_activation_checkpoint(gm, *args,
**checkpoint_kwargs) with a context_fn in gm.meta["_checkpoint_context_fn"],
wrap(gm, *args), map_impl(gm, xs, args)."""
from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch._higher_order_ops.hints_wrap import hints_wrapper as hints_wrapper_op
from torch._higher_order_ops.map import map as map_hop
from torch._higher_order_ops.wrap import wrap as wrap_op
from torch.utils.checkpoint import noop_context_fn

from .base import unsupported
from .constant import ConstVar
from .containers import DictVar, ListVar, TupleVar
from .objects import ObjectVar
from .symbolic import SymNodeVar
from .tensor import TensorVar
from .functorch import _ArgsAs, _tensors
from .modules import NNModuleVar


class HigherOrderVar(ObjectVar):
    """A higher-order operator (the Python function users call, or torch.ops.higher_order.*)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return _BY_ID[id(self.value)][1](tx, args, kwargs)


def higher_order_var(value, source):
    """The Var for `value` if it is a higher-order operator we trace, else None."""
    # By identity: hashing a program's object may run (and fail in) its __hash__.
    known = _BY_ID.get(id(value))
    return HigherOrderVar(value, source) if known is not None and known[0] is value else None


def _bind(what, names, args, kwargs, defaults=None):
    """Positional and keyword arguments to `names`, in order."""
    if len(args) > len(names):
        unsupported(f"{what}: too many arguments")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            unsupported(f"{what}: unexpected argument {k!r}")
        bound[k] = v
    for k, v in (defaults or {}).items():
        bound.setdefault(k, v)
    missing = [n for n in names if n not in bound]
    if missing:
        unsupported(f"{what}: missing argument {missing[0]!r}")
    return [bound[n] for n in names]


def _sequence(tx, v, what):
    if isinstance(v, ConstVar) and type(v.value) in (tuple, list):
        return v.unpack(tx)                 # a literal () or (1, 2): folded by the compiler
    if not isinstance(v, (TupleVar, ListVar)):
        unsupported(f"{what} must be a tuple or list, not {v}")
    return v.unpack(tx)


def _check_pytree(v, what):
    """Refuse `v` unless it is tensors, numbers and constants in tuples, lists and dicts."""
    if isinstance(v, (TensorVar, SymNodeVar, ConstVar)):
        return
    if type(v) in (TupleVar, ListVar):
        for x in v.items:
            _check_pytree(x, what)
    elif type(v) is DictVar:
        for x in v.items.values():
            _check_pytree(x, what)
    else:
        unsupported(f"{what} must be tensors (in tuples, lists and dicts), not {v}")


def _fresh_like(tx, examples: list, requires_grad: list) -> list:
    """New FakeTensors with the metadata of `examples` (a result is not any tensor the
    body saw, so it must not share identity or storage with one)."""
    out = []
    with tx.output.fake_mode:
        for ex, grad in zip(examples, requires_grad):
            if not isinstance(ex, torch.Tensor):
                out.append(ex)
                continue
            t = torch.empty_strided(ex.shape, ex.stride(), dtype=ex.dtype, device=ex.device)
            out.append(t.requires_grad_(True) if grad else t)
    return out


# ---------------------------------------------------------------- torch.cond
def _cond(tx, args, kwargs):
    pred, true_fn, false_fn, operands = _bind(
        "torch.cond", ("pred", "true_fn", "false_fn", "operands"), args, kwargs,
        {"operands": TupleVar([])})
    ops = _sequence(tx, operands, "torch.cond's operands")
    if isinstance(pred, ConstVar):
        # As torch.cond on a Python constant: the one branch, traced in line.
        branch = true_fn if pred.value else false_fn
        return branch.call(tx, ops, {})
    if isinstance(pred, TensorVar):
        if not (type(pred.example.numel()) is int and pred.example.numel() == 1):
            unsupported("torch.cond's pred must be a tensor of one element")
    elif not (isinstance(pred, SymNodeVar) and isinstance(pred.example, torch.SymBool)):
        unsupported(f"torch.cond's pred must be a bool, a SymBool or a tensor, not {pred}")
    for op in ops:
        # Nested tuples, lists and dicts of tensors are flattened into the op's operands
        # (speculate gives each tensor a placeholder); the branches see the structure.
        _check_pytree(op, "torch.cond's operands")
    branches = [tx.subgraphs.speculate(tx, fn, ops, f"torch.cond {name}")
                for fn, name in ((true_fn, "true_fn"), (false_fn, "false_fn"))]
    t, f = branches
    if not tx.subgraphs.same_structure(t, f):
        unsupported("torch.cond's branches return different structures")
    for a, b in zip(t.output_examples(), f.output_examples()):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            unsupported("torch.cond's branches must return tensors")
        if (a.dtype, a.device, tuple(a.shape)) != (b.dtype, b.device, tuple(b.shape)):
            unsupported(f"torch.cond's branches return tensors of different metadata "
                        f"({a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)})")
    lifted = tx.subgraphs.merge_inputs(branches)
    true_node = tx.output.install_subgraph("cond_true", t.module())
    false_node = tx.output.install_subgraph("cond_false", f.module())
    examples = _fresh_like(tx, t.output_examples(),
                           [a.requires_grad or b.requires_grad
                            for a, b in zip(t.output_examples(), f.output_examples())])
    outs = tx.subgraphs.call_hop(tx, torch.ops.higher_order.cond,
                    (pred, true_node, false_node, (*t.output.arg_vars, *lifted)), examples)
    return t.rebuild(outs)


# ---------------------------------------------------------------- torch.while_loop
def _while_loop(tx, args, kwargs):
    cond_fn, body_fn, carried = _bind(
        "torch.while_loop", ("cond_fn", "body_fn", "carried_inputs"), args, kwargs)
    init = _sequence(tx, carried, "torch.while_loop's carried_inputs")
    if not all(isinstance(v, TensorVar) for v in init):
        unsupported("torch.while_loop carrying something other than tensors")
    if torch.is_grad_enabled() and any(v.example.requires_grad for v in init):
        unsupported("torch.while_loop over tensors that require grad (no backward)")
    c = tx.subgraphs.speculate(tx, cond_fn, init, "torch.while_loop cond_fn", single_output=True)
    b = tx.subgraphs.speculate(tx, body_fn, init, "torch.while_loop body_fn")
    pred = c.output_examples()
    if c.spec[0] != "leaf" or not (pred[0].dtype == torch.bool and pred[0].dim() == 0):
        unsupported("torch.while_loop's cond_fn must return a boolean scalar tensor")
    outs = b.output_examples()
    if b.spec[0] not in (TupleVar, ListVar) or len(outs) != len(init) or \
            any(s[0] != "leaf" for s in b.spec[1]):
        unsupported("torch.while_loop's body_fn must return a tuple like carried_inputs")
    for v, o in zip(init, outs):
        ex = v.example
        if (ex.dtype, ex.device, tuple(ex.shape), ex.stride()) != (o.dtype, o.device, tuple(o.shape), o.stride()):
            unsupported("torch.while_loop's body_fn changes a carried tensor's metadata")
    if any(v.example.requires_grad for v in (*c.output.lifted, *b.output.lifted)) and torch.is_grad_enabled():
        unsupported("torch.while_loop reading tensors that require grad (no backward)")
    lifted = tx.subgraphs.merge_inputs([c, b])
    cond_node = tx.output.install_subgraph("while_cond", c.module())
    body_node = tx.output.install_subgraph("while_body", b.module())
    examples = _fresh_like(tx, [v.example for v in init], [False] * len(init))
    results = tx.subgraphs.call_hop(tx, torch.ops.higher_order.while_loop,
                       (cond_node, body_node, tuple(init), tuple(lifted)), examples)
    return TupleVar(results)


# ---------------------------------------------------------------- checkpoint
_CHECKPOINT_KWARGS = ("use_reentrant", "context_fn", "determinism_check", "debug",
                      "early_stop", "preserve_rng_state")


def _checkpoint(tx, args, kwargs):
    """A non-reentrant checkpoint: the region is one tag_activation_checkpoint call, whose
    intermediates AOTAutograd recomputes in the backward instead of saving."""
    if not args:
        unsupported("torch.utils.checkpoint.checkpoint without a function")
    fn, fn_args = args[0], list(args[1:])
    ckpt = {k: v for k, v in kwargs.items() if k in _CHECKPOINT_KWARGS}
    fn_kwargs = {k: v for k, v in kwargs.items() if k not in _CHECKPOINT_KWARGS}
    reentrant = ckpt.pop("use_reentrant", None)
    if not (isinstance(reentrant, ConstVar) and reentrant.value is False):
        # The reentrant variant differs (no grads without an input needing one, a
        # warning when not given): CPython runs it.
        unsupported("torch.utils.checkpoint.checkpoint without use_reentrant=False")
    context_fn = ckpt.pop("context_fn", None)
    context = None
    if context_fn is not None:
        context = getattr(context_fn, "value", None)
        if context is not noop_context_fn:
            if context_fn.source is None or not callable(context):
                unsupported("torch.utils.checkpoint.checkpoint with a context_fn made in the frame")
            tx.guards.identity(context_fn.source, context)
        else:
            context = None
    consts = {}
    for k, v in ckpt.items():
        if not isinstance(v, ConstVar):
            unsupported(f"torch.utils.checkpoint.checkpoint's {k} is not a constant")
        consts[k] = v.value
    mode = tx.output.fake_mode
    drew, mode.used_rng = mode.used_rng, False
    try:
        body = tx.subgraphs.speculate(tx, fn, fn_args, "torch.utils.checkpoint.checkpoint function",
                         fn_kwargs, allow_aliasing=True)
        random = mode.used_rng
    finally:
        mode.used_rng = drew or mode.used_rng
    if not body.leaves:
        # Nothing to recompute; the region's ops are the frame's, inline.
        return fn.call(tx, fn_args, fn_kwargs)
    gm = body.module()
    examples = _fresh_like(tx, body.output_examples(),
                           [getattr(e, "requires_grad", False) for e in body.output_examples()])
    if random and consts.get("preserve_rng_state", True) and tx.output.functionalizes and \
            not _recomputes_random(tx, body):
        unsupported("torch.utils.checkpoint.checkpoint over random ops, on a backend that "
                    "may recompute them with other numbers")
    if random and consts.get("preserve_rng_state", True) and not tx.output.functionalizes:
        # The higher-order op's eager implementation recomputes without restoring the
        # random state (torch leaves that to Inductor's RNG functionalization): the
        # backward would see another dropout mask.  A backend that runs the graph's
        # ops as traced calls checkpoint itself, as CPython does (the state stashed
        # before the region, restored for the recompute).  A backend that re-traces
        # the graph gets the op where it says it recomputes random ops with the
        # forward's state (__frametrace_recomputes_random_ops__: AOTAutograd's
        # partitioners, functionalize_rng_ops), else the region runs in CPython.
        node = tx.output.install_subgraph("checkpoint_body", gm)
        kwargs = dict(consts, context_fn=context) if context is not None else consts
        outs = tx.subgraphs.call_hop(tx, checkpoint_keeping_rng, (node, *body.inputs()), examples, kwargs)
        return body.rebuild(outs)
    if context is not None:
        gm.meta["_checkpoint_context_fn"] = context
    node = tx.output.install_subgraph("checkpoint_body", gm)
    outs = tx.subgraphs.call_hop(tx, torch.ops.higher_order.tag_activation_checkpoint,
                    (node, *body.inputs()), examples, consts)
    return body.rebuild(outs)


def _recomputes_random(tx, body) -> bool:
    """Whether the backend recomputes this region's random ops with the forward's
    numbers: its `__frametrace_recomputes_random_ops__`, a bool or a function of the
    devices the region's tensors are on."""
    says = getattr(tx.output, "recomputes_random", False)
    if callable(says):
        examples = [*body.output_examples(), *(getattr(v, "example", None) for v in body.inputs())]
        return bool(says({e.device for e in examples if isinstance(e, torch.Tensor)}))
    return bool(says)


def checkpoint_keeping_rng(body, *args, **kwargs):
    """torch.utils.checkpoint.checkpoint(body, *args) as CPython ran it (non-reentrant,
    the random state preserved for the recompute): a graph node's target."""
    return torch.utils.checkpoint.checkpoint(body, *args, use_reentrant=False, **kwargs)


# ---------------------------------------------------------------- wrap
def _wrap(tx, args, kwargs):
    """torch._higher_order_ops.wrap.wrap(fn, *args, **kwargs): fn's ops as one `wrap`
    node over its subgraph (arguments' tensors, then what it read from outside)."""
    if not args:
        unsupported("wrap without a function")
    fn, fn_args = args[0], list(args[1:])
    body = tx.subgraphs.speculate(tx, fn, fn_args, "the function given to wrap", kwargs, allow_aliasing=True)
    return _emit_wrap(tx, body, body.inputs())


def _emit_wrap(tx, body, inputs):
    """The `wrap` node calling `body` on `inputs` (outer Vars, one per placeholder)."""
    # wrap calls fn as is: a tensor fn returns unchanged is the very object passed in
    # (the outer Var), and a view of one is a view of it: its example is the body's own
    # FakeTensor, which shares the outer tensor's storage (so the frame's trace sees
    # writes through it); other results are new tensors.
    outer_of = body.output._outer_of
    same = [outer_of.get(leaf.node) if leaf.node.op == "placeholder" else None
            for leaf in body.leaves]
    views = {id(v) for v in body.output.aliased_outputs(body.leaves)}
    # Inputs the body never reads are not passed (torch.compile passes none).
    placeholders = [p for p in body.graph.nodes if p.op == "placeholder"]
    inputs = [v for p, v in zip(placeholders, inputs) if p.users]
    for p in placeholders:
        if not p.users:
            body.graph.erase_node(p)
    node = tx.output.install_subgraph("wrap_body", body.module())
    examples = _fresh_like(tx, body.output_examples(),
                           [getattr(e, "requires_grad", False) for e in body.output_examples()])
    examples = [leaf.example if id(leaf) in views else ex for leaf, ex in zip(body.leaves, examples)]
    outs = tx.subgraphs.call_hop(tx, wrap_op, (node, *inputs), examples)
    return body.rebuild([s if s is not None else o for s, o in zip(same, outs)])


# ---------------------------------------------------------------- hints_wrapper
def _hints_wrapper(tx, args, kwargs):
    """hints_wrapper(body_fn, args, kwargs, hints=...): body_fn's subgraph as one
    hints_wrapper node, its hints (constants) kept for the backend."""
    body_fn, fn_args, fn_kwargs, hints = _bind(
        "hints_wrapper", ("body_fn", "args", "kwargs", "hints"), args, kwargs)
    items = _sequence(tx, fn_args, "hints_wrapper's args")
    if not all(isinstance(v, (TensorVar, ConstVar)) for v in items) or \
            any(isinstance(v, ConstVar) and type(v.value) not in (int, float, bool) for v in items):
        unsupported("hints_wrapper's args must be tensors, ints, floats or bools")
    no_kwargs = (type(fn_kwargs) is DictVar and not fn_kwargs.items) or \
        (isinstance(fn_kwargs, ConstVar) and fn_kwargs.value == {})
    if not no_kwargs:
        unsupported("hints_wrapper with keyword arguments for the body")
    try:
        hint_values = hints.as_const()
    except Exception:
        hint_values = None
    if not isinstance(hint_values, dict) or not all(
            type(k) is str and type(v) in (int, float, bool, str) for k, v in hint_values.items()):
        unsupported("hints_wrapper's hints must be a dict of constants")
    body = tx.subgraphs.speculate(tx, body_fn, items, "the function given to hints_wrapper")
    node = tx.output.install_subgraph("hints_wrapper_body", body.module())
    examples = _fresh_like(tx, body.output_examples(),
                           [getattr(e, "requires_grad", False) for e in body.output_examples()])
    outs = tx.subgraphs.call_hop(tx, hints_wrapper_op, (node, tuple(body.inputs()), {}), examples,
                    {"hints": hint_values})
    return body.rebuild(outs)


# ---------------------------------------------------------------- functional_call
def _functional_call(tx, args, kwargs):
    """torch.func.functional_call(module, tensors, args, kwargs): the module's call
    speculated as it is, then one wrap node over its subgraph where the placeholders
    the module's own parameters and buffers fill get the given tensors instead (which
    must look like them: the trace read only their metadata)."""
    module, tensors, call_args, call_kwargs, tie, strict = _bind(
        "torch.func.functional_call",
        ("module", "parameter_and_buffer_dicts", "args", "kwargs", "tie_weights", "strict"),
        args, kwargs, {"args": ConstVar(None), "kwargs": ConstVar(None),
                       "tie_weights": ConstVar(True), "strict": ConstVar(False)})
    if type(module) is not NNModuleVar:
        unsupported("torch.func.functional_call over a module made in the frame")
    if not (isinstance(tie, ConstVar) and tie.value is True and
            isinstance(strict, ConstVar) and strict.value is False):
        unsupported("torch.func.functional_call with tie_weights=False or strict=True")
    if type(tensors) is not DictVar or not all(type(k) is str for k in tensors.items):
        unsupported("torch.func.functional_call with other than one dict of tensors")
    fn_args = [] if isinstance(call_args, ConstVar) and call_args.value is None else \
        (list(call_args.items) if type(call_args) is TupleVar else [call_args])
    if isinstance(call_kwargs, ConstVar) and call_kwargs.value is None:
        fn_kwargs = {}
    elif type(call_kwargs) is DictVar and all(type(k) is str for k in call_kwargs.items):
        fn_kwargs = dict(call_kwargs.items)
    else:
        unsupported("torch.func.functional_call's kwargs are not a dict")
    for v in (*fn_args, *fn_kwargs.values()):
        _check_pytree(v, "torch.func.functional_call's arguments")
    m = module.module
    named = dict(m.named_parameters(remove_duplicate=False))
    named.update(m.named_buffers(remove_duplicate=False))
    given = {}                  # id(replaced tensor) -> the Var given for it
    for name, v in tensors.items.items():
        real = named.get(name)
        if real is None or not isinstance(v, TensorVar):
            unsupported(f"torch.func.functional_call: {name!r} is not a tensor for a "
                        f"parameter or buffer of the module")
        if given.setdefault(id(real), v) is not v:
            unsupported("torch.func.functional_call given two tensors for one tied parameter")
    # The module reads the given tensors where it reads its own, as CPython's call
    # does (each swapped into its module's _parameters/_buffers for the call; a tied
    # one under every name): traced with their own metadata, types and values.
    instead = {}
    for name, real in named.items():
        if id(real) in given:
            owner_path, _, leaf = name.rpartition(".")
            owner = m.get_submodule(owner_path) if owner_path else m
            instead[(id(owner), leaf)] = (owner, given[id(real)])
    replaced = {id(real): real for real in named.values() if id(real) in given}
    body = tx.subgraphs.speculate(tx, module, fn_args, "the module given to torch.func.functional_call",
                     fn_kwargs, allow_aliasing=True, reparametrized=(instead, replaced))
    for v in body.output.lifted:
        graph_input = tx.output.input_of(v)
        if graph_input is not None and id(graph_input.value) in replaced and \
                graph_input.value is replaced[id(graph_input.value)]:
            unsupported("torch.func.functional_call's module reads a tensor it replaces "
                        "other than as its module's attribute")
    return _emit_wrap(tx, body, body.inputs())



# ---------------------------------------------------------------- map
def _map(tx, args, kwargs):
    """torch._higher_order_ops.map.map(f, xs, *args): f speculated over one slice of
    the leading dimension of xs's tensors, then one map_impl node (torch's own op, which
    stacks the slices' results and has a backward)."""
    if kwargs or len(args) < 2:
        unsupported("map takes f, xs and positional arguments only")
    f, xs, extra = args[0], args[1], list(args[2:])
    for v in (xs, *extra):
        _check_pytree(v, "map's arguments")
    mapped = _tensors(xs)
    if not mapped or not all(isinstance(t, TensorVar) for t in mapped):
        unsupported("map's xs must be tensors")
    if any(t.example.dim() == 0 for t in mapped):
        unsupported("map over a 0-dimensional tensor")
    size = mapped[0].example.shape[0]
    # (Comparing symbolic sizes guards on the outcome.)
    if size == 0 or any(t.example.shape[0] != size for t in mapped[1:]):
        unsupported("map's xs have an empty or inconsistent leading dimension")
    with tx.output.fake_mode:
        slices = [t.example[0].clone(memory_format=torch.contiguous_format)
                  .requires_grad_(t.example.requires_grad) for t in mapped]
    examples = [slices] + [[None] * len(_tensors(e)) for e in extra]
    # The slices' layout at run time is map_impl's business (a view or a copy): the body
    # may not read strides (as in a vmapped function).
    body = tx.subgraphs.speculate(tx, _ArgsAs(f, examples, hides_layout=True), [xs, *extra],
                     "the function given to map")
    outs = body.output_examples()
    if not all(isinstance(o, torch.Tensor) for o in outs) or not outs or \
            any(s[0] == "const" for s in _spec_leaves(body.spec)):
        unsupported("the function given to map must return tensors")
    n = len(mapped)
    inputs = body.inputs()
    node = tx.output.install_subgraph("map_body", body.module())
    with tx.output.fake_mode:
        examples = [torch.empty((size, *o.shape), dtype=o.dtype, device=o.device)
                    .requires_grad_(o.requires_grad) for o in outs]
    results = tx.subgraphs.call_hop(tx, torch.ops.higher_order.map_impl,
                       (node, list(inputs[:n]), list(inputs[n:])), examples)
    return body.rebuild(results)


def _spec_leaves(spec):
    if spec[0] in ("leaf", "const"):
        yield spec
    else:
        for s in spec[1]:
            yield from _spec_leaves(s)


_HANDLERS = {
    hints_wrapper_op: _hints_wrapper,
    torch.func.functional_call: _functional_call,
    map_hop: _map,
    wrap_op: _wrap,
    torch.cond: _cond,
    torch.ops.higher_order.cond: _cond,
    torch.while_loop: _while_loop,
    torch.utils.checkpoint.checkpoint: _checkpoint,
}
_BY_ID = {id(op): (op, handler) for op, handler in _HANDLERS.items()}
