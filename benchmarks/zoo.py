"""A zoo of Hugging Face architectures from small configs (random weights, no
download): is frametrace right on each, and how many graphs and breaks does it take,
beside torch.compile, measured in one run.  Both use a counting eager backend, so the
comparison is of the tracers.

    python benchmarks/zoo.py [--only gpt2,t5] [--no-torch-compile] [--grad] [--jobs N]

Each model runs in a child process (a crash or hang costs one row, not the run).  A row
is "ok" when every output tensor of frametrace's forward matches eager (atol/rtol 1e-4)
on two calls with different inputs; "WRONG" otherwise; "error" when the compiled call
raised where eager did not.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# model_type -> extra config overrides (beyond SMALL)
ARCHS = {
    "gpt2": {}, "bert": {}, "llama": {}, "t5": {}, "bart": {}, "opt": {}, "gemma2": {},
    "bloom": {}, "codegen": {}, "deberta": {}, "deberta-v2": {}, "mbart": {}, "pegasus": {},
    "marian": {}, "gpt_neo": {"attention_types": [[["global", "local"], 1]]}, "gptj": {},
    "mistral": {}, "qwen2": {}, "phi": {}, "falcon": {}, "roberta": {}, "electra": {},
    "albert": {}, "distilbert": {}, "mpnet": {}, "xlm-roberta": {}, "gpt_neox": {},
    "stablelm": {}, "gemma": {}, "mixtral": {}, "phi3": {}, "starcoder2": {}, "olmo": {},
    "mt5": {}, "squeezebert": {},
    "convbert": {}, "xlnet": {}, "ctrl": {}, "biogpt": {}, "persimmon": {}, "mamba": {},
    "qwen3": {}, "granite": {}, "cohere": {}, "nemotron": {}, "olmo2": {}, "glm": {},
    "gpt_bigcode": {}, "m2m_100": {}, "blenderbot": {}, "plbart": {}, "led": {},
    "prophetnet": {}, "big_bird": {"attention_type": "original_full"}, "layoutlm": {},
    "camembert": {}, "ernie": {}, "megatron-bert": {}, "rembert": {}, "roformer": {},
    "xglm": {}, "mobilebert": {}, "canine": {}, "nystromformer": {}, "yoso": {},
}

SMALL = dict(
    vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128, d_model=32,
    d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4, n_embd=32, n_layer=2,
    n_head=4, n_positions=128, n_inner=64, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
    decoder_ffn_dim=64, head_dim=8, embedding_size=32, dim=32, hidden_dim=64, n_layers=2,
    n_heads=4, rotary_dim=4, partial_rotary_factor=0.5, num_local_experts=2,
    num_experts_per_tok=1, d_head=8, d_inner=64, state_size=4, expand=2, conv_kernel=4,
    time_step_rank=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    decoder_start_token_id=1, sliding_window=64, attn_implementation="eager",
    max_seq_len=128, embed_dim=32, num_embeddings=128, ngram=2, sep_token_id=2,
    num_buckets=8, max_length=128, block_size=8,
)


def build(model_type):
    import torch
    import transformers
    cfg = transformers.AutoConfig.for_model(model_type)
    for k, v in {**SMALL, **ARCHS.get(model_type, {})}.items():
        if k == "attn_implementation":
            continue
        if hasattr(cfg, k) or k in getattr(cfg, "attribute_map", {}):
            try:
                setattr(cfg, k, v)
            except Exception:
                pass
    layers = getattr(cfg, "num_hidden_layers", None)
    if isinstance(getattr(cfg, "layer_types", None), list) and layers:
        try:                      # per-layer lists were made for the default depth
            cfg.layer_types = (cfg.layer_types * layers)[:layers]
        except AttributeError:
            pass
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(cfg).eval(), cfg


def inputs(model, cfg, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (2, 12 + seed), generator=g)
    kw = {"input_ids": ids}
    if getattr(cfg, "is_encoder_decoder", False):
        kw["decoder_input_ids"] = torch.randint(3, 100, (2, 7 + seed), generator=g)
    return kw


def tensors(out):
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    for name in ("keys", "values", "layers"):
        pass
    return []


def child(model_type, compiler, grad):
    import torch
    model, cfg = build(model_type)
    graphs = [0]

    def counter(gm, example_inputs):
        graphs[0] += 1
        return gm.forward
    if compiler == "frametrace":
        import frametrace
        from frametrace import convert
        records = []
        convert.record_observers.append(records.append)
        compiled = frametrace.optimize(backend=counter)(model)
    else:
        import torch._dynamo
        compiled = torch.compile(model, backend=counter)
    result = {"status": "ok"}
    for seed in range(2):
        kw = inputs(model, cfg, seed)
        with torch.set_grad_enabled(grad):
            want = tensors(model(**kw))
            try:
                got = tensors(compiled(**kw))
            except Exception as e:
                return {"status": "error", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
        if len(got) != len(want):
            return {"status": "WRONG", "detail": f"{len(got)} outputs vs {len(want)}"}
        for i, (a, b) in enumerate(zip(got, want)):
            if a.shape != b.shape or not torch.allclose(a.float(), b.float(), atol=1e-4, rtol=1e-4):
                diff = (a.float() - b.float()).abs().max().item() if a.shape == b.shape else "shape"
                return {"status": "WRONG", "detail": f"output {i} differs by {diff} (call {seed})"}
    result["graphs"] = graphs[0]
    if compiler == "frametrace":
        result["breaks"] = sum(r.outcome == "break" for r in records)
        result["fallbacks"] = sum(r.outcome == "fallback" for r in records)
        reasons = [r.reason for r in records if r.reason]
        result["reasons"] = sorted(set(reasons))[:3]
        result["internal_errors"] = convert.counters["internal_error"]
    else:
        from torch._dynamo.utils import counters
        result["breaks"] = sum(counters["graph_break"].values())
    return result


def run_one(model_type, compiler, grad, timeout):
    cmd = [sys.executable, __file__, "--child", model_type, compiler] + (["--grad"] if grad else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
    return {"status": "crash" if p.returncode < 0 else "build-failed", "detail": tail[0][:200]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=1, help="models run at once (child processes)")
    ap.add_argument("--child", nargs=2)
    a = ap.parse_args()
    if a.child:
        try:
            build(a.child[0])
        except Exception as e:
            print("RESULT " + json.dumps({"status": "skip", "detail": f"{type(e).__name__}: {str(e)[:150]}"}))
            return
        print("RESULT " + json.dumps(child(a.child[0], a.child[1], a.grad)), flush=True)
        return
    archs = a.only.split(",") if a.only else list(ARCHS)
    totals = {"ft_ok": 0, "tc_ok": 0, "n": 0}
    print(f"{'model':14} {'frametrace':>10} {'graphs':>6} {'breaks':>6} {'fb':>3} | {'torch.compile':>13} {'graphs':>6} {'breaks':>6}  detail")

    def both(arch):
        ft = run_one(arch, "frametrace", a.grad, a.timeout)
        if ft["status"] == "skip" or a.no_torch_compile:
            return ft, {"status": "-"}
        return ft, run_one(arch, "torch.compile", a.grad, a.timeout)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        rows = pool.map(both, archs)
        for arch, (ft, tc) in zip(archs, rows):
            if ft["status"] == "skip":
                print(f"{arch:14} skipped: {ft['detail']}")
                continue
            report(arch, ft, tc, totals)
    print(f"\ncorrect: frametrace {totals['ft_ok']}/{totals['n']}, torch.compile "
          f"{totals['tc_ok']}/{totals['n']}")


def report(arch, ft, tc, totals):
    totals["n"] += 1
    totals["ft_ok"] += ft["status"] == "ok"
    totals["tc_ok"] += tc["status"] == "ok"
    detail = ft.get("detail") or "; ".join(ft.get("reasons", []))
    print(f"{arch:14} {ft['status']:>10} {ft.get('graphs', ''):>6} {ft.get('breaks', ''):>6} "
          f"{ft.get('fallbacks', ''):>3} | {tc['status']:>13} {tc.get('graphs', ''):>6} "
          f"{tc.get('breaks', ''):>6}  {detail[:150]}", flush=True)


if __name__ == "__main__":
    main()
