"""Mixtures of experts (issue 31, item 3): HF Mixtral-style model, eager / frametrace
`triton` / Inductor timed interleaved in one process, with graph counts, breaks and the
error against eager.

    python benchmarks/moe.py [--impls grouped_mm,loop,eager,batched_mm] [--batch 8 --seq 256]
    python benchmarks/moe.py --smoke      # CPU, tiny sizes, Triton's interpreter: a check that it runs

The model is transformers' MixtralModel (2 layers, 8 local experts, top-2, bf16, hidden
1024, intermediate 3584, 16 heads, 4 KV heads by default), `model.forward` compiled,
no_grad, use_cache=False.  Its experts run one of transformers' experts implementations
(`config._experts_implementation`):

- `grouped_mm`: transformers 5's default: tokens sorted by expert, `torch._grouped_mm`
  (or `F.grouped_mm`) over the offsets; no data-dependent size.
- `batched_mm`: every (token, expert) pair's weights gathered, `bmm`.
- `eager`: transformers 5's loop over the experts that were hit (`nonzero()` of the
  routing mask, a `torch.where` per expert, `index_add_`): its trip count is data.
- `loop`: transformers 4.x's Mixtral block (registered here): `for e in
  range(num_experts)`, `torch.where` of expert e's mask, gather, SwiGLU MLP, weighted
  `index_add_`: one graph with capture_dynamic_output_shape_ops, whose per-expert
  token counts are unbacked sizes.

Both compilers get `capture_dynamic_output_shape_ops=True` (`--no-capture`: off), and
`--capture-scalars` adds capture_scalar_outputs.  Each implementation runs in its own
process (a CUDA fault costs one row).  Printed per row: milliseconds of each, the ratios,
frametrace's graphs / breaks / whole-graph eager fallbacks (and the triton backend's
kernels, aten calls), Inductor's graphs, and the max abs / relative-norm error of each
against eager.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")   # (before Triton is imported)

import torch
import torch.nn.functional as F

import frametrace
from triton_kernels import FallbackCount   # (this folder is the script's path)
from children import last_line, run_child  # noqa: E402

IMPLS = ("grouped_mm", "loop", "eager", "batched_mm")


def loop_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers 4.x's MixtralSparseMoeBlock loop over the 3-D expert weights of 5.x."""
    final = torch.zeros_like(hidden_states)
    expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
    for e in range(self.num_experts):
        pos, tok = torch.where(expert_mask[e])
        current = hidden_states[tok]
        gate, up = F.linear(current, self.gate_up_proj[e]).chunk(2, dim=-1)
        current = F.linear(self.act_fn(gate) * up, self.down_proj[e]) * top_k_weights[tok, pos, None]
        final.index_add_(0, tok, current.to(final.dtype))
    return final


def build(args, impl):
    from transformers import MixtralConfig, MixtralModel
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    ALL_EXPERTS_FUNCTIONS.register("loop", loop_experts_forward)
    cfg = MixtralConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                        num_hidden_layers=args.layers, num_attention_heads=args.heads,
                        num_key_value_heads=args.kv_heads, num_local_experts=args.experts,
                        num_experts_per_tok=args.top_k, max_position_embeddings=max(4096, args.seq))
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    model = MixtralModel(cfg).to(device=args.device, dtype=args.dtype).eval()
    if model.config._experts_implementation != impl:
        raise RuntimeError(f"transformers chose {model.config._experts_implementation}, not {impl}")
    return model


