"""Warm starts: the first call of a compiled model in a fresh process, cold (empty cache
folder) and warm (the folder a previous process filled), for frametrace's on-disk cache
(frametrace/warm_cache.py) and torch.compile with its own caches on, same backend.

    python benchmarks/warm_start.py [--models gpt2,mlp] [--repeat 3] [--md FILE]
                                    [--compilers frametrace,torch.compile] [--no-eager]

Models (CPU): gpt2 (transformers' GPT2LMHeadModel, GPT2Config(n_layer=6), random weights,
batch 2 x 64 tokens, the model's own loss, forward + backward; backend aot_eager),
gpt2_1x32 and gpt2_1x8 (the same with 1 x 32 and 1 x 8 tokens: the compile cost where
compute does not dominate the first call) and mlp (8 Linear+GELU
layers of width 512, batch 64, forward + backward; backend eager; mlp_aot: the same on
aot_eager).  Each measurement is a
process of its own: imports and the model are built first, untimed; the first call (forward,
loss, backward) is timed, then the fastest of three more calls, as the steady state.
One torch thread.  The figure is
the median over --repeat fresh cache folders (cold: the folder empty; warm: the process
right after the cold one, same folder); a second line gives the same in CPU seconds
(`time.process_time`), which a loaded machine disturbs less than the wall clock.
Each model also runs uncompiled, --repeat fresh processes prepared as frametrace's
(same imports), for eager's own first call (unless --no-eager): each row then gives,
beside the issue's warm/cold, the compile-cost ratio (warm first call - eager's first
call) / (cold first call - eager's first call), what a warm start leaves of compiling
beyond the first-call cost that eager pays too.

The `triton` backend on CUDA (issue 33's target: a warm first call at most 10% of the
cold one, and at most torch.compile's warm first call):

    python benchmarks/warm_start.py --models llama,effnet --repeat 1     # on a GPU, ~6 min

WARM_START_LOGDIR=DIR keeps each child process's stderr in DIR; WARM_START_PROFILE=N
profiles frametrace's first call (cold and warm children) and writes its N functions of
most cumulative time to that stderr.

llama: transformers' LlamaForCausalLM from a small config (2 layers, hidden 1024,
intermediate 2816, 16 heads, vocab 32000, random weights), batch 2 x 512 tokens, the
model's own loss, forward + backward; effnet: timm's efficientnet_b0 (random weights) where
timm is installed, else a small EfficientNet-like conv net of our own (MBConv blocks:
expand, depthwise, squeeze-excite, project), batch 16 x 3 x 224 x 224, train mode, a
cross-entropy loss, forward + backward.  fp32 weights, on CUDA; frametrace with
backend="triton", torch.compile with Inductor (its FX graph and AOTAutograd caches on, the
default).  Both compilers' caches start empty in a cold process: frametrace's folder
(entries and autotuning choices), Inductor's, and Triton's compiled binaries
(TRITON_CACHE_DIR) are all under the measurement's temporary folder.  The rows say what
the warm process took from the cache (entries, autotuning choices, the backend's
compiled modules: backend/triton/result_cache.py), how many kernel candidates it still
timed, and the time our own pipeline (lowering, scheduling, code generation) took cold
and warm (0 builds warm when the backend's result came from the cache).  Without CUDA these rows are skipped with a line saying so;
`--smoke` runs them on the CPU with tiny sizes and the kernels in Triton's interpreter
(frametrace only), to check the script.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import run_child  # noqa: E402


def _gpt2(batch=2, tokens=64):
    import torch
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        GPT2LMHeadModel = None
    torch.manual_seed(0)
    if GPT2LMHeadModel is not None:
        cfg = GPT2Config(n_layer=6, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, cfg.vocab_size, (batch, tokens))

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


def _device():
    return "cpu" if os.environ.get("WARM_START_SMOKE") else "cuda"


def _llama():
    import torch
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise SystemExit("transformers is not installed") from None
    smoke = _device() == "cpu"
    torch.manual_seed(0)
    size = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=32) if smoke else \
        dict(num_hidden_layers=2, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
             num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
    cfg = LlamaConfig(**size, use_cache=False)
    model = LlamaForCausalLM(cfg).to(_device())
    ids = torch.randint(0, cfg.vocab_size, (2, 8 if smoke else 512),
                        generator=torch.Generator().manual_seed(0)).to(_device())

    def step(m):
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.item()
    return model, step, "triton"


class _SqueezeExcite(torch.nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.reduce, self.expand = torch.nn.Conv2d(c, r, 1), torch.nn.Conv2d(r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.expand(torch.nn.functional.silu(self.reduce(s))).sigmoid()


class _MBConv(torch.nn.Module):
    def __init__(self, cin, cout, stride, expand=4):
        super().__init__()
        nn, mid = torch.nn, cin * expand
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.SiLU(),
            _SqueezeExcite(mid, max(4, cin // 4)),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


def _small_effnet():
    """EfficientNet-like (timm is not installed): a stem, MBConv blocks (1x1 expand,
    depthwise 3x3, squeeze-excite, 1x1 project, residual where shapes allow), a head.
    (Its classes are module-level: the cache finds a module's class again by name.)"""
    nn = torch.nn
    widths = [(32, 16, 1), (16, 24, 2), (24, 24, 1), (24, 40, 2), (40, 80, 2), (80, 80, 1)]
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU(),
        *[_MBConv(a, b, s) for a, b, s in widths],
        nn.Conv2d(80, 320, 1, bias=False), nn.BatchNorm2d(320), nn.SiLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(320, 1000))


