"""A server's traffic: one compiled model called with changing sequence lengths (issue 31,
item 1: dynamic shapes as fast as static).  Eager, frametrace (`backend="triton"`) and
torch.compile (Inductor), each in a process of its own.

    python benchmarks/shape_sweep.py [--variants eager,ft,tc] [--md FILE]

The model: transformers' BertModel from a config (6 layers, hidden 768, 12 heads,
intermediate 3072, random weights), bf16, eval, on CUDA, batch 16, an attention mask with
one padded row.  12 sequence lengths (32 to 512, not all multiples of 16), each called 4
times (`--rounds`) in a shuffled order; the first round of all 12 lengths is the warm-up (compiles:
static at first, then one graph with a symbolic length, for both compilers), the rest is
timed per call (`last round`: the mean of the last round's calls alone).  The row: the whole program's seconds (compiles included), the mean per
call after warm-up, graphs compiled in all and after the warm-up, and the largest
difference from eager's outputs relative to their scale.  `--smoke` runs tiny sizes on the
CPU (Triton's interpreter for `ft`).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import print_table, run_child  # noqa: E402
VARIANTS = ("eager", "ft", "tc")   # also ft_general: frametrace without sized fast wrappers
LENGTHS = (32, 48, 64, 80, 100, 128, 160, 200, 256, 320, 400, 512)


def one(variant, smoke, profile=False, rounds=4):
    import transformers
    device = torch.device("cpu" if smoke else "cuda")
    torch.manual_seed(0)
    if smoke:
        cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=512)
        lengths, batch = LENGTHS[:5], 2
    else:
        cfg = transformers.BertConfig(num_hidden_layers=6, hidden_size=768, num_attention_heads=12,
                                      intermediate_size=3072, vocab_size=30522)
        lengths, batch = LENGTHS, 16
    model = transformers.BertModel(cfg).to(device).eval()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    records = []
    fwd = model
    if variant.startswith("ft"):
        import frametrace
        if variant == "ft_general":     # every call through the general symbolic wrapper
            from frametrace.backends.triton import config
            config.sized_fast_after = 0
        frametrace.convert.record_observers.append(lambda r: records.append((time.perf_counter(), r)))
        fwd = frametrace.optimize(model, backend="triton")
    elif variant == "tc":
        fwd = torch.compile(model)
    order = []
    rng = random.Random(4)
    for _ in range(rounds):
        r = list(lengths)
        rng.shuffle(r)
        order.append(r)
    g = torch.Generator().manual_seed(5)

    def call(n):
        ids = torch.randint(0, cfg.vocab_size, (batch, n), generator=g).to(device)
        mask = torch.ones_like(ids)
        mask[0, n // 2:] = 0
        with torch.no_grad():
            out = fwd(input_ids=ids, attention_mask=mask).last_hidden_state
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out
    start = time.perf_counter()
    sums = []
    for n in order[0]:
        out = call(n)
        sums.append(out.float().abs().sum().item() / out.numel())
    warm_end = time.perf_counter()
    if variant == "tc":
        from torch._dynamo.utils import counters
        graphs_warm = counters["stats"]["unique_graphs"]
    per_call = []
    for r in order[1:]:
        for n in r:
            t = time.perf_counter()
            out = call(n)
            per_call.append(time.perf_counter() - t)
            sums.append(out.float().abs().sum().item() / out.numel())
    end = time.perf_counter()
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof
        for n in (lengths[-1], lengths[4]):
            with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
                call(n)
            print(f"--- {variant}, length {n}", file=sys.stderr)
            print(pr.key_averages().table(sort_by="self_cuda_time_total" if device.type == "cuda"
                                          else "self_cpu_time_total", row_limit=18, max_name_column_width=60),
                  file=sys.stderr)
        import cProfile
        import io
        import pstats
        cp = cProfile.Profile()
        cp.enable()
        for n in order[-1][:6]:
            call(n)
        cp.disable()
        text = io.StringIO()
        pstats.Stats(cp, stream=text).sort_stats("tottime").print_stats(30)
        print(f"--- {variant}, Python profile of 6 calls", file=sys.stderr)
        print(text.getvalue(), file=sys.stderr)
    res = {"variant": variant, "total_s": end - start, "warmup_s": warm_end - start,
           "per_call_ms": statistics.mean(per_call) * 1e3,
           "last_round_ms": statistics.mean(per_call[-len(order[-1]):]) * 1e3,
           "round_ms": [round(statistics.mean(per_call[i:i + len(lengths)]) * 1e3, 2)
                        for i in range(0, len(per_call), len(lengths))], "numbers": sums}
    if variant.startswith("ft"):
        from frametrace.backends.triton import backend
        res.update(graphs=sum(r.graph_module is not None for _, r in records),
                   late=sum(r.graph_module is not None for t, r in records if t >= warm_end),
                   eager_graphs=backend.STATS["eager_graphs"])
    elif variant == "tc":
        res.update(graphs=counters["stats"]["unique_graphs"],
                   late=counters["stats"]["unique_graphs"] - graphs_warm)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--profile", action="store_true", help="a profile of one call at two lengths, to stderr")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds over the 12 lengths, the first the warm-up (a server's steady state: more)")
    p.add_argument("--md")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print("RESULT " + json.dumps(one(a.one, a.smoke, a.profile, a.rounds)))
        return
    rows = {}
    for v in a.variants.split(","):
        argv = ["--one", v, "--rounds", str(a.rounds)] + (["--smoke"] if a.smoke else []) + \
            (["--profile"] if a.profile else [])
        rows[v] = run_child(__file__, argv, a.timeout, stderr_tail=12000 if a.profile else 0)
        r = rows[v]
        print(f"{v}: " + (json.dumps({k: x for k, x in r.items() if k != "numbers"}) if "error" not in r
                          else "FAILED " + r["error"]), file=sys.stderr, flush=True)
    e, i = rows.get("eager"), rows.get("tc")
    lines = ["| variant | whole program s | per call after warm-up ms | vs eager | vs Inductor | "
             "last round ms | graphs | compiles after warm-up | max rel diff vs eager |", "|" + "---|" * 9]
    for v, r in rows.items():
        if "error" in r:
            lines.append(f"| {v} | failed | | | | | | | |")
            continue
        ok = lambda x: x is not None and "error" not in x  # noqa: E731
        ve = f"{r['per_call_ms'] / e['per_call_ms']:.2f}" if ok(e) else "–"
        vi = f"{r['per_call_ms'] / i['per_call_ms']:.2f}" if ok(i) else "–"
        diff = (max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(r["numbers"], e["numbers"]))
                if ok(e) else float("nan"))
        lines.append(f"| {v} | {r['total_s']:.1f} | {r['per_call_ms']:.2f} | {ve} | {vi} | {r['last_round_ms']:.2f} | "
                     f"{r.get('graphs', '–')} | {r.get('late', '–')} | {diff:.1e} |")
    text = "\n".join(lines)
    print_table(text, a.md)


if __name__ == "__main__":
    main()
