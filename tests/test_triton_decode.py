"""backend="triton" on decode-shaped graphs (batch 1, one token): a single row still fuses
into one kernel, attention operands meet the attention kernels' 16-byte stride contract,
and CUDA-graph replay decides by what it saves, not by a launch count."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, cudagraphs, last_compiled, wrapper  # noqa: E402
from triton_harness import triton_check  # noqa: E402


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def run(fn, *inputs, calls=2):
    """fn compiled with the triton backend matches eager on fresh inputs over `calls` calls."""
    return triton_check(fn, calls=[[t.clone() + i if t.is_floating_point() else t.clone() for t in inputs]
                                   for i in range(calls)], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 96), (1, 96), (96,)])
def test_one_row_residual_norm_and_softmax_are_one_kernel(shape):
    w, b = torch.randn(96), torch.randn(96)

    def block(x, y):
        h = x + y
        return h, F.layer_norm(h, (96,), w, b), torch.softmax(h, -1).sum(-1)
    mod = run(block, torch.randn(*shape), torch.randn(*shape))
    assert len(mod.kernels) == 1, mod.source


def test_one_row_looped_reduction_is_one_kernel(monkeypatch):
    from frametrace.backends.triton import config
    monkeypatch.setattr(config, "persistent_rblock_max", 32)
    mod = run(lambda x, y: torch.softmax(x * y, -1), torch.randn(1, 200), torch.randn(1, 200))
    assert len(mod.kernels) == 1, mod.source


@pytest.mark.parametrize("keys", [129, 7, 128])
def test_attention_mask_stored_by_a_kernel_meets_the_16_byte_contract(keys):
    # a decode step: one query over `keys` keys, the additive mask computed in the graph.
    # (On the CPU F.scaled_dot_product_attention with a mask decomposes into matmuls; the
    # CPU flash kernel, called directly, stands for the CUDA ones, which stay aten calls.)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def step(q, k, v, valid):
        mask = torch.where(torch.arange(keys) < valid, 0.0, float("-inf")).view(1, 1, 1, keys)
        return flash(q, k, v, attn_mask=mask * 1.0)[0]
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 4, keys, 16), torch.randn(1, 4, keys, 16)
    mod = run(step, q, k, v, torch.tensor(keys - 2))
    attention = [e for e in mod.externs if "attention" in e]
    assert attention, mod.externs
    assert ("align_attention(" in mod.source) == (keys % 8 != 0), mod.source


def test_attention_operands_are_realigned_by_a_view_or_a_padded_copy():
    t = torch.randn(2, 3, 129)
    a = wrapper._align_attention(t)
    assert torch.equal(a, t) and a.stride() == (3 * 136, 136, 1)
    mask = torch.randn(1, 1, 1, 129)          # only size-1 dims are off: a view, no copy
    v = wrapper._align_attention(mask)
    assert torch.equal(v, mask) and v.data_ptr() == mask.data_ptr() and v.stride() == (8, 8, 8, 1)
    dense = torch.randn(2, 3, 128)
    assert wrapper._align_attention(dense) is dense
    assert wrapper.aligned_strides((1, 1, 1, 129), (0, 0, 0, 1))
    assert not wrapper.aligned_strides((1, 2, 1, 129), (258, 129, 129, 1))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_gpu_many_small_launches_replay_as_a_cuda_graph(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    # The decision is timed; under a loaded machine (the suite's workers sharing one
    # GPU) a replay need not win.  What is tested here is the replay itself: a graph
    # that is kept is captured, replayed and gives each call outputs of its own.
    from frametrace.backends.triton import cudagraphs
    monkeypatch.setattr(cudagraphs, "HOST_BOUND", 0.0)
    monkeypatch.setattr(cudagraphs, "KEEP_BELOW", float("inf"))
    monkeypatch.setattr(cudagraphs, "HOST_SATURATED", float("inf"))
    w = torch.randn(64, 64, device="cuda")

    def decode(x):   # matmuls between norms: many small launches
        for _ in range(6):
            x = F.layer_norm(torch.tanh(x @ w), (64,))
        return x, x.sum()
    compiled = frametrace.optimize(backend="triton")(decode)
    outs = []
    for i in range(6):
        x = torch.randn(1, 64, device="cuda")
        got, want = compiled(x), decode(x)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        outs.append(got[0])
    runner = last_compiled().runner
    assert runner is not None and runner.graph is not None, runner and runner.decision
    assert "vs replay" in runner.decision
    assert runner.launch_us is not None and runner.launch_us > 0
    assert len({o.data_ptr() for o in outs[-3:]}) == 3   # each call's outputs are its own


@cuda
def test_gpu_bound_graph_keeps_launching(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")

    def big(x, y):
        return torch.softmax(x, -1), (x * y).sum(0)
    compiled = frametrace.optimize(backend="triton")(big)
    x, y = torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda")
    for _ in range(4):
        torch.testing.assert_close(compiled(x, y), big(x, y), atol=1e-3, rtol=1e-3)
    runner = last_compiled().runner
    assert runner is not None and runner.graph is None, runner.decision
    assert "GPU-bound" in runner.decision or "vs replay" in runner.decision
    torch.testing.assert_close(compiled(x, y), big(x, y), atol=1e-3, rtol=1e-3)


@cuda
@pytest.mark.parametrize("warm_calls", [1, 6])
def test_gpu_call_inside_the_callers_cuda_graph_capture_launches_into_it(monkeypatch, warm_calls):
    # a serving loop captures a compiled step in its own CUDA graph: the call launches
    # our kernels into that capture (neither replaying our graph inside it, which CUDA
    # refuses, nor timing with a synchronize), whether or not our replay was set up yet
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(cudagraphs, "HOST_BOUND", 0.0)   # replaying is kept, whatever it saves
    monkeypatch.setattr(cudagraphs, "KEEP_BELOW", 1e9)
    monkeypatch.setattr(cudagraphs, "HOST_SATURATED", 1e9)
    w = torch.randn(64, 64, device="cuda")

    def decode(x):
        for _ in range(6):
            x = F.layer_norm(torch.tanh(x @ w), (64,))
        return x.sum(0)
    compiled = frametrace.optimize(backend="triton")(decode)
    x = torch.randn(8, 64, device="cuda")
    for _ in range(warm_calls):
        compiled(x)
    mod = last_compiled()
    runner = mod.runner
    assert runner is not None
    assert (runner.graph is not None) == (warm_calls > 4), runner.decision
    direct = []
    inner_call = runner.call
    monkeypatch.setattr(runner, "call", lambda args: (direct.append(1), inner_call(args))[1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        compiled(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(x)
    # the warm-up call on the side stream launched directly too unless our graph replays;
    # a rerun of the frame in CPython would call neither
    assert len(direct) == (1 if warm_calls > 4 else 2)
    for i in range(3):
        x.copy_(torch.randn(8, 64, device="cuda"))
        graph.replay()
        torch.testing.assert_close(out, decode(x), atol=1e-4, rtol=1e-4)


def test_value_read_through_a_view_by_a_later_kernel_is_stored():
    # ConvNeXt's head at batch 1 (timm, bf16): residual, global average pool, LayerNorm over
    # channels through a permute; the pooled value reaches the norm's kernel as a view of
    # its buffer, which was left unwritten (NameError in the wrapper)
    C = 32
    bf = dict(dtype=torch.bfloat16)
    g, lw, lb, fw = (torch.randn(C, **bf), torch.randn(C, **bf), torch.randn(C, **bf),
                     torch.randn(10, C, **bf))

    def head(y, shortcut):
        x = y.permute(0, 3, 1, 2).mul(g.reshape(1, -1, 1, 1)) + shortcut
        x = F.adaptive_avg_pool2d(x, 1)
        x = F.layer_norm(x.permute(0, 2, 3, 1), (C,), lw, lb, 1e-6).permute(0, 3, 1, 2)
        return F.linear(x.flatten(1), fw)
    compiled = frametrace.optimize(backend="triton", fullgraph=True)(head)
    for _ in range(2):
        y, shortcut = torch.randn(1, 3, 3, C, **bf), torch.randn(1, C, 3, 3, **bf)
        torch.testing.assert_close(compiled(y, shortcut).float(), head(y, shortcut).float(),
                                   atol=1e-1, rtol=5e-2)
    assert len(last_compiled().kernels) == 2, last_compiled().source


def _sdpa_masks(mod):
    """The attn_mask of each attention extern of a compiled module."""
    from frametrace.backends.triton.ir import Extern
    return [e.kwargs.get("attn_mask", e.args[3] if len(e.args) > 3 else None)
            for e in mod.wrapper.schedule if isinstance(e, Extern) and "attention" in str(e.op)]


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_constant_mask_that_masks_nothing_is_dropped(kind):
    # as Hugging Face builds it under compilation: a padding mask of ones, expanded
    def attend(q, k, v):
        pad = torch.ones(q.shape[0], k.shape[2], dtype=torch.bool)
        mask = pad[:, None, None, :].expand(-1, 1, q.shape[2], -1)
        if kind == "additive":
            mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    mod = run(attend, torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16))
    assert _sdpa_masks(mod) == [None], mod.source


def test_masks_that_mask_something_or_come_from_inputs_are_kept():
    def causal(q, k, v):
        mask = torch.ones(8, 8, dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def given(q, k, v, pad):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :])
    q = torch.randn(2, 4, 8, 16)
    mod = run(causal, q, q.clone(), q.clone())
    assert len(_sdpa_masks(mod)) == 1 and _sdpa_masks(mod)[0] is not None
    backend.COMPILED.clear()
    mod = run(given, q, q.clone(), q.clone(), torch.ones(2, 8, dtype=torch.bool))
    assert len(_sdpa_masks(mod)) == 1 and _sdpa_masks(mod)[0] is not None


def test_random_masks_are_not_constants():
    def noisy(q, k, v):
        mask = torch.rand(8, 8) < 2.0      # all True, but not a constant
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q = torch.randn(2, 4, 8, 16)
    mod = run(noisy, q, q.clone(), q.clone())
    assert all(m is not None for m in _sdpa_masks(mod)) and _sdpa_masks(mod)
