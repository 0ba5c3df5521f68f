"""Data-parallel training compiled by frametrace: DistributedDataParallel around a model,
`frametrace.optimize` around DDP.

    torchrun --nproc-per-node 2 examples/ddp_train.py            # CUDA + NCCL if there
    torchrun --nproc-per-node 2 examples/ddp_train.py --cpu      # CPU + gloo

DDP's forward (the reducer's bookkeeping, buffer broadcasts) runs in CPython; the
model's forward is one compiled frame, cut into one piece per gradient bucket so that
each bucket's all-reduce starts while the earlier layers' backward still runs
(`frametrace.config.ddp_split_graphs = False` keeps it whole).  `DDP(frametrace.optimize(
model))` works the same.  Each rank prints its loss; the ranks' parameters stay equal.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import frametrace


class MLP(nn.Module):
    def __init__(self, width=256, depth=6):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.nn.functional.gelu(layer(x))
        return self.head(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default="default", help="frametrace backend")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)                        # the same initial weights on every rank
    model = MLP().to(device)
    # Small buckets (1 MiB, about 4 layers) so that this small model has several.
    ddp = DDP(model, device_ids=[device.index] if cuda else None, bucket_cap_mb=1)
    # (CompileCounter: the backend, counting the graphs it is given)
    counter = frametrace.testing.CompileCounter(inner=args.backend)
    compiled = frametrace.optimize(ddp, backend=counter)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the data
    for step in range(args.steps):
        x = torch.randn(64, 256, generator=g).to(device)
        y = torch.randint(0, 10, (64,), generator=g).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = nn.functional.cross_entropy(compiled(x), y)
        loss.backward()                         # all-reduces overlap the backward
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 5 == 0 or step == args.steps - 1:
            print(f"rank {rank} step {step}: loss {loss.item():.4f}")

    # Every rank holds the same weights: the gradients were averaged.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    others = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(others, flat)
    assert all(torch.equal(o, flat) for o in others), "ranks' weights differ"
    if rank == 0:
        print(f"{world} ranks, weights equal; {counter.frame_count} graph(s) compiled "
              "(one per gradient bucket where the backend compiles the backward whole)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
