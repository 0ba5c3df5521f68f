"""Dynamic shapes: 32 calls with 32 different sizes, from a fresh compiler state.
Prints compiles (graphs handed to the backend) and the total time of the 32 calls
(tracing, compiling and running) for frametrace and torch.compile, both with the
default dynamic=None (static first, then automatic dynamic) and backend "eager",
measured side by side in one run; the ratio is frametrace / torch.compile.

    python benchmarks/dynamic.py [--repeats N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from models import (MODELS, Counter, side_by_side, with_frametrace,  # noqa: E402
                    with_torch_compile)


class Block(torch.nn.Module):
    """An MLP and a self-attention whose batch and sequence sizes both vary."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm(x))


def block_inputs(i):
    return (torch.randn(2 + i % 7, 8 + i, 64),)


def gpt2_inputs(i):
    return (torch.randint(0, 100, (2, 8 + i)),)


CASES = {
    "block (batch 2..8, seq 8..39)": (Block, block_inputs),
    "gpt2 (seq 8..39)": (MODELS["gpt2"], gpt2_inputs),
    "llama (seq 8..39)": (MODELS["llama"], gpt2_inputs),
}


def run_sizes(compile_fn, make_model, make_inputs, sizes=32):
    """Total seconds of `sizes` calls of a fresh compiled model, and its compiles."""
    torch.manual_seed(0)
    model = make_model().eval()
    counter = Counter()
    compiled = compile_fn(model, counter)
    inputs = [make_inputs(i) for i in range(sizes)]
    with torch.no_grad():
        t0 = time.perf_counter()
        outs = [compiled(*args) for args in inputs]
        seconds = time.perf_counter() - t0
        for args, out in zip(inputs, outs):
            ref = model(*args)
            out, ref = (getattr(o, "last_hidden_state", o) for o in (out, ref))
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    return seconds, counter.graphs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="best of N fresh runs each")
    args = p.parse_args()
    for compile_fn in (with_frametrace, with_torch_compile):    # imports, warm caches
        run_sizes(compile_fn, Block, block_inputs, sizes=2)
    print(f"torch {torch.__version__}; 32 sizes per case; best of {args.repeats} fresh runs")
    print(f"{'case':32}{'ft compiles':>12}{'tc compiles':>12}{'frametrace s':>14}"
          f"{'torch.compile s':>17}{'ratio':>8}")
    for name, (make_model, make_inputs) in CASES.items():
        ft, tc, ft_s, tc_s = side_by_side(lambda c: run_sizes(c, make_model, make_inputs),
                                          args.repeats)
        print(f"{name:32}{ft[1]:>12}{tc[1]:>12}{ft_s:>14.3f}{tc_s:>17.3f}"
              f"{ft_s / tc_s:>8.3f}")


if __name__ == "__main__":
    main()
