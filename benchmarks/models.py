"""Hugging Face GPT-2, BERT and LLaMA (small configs, random weights, eval, no_grad):
graphs, ops and first-call time (trace + compile + run) for frametrace and
torch.compile(backend="eager"), measured side by side in one run, with the ratio.
Target: frametrace's first call at most 1/3 of torch.compile's on every model.

    python benchmarks/models.py [--repeats N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import frametrace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_transformers import MODELS  # noqa: E402  (the same configs as the tests)


class Counter:
    """A torch.compile-protocol backend counting graphs and ops (used for both)."""

    def __init__(self):
        self.graphs = 0
        self.ops = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        self.ops += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        return gm.forward


def first_call(compile_fn, name, ids):
    """Fresh model, fresh compiler state; seconds for the first call, graphs, ops."""
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    counter = Counter()
    compiled = compile_fn(model, counter)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = compiled(ids)
        seconds = time.perf_counter() - t0
        ref = model(ids)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, atol=1e-4, rtol=1e-4)
    return seconds, counter.graphs, counter.ops


def with_frametrace(model, counter):
    frametrace.reset()
    return frametrace.optimize(backend=counter)(model)


def with_torch_compile(model, counter):
    torch._dynamo.reset()
    return torch.compile(model, backend=counter)


def side_by_side(measure, repeats):
    """`measure(compile_fn)` returns (seconds, ...): run it `repeats` times with each
    compiler; returns the first frametrace result, the first torch.compile result, and
    the best seconds of each."""
    ft = [measure(with_frametrace) for _ in range(repeats)]
    tc = [measure(with_torch_compile) for _ in range(repeats)]
    return ft[0], tc[0], min(r[0] for r in ft), min(r[0] for r in tc)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="best of N fresh compiles each")
    args = p.parse_args()
    ids = torch.randint(0, 100, (2, 16))
    # Warm both compilers' imports and caches on a throwaway model, so neither pays
    # one-time import costs inside the measurement.
    for compile_fn in (with_frametrace, with_torch_compile):
        first_call(compile_fn, "bert", ids)

    print(f"torch {torch.__version__}; best of {args.repeats} fresh first calls, seconds")
    print(f"{'model':8}{'ft graphs':>10}{'ft ops':>8}{'tc graphs':>10}{'tc ops':>8}"
          f"{'frametrace s':>14}{'torch.compile s':>17}{'ratio':>8}")
    for name in MODELS:
        ft, tc, ft_s, tc_s = side_by_side(lambda c: first_call(c, name, ids), args.repeats)
        print(f"{name:8}{ft[1]:>10}{ft[2]:>8}{tc[1]:>10}{tc[2]:>8}"
              f"{ft_s:>14.3f}{tc_s:>17.3f}{ft_s / tc_s:>8.3f}")


if __name__ == "__main__":
    main()
