"""GPU kernel time of frametrace's `triton` backend against eager and torch.compile
(Inductor), measured interleaved in one run, with each one's ratio to the memory-traffic
floor (bytes read once + bytes written once, over 4.3 TB/s, the copy bandwidth measured
on the H200) and, for whole models, the speedup over eager.  Kernel cases time CUDA-graph
replays of 10 calls (kernel time, no per-call Python); models time plain calls.

    python benchmarks/triton_kernels.py [--cases gelu,softmax,...] [--quick] [--md FILE]
                                        [--ablate welford_mean,eviction_hints]

`--ablate` times frametrace again with each named config switch off (or, as
`name=N&name2=M`, with those settings), interleaved with the rest: a fast path's gain,
measured.

Cases: gelu (gelu(x*w+b), x, w and b all 8192x8192 bf16: 4 x 128 MB moved), gelu_bcast (the
same with w and b vectors of 8192, broadcast; erf's cost shows), gelu_libdevice /
gelu_bcast_libdevice (with libdevice's erf), rmsnorm (add + RMSNorm 16384x4096 bf16), softmax
(8192x8192 bf16), swiglu (silu(a)*b 8192x14336 bf16), layernorm (16384x4096 bf16),
llama (HF LLaMA, 8 layers, hidden 2048) and gpt2 (HF GPT-2 default config), forward in
bf16, batch 8 x sequence 512, use_cache=False, no_grad.

Issue-13 cases (bf16 unless said): colsum (x.sum(0), 8192x8192 fp32), mean_mid (mean over
dim 1 of 64x1024x1024), channel_stats (var_mean over (0,2,3) of NCHW 64x256x56x56),
transpose_add (x.t() + y, 8192x8192), nchw_to_nhwc (64x256x56x56 to channels_last),
bn_relu (inference BatchNorm + ReLU, NCHW 64x256x56x56), cumsum (last dim of 8192x4096),
cross_entropy (8192 rows x 32000 classes, mean), conv_epilogue (3x3 conv 256->256 on
64x256x56x56 + bias + BatchNorm + ReLU + residual; the conv is cuDNN's, no floor), bntrain
(training batch_norm of 64x256x56x56), fullsum (x.float().sum(), 8192x8192).
Issue-31 cases: groupnorm_silu (SiLU of group_norm, 32 groups with weight and bias, NCHW
32x512x64x64 fp16), l2norm (F.normalize(x, dim=-1), 16384x4096 fp32), dropout_residual
(x + F.dropout(y, 0.1, training=True), 16384x4096 bf16; the floor reads x and y and writes
the sum, no mask), kl_div (batchmean KL of two log_softmaxes, log_target, 4096x32000 bf16),
masked_mean ((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), h 64x512x1024 bf16,
mask 64x512 bf16 of 0/1), maxpool (F.max_pool2d(x, 3, 2, padding=1), NCHW 64x256x112x112).
Whole models: bert (HF BERT-base, 8x512), vit (HF ViT-base, 64x224x224), t5 (HF T5-small,
encoder 8x512 + decoder 8x128), gpt2_decode (HF GPT-2, batch 1, one new token over a 128-token
cache, no graph capture by the benchmark: per-call latency), resnet50 and convnext_tiny (timm,
batch 64, 224x224).  Every case runs in its own process (a CUDA fault costs one row); a row
counts whole-graph eager fallbacks and CUDA errors.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

import frametrace

BANDWIDTH = 4.3e12
KERNELS = ("gelu", "gelu_bcast", "rmsnorm", "softmax", "swiglu", "layernorm",
           "colsum", "mean_mid", "channel_stats", "transpose_add", "nchw_to_nhwc", "bn_relu",
           "cumsum", "cross_entropy", "conv_epilogue", "bntrain", "fullsum",
           "groupnorm_silu", "l2norm", "dropout_residual", "kl_div", "masked_mean", "maxpool")
MODELS = ("llama", "gpt2", "bert", "vit", "t5", "gpt2_decode", "resnet50", "convnext_tiny")
NO_FLOOR = ("conv_epilogue",)   # compute-bound: no memory floor
# random cases: each variant draws its own numbers, so the error compared is that of the
# fraction of elements dropped (out == x exactly where y was dropped), not of the values
RANDOM = {"dropout_residual": lambda out, x, y: (out == x).float().mean()}


def rms_norm(h, w, eps=1e-6):
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * w


def add_rms_norm(x, residual, w):
    h = x + residual
    return h, rms_norm(h, w)


def kernel_case(name):
    """(function, inputs) of a kernel case."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    if name in ("gelu", "gelu_bcast"):
        wb = (8192,) if name == "gelu_bcast" else (8192, 8192)
        return (lambda x, w, b: F.gelu(x * w + b)), [torch.randn(8192, 8192, **bf),
                                                     torch.randn(*wb, **bf), torch.randn(*wb, **bf)]
    if name == "rmsnorm":
        return add_rms_norm, [torch.randn(16384, 4096, **bf), torch.randn(16384, 4096, **bf),
                              torch.randn(4096, **bf)]
    if name == "softmax":
        return (lambda x: torch.softmax(x, -1)), [torch.randn(8192, 8192, **bf)]
    if name == "swiglu":
        return (lambda a, b: F.silu(a) * b), [torch.randn(8192, 14336, **bf), torch.randn(8192, 14336, **bf)]
    if name == "layernorm":
        w, b = torch.randn(4096, **bf), torch.randn(4096, **bf)
        return (lambda x: F.layer_norm(x, (4096,), w, b)), [torch.randn(16384, 4096, **bf)]
    if name == "colsum":
        return (lambda x: x.sum(0)), [torch.randn(8192, 8192, device="cuda")]
    if name == "mean_mid":
        return (lambda x: x.mean(1)), [torch.randn(64, 1024, 1024, **bf)]
    if name == "channel_stats":
        return (lambda x: torch.var_mean(x, (0, 2, 3))), [torch.randn(64, 256, 56, 56, **bf)]
    if name == "transpose_add":
        return (lambda x, y: x.t() + y), [torch.randn(8192, 8192, **bf), torch.randn(8192, 8192, **bf)]
    if name == "nchw_to_nhwc":
        return (lambda x: x.contiguous(memory_format=torch.channels_last)), [torch.randn(64, 256, 56, 56, **bf)]
    if name in ("bn_relu", "conv_epilogue"):
        c = 256
        mean, var = torch.randn(c, **bf) * 0.1, torch.rand(c, **bf) + 0.5
        g, b = torch.randn(c, **bf), torch.randn(c, **bf)
        if name == "bn_relu":
            return (lambda x: F.relu(F.batch_norm(x, mean, var, g, b, False))), \
                [torch.randn(64, c, 56, 56, **bf)]
        w, bias = torch.randn(c, c, 3, 3, **bf) * 0.02, torch.randn(c, **bf)
        return (lambda x: F.relu(F.batch_norm(F.conv2d(x, w, bias, padding=1), mean, var, g, b, False) + x)), \
            [torch.randn(64, c, 56, 56, **bf)]
    if name == "bntrain":
        rm, rv = torch.zeros(256, device="cuda"), torch.ones(256, device="cuda")
        w, b = torch.randn(256, **bf), torch.randn(256, **bf)
        return (lambda x: F.batch_norm(x, rm, rv, w, b, training=True)), \
            [torch.randn(64, 256, 56, 56, **bf)]
    if name == "fullsum":
        return (lambda x: x.float().sum()), [torch.randn(8192, 8192, **bf)]
    if name == "cumsum":
        return (lambda x: torch.cumsum(x, -1)), [torch.randn(8192, 4096, **bf)]
    if name == "cross_entropy":
        return (lambda logits, t: F.cross_entropy(logits, t)), [
            torch.randn(8192, 32000, **bf), torch.randint(0, 32000, (8192,), device="cuda")]
    if name == "groupnorm_silu":
        hf = dict(device="cuda", dtype=torch.float16)
        w, b = torch.randn(512, **hf), torch.randn(512, **hf)
        return (lambda x: F.silu(F.group_norm(x, 32, w, b))), [torch.randn(32, 512, 64, 64, **hf)]
    if name == "l2norm":
        return (lambda x: F.normalize(x, dim=-1)), [torch.randn(16384, 4096, device="cuda")]
    if name == "dropout_residual":
        return (lambda x, y: x + F.dropout(y, 0.1, training=True)), \
            [torch.randn(16384, 4096, **bf), torch.randn(16384, 4096, **bf)]
    if name == "kl_div":
        return (lambda a, b: F.kl_div(F.log_softmax(a, -1), F.log_softmax(b, -1), log_target=True,
                                      reduction="batchmean")), \
            [torch.randn(4096, 32000, **bf), torch.randn(4096, 32000, **bf)]
    if name == "masked_mean":
        mask = (torch.rand(64, 512, device="cuda") < 0.8).to(torch.bfloat16)
        mask[:, 0] = 1   # no empty row
        return (lambda h, m: (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)), \
            [torch.randn(64, 512, 1024, **bf), mask]
    if name == "maxpool":
        return (lambda x: F.max_pool2d(x, 3, 2, padding=1)), [torch.randn(64, 256, 112, 112, **bf)]
    raise ValueError(name)


