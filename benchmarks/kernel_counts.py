"""Kernels, aten calls and allocations per graph of a training step, with the triton
backend, on the CPU (Triton's interpreter): a host-bound step on the GPU pays for each
launch and each allocation, so these counts are what to drive down.

    TRITON_INTERPRET=1 python benchmarks/kernel_counts.py [--models bert,gpt2,llama]
        [--layers 2] [--precision autocast|bf16|fp32] [--list] [--inductor] [--json FILE]

Each model is a tiny HF config (hidden 64, 4 heads, `--layers` layers, vocab 256, batch 2
x 16 tokens; `--batch`, `--seq`, `--hidden` change those) in the
training benchmark's precision (`autocast`, the default: fp32 weights, bf16 autocast
around the forward and the loss; `bf16` weights; or `fp32`), run as one step: the forward with the model's loss (labels given), then `loss.backward()`,
compiled with `frametrace.optimize(backend="triton")`.  Per graph (forward, backward, and
inference graphs if any) it prints:

  kernels   launches of generated kernels
  externs   aten calls in the wrapper (matmuls, attention, scatter-adds, fallbacks)
  allocs    buffers the wrapper allocates for kernels' stores (`empty_strided`), plus the
            results of externs (each allocates its output)
  layouts   `ensure_layout` calls (copies when an extern's output is not laid out as planned)

(externs include fallbacks: ops a kernel could have run, listed with why under `--list`)

and, with `--list`, every kernel as the FX ops it computes (its stored values' ops first,
`+` the ops fused into it), and a histogram of those signatures: a kernel that is one
`sum` or one `mul` is a missed fusion.  Counts per layer scale to the real models (the
kernel structure does not depend on the widths, except where a width decides between a
persistent and a looped reduction).  `--inductor` also prints the number of kernels
Inductor generates for the same model on the CPU (C++ kernels, a reference only:
Inductor's CPU fusion differs from its GPU one).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import frametrace  # noqa: E402

MODELS = ("bert", "gpt2", "llama")
BATCH, SEQ, VOCAB, HIDDEN = 2, 16, 256, 64


def make_model(name, layers):
    import transformers
    torch.manual_seed(0)
    h, positions = HIDDEN, max(64, SEQ)
    if name == "llama":
        cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=h, intermediate_size=2 * h,
                                       num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
                                       max_position_embeddings=positions, use_cache=False)
        return transformers.LlamaForCausalLM(cfg)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=h, n_head=4, vocab_size=VOCAB, n_positions=positions,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        return transformers.GPT2LMHeadModel(cfg)
    if name == "bert":
        cfg = transformers.BertConfig(num_hidden_layers=layers, hidden_size=h, intermediate_size=2 * h,
                                      num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=positions,
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return transformers.BertForMaskedLM(cfg)
    raise ValueError(name)


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _op_name(node) -> str:
    t = node.target
    return str(getattr(t, "__name__", t)).replace(".default", "")


def kernel_ops(kernel) -> str:
    """The kernel as ops: its stored values' FX ops, then `+` the others it fuses."""
    from frametrace.backends.triton.fallback import Traced, kernel_nodes
    stored = [c.node.fn.node for c in kernel.stores if isinstance(getattr(c.node, "fn", None), Traced)]
    fused = kernel_nodes(kernel.group, kernel.stores) - set(stored)
    names = sorted({_op_name(n) for n in stored})
    rest = sorted({_op_name(n) for n in fused} - set(names))
    return ",".join(names) + (" + " + ",".join(rest) if rest else "")


def counts(mod) -> dict:
    src = mod.source
    return {"kernels": len(mod.kernels), "externs": len(mod.externs),
            "allocs": src.count("empty_strided(") + len(mod.externs),
            "layouts": src.count("ensure_layout("),
            "fallbacks": [f"{f.node} ({f.op}): {f.reason}" for f in mod.fallbacks],
            "extern_ops": dict(collections.Counter(str(o).replace("aten.", "").replace(".default", "")
                                                   for o in mod.extern_ops))}


def _autocast(precision):
    """The training benchmark's precisions: `autocast` (fp32 weights, bf16 autocast around
    the forward and loss, as its default), `bf16` (bf16 weights), `fp32`."""
    import contextlib
    if precision == "autocast":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_model(name, layers, listing, precision="autocast"):
    from frametrace.backends.triton import backend
    model = make_model(name, layers)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    backend.COMPILED.clear()
    step = frametrace.optimize(backend="triton")(model)
    with _autocast(precision):
        out = step(**batch())
    out.loss.backward()
    rows = []
    for mod in list(backend.COMPILED):
        row = {"model": name, "graph": mod.kind, **counts(mod)}
        if listing:
            row["kernel_list"] = [kernel_ops(k) for k in mod.kernels]
        rows.append(row)
    return rows


def inductor_kernels(name, layers, precision) -> int:
    """Kernels Inductor generates for one step of the same model (CPU, a reference)."""
    from torch._inductor import metrics
    torch._dynamo.reset()
    metrics.reset()
    model = make_model(name, layers)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    with _autocast(precision):
        out = torch.compile(model, backend="inductor")(**batch())
    out.loss.backward()
    return metrics.generated_kernel_count


def main(argv=None):
    global BATCH, SEQ, HIDDEN
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--seq", type=int, default=SEQ)
    p.add_argument("--hidden", type=int, default=HIDDEN,
                   help="(split reductions, persistent or looped rows depend on the sizes)")
    p.add_argument("--precision", default="autocast", choices=("autocast", "bf16", "fp32"))
    p.add_argument("--list", action="store_true", help="every kernel's ops, and a histogram of them")
    p.add_argument("--inductor", action="store_true", help="Inductor's kernel count too (CPU)")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    BATCH, SEQ, HIDDEN = args.batch, args.seq, args.hidden
    all_rows = []
    print(f"{'model':8} {'graph':10} {'kernels':>8} {'externs':>8} {'allocs':>7} {'layouts':>8}")
    for name in args.models.split(","):
        rows = run_model(name, args.layers, args.list, args.precision)
        all_rows += rows
        for r in rows:
            print(f"{r['model']:8} {r['graph']:10} {r['kernels']:8} {r['externs']:8} {r['allocs']:7} {r['layouts']:8}"
                  f"   {r['extern_ops']}")
        if args.inductor:
            print(f"{name:8} {'inductor':10} {inductor_kernels(name, args.layers, args.precision):8}  (CPU kernels, fwd+bwd)")
        if args.list:
            for r in rows:
                print(f"\n-- {name} {r['graph']}: {r['kernels']} kernels")
                for f in r["fallbacks"]:
                    print(f"  fallback: {f}")
                for sig, n in collections.Counter(r["kernel_list"]).most_common():
                    print(f"  {n:4}  {sig}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return all_rows


if __name__ == "__main__":
    main()
