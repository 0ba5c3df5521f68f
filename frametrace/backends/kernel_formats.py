"""Ops whose aten kernel gives its result the input's memory format where torch's
decompositions and meta functions do not: behind AOTAutograd the result must be asked
for in that format explicitly.

- Upsampling (nearest, nearest-exact, linear, bilinear, bicubic, trilinear), on every
  device: aten's kernels are structured, their output allocated in the input's suggested
  format.  torch's Python decompositions -- which AOTAutograd runs at the Autograd key
  (the Python dispatcher is on while it traces, so a backend's decomposition table is
  never asked) -- and the meta functions store a CUDA image of few channels contiguous,
  a speed heuristic of Inductor's.  Seen by the OpInfo sweep on the H200: interpolate
  nearest / nearest-exact / bilinear of a 3-channel channels-last image came back
  contiguous from the triton backend, channels-last from eager.
- channel_shuffle and max_unpool2d/3d on the CPU: the CPU kernels keep the input's
  format, the decompositions (and CUDA's kernels) give a contiguous result.
- pixel_shuffle the other way round, off the CPU: aten's kernel there is
  math_pixel_shuffle, whose result is contiguous, where torch's reference decomposition
  keeps a channels-last input's format (its meta function says contiguous).  Seen by
  the OpInfo sweep on the H200.

`keep_kernel_formats` inserts `contiguous(memory_format=...)` (the kernel's format)
after each such op on a tensor whose suggested format is not the contiguous one, before AOTAutograd traces the
graph: where the decomposition already gives the format, the request is no op; where it
does not, the copy fuses into the kernel that computes the result (triton) or is one
more copy (aot_eager), the price of eager's layout.  `config.keep_kernel_formats` turns
it off.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

aten = torch.ops.aten


def _objects(owner, names):
    return {getattr(owner, n) for n in names if getattr(owner, n, None) is not None}


def _packets(names):
    return frozenset(p for p in (getattr(aten, n, None) for n in names) if p is not None)


_UPSAMPLE_NAMES = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
                   "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
                   "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
                   "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
_UPSAMPLE_FUNCTIONS = frozenset(
    _objects(F, ("interpolate", "upsample", "upsample_bilinear", "upsample_nearest"))
    | _objects(torch._C._nn, _UPSAMPLE_NAMES))
_UPSAMPLE_PACKETS = _packets(_UPSAMPLE_NAMES)
# interpolate's modes that are aten upsamplings ("area" is adaptive average pooling)
_MODES = frozenset({"nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear"})

_CPU_NAMES = ("channel_shuffle", "native_channel_shuffle", "max_unpool2d", "max_unpool3d")
_CPU_FUNCTIONS = frozenset(_objects(torch, _CPU_NAMES) | _objects(F, _CPU_NAMES)
                           | _objects(torch._C._nn, _CPU_NAMES))
_CPU_PACKETS = _packets(_CPU_NAMES)

_CONTIGUOUS_OFF_CPU_NAMES = ("pixel_shuffle",)
_CONTIGUOUS_OFF_CPU_FUNCTIONS = frozenset(_objects(torch, _CONTIGUOUS_OFF_CPU_NAMES)
                                          | _objects(F, _CONTIGUOUS_OFF_CPU_NAMES))
_CONTIGUOUS_OFF_CPU_PACKETS = _packets(_CONTIGUOUS_OFF_CPU_NAMES)


def _kernel_format(node, x):
    """The memory format aten's kernel gives `node`'s result on `x`'s device where the
    decompositions may give another, or None (they agree)."""
    if node.op != "call_function":
        return None
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if target is F.interpolate:
        mode = node.kwargs.get("mode", node.args[3] if len(node.args) > 3 else "nearest")
        return torch._prims_common.suggest_memory_format(x) if mode in _MODES else None
    if target in _UPSAMPLE_FUNCTIONS or packet in _UPSAMPLE_PACKETS:
        return torch._prims_common.suggest_memory_format(x)
    if x.device.type == "cpu":
        if target in _CPU_FUNCTIONS or packet in _CPU_PACKETS:
            return torch._prims_common.suggest_memory_format(x)
    elif target in _CONTIGUOUS_OFF_CPU_FUNCTIONS or packet in _CONTIGUOUS_OFF_CPU_PACKETS:
        return torch.contiguous_format
    return None


def keep_kernel_formats(gm: torch.fx.GraphModule) -> int:
    """Insert `contiguous(memory_format=...)` after each op of `gm` (a graph with fake
    values in `meta["val"]`) whose kernel gives a channels-last input's result another
    format than the decompositions may; returns how many it inserted."""
    added = 0
    for node in list(gm.graph.nodes):
        if not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        x, out = node.args[0].meta.get("val"), node.meta.get("val")
        if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or x.dim() not in (4, 5):
            continue
        try:
            fmt = _kernel_format(node, x)
            if fmt is None or torch._prims_common.suggest_memory_format(x) is torch.contiguous_format:
                continue   # (a contiguous input: every kernel and decomposition agree)
            kept = out.contiguous(memory_format=fmt)
        except Exception:   # symbolic strides it cannot decide: left as traced
            continue
        with gm.graph.inserting_after(node):
            new = gm.graph.call_method("contiguous", (node,), {"memory_format": fmt})
        node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
        new.meta.update(node.meta)
        new.meta["val"] = kept
        added += 1
    if added:
        gm.recompile()
    return added