def time_interleaved(fns, inputs, rounds, iters, cuda):
    """Median milliseconds per call of each fn, measured round-robin."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for x in inputs[:iters]:
                    fn(x)
                end.record()
                end.synchronize()
                times[k].append(start.elapsed_time(end) / iters)
            else:
                t0 = time.perf_counter()
                for x in inputs[:iters]:
                    fn(x)
                times[k].append((time.perf_counter() - t0) * 1e3 / iters)
    return {k: statistics.median(v) for k, v in times.items()}


def errors(got, ref):
    got, ref = got.float(), ref.float()
    return (got - ref).abs().max().item(), ((got - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def run(args, impl) -> dict:
    from frametrace import convert
    from frametrace.backends.triton import backend as triton_backend
    from torch._inductor.compile_fx import compile_fx
    # no warm start from an earlier run's entries: the on-disk cache is keyed by guards,
    # and the eager experts' top frames, which break at their loop, also serve the other
    # implementations (their guards hold), which then run split as that run traced them
    frametrace.config.cache = args.warm
    frametrace.config.capture_dynamic_output_shape_ops = not args.no_capture
    torch._dynamo.config.capture_dynamic_output_shape_ops = not args.no_capture
    frametrace.config.capture_scalar_outputs = args.capture_scalars
    torch._dynamo.config.capture_scalar_outputs = args.capture_scalars
    model = build(args, impl)
    cuda = args.device == "cuda"
    # several batches of token ids: the routing, so the tokens per expert, differs between them
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(args.device)
              for _ in range(args.iters)]

    def call(m):
        return lambda ids: m(input_ids=ids, use_cache=False).last_hidden_state

    records, inductor_graphs = [], [0]

    def inductor(gm, example_inputs):
        inductor_graphs[0] += 1
        return compile_fx(gm, example_inputs)

    log = FallbackCount()   # (the triton backend's whole-graph eager runs)
    logging.getLogger("frametrace").addHandler(log)
    logging.getLogger("frametrace").setLevel(logging.INFO)
    convert.record_observers.append(records.append)
    fns = {"eager": call(model),
           "frametrace": call(frametrace.optimize(model, backend="triton")),
           "inductor": call(torch.compile(model, backend=inductor))}
    first = {}
    with torch.no_grad():
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn(inputs[0])
            if cuda:
                torch.cuda.synchronize()
            first[k] = time.perf_counter() - t0
        outs = {k: [fn(x) for x in inputs] for k, fn in fns.items()}   # (every routing seen: no compile timed)
        errs = {k: max(errors(g, r) for g, r in zip(outs[k], outs["eager"])) for k in ("frametrace", "inductor")}
        ms = time_interleaved(fns, inputs, args.rounds, args.iters, cuda)
    convert.record_observers.remove(records.append)
    graphs = [r for r in records if r.graph_module is not None]
    breaks = [r for r in records if r.outcome == "break"]
    fallbacks = [r for r in records if r.outcome == "fallback"]
    mods = triton_backend.COMPILED
    return {"impl": impl, "ms": ms, "first_s": first, "errs": errs,
            "ft_graphs": len(graphs), "ft_compiles": len(records), "ft_breaks": len(breaks),
            "ft_fallback_frames": len(fallbacks),
            "break_reasons": sorted({(r.reason or "")[:160] for r in breaks + fallbacks}),
            "eager_graphs": len(log.reasons), "eager_reasons": log.reasons[:3],
            "kernels": sum(len(m.kernels) for m in mods), "aten": sum(len(m.externs) for m in mods),
            "inductor_graphs": inductor_graphs[0]}


HEAD = ("| impl | eager ms | frametrace ms | inductor ms | ft/inductor | ft vs eager | inductor vs eager "
        "| ft graphs (breaks, eager-run graphs) | inductor graphs | ft kernels / aten calls "
        "| ft max abs / rel err | inductor max abs / rel err | first call s (ft / inductor) |")


def row(r) -> str:
    ms, e = r["ms"], r["errs"]
    return (f"| {r['impl']} | {ms['eager']:.3f} | {ms['frametrace']:.3f} | {ms['inductor']:.3f} | "
            f"{ms['frametrace'] / ms['inductor']:.2f} | {ms['eager'] / ms['frametrace']:.2f}x | "
            f"{ms['eager'] / ms['inductor']:.2f}x | {r['ft_graphs']} ({r['ft_breaks']}, {r['eager_graphs']}) | "
            f"{r['inductor_graphs']} | {r['kernels']} / {r['aten']} | "
            f"{e['frametrace'][0]:.2e} / {e['frametrace'][1]:.2e} | {e['inductor'][0]:.2e} / {e['inductor'][1]:.2e} | "
            f"{r['first_s']['frametrace']:.1f} / {r['first_s']['inductor']:.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=3584)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=5, help="calls per round (each a different batch)")
    p.add_argument("--no-capture", action="store_true", help="capture_dynamic_output_shape_ops off")
    p.add_argument("--capture-scalars", action="store_true", help="capture_scalar_outputs on too")
    p.add_argument("--warm", action="store_true",
                   help="let frametrace read and write its on-disk cache (a warm start)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, tiny sizes, Triton's interpreter (TRITON_INTERPRET=1): a check that it runs")
    p.add_argument("--timeout", type=int, default=600, help="seconds per implementation")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke:
        for k, v in dict(hidden=32, ffn=64, heads=4, kv_heads=2, vocab=128, batch=2, seq=16,
                         rounds=2, iters=3, dtype="float32").items():
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    args.device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    args.dtype = getattr(torch, args.dtype)
    if args.child:
        print("ROW " + json.dumps(run(args, args.child)), flush=True)
        return
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}"
          f"{' ' + torch.cuda.get_device_name() if args.device == 'cuda' else ''}; Mixtral {args.layers} layers, "
          f"{args.experts} experts, top-{args.top_k}, hidden {args.hidden}, ffn {args.ffn}, batch "
          f"{args.batch} x {args.seq}, {args.dtype}; capture_dynamic_output_shape_ops={not args.no_capture}"
          f", capture_scalar_outputs={args.capture_scalars}", flush=True)
    rows = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    argv, skip = [], False
    for a in sys.argv[1:]:   # (the child gets every option but --impls)
        if skip or a.startswith("--impls"):
            skip = a == "--impls" and not skip
            continue
        argv.append(a)
    for impl in args.impls.split(","):
        r = run_child(__file__, ["--child", impl] + argv, args.timeout, marker="ROW")
        if r.get("error") == "timed out":
            rows.append(f"| {impl} | timed out after {args.timeout} s |")
            print(rows[-1], flush=True)
            continue
        if "error" in r:
            sys.stderr.write(r["stderr"][-3000:])
            rows.append(f"| {impl} | failed: {last_line(r['stderr'])[:200]} |")
        else:
            rows.append(row(r))
            for why in r["break_reasons"]:
                print(f"{impl}: frametrace break/fallback: {why}", flush=True)
            for why in r["eager_reasons"]:
                print(f"{impl}: triton backend: {why}", flush=True)
        print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
