"""DDP and FSDP2 models compiled, on 2 processes over gloo (CPU, loopback).

Each test spawns two processes that build the same model twice, run it as the
uncompiled wrapper and compiled, over several steps of fresh inputs, and compare
gradients (and parameters, buffers, optimizer states) after every step on each rank;
rank 0 sends back what was compiled (graphs, breaks) and the order in which the
gradient all-reduces and the backward's autograd nodes ran, which says whether the
all-reduces overlapped the backward.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import os
import pickle
import sys
import tempfile
import time

import pytest
import torch
import torch.nn as nn

import frametrace

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

TIMEOUT = 180               # seconds per test: spawning, compiling, the steps (a loaded machine)
STEPS = 3


# ---------------------------------------------------------------- launching
def _entry(rank, store, out, scenario, opts, environ):
    # (the test's environment now, not the fork server's at its start: a fixture's
    # TRITON_INTERPRET; frametrace reads its variables when used)
    os.environ.clear()
    os.environ.update(environ)
    # (a file rendezvous, not a port: test processes running side by side, as under
    # pytest-xdist, raced for the ports a free-port probe had found)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        result = globals()[scenario](rank, **opts)
        if rank == 0:
            with open(out, "wb") as f:
                pickle.dump(result, f)
    finally:
        # A model that outlives the process group (a reference cycle the collector has
        # not reached yet) keeps gloo's worker threads running after it; one of them then
        # frees a Python comm hook's callback while the interpreter exits and aborts the
        # process ("terminate called without an active exception", in CPython alone too,
        # with a DDP kept past destroy_process_group).  Collected first, the group's
        # last reference goes with destroy_process_group, which joins the threads.
        gc.collect()
        dist.destroy_process_group()


# Each rank a child of multiprocessing's fork server, which imported torch, frametrace
# and this file once (a new interpreter per rank spent most of a test importing them).
# The server never runs torch ops (no threads to lose in a fork), and the children get
# the test's environment (_entry).  FRAMETRACE_TEST_NO_FORK=1: a new interpreter each.
if os.environ.get("FRAMETRACE_TEST_NO_FORK") == "1" or \
        "forkserver" not in mp.get_all_start_methods():
    _START_METHOD = "spawn"
else:
    _START_METHOD = "forkserver"
    mp.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel",
                               "frametrace", __name__])


def launch(scenario, **opts):
    """Runs `scenario(rank, **opts)` on 2 gloo processes; rank 0's result.  A process
    that raises fails the test with its traceback; past TIMEOUT both are killed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pkl")
        store = os.path.join(tmp, "rendezvous")
        ctx = mp.start_processes(_entry, args=(store, out, scenario, opts, dict(os.environ)),
                                 nprocs=2, join=False, start_method=_START_METHOD)
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                if ctx.join(timeout=1):
                    break
            except mp.ProcessExitedException as e:
                # gloo's teardown abort ("terminate called without an active exception",
                # see _entry) after rank 0 wrote its result: every collective had completed
                # on both ranks, and an error of the scenario's own is an exception with a
                # traceback, not a signal.  Anything else fails the test.
                if e.signal_name != "SIGABRT" or not os.path.exists(out):
                    raise
                for p in ctx.processes:
                    p.join(timeout=30)
                break
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"{scenario} took over {TIMEOUT} s")
        with open(out, "rb") as f:
            return pickle.load(f)


# ---------------------------------------------------------------- what is compared
class Net(nn.Module):
    def __init__(self, bn=False, unused=False, width=32, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.bn = nn.BatchNorm1d(width) if bn else None
        self.unused = nn.Linear(width, width) if unused else None
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if self.bn is not None and i == 1:
                x = self.bn(x)
        return self.head(x)


def _inputs(rank, step, width=32, batches=(8,)):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(batches[step % len(batches)], width, generator=g)


def _assert_same(what, a, b, step):
    for (name, x), (_, y) in zip(a, b):
        if x is None or y is None:
            assert x is None and y is None, f"step {step}: {what} {name}: {x} vs {y}"
            continue
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), \
            f"step {step}: {what} {name} differ:\n{x}\nvs\n{y}"


def _grads(model):
    return [(n, None if p.grad is None else p.grad.detach().clone())
            for n, p in model.named_parameters()]