def model_case(name):
    import transformers
    torch.manual_seed(0)
    if name == "llama":
        cfg = transformers.LlamaConfig(num_hidden_layers=8, hidden_size=2048, intermediate_size=5632,
                                       num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                       max_position_embeddings=1024)
        model = transformers.LlamaModel(cfg)
    else:
        model = transformers.GPT2Model(transformers.GPT2Config())
    if name not in ("llama", "gpt2"):
        return other_model(name)
    model = model.cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, 32000 if name == "llama" else 50257, (8, 512), device="cuda")

    def fn(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state
    return fn, [ids], model


def other_model(name):
    import transformers
    cuda = dict(device="cuda")
    if name in ("resnet50", "convnext_tiny"):
        import timm
        model = timm.create_model(name).cuda().to(torch.bfloat16).eval()
        return (lambda x: model(x)), [torch.randn(64, 3, 224, 224, dtype=torch.bfloat16, **cuda)], model
    if name == "bert":
        model = transformers.BertModel(transformers.BertConfig())
        model = model.cuda().to(torch.bfloat16).eval()
        return (lambda ids: model(input_ids=ids).last_hidden_state), \
            [torch.randint(0, 30522, (8, 512), **cuda)], model
    if name == "vit":
        model = transformers.ViTModel(transformers.ViTConfig()).cuda().to(torch.bfloat16).eval()
        return (lambda px: model(pixel_values=px).last_hidden_state), \
            [torch.randn(64, 3, 224, 224, dtype=torch.bfloat16, **cuda)], model
    if name == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config())  # t5-small sizes
        model = model.cuda().to(torch.bfloat16).eval()
        return (lambda ids, dec: model(input_ids=ids, decoder_input_ids=dec).logits), \
            [torch.randint(0, 32000, (8, 512), **cuda), torch.randint(0, 32000, (8, 128), **cuda)], model
    if name == "gpt2_decode":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda().to(torch.bfloat16).eval()
        prompt = torch.randint(0, 50257, (1, 128), **cuda)
        with torch.no_grad():
            cache = model(input_ids=prompt, use_cache=True).past_key_values
        pos = torch.tensor([[128]], **cuda)

        def step(tok):
            # one decode step over the 128-token cache; the cache is cropped back after the
            # step so that every call sees the same shapes (a static graph)
            out = model(input_ids=tok, past_key_values=cache, position_ids=pos, use_cache=True).logits
            return out
        step.after = lambda: cache.crop(128)
        return step, [torch.randint(0, 50257, (1, 1), **cuda)], model
    raise ValueError(name)


