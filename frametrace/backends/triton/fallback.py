"""What runs as an aten call though a kernel could have run it, and why: the ops meant to
stay aten, the record of each fallback, and the tags that name the FX node behind each
piece of kernel code, so that a kernel that cannot be generated or launched costs only
the nodes it fuses (backend.py builds the graph again with those as aten calls)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import context
from .ir import Computed, IRNode, Pointwise
from .kernel_source import KernelCodegen

aten = torch.ops.aten

# Ops that stay aten calls by design (cuBLAS, cuDNN, attention kernels, the copy that
# writes an input's mutation back): calling them is not a fallback.
BY_DESIGN = frozenset(f"aten::{n}" for n in (
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "_int_mm", "_scaled_mm",
    "convolution", "_convolution", "cudnn_convolution", "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward", "_efficient_attention_forward", "copy_",
    # their gradients, in a backward graph
    "convolution_backward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_flash_attention_backward",
    "_efficient_attention_backward"))
# Scatter-adds (an embedding's or a gather's gradient) when they accumulate: aten's kernels
# add colliding rows with atomics
SCATTER_ADDS = frozenset(f"aten::{n}" for n in ("index_put", "scatter_add", "index_add"))


class Fallback(NamedTuple):
    """An FX node that runs as an aten call though a kernel could have run it, and why."""
    node: str
    op: str
    reason: str


def rng_wrapper(target) -> int | None:
    """For AOTAutograd's higher-order ops that run a random op in a given RNG state
    (graphsafe_run_with_rng_state(op, *args, rng_state=generator), run_with_rng_state(
    state, op, *args), run_and_save_rng_state(op, *args)): the position of the op among
    their arguments; else None."""
    if not isinstance(target, torch._ops.HigherOrderOperator):
        return None
    return {"graphsafe_run_with_rng_state": 0, "run_and_save_rng_state": 0,
            "run_with_rng_state": 1}.get(target.name())


def wrapped_op(target, args):
    """(the op a call of `target` runs, the position of that op's first operand in
    `args`): `target` and 0, or the random op an RNG wrapper runs and the place after it."""
    at = rng_wrapper(target)
    if at is None or len(args) <= at:
        return target, 0
    return args[at], at + 1


def by_design(node, reason, src_device, out_device) -> bool:
    """Whether `node` is an aten call by design: an op meant to be one, which has no
    lowering (`reason` None), a random op run in a given RNG state (the state is set
    around an aten call: no kernel draws from a torch.Generator), or a copy between
    devices."""
    if reason is None and rng_wrapper(node.target) is not None:
        return True
    if reason is None or node.target is aten.copy_.default:  # (a write-back no kernel stores)
        name = getattr(getattr(node.target, "_schema", None), "name", None)
        return name in BY_DESIGN or name in SCATTER_ADDS and _accumulates(node)
    return node.target in (aten._to_copy.default, aten.copy.default) and src_device != out_device


def _accumulates(node) -> bool:
    if node.target is aten.index_put.default:
        return bool(node.kwargs.get("accumulate", len(node.args) > 3 and node.args[3]))
    return True


class Traced:
    """A lowered value's code generator, tagged with the FX node it came from."""
    __slots__ = ("fn", "node")

    def __init__(self, fn, node):
        self.fn, self.node = fn, node

    def __call__(self, k, *idx):
        record = context.current().record
        if record is not None:
            record.add(self.node)
        try:
            return self.fn(k, *idx)
        except Exception as e:
            if getattr(e, "frametrace_node", None) is None:
                e.frametrace_node = self.node  # the innermost node: its code raised
            raise


def trace(value, node, new_items):
    """Tag the code generators of what `node` lowered to, and of the nodes its lowering
    realized (`new_items`), with `node`."""
    for v in ir_values(value):
        if isinstance(v, Pointwise) and not isinstance(v.fn, Traced):
            v.fn = Traced(v.fn, node)
    for item in new_items:
        fn = getattr(item.node, "fn", None) if isinstance(item, Computed) else None
        if callable(fn) and not isinstance(fn, Traced):
            item.node.fn = Traced(fn, node)


def ir_values(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from ir_values(v)
    elif isinstance(value, IRNode):
        yield value


def kernel_nodes(group, stores, failed: BaseException | None = None) -> set:
    """The FX nodes a kernel computes: those of its realized members, and those whose code
    its generation inlines (recorded by generating it again, in its compile's context).
    `failed`: the error its generation raised, for a kernel that could not be generated."""
    nodes = {c.node.fn.node for c in group.members if isinstance(getattr(c.node, "fn", None), Traced)}
    ctx = group.ctx
    ctx.record = set()
    try:
        KernelCodegen(group, stores).generate()
    except type(failed) if failed is not None else ():
        # generating it again fails as it did (the IR and the choices are the same): the
        # nodes whose code ran up to the failure are recorded, and the caller handles
        # the failure itself.  Any other error, or any error of a kernel that generated
        # before (one blamed for its launch), is a bug here and raises.
        pass
    finally:
        nodes |= ctx.record
        ctx.record = None
    return nodes