def _effnet():
    import torch
    smoke = _device() == "cpu"
    torch.manual_seed(0)
    try:
        import timm
        model = timm.create_model("efficientnet_b0")
    except ImportError:
        model = _small_effnet()
    model = model.to(_device()).train()
    g = torch.Generator().manual_seed(0)
    n, side = (2, 16) if smoke else (16, 224)
    x = torch.randn(n, 3, side, side, generator=g).to(_device())
    labels = torch.randint(0, 1000, (n,), generator=g).to(_device())

    def step(m):
        loss = torch.nn.functional.cross_entropy(m(x), labels)
        loss.backward()
        return loss.item()
    return model, step, "triton"


def _gpt2_1x32():
    return _gpt2(1, 32)


def _gpt2_1x8():
    return _gpt2(1, 8)


MODELS = {"gpt2": _gpt2, "gpt2_1x32": _gpt2_1x32, "gpt2_1x8": _gpt2_1x8, "mlp": _mlp, "mlp_aot": _mlp_aot, "llama": _llama, "effnet": _effnet}
# Rows of the triton backend on CUDA (skipped without it; --smoke: the CPU, interpreted)
CUDA_MODELS = ("llama", "effnet")


def child(variant, model_name, cache):
    if variant == "frametrace":
        os.environ["FRAMETRACE_CACHE_DIR"] = cache
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    # (Triton's compiled binaries: cold in a cold process, for either compiler)
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    if os.environ.get("WARM_START_SMOKE"):
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    torch.set_num_threads(1)        # (a shared machine: one thread measures steadier)
    model, step, backend = MODELS[model_name]()
    if backend == "triton" and variant != "frametrace":
        backend = "inductor"
    if variant == "eager":
        # (the baseline: the model itself, uncompiled, in a process prepared as frametrace's
        # -- the same imports, untimed -- so that its first call shows torch's own
        # first-call cost in a fresh process)
        sys.path.insert(0, ROOT)
        import frametrace  # noqa: F401
        import torch._functorch.aot_autograd  # noqa: F401
        compiled = model
    elif variant == "frametrace":
        sys.path.insert(0, ROOT)
        import frametrace
        if backend != "eager" and not os.environ.get("WARM_START_TIME_AOT_IMPORT"):
            # (AOTAutograd's import, which is torch._dynamo's, 2.7 s here: untimed, as the
            # torch.compile child's `import torch._dynamo`; a process pays it once, cold
            # or warm, at its first aot_eager compile)
            import torch._functorch.aot_autograd  # noqa: F401
        compiled = frametrace.optimize(model, backend=backend)
        import logging

        class _Keep(logging.Handler):     # (why a restored module was compiled again)
            def emit(self, record):
                whys.append(record.getMessage()[:400])
        whys = []
        logging.getLogger("frametrace.cache").addHandler(_Keep(logging.WARNING))
    else:
        import torch._dynamo  # noqa: F401  (imports, untimed, as frametrace's)
        compiled = torch.compile(model, backend=backend)
    profile = int(os.environ.get("WARM_START_PROFILE", "0")) if variant == "frametrace" else 0
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step(compiled)
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    if profile:
        import io
        import pstats
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(profile)
        print(text.getvalue(), file=sys.stderr)
    second = second_cpu = float("inf")
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        step(compiled)
        second = min(second, time.perf_counter() - t0)
        second_cpu = min(second_cpu, time.process_time() - c0)
    extra = {}
    if variant == "frametrace":
        extra = dict(frametrace.warm_cache.stats)
        if backend == "triton":
            from frametrace.backends.triton import autotune, backend as triton_backend, tune_cache
            from frametrace.backends.triton import result_cache
            extra.update(recompiled=result_cache.STATS["recompiled"], cache_warnings=whys,
                         timed=autotune.STATS["timed"], tune_hits=tune_cache.STATS["hits"],
                         tune_stores=tune_cache.STATS["stores"],
                         eager_graphs=triton_backend.STATS["eager_graphs"],
                         # (our pipeline: builds = lowering + scheduling + codegen; restored =
                         # modules rebuilt from the result cache instead)
                         builds=triton_backend.PIPELINE["builds"],
                         build_s=triton_backend.PIPELINE["build_seconds"],
                         restored=triton_backend.PIPELINE["restored"],
                         restore_s=triton_backend.PIPELINE["restore_seconds"])
    else:
        from torch._dynamo.utils import counters
        extra = {"aot_autograd": dict(counters["aot_autograd"])}    # (its cache's hits, misses)
    print("RESULT", json.dumps({"first": first, "second": second, "first_cpu": first_cpu,
                                "second_cpu": second_cpu, "loss": loss, **extra}))


