"""GPU kernel time of frametrace's `triton` backend against eager and torch.compile
(Inductor), measured interleaved in one run, with each one's ratio to the memory-traffic
floor (bytes read once + bytes written once, over 4.3 TB/s, the copy bandwidth measured
on the H200) and, for whole models, the speedup over eager.  Kernel cases time CUDA-graph
replays of 10 calls (kernel time, no per-call Python); models time plain calls.

    python benchmarks/triton_kernels.py [--cases gelu,softmax,...] [--quick] [--md FILE]

Cases: gelu (gelu(x*w+b), x, w and b all 8192x8192 bf16: 4 x 128 MB moved), gelu_bcast (the
same with w and b vectors of 8192, broadcast; erf's cost shows), gelu_libdevice /
gelu_bcast_libdevice (with libdevice's erf), rmsnorm (add + RMSNorm 16384x4096 bf16), softmax
(8192x8192 bf16), swiglu (silu(a)*b 8192x14336 bf16), layernorm (16384x4096 bf16),
colsum (x.sum(0), 8192x8192 fp32), midmean (x.mean(1), 32x2048x1024 bf16), bnstats
(var_mean over (0, 2, 3) of 64x256x56x56 bf16), bntrain (training batch_norm of it), fullsum
(x.float().sum(), 8192x8192 bf16), llama (HF LLaMA, 8 layers, hidden 2048) and gpt2 (HF GPT-2 default config), forward in
bf16, batch 8 x sequence 512, use_cache=False, no_grad.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import frametrace

BANDWIDTH = 4.3e12
KERNELS = ("gelu", "gelu_bcast", "rmsnorm", "softmax", "swiglu", "layernorm")
# reductions over other axes than the last: outer (column sum, middle-dim mean) and split
# (few outputs: per-channel statistics, a full sum)
REDUCTIONS = ("colsum", "midmean", "bnstats", "bntrain", "fullsum")
MODELS = ("llama", "gpt2")


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
    if name == "midmean":
        return (lambda x: x.mean(1)), [torch.randn(32, 2048, 1024, **bf)]
    if name == "bnstats":
        return (lambda x: torch.var_mean(x, (0, 2, 3))), [torch.randn(64, 256, 56, 56, **bf)]
    if name == "bntrain":
        rm, rv = torch.zeros(256, device="cuda"), torch.ones(256, device="cuda")
        w, b = torch.randn(256, **bf), torch.randn(256, **bf)
        return (lambda x: F.batch_norm(x, rm, rv, w, b, training=True)), \
            [torch.randn(64, 256, 56, 56, **bf)]
    if name == "fullsum":
        return (lambda x: x.float().sum()), [torch.randn(8192, 8192, **bf)]
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
    model = model.cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, 32000 if name == "llama" else 50257, (8, 512), device="cuda")

    def fn(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state
    return fn, [ids], model


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


def compile_variants(fn):
    from frametrace.backends.triton import backend, last_compiled
    backend.COMPILED.clear()
    frametrace.reset()
    torch._dynamo.reset()
    ft = frametrace.optimize(backend="triton")(fn)
    tc = torch.compile(fn)
    return {"eager": fn, "frametrace": ft, "inductor": tc}, last_compiled


def run_case(name, args_ns):
    is_model = name in MODELS
    if is_model:
        fn, inputs, _ = model_case(name)
    else:
        fn, inputs = kernel_case(name.replace("_libdevice", ""))
    from frametrace.backends.triton import backend, config
    config.fast_erf = not name.endswith("_libdevice")  # libdevice's erf for every dtype
    fns, last_compiled = compile_variants(fn)
    with torch.no_grad():
        t0 = time.perf_counter()
        outs = {k: f(*inputs) for k, f in fns.items()}   # compiles, tunes
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        for f in fns.values():  # warm-up (and CUDA graph capture on the third call)
            for _ in range(3):
                f(*inputs)
        torch.cuda.synchronize()
        errs = {k: rel_err(outs[k], outs["eager"]) for k in ("frametrace", "inductor")}
        rounds, iters = (5, 3) if args_ns.quick else ((15, 5) if is_model else (25, 10))
        ms = time_interleaved(fns, inputs, rounds, iters, graphs=not is_model)
    mod = last_compiled()
    if mod is not None and is_model:
        import collections
        print(name, "aten calls:", dict(collections.Counter(mod.externs)), flush=True)
    floor_ms = (nbytes(inputs) + nbytes(outs["eager"])) / BANDWIDTH * 1e3
    info = {"kernels": len(mod.kernels) if mod else 0,
            "unique": len(mod.unique_kernels) if mod else 0,
            "externs": len(mod.externs) if mod else 0,
            "cudagraph": bool(mod and mod.runner and mod.runner.graph is not None),
            "fast": bool(mod and mod.fast),
            "graphs": len(backend.COMPILED),
            "compile_s": compile_s}
    return ms, floor_ms, errs, info


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(KERNELS + REDUCTIONS + MODELS))
    p.add_argument("--quick", action="store_true", help="fewer timing rounds")
    p.add_argument("--md", help="also write the table as markdown to this file")
    p.add_argument("--no-cudagraphs", action="store_true")
    p.add_argument("--no-fast-launch", action="store_true", help="launch through Triton's JIT")
    args = p.parse_args()
    from frametrace.backends.triton import config
    config.cudagraphs = not args.no_cudagraphs
    config.fast_launch = not args.no_fast_launch
    import triton
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    head = ("| case | eager ms | frametrace ms | inductor ms | floor ms | eager/floor | "
            "frametrace/floor | inductor/floor | ft vs eager | inductor vs eager | ft kernels | "
            "ft rel err | ind rel err |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for name in args.cases.split(","):
        try:
            ms, floor, errs, info = run_case(name, args)
        except Exception as e:  # keep the other cases' numbers
            import traceback
            traceback.print_exc()
            print(f"{name}: failed: {e!r}", file=sys.stderr)
            continue
        e, f, i = ms["eager"], ms["frametrace"], ms["inductor"]
        ratios = " | ".join("-" if name in MODELS else f"{t / floor:.2f}" for t in (e, f, i))
        row = (f"| {name} | {e:.3f} | {f:.3f} | {i:.3f} | {'-' if name in MODELS else f'{floor:.3f}'} | "
               f"{ratios} | {e / f:.2f}x | {e / i:.2f}x | {info['kernels']} ({info['unique']} unique, "
               f"{info['externs']} aten{', cudagraph' if info['cudagraph'] else ''}"
               f"{', fast launch' if info['fast'] else ''}, {info['graphs']} graph) | "
               f"{errs['frametrace']:.1e} | {errs['inductor']:.1e} |")
        rows.append(row)
        print(row, flush=True)
    print("\n".join(rows))
    if args.md:
        with open(args.md, "w") as fh:
            fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
