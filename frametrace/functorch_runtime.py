"""What a graph calls to apply torch.func transforms and user autograd.Functions to
traced subgraphs (the tracing side is variables/functorch.py).

The graph keeps these functions by reference; each takes the subgraph (a GraphModule, as
a get_attr node) and plain constants describing the call, so backends trace through them
like any Python function: AOTAutograd runs the real transform (or the autograd.Function
below) over its FakeTensors and records the ops it dispatches.  Only public torch.func and
torch.autograd APIs are used, so the graphs mean the same on every torch version we
support.

A body spec describes what the traced callable returned over the subgraph's outputs:
``("leaf",)`` (the next output), ``("const", value)``, ``("tuple", specs)``,
``("list", specs)``, ``("dict", specs, keys)``."""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree


def unflatten_body(spec, leaves):
    kind = spec[0]
    if kind == "leaf":
        return next(leaves)
    if kind == "const":
        return spec[1]
    items = [unflatten_body(s, leaves) for s in spec[1]]
    if kind == "dict":
        return dict(zip(spec[2], items))
    return tuple(items) if kind == "tuple" else items


def _tensors_in(values, out):
    """The tensors of call arguments, in the order the tracer made placeholders for them
    (through tuples, lists and dict values)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            _tensors_in(v, out)
        elif isinstance(v, dict):
            _tensors_in(v.values(), out)
    return out


def _as_function(body, spec, lifted):
    """The user's callable again: the subgraph over its arguments' tensors, with the
    tensors it read from outside (closed over, not transformed) appended."""
    def fn(*args, **kwargs):
        tensors = _tensors_in((*args, *kwargs.values()), [])
        return unflatten_body(spec, iter(body(*tensors, *lifted)))
    return fn


_TRANSFORMS = {
    "vmap": lambda: torch.func.vmap,
    "grad": lambda: torch.func.grad,
    "grad_and_value": lambda: torch.func.grad_and_value,
    "jacrev": lambda: torch.func.jacrev,
    "jacfwd": lambda: torch.func.jacfwd,
}


def remake_transform(kind, fn, options):
    """``torch.func.<kind>(fn, **options)``, for a transformed function that outlives its
    graph (held at a graph break)."""
    return _TRANSFORMS[kind]()(fn, **dict(options))


def transformed(body, kind, options, spec, args, kwargs, lifted):
    """``kind(fn, **options)(*args, **kwargs)`` for the traced fn: its whole result."""
    return _TRANSFORMS[kind]()(_as_function(body, spec, lifted), **dict(options))(*args, **kwargs)


def apply_transform(body, kind, options, spec, args, kwargs, lifted):
    """The graph's call: `transformed`'s result as a flat tuple of its leaves."""
    return tuple(pytree.tree_leaves(transformed(body, kind, options, spec, args, kwargs, lifted)))


def vjp_result(body, options, spec, primals, cotangents, lifted):
    """The gradients the vjp function of ``vjp(fn, *primals)`` gives for `cotangents`."""
    _, pullback, *_ = torch.func.vjp(_as_function(body, spec, lifted), *primals, **dict(options))
    return pullback(cotangents)


def apply_vjp(body, options, spec, primals, cotangents, lifted):
    return tuple(pytree.tree_leaves(vjp_result(body, options, spec, primals, cotangents, lifted)))


def jvp_result(body, options, spec, primals, tangents, lifted):
    """``torch.func.jvp(fn, primals, tangents, **options)`` for the traced fn."""
    return torch.func.jvp(_as_function(body, spec, lifted), tuple(primals), tangents,
                          **dict(options))


def apply_jvp(body, options, spec, primals, tangents, lifted):
    return tuple(pytree.tree_leaves(jvp_result(body, options, spec, primals, tangents, lifted)))


def call_body(body, spec, args, lifted):
    """The traced fn itself, flat (vjp's primal output)."""
    return tuple(pytree.tree_leaves(_as_function(body, spec, lifted)(*args)))


# ---------------------------------------------------------------- autograd.Function
class _Applied(torch.autograd.Function):
    """A user's autograd.Function as traced: `fwd` returns the outputs and then the values
    forward kept for backward (saved tensors and ctx attributes); `bwd` takes the output
    gradients, those values and the tensors backward read from outside, and returns the
    gradients of the inputs that get one."""

    @staticmethod
    def forward(ctx, plan, fwd, bwd, n_inputs, *tensors):
        inputs, rest = tensors[:n_inputs], tensors[n_inputs:]
        n_fwd_lifted = plan["fwd_lifted"]
        results = fwd(*inputs, *rest[:n_fwd_lifted])
        outs, kept = results[:plan["outputs"]], results[plan["outputs"]:]
        ctx.plan, ctx.bwd, ctx.n_tensors = plan, bwd, len(tensors)
        ctx.bwd_lifted = rest[n_fwd_lifted:]
        ctx.kept = [None if isinstance(k, torch.Tensor) else k for k in kept]
        ctx.save_for_backward(*(k for k in kept if isinstance(k, torch.Tensor)))
        non_diff = [outs[i] for i in plan["non_differentiable"]]
        if non_diff:
            ctx.mark_non_differentiable(*non_diff)
        return outs if plan["tuple_out"] else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        if ctx.plan["once_differentiable"]:
            return _once_differentiable_backward(ctx, *grads)
        return _backward(ctx, *grads)


def _backward(ctx, *grads):
    saved = iter(ctx.saved_tensors)
    kept = [next(saved) if k is None else k for k in ctx.kept]
    got = iter(ctx.bwd(*grads, *kept, *ctx.bwd_lifted))
    wanted = [next(got) if has else None for has in ctx.plan["grads"]]
    return (None, None, None, None, *wanted, *[None] * (ctx.n_tensors - len(wanted)))


# The user's decorator, around the traced backward: no history, and an error on a
# second differentiation, as in eager.
_once_differentiable_backward = torch.autograd.function.once_differentiable(_backward)


def apply_function(plan, fwd, bwd, n_inputs, *tensors):
    """The graph's call of a traced autograd.Function: its outputs as a flat tuple.
    Tensors forward or backward read from outside (after the `n_inputs` arguments) are
    constants to autograd, as in eager, where forward runs without recording."""
    lifted = (t.detach() for t in tensors[n_inputs:])
    out = _Applied.apply(plan, fwd, bwd, n_inputs, *tensors[:n_inputs], *lifted)
    return tuple(out) if plan["tuple_out"] else (out,)