def nbytes(tensors) -> int:
    flat = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))


def as_graph(fn, args, iters):
    """`iters` calls of fn captured as one CUDA graph: kernel time without the Python
    around each call (guards, wrappers, launches), the same for all three."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn(*args)
    return lambda *a: graph.replay()


def time_interleaved(fns: dict, args, rounds: int, iters: int, graphs: bool) -> dict:
    """Median milliseconds per call of each fn, measured round-robin with CUDA events;
    with `graphs`, each round replays `iters` calls captured as a CUDA graph."""
    runs = {k: (as_graph(fn, args, iters), 1) if graphs else (fn, iters) for k, fn in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, (fn, n) in runs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn(*args)
            end.record()
            end.synchronize()
            times[k].append(start.elapsed_time(end) / iters)
    return {k: statistics.median(v) for k, v in times.items()}


def rel_err(got, ref) -> float:
    got, ref = [t.float() for t in (got if isinstance(got, (list, tuple)) else [got])], \
        [t.float() for t in (ref if isinstance(ref, (list, tuple)) else [ref])]
    return max(((g - r).norm() / r.norm().clamp_min(1e-12)).item() for g, r in zip(got, ref))


def compile_variants(fn, ablate=()):
    """eager, frametrace and Inductor of `fn`; and for each name in `ablate`, frametrace
    with that `frametrace.backends.triton.config` switch off (a fresh copy of a function's
    code, so that it compiles apart; the switch is off during each of its calls)."""
    from frametrace.backends.triton import backend, config, last_compiled
    backend.COMPILED.clear()
    frametrace.reset()
    torch._dynamo.reset()
    ft = frametrace.optimize(backend="triton")(fn)
    tc = torch.compile(fn)
    fns = {"eager": fn, "frametrace": ft, "inductor": tc}
    for i, variant in enumerate(ablate):
        settings = {}
        for item in variant.split("&"):
            name, _, value = item.partition("=")
            if not hasattr(config, name):
                raise SystemExit(f"--ablate: frametrace.backends.triton.config has no {name!r}")
            settings[name] = type(getattr(config, name))(int(value)) if value else False
        if not isinstance(fn, types.FunctionType):
            raise SystemExit("--ablate takes kernel cases (functions), not models")
        copy = types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_variant{i}"),
                                  fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        compiled = frametrace.optimize(backend="triton")(copy)

        def under(*a, compiled=compiled, settings=settings):
            saved = {k: getattr(config, k) for k in settings}
            for k, v in settings.items():
                setattr(config, k, v)
            try:
                return compiled(*a)
            finally:
                for k, v in saved.items():
                    setattr(config, k, v)
        fns[variant if "=" in variant else f"no {variant}"] = under
    return fns, last_compiled


class FallbackCount(logging.Handler):
    """Counts the triton backend's whole-graph fallbacks (eager or aot_eager)."""
    def __init__(self):
        super().__init__(logging.INFO)
        self.reasons = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("triton backend") and ("runs eagerly" in msg or "runs with aot_eager" in msg):
            self.reasons.append(msg)


