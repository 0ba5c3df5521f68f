"""Token-by-token decoding: HF `generate()` with `model.forward` compiled, eager against
frametrace and torch.compile (Inductor), each in a process of its own (issue 31, item 2).

    python benchmarks/decode.py [--variants eager,ft,tc,ft_ro,tc_ro] [--batch 1,8] [--md FILE]

The model: transformers' LlamaForCausalLM from a config (8 layers, hidden 1024,
intermediate 2816, 16 heads, vocab 32000, random weights), bf16, eval, on CUDA; a prompt
of 32 tokens, 64 new tokens (greedy, `min_new_tokens` so every call makes 64), the default
DynamicCache (the KV length grows by one each step: a graph with a symbolic length).
Variants: `eager`; `ft` (frametrace, `backend="triton"`); `ft_ro` (the same with
`mode="reduce-overhead"`); `tc` (torch.compile, Inductor); `tc_ro` (Inductor,
`mode="reduce-overhead"`); a variant ending in `_sc` (`eager_sc`, `ft_sc`, ...) generates
with `cache_implementation="static"` (HF's StaticCache: the same shapes every step).  Two untimed `generate()` calls compile (prefill and decode
graphs), then the median of --calls timed calls; per token is that over the new tokens.
The row says how many graphs were compiled in the timed calls (0 is the goal), the
frames left to CPython (frametrace), and whether the tokens equal eager's (bf16 greedy
decoding may part ways after a near tie: the first position where they differ is
printed).  `--profile` prints frametrace's per-call Python profile of one timed call.
`--smoke` runs tiny sizes on the CPU (Triton's interpreter for `ft`) to check the script.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import print_table, run_child  # noqa: E402
VARIANTS = ("eager", "ft", "tc", "ft_ro", "tc_ro")   # each also with "_sc": StaticCache


def model_and_prompt(batch, smoke, device):
    import transformers
    torch.manual_seed(0)
    if smoke:
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                       num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                                       max_position_embeddings=256)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=8, hidden_size=1024, intermediate_size=2816,
                                       num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                       max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(cfg).to(device)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    model.eval()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (batch, 8 if smoke else 32), generator=g).to(device)
    return model, prompt


def one(variant, batch, smoke, calls, new, profile):
    static_cache = variant.endswith("_sc")
    variant = variant[:-3] if static_cache else variant
    device = torch.device("cpu" if smoke else "cuda")
    model, prompt = model_and_prompt(batch, smoke, device)
    records = []
    if variant.startswith("ft"):
        import frametrace
        frametrace.convert.record_observers.append(lambda r: records.append((time.perf_counter(), r)))
        kw = {"mode": "reduce-overhead"} if variant == "ft_ro" else {}
        model.forward = frametrace.optimize(model.forward, backend="triton", **kw)
    elif variant.startswith("tc"):
        kw = {"mode": "reduce-overhead"} if variant == "tc_ro" else {}
        model.forward = torch.compile(model.forward, **kw)

    def gen():
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=0, **({"cache_implementation": "static"} if static_cache else {}))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out
    t0 = time.perf_counter()
    for _ in range(2):
        out = gen()
    warm_s = time.perf_counter() - t0
    warm_mark = time.perf_counter()
    if variant.startswith("tc"):
        from torch._dynamo.utils import counters
        graphs_before = counters["stats"]["unique_graphs"]
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        out = gen()
        times.append(time.perf_counter() - t)
    result = {"variant": variant + ("_sc" if static_cache else ""), "batch": batch, "warmup_s": warm_s,
              "median_s": statistics.median(times), "times": times,
              "tokens": out[:, -new:].tolist()}
    if variant.startswith("ft"):
        late = [r for t, r in records if t >= warm_mark]
        from frametrace.backends.triton import backend
        result.update(graphs=sum(r.graph_module is not None for _, r in records),
                      late_compiles=sum(r.graph_module is not None for r in late),
                      late_cpython=sum(r.outcome == "fallback" for r in late),
                      eager_graphs=backend.STATS["eager_graphs"],
                      fallback_nodes=backend.STATS["fallback_nodes"],
                      modules=[dict(kind=m.kind, symbolic=m.symbolic, kernels=len(m.kernels),
                                    externs=len(m.externs), fast=m.fast is not None,
                                    cudagraph=m.runner is not None) for m in backend.COMPILED])
    elif variant.startswith("tc"):
        result.update(graphs=counters["stats"]["unique_graphs"],
                      late_compiles=counters["stats"]["unique_graphs"] - graphs_before)
    if profile and variant.startswith("ft"):
        import cProfile
        import io
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        gen()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue(), file=sys.stderr)
    return result


def first_difference(a, b):
    for r, (x, y) in enumerate(zip(a, b)):
        for i, (p, q) in enumerate(zip(x, y)):
            if p != q:
                return f"row {r} token {i}"
    return "none"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", default="1,8")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--md")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    new = 6 if a.smoke and a.new == 64 else a.new
    if a.one:
        r = one(a.one[0], int(a.one[1]), a.smoke, a.calls, new, a.profile)
        print("RESULT " + json.dumps(r))
        return
    lines = ["| batch | variant | per token ms | generate s | vs eager | vs Inductor | warm-up s | "
             "graphs | compiles in timed calls | eager graphs | first token differing from eager |",
             "|" + "---|" * 11]
    for b in (int(x) for x in a.batch.split(",")):
        rows = {}
        for v in a.variants.split(","):
            argv = ["--one", v, str(b), "--calls", str(a.calls), "--new", str(a.new)] + \
                (["--smoke"] if a.smoke else []) + (["--profile"] if a.profile else [])
            rows[v] = run_child(__file__, argv, a.timeout,
                                stderr_tail=6000 if a.profile and v.startswith("ft") else 0)
            r = rows[v]
            if "error" in r:
                print(f"batch {b} {v}: FAILED {r['error']}", file=sys.stderr)
                continue
            print(f"batch {b} {v}: " + json.dumps({k: r[k] for k in r if k not in ("tokens", "times")}),
                  file=sys.stderr, flush=True)
        for v, r in rows.items():
            sc = "_sc" if v.endswith("_sc") else ""
            e, i = rows.get("eager" + sc), rows.get("tc" + sc)
            if "error" in r:
                lines.append(f"| {b} | {v} | failed | | | | | | | | |")
                continue
            ms = r["median_s"] / new * 1e3
            ve = f"{r['median_s'] / e['median_s']:.2f}" if e and "error" not in e else "–"
            vi = f"{r['median_s'] / i['median_s']:.2f}" if i and "error" not in i else "–"
            diff = first_difference(e["tokens"], r["tokens"]) if e and "error" not in e else "–"
            lines.append(f"| {b} | {v} | {ms:.2f} | {r['median_s']:.3f} | {ve} | {vi} | {r['warmup_s']:.1f} | "
                         f"{r.get('graphs', '–')} | {r.get('late_compiles', '–')} | {r.get('eager_graphs', '–')} | {diff} |")
    text = "\n".join(lines)
    print_table(text, a.md)


if __name__ == "__main__":
    main()
