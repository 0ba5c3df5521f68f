"""Distributed training step time, peak memory and losses: eager, frametrace and
torch.compile, under DDP and FSDP2, on every rank of a torchrun launch.

    torchrun --nproc-per-node 2 benchmarks/distributed.py [--models llama8,gpt2]
        [--wrappers ddp,fsdp] [--variants eager,frametrace,torch.compile] [--steps 10]
        [--warmup 3] [--batch 4] [--seq 512] [--precision autocast|fsdp-bf16|fp32]
        [--ft-backend default] [--tc-backend inductor] [--bucket-cap-mb 25] [--md FILE]
        [--fsdp-compile blocks|root] [--reasons]
    torchrun --nproc-per-node 2 benchmarks/distributed.py --smoke   # tiny, CPU + gloo

CUDA + NCCL where there are GPUs (one per rank, LOCAL_RANK), else CPU + gloo.  Models
(benchmarks/training.py's configs, random weights): llama8 (LlamaForCausalLM, 8 layers,
hidden 2048, intermediate 5632, 16 heads, vocab 32000), llama4, gpt2 (GPT-2 small);
`--smoke` makes them tiny.  Each rank trains on its own batches (`--batch` x `--seq`
tokens, the model's own loss).

Wrappers: `ddp` is DistributedDataParallel(model, bucket_cap_mb=--bucket-cap-mb);
`fsdp` is FSDP2: `fully_shard` on each decoder block, then on the root.  Variants:
`eager`; `frametrace`: `frametrace.optimize(DDP(model))`, under FSDP2 each block's
`forward` replaced by `frametrace.optimize(block.forward)` (`--fsdp-compile blocks`, the
default: no graph break; the root's embedding, head and loss eager) or
`frametrace.optimize(root)` (`--fsdp-compile root`: a break at each block's call), with
`--ft-backend` (default: the triton backend on CUDA graphs, eager on the CPU);
`torch.compile`, the same with `torch.compile` (DDP: its DDPOptimizer) and
`--tc-backend`.  Precision: `autocast` (fp32 weights,
`torch.autocast(bfloat16)` around forward and loss; the default on CUDA), `fsdp-bf16`
(FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32); DDP as
autocast), `fp32` (the default on the CPU).  AdamW (foreach) in eager for every variant.

Each variant starts from the same weights and first runs 3 steps on 3 fixed batches
(compiling on the first); its losses are compared with eager's (max abs difference).
Then --warmup untimed steps and --steps timed ones (synchronised, the slowest rank's
time per step): the median is the step time.  Peak memory: the CUDA allocator's peak
during the timed steps on rank 0, MiB (none on the CPU).  frametrace's columns: graphs
compiled (DDP's bucket pieces each count), graph breaks.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frametrace  # noqa: E402
from frametrace import convert  # noqa: E402
from training import make_batch, make_model  # noqa: E402

CHECK_STEPS = 3


def blocks(model):
    """The decoder blocks FSDP2 shards one by one (HF's LlamaDecoderLayer, GPT2Block)."""
    # (fully_shard gives each one a class of its own: FSDPLlamaDecoderLayer)
    return [m for m in model.modules()
            if type(m).__name__.removeprefix("FSDP") in ("LlamaDecoderLayer", "GPT2Block")]


def wrap(model, wrapper, args):
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [args.device.index] if args.device.type == "cuda" else None
        return DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if args.precision == "fsdp-bf16" else MixedPrecisionPolicy()
    for block in blocks(model):
        fully_shard(block, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


class Run:
    """One variant under one wrapper: its model, optimizer, and what frametrace did."""

    def __init__(self, kind, base, wrapper, args):
        self.kind, self.args = kind, args
        torch.manual_seed(0)
        model = copy.deepcopy(base).to(args.device)
        self.wrapped = wrap(model, wrapper, args)
        self.forward = self.wrapped
        self.counter, self.records = None, []
        if kind == "frametrace":
            frametrace.reset()
            self.counter = frametrace.testing.CompileCounter(inner=args.ft_backend)
            convert.record_observers.append(self.records.append)
            self.compile(wrapper, lambda f: frametrace.optimize(f, backend=self.counter))
        elif kind == "torch.compile":
            torch._dynamo.reset()
            self.compile(wrapper, lambda f: torch.compile(f, backend=args.tc_backend))
        self.opt = torch.optim.AdamW(self.wrapped.parameters(), lr=1e-4, foreach=True)

    def compile(self, wrapper, compile_fn):
        if wrapper == "fsdp" and self.args.fsdp_compile == "blocks":
            # Each block's forward, called by FSDP's hooks (torchtitan's recipe); the
            # root's embedding, head and loss stay eager.
            for block in blocks(self.wrapped):
                block.forward = compile_fn(block.forward)
        else:
            self.forward = compile_fn(self.wrapped)

    def step(self, batch):
        autocast = self.args.precision == "autocast"
        with torch.autocast(self.args.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = self.forward(**batch).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach().float()

    def done(self):
        if self.records:
            convert.record_observers.remove(self.records.append)
        if self.counter is None:
            return "", ""
        breaks = [r.reason for r in self.records if r.outcome == "break"]
        if self.args.reasons and dist.get_rank() == 0:
            for reason in sorted(set(breaks)):
                print(f"  break x{breaks.count(reason)}: {reason}", flush=True)
        return str(self.counter.frame_count), str(len(breaks))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def measure(kind, base, wrapper, name, vocab, args, eager_losses):
    rank = dist.get_rank()
    batches = [make_batch(name, vocab, args.batch, args.seq, args.device, 1000 * rank + i)
               for i in range(CHECK_STEPS + 1)]
    run = Run(kind, base, wrapper, args)
    t0 = time.perf_counter()
    losses = [run.step(b) for b in batches[:CHECK_STEPS]]
    sync(args.device)
    first = time.perf_counter() - t0
    for _ in range(args.warmup):
        run.step(batches[-1])
    sync(args.device)
    if args.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        run.step(batches[-1])
        sync(args.device)
        times.append(time.perf_counter() - t0)
    # The slowest rank's time per step: the step ends for everyone at the last all-reduce.
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    peak = torch.cuda.max_memory_allocated() / 2**20 if args.device.type == "cuda" else None
    losses = torch.stack(losses).cpu()
    diff = None if eager_losses is None else (losses - eager_losses).abs().max().item()
    graphs, breaks = run.done()
    row = {"model": name, "wrapper": wrapper, "variant": kind, "step_ms": 1000 * t.item(),
           "first_3_steps_s": first, "peak_mib": peak, "loss": losses[-1].item(),
           "loss_diff": diff, "graphs": graphs, "breaks": breaks}
    del run
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
    return row, losses


def fmt(row):
    peak = "-" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
    diff = "-" if row["loss_diff"] is None else f"{row['loss_diff']:.2e}"
    return (f"| {row['model']} | {row['wrapper']} | {row['variant']} | {row['step_ms']:.1f} | "
            f"{peak} | {row['first_3_steps_s']:.1f} | {row['loss']:.4f} | {diff} | "
            f"{row['graphs']} | {row['breaks']} |")


HEADER = ("| model | wrapper | variant | step ms | peak MiB | first 3 steps s | loss | "
          "loss - eager's | graphs | breaks |\n|---|---|---|---|---|---|---|---|---|---|")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama8,gpt2")
    p.add_argument("--wrappers", default="ddp,fsdp")
    p.add_argument("--variants", default="eager,frametrace,torch.compile")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--precision", choices=("autocast", "fsdp-bf16", "fp32"), default=None)
    p.add_argument("--ft-backend", default="default")
    p.add_argument("--tc-backend", default="inductor")
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--fsdp-compile", choices=("blocks", "root"), default="blocks",
                   help="under FSDP2, compile each block's forward or the root module")
    p.add_argument("--smoke", action="store_true", help="tiny models, few steps (CPU check)")
    p.add_argument("--md", help="also write the table to this file (rank 0)")
    p.add_argument("--reasons", action="store_true", help="print frametrace's graph breaks")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    args.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(args.device)
    if args.precision is None:
        args.precision = "autocast" if cuda else "fp32"
    if args.smoke:
        args.batch, args.seq, args.steps, args.warmup = 2, 32, 2, 1
    rank = dist.get_rank()
    rows = []
    if rank == 0:
        print(f"{dist.get_world_size()} ranks, {args.device.type}, {args.precision}, batch "
              f"{args.batch} x {args.seq} per rank\n{HEADER}", flush=True)
    for name in args.models.split(","):
        base, vocab = make_model(name, args.smoke, dropout=False)
        for wrapper in args.wrappers.split(","):
            eager_losses = None
            for kind in args.variants.split(","):
                try:
                    row, losses = measure(kind, base, wrapper, name, vocab, args, eager_losses)
                except Exception as e:      # one failing variant costs one row
                    if rank == 0:
                        print(f"| {name} | {wrapper} | {kind} | failed: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:150]} |", flush=True)
                    continue
                if kind == "eager":
                    eager_losses = losses
                rows.append(row)
                if rank == 0:
                    print(fmt(row), flush=True)
    if rank == 0 and args.md:
        with open(args.md, "w") as f:
            f.write(HEADER + "\n" + "\n".join(fmt(r) for r in rows) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