def run_case(name, args_ns):
    is_model = name in MODELS
    if is_model:
        fn, inputs, _ = model_case(name)
    else:
        fn, inputs = kernel_case(name.replace("_libdevice", ""))
    from frametrace.backends.triton import backend, config
    config.fast_erf = not name.endswith("_libdevice")  # libdevice's erf for every dtype
    fallbacks = FallbackCount()
    logging.getLogger("frametrace").addHandler(fallbacks)
    logging.getLogger("frametrace").setLevel(logging.INFO)
    fns, last_compiled = compile_variants(fn, [a for a in args_ns.ablate.split(",") if a])
    after = getattr(fn, "after", None)
    if after is not None:  # state the step changes, put back after every call (outside the timing's compiled code)
        fns = {k: (lambda *a, f=f: (f(*a), after())[0]) for k, f in fns.items()}
    with torch.no_grad():
        t0 = time.perf_counter()
        outs = {k: f(*inputs) for k, f in fns.items()}   # compiles, tunes
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        for f in fns.values():  # warm-up (and CUDA graph capture on the third call)
            for _ in range(3):
                f(*inputs)
        torch.cuda.synchronize()
        stat = RANDOM.get(name)
        if stat is not None:
            outs_cmp = {k: stat(o, *inputs).reshape(1) for k, o in outs.items()}
        else:
            outs_cmp = outs
        errs = {k: rel_err(outs_cmp[k], outs_cmp["eager"]) for k in fns if k != "eager"}
        rounds, iters = (5, 3) if args_ns.quick else ((15, 5) if is_model else (25, 10))
        ms = time_interleaved(fns, inputs, rounds, iters, graphs=not is_model)
    mod = last_compiled()
    if mod is not None and is_model:
        import collections
        print(name, "aten calls:", dict(collections.Counter(mod.externs)), flush=True)
    floor_ms = (nbytes(inputs) + nbytes(outs["eager"])) / BANDWIDTH * 1e3
    info = {"kernels": sum(len(m.kernels) for m in backend.COMPILED),
            "unique": len({k for m in backend.COMPILED for k in m.unique_kernels}),
            "externs": sum(len(m.externs) for m in backend.COMPILED),
            "cudagraph": bool(mod and mod.runner and mod.runner.graph is not None),
            "fast": bool(mod and mod.fast),
            "graphs": len(backend.COMPILED),
            "eager_fallbacks": len(fallbacks.reasons),
            # the wrapper's measured host cost per launch, and the CUDA-graph decision
            "launch_us": mod.runner.launch_us if mod and mod.runner else None,
            "graph_decision": mod.runner.decision if mod and mod.runner else None,
            "fallback_reasons": fallbacks.reasons[:3],
            "compile_s": compile_s}
    return ms, floor_ms, errs, info


