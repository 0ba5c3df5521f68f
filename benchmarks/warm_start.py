"""Warm starts: the first call of a compiled model in a fresh process, cold (empty cache
folder) and warm (the folder a previous process filled), for frametrace's on-disk cache
(frametrace/warm_cache.py) and torch.compile with its own caches on, same backend.

    python benchmarks/warm_start.py [--models gpt2,mlp] [--repeat 3] [--md FILE]

Models (CPU): gpt2 (transformers' GPT2LMHeadModel, GPT2Config(n_layer=6), random weights,
batch 2 x 64 tokens, the model's own loss, forward + backward; backend aot_eager, a
GPT-2-like module of our own where transformers is missing) and mlp (8 Linear+GELU
layers of width 512, batch 64, forward + backward; backend eager; mlp_aot: the same on
aot_eager).  Each measurement is a
process of its own: imports and the model are built first, untimed; the first call (forward,
loss, backward) is timed, then the fastest of three more calls, as the steady state.
One torch thread.  The figure is
the median over --repeat fresh cache folders (cold: the folder empty; warm: the process
right after the cold one, same folder).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gpt2():
    import torch
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        GPT2LMHeadModel = None
    torch.manual_seed(0)
    if GPT2LMHeadModel is not None:
        cfg = GPT2Config(n_layer=6, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, cfg.vocab_size, (2, 64))

        def step(m):
            out = m(input_ids=ids, labels=ids)
            out.loss.backward()
            return out.loss.item()
        return model, step, "aot_eager"
    raise SystemExit("transformers is not installed")


def _mlp():
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(64, 512)

    def step(m):
        y = m(x).square().mean()
        y.backward()
        return y.item()
    return model, step, "eager"


def _mlp_aot():
    model, step, _ = _mlp()
    return model, step, "aot_eager"


MODELS = {"gpt2": _gpt2, "mlp": _mlp, "mlp_aot": _mlp_aot}


def child(variant, model_name, cache):
    if variant == "frametrace":
        os.environ["FRAMETRACE_CACHE_DIR"] = cache
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    import torch
    torch.set_num_threads(1)        # (a shared machine: one thread measures steadier)
    model, step, backend = MODELS[model_name]()
    if variant == "frametrace":
        sys.path.insert(0, ROOT)
        import frametrace
        if backend != "eager" and not os.environ.get("WARM_START_TIME_AOT_IMPORT"):
            # (AOTAutograd's import, which is torch._dynamo's, 2.7 s here: untimed, as the
            # torch.compile child's `import torch._dynamo`; a process pays it once, cold
            # or warm, at its first aot_eager compile)
            import torch._functorch.aot_autograd  # noqa: F401
        compiled = frametrace.optimize(model, backend=backend)
    else:
        import torch._dynamo  # noqa: F401  (imports, untimed, as frametrace's)
        compiled = torch.compile(model, backend=backend)
    t0 = time.perf_counter()
    loss = step(compiled)
    first = time.perf_counter() - t0
    second = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        step(compiled)
        second = min(second, time.perf_counter() - t0)
    extra = {}
    if variant == "frametrace":
        extra = dict(frametrace.warm_cache.stats)
    else:
        from torch._dynamo.utils import counters
        extra = {"aot_autograd": dict(counters["aot_autograd"])}    # (its cache's hits, misses)
    print("RESULT", json.dumps({"first": first, "second": second, "loss": loss, **extra}))


def _measure(variant, model_name, cache):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, __file__, "--child", variant, model_name, cache],
                          env=env, capture_output=True, text=True, timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        raise RuntimeError(f"{variant} {model_name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[0][7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2,mlp")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=None)
    ap.add_argument("--child", nargs=3, default=None)
    ns = ap.parse_args()
    if ns.child:
        child(*ns.child)
        return
    rows = []
    for model_name in ns.models.split(","):
        for variant in ("frametrace", "torch.compile"):
            colds, warms, steady, hits, backend_hits = [], [], [], [], []
            for _ in range(ns.repeat):
                with tempfile.TemporaryDirectory(prefix="warm-start-") as cache:
                    cold = _measure(variant, model_name, cache)
                    warm = _measure(variant, model_name, cache)
                    assert abs(cold["loss"] - warm["loss"]) <= 1e-4 * max(1.0, abs(cold["loss"])), (cold, warm)
                colds.append(cold["first"])
                warms.append(warm["first"])
                steady.append(warm["second"])
                hits.append(warm.get("hits"))
                backend_hits.append(warm.get("backend_hits", warm.get("aot_autograd")))
            c, w, st = statistics.median(colds), statistics.median(warms), statistics.median(steady)
            rows.append((model_name, variant, c, w, w / c, st, hits[-1]))
            # (first call minus a steady call: what compiling, or loading, cost)
            print(f"{model_name:5} {variant:13} cold {c:7.3f}s  warm {w:7.3f}s  "
                  f"warm/cold {w / c:6.1%}  steady call {st:.3f}s  compile cost cold "
                  f"{c - st:.3f}s warm {w - st:.3f}s"
                  + (f"  cache hits {hits[-1]}" if hits[-1] is not None else "")
                  + f"  backend cache {backend_hits[-1]}", flush=True)
    if ns.md:
        with open(ns.md, "w") as fh:
            fh.write("| model | compiler | cold first call | warm first call | warm/cold | steady call |"
                     " compile cost cold / warm |\n")
            fh.write("|---|---|---|---|---|---|---|\n")
            for m, v, c, w, r, s, _ in rows:
                fh.write(f"| {m} | {v} | {c:.3f} s | {w:.3f} s | {r:.1%} | {s:.3f} s | "
                         f"{c - s:.3f} s / {w - s:.3f} s |\n")


if __name__ == "__main__":
    main()
