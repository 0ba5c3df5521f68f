"""Per-call cost of a tiny compiled function (``x + 1`` on a 4-element tensor):
eager, frametrace (eager backend) and torch.compile(backend="eager"), measured in one
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
    ft = frametrace.optimize("eager")(fn)
    tc = torch.compile(fn, backend="eager")
    for f in (fn, ft, tc):   # compile and warm up
        for _ in range(200):
            f(x)
    assert torch.equal(ft(x), fn(x)) and torch.equal(tc(x), fn(x))

    best = {"eager": float("inf"), "frametrace": float("inf"), "torch.compile": float("inf")}
    for _ in range(args.repeats):   # interleaved, so drift hits all three alike
        for name, f in (("eager", fn), ("frametrace", ft), ("torch.compile", tc)):
            best[name] = min(best[name], per_call(f, x, args.calls))

    eager = best["eager"]
    print(f"torch {torch.__version__}, per call (best of {args.repeats} x {args.calls} calls)")
    print(f"{'':16}{'us/call':>10}{'added us':>10}")
    for name, t in best.items():
        print(f"{name:16}{t * 1e6:10.2f}{(t - eager) * 1e6:10.2f}")
    ratio = (best["frametrace"] - eager) / (best["torch.compile"] - eager)
    print(f"frametrace added cost / torch.compile added cost = {ratio:.3f} (target <= 0.25)")


if __name__ == "__main__":
    main()