HEAD = ("| case | eager ms | frametrace ms | inductor ms | floor ms | frametrace/inductor | eager/floor | "
        "frametrace/floor | inductor/floor | ft vs eager | inductor vs eager | ft kernels | "
        "eager fallbacks | ft rel err | ind rel err |")


def row(name, ms, floor, errs, info) -> str:
    e, f, i = ms["eager"], ms["frametrace"], ms["inductor"]
    no_floor = name in MODELS or name in NO_FLOOR
    launch = "" if info.get("launch_us") is None else f", {info['launch_us']:.1f} us/launch"
    ratios = " | ".join("-" if no_floor else f"{t / floor:.2f}" for t in (e, f, i))
    return (f"| {name} | {e:.3f} | {f:.3f} | {i:.3f} | {'-' if no_floor else f'{floor:.3f}'} | "
            f"{f / i:.2f} | {ratios} | {e / f:.2f}x | {e / i:.2f}x | {info['kernels']} "
            f"({info['unique']} unique, {info['externs']} aten{', cudagraph' if info['cudagraph'] else ''}"
            f"{', fast launch' if info['fast'] else ''}, {info['graphs']} graph"
            f"{launch}) | "
            f"{info['eager_fallbacks']} | {errs['frametrace']:.1e} | {errs['inductor']:.1e} |")


def child(name, args) -> None:
    """Runs one case in this process and prints its row as a JSON line."""
    import json
    ms, floor, errs, info = run_case(name, args)
    for k in ms:
        if k not in ("eager", "frametrace", "inductor"):
            print(f"{name}: frametrace with {k}: {ms[k]:.4f} ms (with it {ms['frametrace']:.4f}, "
                  f"inductor {ms['inductor']:.4f}; rel err {errs[k]:.1e})", flush=True)
    print("ROW " + json.dumps({"row": row(name, ms, floor, errs, info), "info": info}), flush=True)


def isolated(name, argv, timeout) -> str:
    """One case in a child process: a CUDA fault or a hang costs that row only."""
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from children import last_line, run_child
    got = run_child(__file__, ["--child", name] + argv, timeout, marker="ROW", echo_stdout=True,
                    failed_stderr=3000)
    if got.get("error") == "timed out":
        return f"| {name} | timed out after {timeout} s |"
    if "error" not in got:
        for why in got["info"]["fallback_reasons"]:
            print(f"{name}: eager fallback: {why}", flush=True)
        if got["info"].get("graph_decision"):
            print(f"{name}: CUDA graph: {got['info']['graph_decision']}", flush=True)
        return got["row"]
    tail = last_line(got["stderr"])
    cuda = " (CUDA error)" if "CUDA" in got["stderr"] or "cuda" in tail else ""
    return f"| {name} | failed{cuda}: {tail[:200]} |"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(KERNELS + MODELS))
    p.add_argument("--quick", action="store_true", help="fewer timing rounds")
    p.add_argument("--md", help="also write the table as markdown to this file")
    p.add_argument("--no-cudagraphs", action="store_true")
    p.add_argument("--no-fast-launch", action="store_true", help="launch through Triton's JIT")
    p.add_argument("--timeout", type=int, default=300, help="seconds per case")
    p.add_argument("--ablate", default="", help="comma-separated config switches: each also "
                   "timed off, interleaved with the rest (kernel cases only)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    from frametrace.backends.triton import config
    config.cudagraphs = not args.no_cudagraphs
    config.fast_launch = not args.no_fast_launch
    if args.child:
        return child(args.child, args)
    import triton
    if args.ablate and any(c in MODELS for c in args.cases.split(",")):
        raise SystemExit("--ablate takes kernel cases (functions), not models")
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    rows = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    argv = [a for a in ("--quick", "--no-cudagraphs", "--no-fast-launch")
            if getattr(args, a[2:].replace("-", "_"))]
    if args.ablate:
        argv += ["--ablate", args.ablate]
    for name in args.cases.split(","):
        rows.append(isolated(name, argv, args.timeout))
        print(rows[-1], flush=True)
    print("\n".join(rows))
    if args.md:
        with open(args.md, "w") as fh:
            fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
