"""First call (trace + compile + run) of timm vision models, frametrace's `triton` backend
against torch.compile's Inductor, each in a fresh process with empty caches (issue 31,
item 5: compile time at or below Inductor's).

    python benchmarks/first_call.py [--models efficientnet_b0,mobilenetv3_large_100,swin_tiny_patch4_window7_224]
        [--variants ft,ft_all,tc] [--batch 64] [--train] [--md FILE]

Variants: ft (frametrace, its defaults), ft_all (frametrace with every block-size
candidate timed, `autotune_candidates="all"`, the policy before "few"), tc (torch.compile,
default mode).  Every process gets its own empty Triton, Inductor and frametrace cache
folders, so nothing is reused between rows.  The model: timm, random weights, bf16, eval
under no_grad (`--train`: train mode, forward + backward of the mean, fp32 weights under
bf16 autocast), batch x 3 x 224 x 224 on CUDA.  The row: first call s, the median of 20
later calls in ms (the kernels picked), the largest difference from eager relative to
eager's largest magnitude.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import print_table, run_child  # noqa: E402

MODELS = ("efficientnet_b0", "mobilenetv3_large_100", "swin_tiny_patch4_window7_224")
VARIANTS = ("ft", "ft_all", "tc")


def one(model_name, variant, batch, train):
    import timm
    torch.manual_seed(0)
    model = timm.create_model(model_name).cuda()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    if train:
        model.train()
    else:
        model = model.eval().to(torch.bfloat16)
        x = x.to(torch.bfloat16)

    def step(fn):
        if train:
            with torch.autocast("cuda", torch.bfloat16):
                out = fn(x)
            out.float().mean().backward()
            return out.detach()
        with torch.no_grad():
            return fn(x)
    ref = step(model).float()
    model.zero_grad(set_to_none=True)
    if variant.startswith("ft"):
        import frametrace
        from frametrace.backends.triton import config
        if variant == "ft_all":
            config.autotune_candidates = "all"
        fn = frametrace.optimize(model, backend="triton")
    else:
        fn = torch.compile(model)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = step(fn)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    times = []
    for _ in range(23):
        t = time.perf_counter()
        step(fn)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    diff = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    return {"first_s": first, "steady_ms": statistics.median(times[3:]) * 1e3, "diff": diff}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--train", action="store_true")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--md")
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print("RESULT " + json.dumps(one(a.one[0], a.one[1], a.batch, a.train)))
        return
    lines = ["| model | variant | first call s | vs Inductor | steady ms | vs Inductor | max rel diff vs eager |",
             "|---|---|---|---|---|---|---|"]
    for m in a.models.split(","):
        rows = {}
        for v in a.variants.split(","):
            with tempfile.TemporaryDirectory() as d:
                for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                                 ("FRAMETRACE_CACHE_DIR", "frametrace")):
                    os.environ[var] = os.path.join(d, sub)
                rows[v] = run_child(__file__, ["--one", m, v, "--batch", str(a.batch)] +
                                    (["--train"] if a.train else []), a.timeout)
            print(f"{m} {v}: {json.dumps(rows[v])[:400]}", file=sys.stderr, flush=True)
        tc = rows.get("tc")
        for v, r in rows.items():
            if "error" in r:
                lines.append(f"| {m} | {v} | failed: {r['error'].strip().splitlines()[-1][:120] if r['error'].strip() else ''} | | | | |")
                continue
            ok = tc is not None and "error" not in tc
            lines.append(f"| {m} | {v} | {r['first_s']:.1f} | {r['first_s'] / tc['first_s']:.2f} | "
                         f"{r['steady_ms']:.2f} | {r['steady_ms'] / tc['steady_ms']:.2f} | {r['diff']:.1e} |"
                         if ok else f"| {m} | {v} | {r['first_s']:.1f} | – | {r['steady_ms']:.2f} | – | {r['diff']:.1e} |")
    text = "\n".join(lines)
    print_table(text, a.md)


if __name__ == "__main__":
    main()