def _watch_backward(loss, events):
    """Logs each autograd node of `loss`'s graph (not the gradient accumulators) as it
    starts: ("backward", name)."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ != "AccumulateGrad":
            fn.register_prehook(lambda grads, name=fn.name(): events.append(("backward", name)))
        todo += [f for f, _ in fn.next_functions]


def overlapped(events) -> bool:
    """Whether some autograd node of the backward started after the first all-reduce
    was launched: communication overlapping computation."""
    kinds = [k for k, _ in events]
    return "allreduce" in kinds and "backward" in kinds[kinds.index("allreduce"):]


class _Recorder:
    """What frametrace compiled while recording: backend calls (graphs and DDP's bucket
    pieces), frames compiled whole and frames with breaks (with their reasons)."""

    def __init__(self, backend):
        from frametrace import convert
        self.convert = convert
        self.counter = frametrace.testing.CompileCounter(inner=backend)
        self.records = []
        convert.record_observers.append(self.records.append)

    def summary(self):
        self.convert.record_observers.remove(self.records.append)
        return {"graphs": self.counter.frame_count,
                "frames": sum(r.outcome == "compiled" for r in self.records),
                "breaks": sum(r.outcome == "break" for r in self.records),
                "fallbacks": sum(r.outcome == "fallback" for r in self.records),
                "reasons": [r.reason for r in self.records if r.reason]}


# ---------------------------------------------------------------- DDP
def ddp_scenario(rank, backend, wrap="outer", split=True, bucket_cap_mb=0.004, bn=False,
                 unused=False, static_graph=False, no_sync=False, fullgraph=False, batches=(8,),
                 steps=STEPS):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    frametrace.config.ddp_split_graphs = split
    torch.manual_seed(0)
    model = Net(bn=bn, unused=unused)
    kwargs = dict(bucket_cap_mb=bucket_cap_mb, find_unused_parameters=unused,
                  static_graph=static_graph)
    eager = DDP(copy.deepcopy(model), **kwargs)
    rec = _Recorder(backend)
    if wrap == "outer":
        ddp = DDP(model, **kwargs)
        compiled = frametrace.optimize(ddp, backend=rec.counter, fullgraph=fullgraph)
    else:
        ddp = compiled = DDP(frametrace.optimize(model, backend=rec.counter,
                                                 fullgraph=fullgraph), **kwargs)
    events = []

    def hook(state, bucket):
        events.append(("allreduce", bucket.index()))
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, hook)
    eager.register_comm_hook(None, _plain_allreduce)
    orders = []
    for step in range(steps):
        x = _inputs(rank, step, batches=batches)
        sync = not no_sync or step != 1
        for m in (eager, compiled):
            with (contextlib.nullcontext() if sync else
                  (ddp if m is compiled else eager).no_sync()):
                loss = m(x).square().mean()
                if m is compiled:
                    events.clear()
                    _watch_backward(loss, events)
                loss.backward()
        orders.append(list(events))
        _assert_same("grad", _grads(eager.module), _grads(ddp.module), step)
        if sync:
            for m in (eager.module, ddp.module):
                with torch.no_grad():
                    for p in m.parameters():
                        if p.grad is not None:
                            p -= 0.1 * p.grad
                            p.grad = None
            _assert_same("parameter", list(eager.module.named_parameters()),
                         list(ddp.module.named_parameters()), step)
        _assert_same("buffer", list(eager.module.named_buffers()),
                     list(ddp.module.named_buffers()), step)
    result = rec.summary()
    result["orders"] = orders
    return result



def _plain_allreduce(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks.allreduce_hook(None, bucket)


def _compiled_pieces(result):
    return [sum(kind == "backward" and "CompiledFunction" in name for kind, name in order)
            for order in result["orders"]]


@pytest.mark.parametrize("wrap", ["outer", "inner"])
def test_ddp_aot_eager_split_at_buckets(wrap):
    # optimize(DDP(m)) and DDP(optimize(m)): DDP's forward runs in CPython (no break in
    # it), the model is one frame, cut into one piece per bucket (a layer's 4224 bytes
    # of parameters fill a 4194-byte bucket; the head's 528 join the last layer's), and
    # the first all-reduce starts before the backward of the earlier pieces.
    r = launch("ddp_scenario", backend="aot_eager", wrap=wrap)
    assert r["frames"] == 1 and r["breaks"] == 0 and r["fallbacks"] == 0, r
    assert r["graphs"] == 4, r
    assert _compiled_pieces(r) == [4] * STEPS, r
    # (DDP's first step reduces all gradients in one bucket, eager too; it rebuilds its
    # buckets in the order the gradients came)
    assert [overlapped(order) for order in r["orders"]] == [False] + [True] * (STEPS - 1), \
        r["orders"]


def test_ddp_dynamic_batch_split():
    # A batch size that changes recompiles once with a symbolic size: the pieces pass
    # it on (the second compile's pieces take the size as an input).
    r = launch("ddp_scenario", backend="aot_eager", batches=(8, 6, 5, 7), steps=4)
    assert r["frames"] == 2 and r["breaks"] == 0 and r["graphs"] == 8, r
    assert _compiled_pieces(r) == [4] * 4, r


def test_ddp_triton_backend_split(triton_interpreter):
    # Our triton backend (its kernels in Triton's interpreter, which the spawned
    # processes inherit from the environment) compiles each piece.
    pytest.importorskip("triton")
    r = launch("ddp_scenario", backend="triton")
    assert r["frames"] == 1 and r["breaks"] == 0 and r["graphs"] == 4, r
    assert [overlapped(order) for order in r["orders"]] == [False] + [True] * (STEPS - 1), \
        r["orders"]


def test_ddp_aot_eager_unsplit_does_not_overlap():
    # config.ddp_split_graphs = False: one graph, its backward one autograd node, and
    # every all-reduce after it (what the split is for).
    r = launch("ddp_scenario", backend="aot_eager", split=False)
    assert r["frames"] == 1 and r["breaks"] == 0 and r["graphs"] == 1, r
    assert _compiled_pieces(r) == [1] * STEPS, r
    assert not any(overlapped(order) for order in r["orders"]), r["orders"]


def test_ddp_eager_backend_not_split():
    # The eager backend runs the graph's ops one by one: their gradients reach the
    # reducer as the backward computes them, nothing to split; it overlaps anyway.
    r = launch("ddp_scenario", backend="eager")
    assert r["frames"] == 1 and r["breaks"] == 0 and r["graphs"] == 1, r
    assert [overlapped(order) for order in r["orders"]] == [False] + [True] * (STEPS - 1), \
        r["orders"]


def test_ddp_fullgraph_one_large_bucket():
    # fullgraph=True holds under DDP: the pieces are the backend's, not breaks.  With
    # DDP's default 25 MiB buckets (the first 1 MiB) this model is one piece.
    r = launch("ddp_scenario", backend="aot_eager", fullgraph=True, bucket_cap_mb=25)
    assert r["frames"] == 1 and r["breaks"] == 0 and r["graphs"] == 1, r


def test_ddp_fullgraph_pieces():
    r = launch("ddp_scenario", backend="aot_eager", fullgraph=True, wrap="inner")
    assert r["frames"] == 1 and r["breaks"] == 0 and r["graphs"] == 4, r


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_ddp_find_unused_no_sync_batchnorm(backend):
    # An unused parameter with find_unused_parameters, BatchNorm's running stats
    # broadcast from rank 0 before each forward, the second step's gradients kept under
    # no_sync() and reduced with the third's.
    r = launch("ddp_scenario", backend=backend, bn=True, unused=True, no_sync=True)
    assert r["frames"] == 1 and r["breaks"] == 0 and r["fallbacks"] == 0, r
    assert [k for k, _ in r["orders"][1] if k == "allreduce"] == [], r["orders"]
    assert overlapped(r["orders"][2]), r["orders"]


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_ddp_static_graph_batchnorm(backend):
    r = launch("ddp_scenario", backend=backend, bn=True, static_graph=True)
    assert r["frames"] == 1 and r["breaks"] == 0 and r["fallbacks"] == 0, r


def train_step_scenario(rank, backend):
    # A training step compiled whole, calling the DDP module inside: DDP's call is a
    # break (its forward in CPython), the model is a frame of its own.
    torch.manual_seed(0)
    model = Net()
    eager = DDP(copy.deepcopy(model), bucket_cap_mb=0.004)
    ddp = DDP(model, bucket_cap_mb=0.004)
    rec = _Recorder(backend)

    def step(m, x):
        loss = m(x).square().mean()
        loss.backward()
        return loss.detach()

    compiled_step = frametrace.optimize(step, backend=rec.counter)
    for i in range(STEPS):
        x = _inputs(rank, i)
        a, b = step(eager, x), compiled_step(ddp, x)
        assert torch.allclose(a, b)
        _assert_same("grad", _grads(eager.module), _grads(ddp.module), i)
        for m in (eager, ddp):
            m.zero_grad()
    return rec.summary()


def test_ddp_called_from_a_compiled_step():
    r = launch("train_step_scenario", backend="aot_eager")
    # (the other break is loss.backward(), as without DDP)
    assert r["breaks"] == 2 and r["fallbacks"] == 0, r["reasons"]
    assert any("DistributedDataParallel's forward runs in CPython" in s for s in r["reasons"]), r
    # Net.forward compiled whole, in 4 pieces, and the step's resumed tail
    assert r["frames"] >= 2 and r["graphs"] >= 5, r


# ---------------------------------------------------------------- FSDP2
class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, width=16, depth=3):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def fsdp_scenario(rank, backend, mixed=None, per_block=False, depth=3):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=mixed, reduce_dtype=torch.float32) \
        if mixed is not None else MixedPrecisionPolicy()
    torch.manual_seed(0)
    base = Stack(depth=depth)

    # A CPU mesh named outright: fully_shard's default mesh is on the machine's
    # accelerator, a CUDA mesh over gloo CPU tensors (a segfault on a GPU machine).
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2,))

    def sharded():
        m = copy.deepcopy(base)
        for block in m.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(m, mesh=mesh, mp_policy=policy)
        return m

    eager, model = sharded(), sharded()
    rec = _Recorder(backend)
    if per_block:
        for block in model.blocks:
            block.forward = frametrace.optimize(block.forward, backend=rec.counter)
        compiled = model
    else:
        compiled = frametrace.optimize(model, backend=rec.counter)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, model)]
    for step in range(STEPS):
        x = _inputs(rank, step, width=16)
        for m, opt in zip((eager, compiled), opts):
            loss = m(x).float().square().mean()
            loss.backward()
        _assert_same("grad", [(n, p.grad.full_tensor()) for n, p in eager.named_parameters()],
                     [(n, p.grad.full_tensor()) for n, p in model.named_parameters()], step)
        for opt in opts:
            opt.step()
            opt.zero_grad()
        _assert_same("parameter", [(n, p.full_tensor()) for n, p in eager.named_parameters()],
                     [(n, p.full_tensor()) for n, p in model.named_parameters()], step)
        states = [[(k, v.full_tensor() if hasattr(v, "full_tensor") else v)
                   for p in o.param_groups[0]["params"] for k, v in sorted(o.state[p].items())]
                  for o in opts]
        _assert_same("optimizer state", *states, step)
    return rec.summary()


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_fsdp2_compiled_per_block(backend):
    # optimize(root): each FSDP2 block's call runs its hooks (all-gather, reshard) in
    # CPython and compiles its forward whole; the root's frame breaks at each block.
    r = launch("fsdp_scenario", backend=backend)
    assert r["fallbacks"] == 0, r
    blocks = [s for s in r["reasons"] if s.startswith("FSDP2 module")]
    assert blocks and len(blocks) == r["breaks"], r
    # (3 block forwards, whole; the root's graphs around them)
    assert r["frames"] >= 3 and r["graphs"] >= 5, r


def test_fsdp2_block_forwards_optimized():
    # Each block's forward optimized on its own: 3 graphs, no break anywhere.
    r = launch("fsdp_scenario", backend="aot_eager", per_block=True)
    assert r == {**r, "graphs": 3, "frames": 3, "breaks": 0, "fallbacks": 0}, r


def test_fsdp2_triton_backend_blocks(triton_interpreter):
    # Our triton backend (Triton's interpreter) under FSDP2, each block's forward
    # optimized: the same gradients, parameters and AdamW states as eager.
    pytest.importorskip("triton")
    r = launch("fsdp_scenario", backend="triton", per_block=True)
    assert r == {**r, "graphs": 3, "frames": 3, "breaks": 0, "fallbacks": 0}, r


def test_fsdp2_mixed_precision():
    # MixedPrecisionPolicy(param_dtype=bfloat16): the blocks compile over the bf16
    # parameters FSDP all-gathers, gradients reduced in float32, as eager.
    r = launch("fsdp_scenario", backend="aot_eager", mixed=torch.bfloat16)
    assert r["fallbacks"] == 0 and r["frames"] >= 3, r


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
