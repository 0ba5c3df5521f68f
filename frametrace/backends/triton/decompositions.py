"""Decompositions applied by AOTAutograd before lowering: torch's core-aten set, plus the
composite ops whose parts fuse well (softmax, gelu, silu, embedding), plus our own
LayerNorm, which stays in aten ops the lowering handles (torch's goes through prims)."""
from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions, decomposition_table, get_decompositions

from . import config, foreach, rng

aten = torch.ops.aten


def _layer_norm(x, normalized_shape, weight, bias, eps):
    """LayerNorm by a var_mean (the lowering's: a row too long for registers is read once
    for both statistics, config.welford) and one pointwise pass."""
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    xf = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    var, mean = torch.var_mean(xf, dims, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.to(x.dtype), mean, rstd


def _group_norm(x, weight, bias, n, c, hw, groups, eps):
    """GroupNorm as a var_mean over each (sample, group)'s channels and positions and one
    pointwise pass (with what follows it: SiLU), as torch's reference computes it on CUDA
    (its CPU branch folds weight and bias through an as_strided).  aten's kernel is a pass of
    its own, its output read again by the next kernel."""
    if not config.decompose_group_norm:
        return NotImplemented   # (read at each trace: the table is built once)
    xf = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    grouped = xf.reshape(n, groups, c // groups, hw)
    var, mean = torch.var_mean(grouped, dim=[2, 3], correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = ((grouped - mean) * rstd).view(x.shape)
    shape = [1, c] + [1] * (x.dim() - 2)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    return out.to(x.dtype), mean.view(n, groups).to(x.dtype), rstd.view(n, groups).to(x.dtype)


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """linalg.vector_norm of real floats by torch's reference (a sum of |x|**ord, or a max,
    in the kernel that reads x, F.normalize's division fusing after it) instead of one aten
    call whose result another kernel reads; complex inputs stay aten's."""
    if not config.decompose_vector_norm or x.dtype.is_complex or (dtype is not None and dtype.is_complex):
        return NotImplemented
    return _TORCH_VECTOR_NORM(x, ord, dim, keepdim, dtype=dtype)


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """torch's decomposition, except that a negative id stays out of range: torch's gives
    indices of 2 or more dims to `weight[indices]`, which wraps -1 to the last row where
    embedding raises.  A negative id becomes the table's length, which x[idx] rejects as
    embedding does (its gradient stays the index_put that `weight[indices]` gets)."""
    if indices.ndim <= 1:
        return _TORCH_EMBEDDING(weight, indices, padding_idx, scale_grad_by_freq, sparse)
    if weight.dim() != 2:
        raise AssertionError(f"'weight' must be 2-D, got {weight.dim()}-D")
    return weight[torch.where(indices < 0, weight.shape[0], indices)]


def _batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    """Inference BatchNorm as per-channel pointwise ops: it fuses into the kernel that reads
    the convolution's output (aten's runs as its own pass over memory)."""
    cd = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    shape = [1, -1] + [1] * (x.dim() - 2)
    invstd = torch.rsqrt(running_var.to(cd) + eps)
    out = (x.to(cd) - running_mean.to(cd).view(shape)) * invstd.view(shape)
    if weight is not None:
        out = out * weight.to(cd).view(shape)
    if bias is not None:
        out = out + bias.to(cd).view(shape)
    # the saved statistics are what aten returns on the device: empty on the CPU
    if x.device.type == "cpu":
        stats = (x.new_zeros((0,)), x.new_zeros((0,)))
    else:
        # a copy: eager's statistics are tensors of their own, never the running mean
        stats = (running_mean.to(cd, copy=True), invstd)
    return (out.to(x.dtype),) + stats


def _in_input_layout(decomposed):
    """torch's decomposition of an upsampling (nearest, linear), with its result in the
    input's memory format, as aten's kernels give it on every device (their structured
    meta asks for the input's suggested format).  torch's decomposition (and its meta
    function, which the fake tensors follow) stores a CUDA input of few channels (under 4
    for nearest, 16 for linear) contiguous, a speed heuristic of Inductor's: a
    channels-last image upsampled on the GPU came back contiguous where eager's is
    channels-last."""
    def upsample(x, *args, **kwargs):
        out = decomposed(x, *args, **kwargs)
        fmt = torch._prims_common.suggest_memory_format(x)
        if fmt is not torch.contiguous_format and not out.is_contiguous(memory_format=fmt):
            out = out.clone(memory_format=fmt)
        return out
    return upsample


def _kernel_checks_dtypes(decomposed):
    """A softmax gradient's decomposition where it computes what eager computes: CUDA's
    kernels check a grad dtype other than the input's ("expected input and grad types to
    match...", and more the H200's sweep found for (float, half)) where the decomposition
    would compute; those stay one aten call (NotImplemented), which raises as eager's
    does."""
    def softmax_backward(grad, output, dim, input_dtype):
        if grad.device.type != "cpu" and grad.dtype != input_dtype:
            return NotImplemented  # (the kernel decides, as in eager)
        return decomposed(grad, output, dim, input_dtype)
    return softmax_backward


_UPSAMPLINGS = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
                "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
                "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d")


@functools.lru_cache(None)
def decompositions():
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([
        aten._softmax, aten._log_softmax, aten.gelu, aten.silu, aten.embedding,
        aten.full_like, aten.zeros_like, aten.ones_like, aten.hardswish, aten.hardsigmoid,
        aten.leaky_relu, aten.hardtanh, aten.elu, aten.mish, aten.softplus, aten.logsumexp,
        # training BatchNorm: per-channel var_mean (a split reduction) and one pointwise pass
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit]))
    # lowered directly: their decompositions go through as_strided or prims
    for op in (aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int,
               aten.var_mean.correction, aten.var.correction, aten.mean.dim):
        table.pop(op, None)
    # index_add stays aten's kernel (atomic adds, or the sort-based index_put under
    # deterministic algorithms, as eager chooses): torch's decomposition makes it an
    # accumulating index_put, whose CUDA kernel always sorts the indices (a Mixtral expert
    # loop's combine, 16 a call on the H200: 200 us of host work each against 42 us)
    for op in (aten.index_add.default, aten.index_add.out):
        table.pop(op, None)
    # attention stays one aten call, on the CPU (the interpreter's tests) as on CUDA, where
    # the cuDNN/flash/efficient kernels have no decomposition
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    table[aten.native_layer_norm.default] = _layer_norm
    table[aten.native_group_norm.default] = _group_norm
    global _TORCH_VECTOR_NORM
    _TORCH_VECTOR_NORM = decomposition_table[aten.linalg_vector_norm.default]
    table[aten.linalg_vector_norm.default] = _vector_norm
    global _TORCH_EMBEDDING
    _TORCH_EMBEDDING = table[aten.embedding.default]
    table[aten.embedding.default] = _embedding
    table.update(foreach.decompositions())  # per tensor: each tensor's chain fuses
    table[aten._native_batch_norm_legit_no_training.default] = _batch_norm_inference
    for op in (aten._softmax_backward_data.default, aten._log_softmax_backward_data.default):
        if op in table:
            table[op] = _kernel_checks_dtypes(table[op])
    for name in _UPSAMPLINGS:
        packet = getattr(aten, name)
        for overload in ("default", "vec"):
            op = getattr(packet, overload, None)
            if op is not None and op in decomposition_table:
                table[op] = _in_input_layout(decomposition_table[op])
    # random ops: seeded Philox numbers that kernels generate (rng.py)
    table.update(rng.decompositions())
    return table
