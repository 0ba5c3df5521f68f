"""Whole programs, not single calls: eager, frametrace and torch.compile run the same loop,
each in its own process, and the table gives wall time including compiles, what ran after
warm-up, and how far each answer is from eager's.

    python benchmarks/workflows.py [--device cpu|cuda] [--workflows train,train_step,generate,serve]
                                   [--tc-backend inductor] [--md FILE] [--smoke]

Workflows (Hugging Face models from configs, random weights, dropout off so that the three
runs can be compared number for number):

- `train`: 50 steps of a GPT-2 language model, the model compiled (`optimize(model)` /
  `torch.compile(model)`), AdamW, a linear warm-up then cosine schedule (`LambdaLR`),
  gradient accumulation over 2 micro-batches, `clip_grad_norm_`, and an eval pass every 10
  steps (`model.eval()`, `no_grad`, then `model.train()`); bf16 autocast on CUDA.
- `train_step`: the same loop with the whole step compiled instead (forward, backward,
  clipping and `opt.step()` in one function; the scheduler steps outside it).
- `generate`: `model.generate()` of a GPT-2 called twice (greedy, a KV cache), with
  `model.forward` compiled.
- `serve`: a BERT classifier answering 36 requests of 12 sequence lengths in a shuffled
  order (a server's traffic), no_grad, the model compiled.

Warm-up is the part of the loop where compiling is expected: `train` the first 11 steps (the
first eval pass and the return to training), `train_step` the first 2, `generate` the first
call, `serve` the first 3 requests (torch.compile turns a size dynamic on its second shape).
After it the goal is no compile at all (`recompiles`) and no frame run in CPython.

frametrace's backend is its default (`frametrace.optimize(model)`); torch.compile's is
`--tc-backend` (Inductor, its default).  Columns: total seconds of the whole program (all
compiles included), seconds after warm-up, graphs compiled, graph breaks, compiles after
warm-up, frames run in CPython after warm-up (frametrace: frames it gave up on; torch.compile:
frames it failed to convert), and the largest relative difference from eager's numbers
(losses, generated tokens, logits).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch

# The checkout this script sits in, not another installed copy
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import run_child  # noqa: E402

WORKFLOWS = ("train", "train_step", "generate", "serve")
VARIANTS = ("eager", "frametrace", "torch.compile")
WARMUP = {"train": 11, "train_step": 2, "generate": 1, "serve": 3}


def _graph_count():
    return 0


# -- the programs ------------------------------------------------------------------------
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def gpt2(device, smoke, train):
    import transformers
    big = device.type == "cuda" and not smoke
    cfg = transformers.GPT2Config(
        n_layer=4 if big else 2, n_embd=512 if big else 64, n_head=8 if big else 4,
        vocab_size=8192 if big else 512, n_positions=512,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    return (model.train() if train else model.eval()), cfg


def bert(device, smoke):
    import transformers
    big = device.type == "cuda" and not smoke
    cfg = transformers.BertConfig(
        num_hidden_layers=4 if big else 2, hidden_size=512 if big else 64,
        num_attention_heads=8 if big else 4, intermediate_size=2048 if big else 128,
        vocab_size=8192 if big else 512, num_labels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(cfg).to(device).eval()


def _batches(cfg, device, n, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device) for _ in range(n)]


def _autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def _schedule(opt, steps, warm):
    def factor(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def run_train(variant, compile_fn, device, smoke, whole_step):
    steps = 8 if smoke else 50
    model, cfg = gpt2(device, smoke, train=True)
    batch, seq = (2, 32) if device.type == "cpu" or smoke else (8, 256)
    data = _batches(cfg, device, 2 * steps, batch, seq, seed=1)
    val = _batches(cfg, device, 1, batch, seq, seed=2)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = _schedule(opt, steps, warm=5)
    numbers, marks = [], Marks(_graph_count)

    # The model compiled, or (whole_step) the step function around the plain model.
    fwd = model if whole_step else compile_fn(model)

    def step_body(a, b):
        for ids in (a, b):                    # gradient accumulation over 2 micro-batches
            with _autocast(device):
                loss = fwd(ids, labels=ids).loss / 2
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def evaluate():
        model.eval()
        with torch.no_grad(), _autocast(device):
            out = fwd(val, labels=val).loss
        model.train()
        return out

    step = compile_fn(step_body) if whole_step else step_body
    for i in range(steps):
        marks.append(time.perf_counter())
        numbers.append(float(step(data[2 * i], data[2 * i + 1])))
        sched.step()
        if (i + 1) % 10 == 0 or (smoke and i == 3):
            numbers.append(float(evaluate()))
        _sync(device)
    return numbers, marks


def run_generate(variant, compile_fn, device, smoke):
    model, cfg = gpt2(device, smoke, train=False)
    model.forward = compile_fn(model.forward)
    new = 8 if smoke else (64 if device.type == "cuda" else 24)
    prompt = _batches(cfg, device, 1, 1, 16, seed=3)[0]
    numbers, marks = [], Marks(_graph_count)
    for i in range(2):
        marks.append(time.perf_counter())
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=0)
        _sync(device)
        numbers += [float(t) for t in out[0, -new:]]
    return numbers, marks


def run_serve(variant, compile_fn, device, smoke):
    model = bert(device, smoke)
    fwd = compile_fn(model)
    lengths = [8, 12, 16, 20, 24, 32, 40, 48, 56, 64, 96, 128]
    if smoke:
        lengths = lengths[:5]
    order = [n for n in lengths for _ in range(3)]
    random.Random(4).shuffle(order)
    # the first three requests have three different lengths (the warm-up torch.compile needs)
    firsts = []
    for n in order:
        if n not in firsts:
            firsts.append(n)
        if len(firsts) == 3:
            break
    for n in firsts:
        order.remove(n)
    order = firsts + order
    numbers, marks = [], Marks(_graph_count)
    g = torch.Generator().manual_seed(5)
    for n in order:
        ids = torch.randint(0, model.config.vocab_size, (4, n), generator=g).to(device)
        mask = torch.ones_like(ids)
        mask[0, n // 2:] = 0                 # one padded row
        marks.append(time.perf_counter())
        with torch.no_grad():
            logits = fwd(input_ids=ids, attention_mask=mask).logits
        _sync(device)
        numbers += [float(v) for v in logits.float().flatten()]
    return numbers, marks


# -- one (workflow, variant) in this process -----------------------------------------------
class Marks(list):
    """The start time of each step, and what `count()` said then (torch.compile's graphs so
    far: its compiles after warm-up are the difference at the warm-up mark)."""

    def __init__(self, count):
        super().__init__()
        self.count, self.counts = count, []

    def append(self, t):
        super().append(t)
        self.counts.append(self.count())


def one(workflow, variant, device, smoke, tc_backend):
    global _graph_count
    records = []
    if variant == "torch.compile":
        from torch._dynamo.utils import counters   # the comparison's own counters

        def _graph_count():
            return counters["stats"]["unique_graphs"]
    if variant == "frametrace":
        import frametrace
        frametrace.convert.record_observers.append(lambda r: records.append((time.perf_counter(), r)))
        compile_fn = frametrace.optimize
    elif variant == "torch.compile":
        def compile_fn(f):
            return torch.compile(f, backend=tc_backend)
    else:
        def compile_fn(f):
            return f
    start = time.perf_counter()
    if workflow in ("train", "train_step"):
        numbers, marks = run_train(variant, compile_fn, device, smoke, workflow == "train_step")
    elif workflow == "generate":
        numbers, marks = run_generate(variant, compile_fn, device, smoke)
    else:
        numbers, marks = run_serve(variant, compile_fn, device, smoke)
    end = time.perf_counter()
    warm_end = marks[WARMUP[workflow]] if WARMUP[workflow] < len(marks) else end
    result = {"workflow": workflow, "variant": variant, "total_s": end - start,
              "after_warmup_s": end - warm_end, "numbers": numbers}
    if variant == "frametrace":
        late = [r for t, r in records if t >= warm_end]
        result.update(
            graphs=sum(r.graph_module is not None for _, r in records),
            breaks=sum(r.outcome == "break" for _, r in records),
            late_compiles=sum(r.graph_module is not None for r in late),
            late_cpython=sum(r.outcome == "fallback" for r in late),
            reasons=sorted({str(r.reason)[:100] for _, r in records if r.reason})[:6])
    elif variant == "torch.compile":
        w = WARMUP[workflow]
        result.update(graphs=counters["stats"]["unique_graphs"],
                      breaks=sum(counters["graph_break"].values()),
                      late_compiles=counters["stats"]["unique_graphs"] - marks.counts[w] if w < len(marks) else 0,
                      late_cpython=counters["frames"]["total"] - counters["frames"]["ok"])
    return result


# -- the table ----------------------------------------------------------------------------
def rel_diff(a, b):
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if math.isnan(x) and math.isnan(y):
            continue
        worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-6))
    return worst


def table(rows, device):
    out = [f"Device: {device}.  Seconds are wall time of the whole program; compiles included.", "",
           "| workflow | eager s | frametrace s | torch.compile s | ft/eager | ft/tc | after warm-up s "
           "(eager / ft / tc) | graphs (ft / tc) | breaks (ft / tc) | compiles after warm-up (ft / tc) | "
           "frames in CPython after warm-up (ft / tc) | max rel diff vs eager (ft / tc) |",
           "|" + "---|" * 12]
    notes = []
    for wf in sorted({r["workflow"] for r in rows}, key=WORKFLOWS.index):
        got = {r["variant"]: r for r in rows if r["workflow"] == wf}
        e, f, t = (got.get(v) for v in VARIANTS)

        def s(r, k, fmt="{:.2f}"):
            if r is None or "error" in r:
                return "failed"
            v = r.get(k)
            return "–" if v is None else fmt.format(v)

        def ratio(a, b):
            if not a or not b or "error" in a or "error" in b:
                return "–"
            return f"{a['total_s'] / b['total_s']:.2f}"

        def diff(r):
            if r is None or "error" in r or e is None or "error" in e:
                return "–"
            return f"{rel_diff(e['numbers'], r['numbers']):.1e}"
        out.append(f"| {wf} | {s(e, 'total_s')} | {s(f, 'total_s')} | {s(t, 'total_s')} | {ratio(f, e)} | "
                   f"{ratio(f, t)} | {s(e, 'after_warmup_s')} / {s(f, 'after_warmup_s')} / {s(t, 'after_warmup_s')} | "
                   f"{s(f, 'graphs', '{}')} / {s(t, 'graphs', '{}')} | {s(f, 'breaks', '{}')} / {s(t, 'breaks', '{}')} | "
                   f"{s(f, 'late_compiles', '{}')} / {s(t, 'late_compiles', '{}')} | "
                   f"{s(f, 'late_cpython', '{}')} / {s(t, 'late_cpython', '{}')} | {diff(f)} / {diff(t)} |")
        for r in (e, f, t):
            if r is not None and "error" in r:
                notes.append(f"- {wf} / {r['variant']} failed: {r['error']}")
        if f is not None and f.get("reasons"):
            notes.append(f"- {wf}: frametrace's break/fallback reasons: " + "; ".join(f["reasons"]))
    return "\n".join(out + ([""] + notes if notes else []))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workflows", default=",".join(WORKFLOWS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--tc-backend", default="inductor")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, few steps: the script runs")
    p.add_argument("--md", help="also write the table to this file")
    p.add_argument("--timeout", type=int, default=900, help="seconds per (workflow, variant) process")
    p.add_argument("--one", nargs=2, metavar=("WORKFLOW", "VARIANT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if a.one:
        r = one(a.one[0], a.one[1], device, a.smoke, a.tc_backend)
        print("RESULT " + json.dumps(r))
        return
    rows = []
    for wf in a.workflows.split(","):
        for v in a.variants.split(","):
            argv = ["--one", wf, v, "--device", a.device, "--tc-backend", a.tc_backend] + \
                (["--smoke"] if a.smoke else [])
            r = run_child(__file__, argv, a.timeout)
            if "error" in r:
                err = f"timed out after {a.timeout} s" if r["error"] == "timed out" else \
                    (r["stderr"].strip().splitlines() or ["no output"])[-1][:200]
                r = {"workflow": wf, "variant": v, "error": err}
            rows.append(r)
            print(f"# {wf} / {v}: " + ("failed" if "error" in rows[-1] else f"{rows[-1]['total_s']:.2f} s"),
                  file=sys.stderr, flush=True)
    text = table(rows, device)
    print(text)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
