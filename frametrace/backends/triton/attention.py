"""Attention masks that mask nothing.  Under compilation Hugging Face models cannot look
at a padding mask's values (`mask.all()` would be data-dependent), so they build an
explicit all-True mask from `ones`/`arange` and pass it to scaled_dot_product_attention;
a boolean mask sends SDPA to its math path (fp32 matmuls and a softmax in memory) where
eager, which skipped the mask, runs a fused flash/cuDNN kernel.  A mask computed from no
graph input is a constant: it is evaluated once at compile time and, when it masks
nothing (all True, or an additive mask of zeros), dropped from the call.
"""
from __future__ import annotations

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

# ops whose results vary from call to call or are uninitialised: never constants
_UNSTABLE = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "empty",
             "exponential", "cauchy", "geometric", "poisson", "seed")


def _is_sdpa(node) -> bool:
    return node.op == "call_function" and \
        getattr(node.target, "__name__", "") == "scaled_dot_product_attention"


def _constant(node, seen) -> bool:
    """`node` depends on no graph input and on nothing random or mutated."""
    if node in seen:
        return seen[node]
    ok = False
    if node.op in ("call_function", "call_method") and "out" not in node.kwargs:
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        inplace = node.op == "call_method" and name.endswith("_") and not name.startswith("__")
        ok = not inplace and not any(u in name for u in _UNSTABLE) and \
            all(_constant(a, seen) for a in node.all_input_nodes)
    seen[node] = ok
    return ok


def _evaluate(gm, node):
    """The value of a constant node, computed with real tensors."""
    sub, env, needed = torch.fx.Graph(), {}, _ancestors(node)
    for n in gm.graph.nodes:   # program order: inputs before their users
        if n is node or n in needed:
            env[n] = sub.node_copy(n, lambda a: env[a])
        if n is node:
            break
    sub.output(env[node])
    with unset_fake_temporarily(), torch.no_grad():
        return torch.fx.GraphModule(gm, sub)()


def _ancestors(node) -> set:
    out, todo = set(), list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo.extend(n.all_input_nodes)
    return out


def _masks_nothing(mask) -> bool:
    if not isinstance(mask, torch.Tensor):
        return False
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return mask.is_floating_point() and not bool(mask.any())


def drop_trivial_masks(gm: torch.fx.GraphModule) -> int:
    """Drop SDPA masks that are constants masking nothing; returns how many."""
    dropped, seen = 0, {}
    for node in list(gm.graph.nodes):
        if not _is_sdpa(node):
            continue
        in_kwargs = "attn_mask" in node.kwargs
        mask = node.kwargs["attn_mask"] if in_kwargs else (node.args[3] if len(node.args) > 3 else None)
        if not isinstance(mask, torch.fx.Node) or not _constant(mask, seen):
            continue
        try:
            trivial = _masks_nothing(_evaluate(gm, mask))
        except Exception:  # whatever cannot be evaluated here stays as it is
            continue
        if trivial:
            if in_kwargs:
                node.kwargs = {**node.kwargs, "attn_mask": None}
            else:
                node.args = node.args[:3] + (None,) + node.args[4:]
            dropped += 1
    if dropped:
        # (the mask's nodes stay: AOTAutograd drops what is unused once the graph is
        # functional; FX's own dead-code pass could drop an in-place method call)
        gm.recompile()
    return dropped
