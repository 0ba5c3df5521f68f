"""Per-call cost of a tiny compiled function (``x + 1`` on a 4-element tensor):
eager, frametrace (eager backend) and torch.compile(backend="eager"), static and with
dynamic=True (the size is symbolic, so the guards check its range), measured in one
run, interleaved, best of several repeats.  Prints frametrace's added cost as a
fraction of torch.compile's (target: at most 0.25).

    python benchmarks/overhead.py [--calls N] [--repeats R]
"""
from __future__ import annotations

import argparse
import time

import torch

import frametrace


def fn(x):
    return x + 1


def per_call(f, x, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        f(x)
    return (time.perf_counter() - t0) / calls


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()

    x = torch.randn(4)
    compiled = {"frametrace": frametrace.optimize("eager")(fn),
                "torch.compile": torch.compile(fn, backend="eager"),
                "frametrace dynamic": frametrace.optimize("eager", dynamic=True)(fn),
                "torch.compile dynamic": torch.compile(fn, backend="eager", dynamic=True)}
    runs = {"eager": fn, **compiled}
    for f in runs.values():   # compile and warm up
        for _ in range(200):
            f(x)
    assert all(torch.equal(f(x), fn(x)) for f in compiled.values())

    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeats):   # interleaved, so drift hits all alike
        for name, f in runs.items():
            best[name] = min(best[name], per_call(f, x, args.calls))

    eager = best["eager"]
    print(f"torch {torch.__version__}, per call (best of {args.repeats} x {args.calls} calls)")
    print(f"{'':24}{'us/call':>10}{'added us':>10}")
    for name, t in best.items():
        print(f"{name:24}{t * 1e6:10.2f}{(t - eager) * 1e6:10.2f}")
    for suffix in ("", " dynamic"):
        ratio = (best["frametrace" + suffix] - eager) / (best["torch.compile" + suffix] - eager)
        print(f"frametrace{suffix} added cost / torch.compile{suffix} added cost = {ratio:.3f} "
              f"(target <= 0.25)")

if __name__ == "__main__":
    main()