def _measure(variant, model_name, cache):
    logs = os.environ.get("WARM_START_LOGDIR")     # (each child's stderr kept there)

    def keep(stderr):
        if logs:
            os.makedirs(logs, exist_ok=True)
            n = len(os.listdir(logs))
            with open(os.path.join(logs, f"{n:02d}-{model_name}-{variant}.err"), "w") as f:
                f.write(stderr)
    got = run_child(__file__, ["--child", variant, model_name, cache], 600, on_stderr=keep)
    if "error" in got:
        raise RuntimeError(f"{variant} {model_name} failed:\n{got['error']}")
    return got


def _ratio(warm, cold, eager_first):
    """The compile cost's share left warm: (warm - eager's first call) / (cold - eager's)."""
    return None if eager_first is None else (warm - eager_first) / (cold - eager_first)


def _pct(x):
    return "   n/a" if x is None else f"{x:6.1%}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2,mlp")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=None)
    ap.add_argument("--compilers", default="frametrace,torch.compile")
    ap.add_argument("--child", nargs=3, default=None)
    ap.add_argument("--no-eager", action="store_true",
                    help="no eager baseline (its first call in a fresh process: the compile-cost ratio)")
    ap.add_argument("--smoke", action="store_true",
                    help="the triton rows on the CPU, tiny, interpreted (frametrace only)")
    ns = ap.parse_args()
    if ns.child:
        child(*ns.child)
        return
    if ns.smoke:
        os.environ["WARM_START_SMOKE"] = "1"
    rows = []
    for model_name in ns.models.split(","):
        if model_name in CUDA_MODELS and not ns.smoke:
            if not torch.cuda.is_available():
                print(f"{model_name:6} skipped: the triton backend's rows need CUDA", flush=True)
                continue
        variants = ("frametrace",) if ns.smoke else tuple(ns.compilers.split(","))
        eager = eager_cpu = None     # (eager's first call in a fresh process: wall, CPU seconds)
        if not (ns.smoke or ns.no_eager):
            runs = []
            for _ in range(ns.repeat):
                with tempfile.TemporaryDirectory(prefix="warm-start-") as cache:
                    runs.append(_measure("eager", model_name, cache))
            e, es, ec, ecs = (statistics.median(r[k] for r in runs)
                              for k in ("first", "second", "first_cpu", "second_cpu"))
            eager, eager_cpu = e, ec
            # (torch's own first-call cost in a fresh process: what a compiled first call pays
            # too, warm or cold)
            print(f"{model_name:5} {'eager':13} first call {e:7.3f}s  steady call {es:.3f}s  first-call "
                  f"cost {e - es:.3f}s;  CPU time: first call {ec:7.3f}s  steady call {ecs:.3f}s  "
                  f"first-call cost {ec - ecs:.3f}s", flush=True)
        for variant in variants:
            colds, warms, steady, hits, backend_hits = [], [], [], [], []
            cpu = []        # (cold first, warm first, warm steady: CPU seconds, this process)
            for _ in range(ns.repeat):
                with tempfile.TemporaryDirectory(prefix="warm-start-") as cache:
                    cold = _measure(variant, model_name, cache)
                    warm = _measure(variant, model_name, cache)
                    tol = 1e-3 if model_name in CUDA_MODELS else 1e-4
                    assert abs(cold["loss"] - warm["loss"]) <= tol * max(1.0, abs(cold["loss"])), (cold, warm)
                if "timed" in warm:     # (the triton backend: what the warm process reused)
                    print(f"{model_name:6} {variant:13} warm: {warm['hits']} entries from the cache, "
                          f"{warm['tune_hits']} autotuning choices from the cache, {warm['timed']} "
                          f"candidates timed (cold: {cold['timed']}, {cold['tune_stores']} choices "
                          f"stored); graphs run without kernels {warm['eager_graphs']}", flush=True)
                    print(f"{model_name:6} {variant:13} backend result from the cache: "
                          f"{'yes' if warm['backend_hits'] and not warm['builds'] else 'NO'} "
                          f"({warm['backend_hits']} of {warm['hits']} entries); pipeline (lowering "
                          f"+ scheduling + codegen): cold {cold['builds']} builds {cold['build_s']:.3f}s, "
                          f"warm {warm['builds']} builds {warm['build_s']:.3f}s + {warm['restored']} "
                          f"modules restored {warm['restore_s']:.3f}s, compiled again "
                          f"{warm['recompiled']}", flush=True)
                    for why in warm["cache_warnings"]:
                        print(f"{model_name:6} {variant:13}   cache: {why}", flush=True)
                cpu.append((cold["first_cpu"], warm["first_cpu"], warm["second_cpu"]))
                colds.append(cold["first"])
                warms.append(warm["first"])
                steady.append(warm["second"])
                hits.append(warm.get("hits"))
                backend_hits.append(warm.get("backend_hits", warm.get("aot_autograd")))
            c, w, st = statistics.median(colds), statistics.median(warms), statistics.median(steady)
            cc, cw, cs = (statistics.median(x) for x in zip(*cpu))
            rows.append((model_name, variant, c, w, w / c, st, hits[-1], eager, _ratio(w, c, eager),
                         cc, cw, cs, eager_cpu, _ratio(cw, cc, eager_cpu)))
            # (first call minus a steady call: what compiling, or loading, cost; the compile-cost
            # ratio: the warm first call's cost beyond eager's own first call in a fresh process,
            # over the cold one's)
            print(f"{model_name:5} {variant:13} cold {c:7.3f}s  warm {w:7.3f}s  "
                  f"warm/cold {w / c:6.1%}  steady call {st:.3f}s  compile cost cold "
                  f"{c - st:.3f}s warm {w - st:.3f}s  (warm - eager first)/(cold - eager first) "
                  f"{_pct(_ratio(w, c, eager))}"
                  + (f"  cache hits {hits[-1]}" if hits[-1] is not None else "")
                  + f"  backend cache {backend_hits[-1]}", flush=True)
            # (CPU time of the process's main thread and its others: steadier than the wall
            # clock on a loaded machine)
            print(f"{model_name:5} {variant:13} CPU time: cold {cc:7.3f}s  warm {cw:7.3f}s  "
                  f"warm/cold {cw / cc:6.1%}  steady call {cs:.3f}s  compile cost cold "
                  f"{cc - cs:.3f}s warm {cw - cs:.3f}s  (warm - eager first)/(cold - eager first) "
                  f"{_pct(_ratio(cw, cc, eager_cpu))}", flush=True)
        mine = [r for r in rows if r[0] == model_name]
        if len(mine) == 2:      # (issue 33: warm <= 10% of cold, and <= torch.compile's warm)
            print(f"{model_name:5} frametrace warm / torch.compile warm {mine[0][3] / mine[1][3]:6.1%}"
                  f"  (frametrace warm/cold {mine[0][4]:.1%}, torch.compile warm/cold "
                  f"{mine[1][4]:.1%}); CPU time {mine[0][10] / mine[1][10]:6.1%}", flush=True)
    if ns.md:
        with open(ns.md, "w") as fh:
            fh.write("| model | compiler | seconds | cold first call | warm first call | warm/cold |"
                     " steady call | compile cost cold / warm | eager first call |"
                     " (warm - eager first) / (cold - eager first) |\n")
            fh.write("|---|---|---|---|---|---|---|---|---|---|\n")
            for m, v, *both in rows:
                for kind, (c, w, s, e, k) in (("wall", (both[0], both[1], both[3], both[5], both[6])),
                                              ("CPU", both[7:])):
                    fh.write(f"| {m} | {v} | {kind} | {c:.3f} s | {w:.3f} s | {w / c:.1%} | {s:.3f} s | "
                             f"{c - s:.3f} s / {w - s:.3f} s | "
                             f"{'-' if e is None else f'{e:.3f} s'} | {_pct(k).strip()} |\n")


if __name__ == "__main__":
    main()
