"""Training step time and peak memory: eager, frametrace (`triton`) and torch.compile
(Inductor), measured interleaved in one process per model, from identical initial weights.

    python benchmarks/training.py [--models llama4,llama8,gpt2,bert] [--steps 20] [--batch 4]
                                  [--timeout 540] [--precision autocast|bf16] [--md FILE]
    python benchmarks/training.py --models resnet50 --separate   # CNN training, issue 31
    python benchmarks/training.py --smoke      # tiny configs on the CPU: the script runs

A step is the forward with the model's own loss (labels given), `loss.backward()`,
`opt.step()` of AdamW (foreach; SGD with momentum 0.9, foreach, for the CNN:
`--optimizer`) and `opt.zero_grad(set_to_none=True)`.  frametrace compiles the
model with `frametrace.optimize(backend="triton")` and the optimizer step with
`frametrace.optimize(backend="triton")(opt.step)`; torch.compile compiles the model and
the optimizer step (a function calling `opt.step()`, as PyTorch's tutorial on compiling
the optimizer does) with Inductor's default mode.  Precision: `autocast` (the default,
what torch.compile's training recipes use: fp32 weights and optimizer state,
`torch.autocast("cuda", torch.bfloat16)` around the forward and the loss) or `bf16`
(weights, gradients and optimizer state in bf16).

Models (HF configs, random weights, no download): llama4 / llama8 (LlamaForCausalLM, 4 or
8 layers, hidden 2048, intermediate 5632, 16 heads, vocab 32000), gpt2 (GPT2LMHeadModel,
GPT2Config()), bert (BertForMaskedLM, BertConfig(), 15% of positions labelled), batch
`--batch` (4) x 512; resnet50 (timm's `resnet50`, else torchvision's; random weights,
BatchNorm in training mode with its running statistics, 1000 classes, cross-entropy on
random labels, `--batch` 64 x 3 x `--image-size` 224 x 224, `--channels-last` optional;
the smoke run's is a two-block bottleneck ResNet defined here, at 2 x 3 x 32 x 32).  Dropout is off (so that the three runs can be compared number for
number; `--dropout` keeps the configs' dropout, and the correctness columns then say
"dropout" instead of comparing).

Each variant first runs 3 steps on 3 fixed batches (compiling on the first): loss and a few
parameters after them are compared with eager (max abs / max rel diff over the 3 losses and
the parameters; relative to each tensor's largest magnitude).  Then `--warmup` untimed
steps each, and `--steps` timed rounds, each round one step of every variant in turn, each
step CUDA-synchronised: the median is the step time.  Peak memory of a step: what the variant holds between steps (its parameters,
optimizer state and anything its compiled code keeps, measured as the allocator's growth
while the variant was built, compiled and run) plus the allocator's peak above its level
at the step's start (torch.cuda.max_memory_allocated), so the other two variants' weights
do not count.  `--separate` runs each variant in its own process instead (not
interleaved): its peak is then `torch.cuda.max_memory_allocated()` over the timed steps
as it is, weights, optimizer state and gradients included, with nothing of another
compiler's in the process, and empty Triton, Inductor and frametrace cache folders (a
first step from cold caches); the checked losses and parameters are compared with the eager
process's.  `--profile N`: after the timed rounds, each variant's step under torch.profiler,
its N costliest kernels and its GPU time by kind (convolutions and GEMMs, Triton, other).  After the timed rounds, one more step per variant is measured phase by phase
on CUDA (`memory_by_phase`: allocated at the forward's, backward's and optimizer's start,
and each phase's peak), printed under the table.  frametrace's counters: graphs compiled (forward and optimizer frames),
graph breaks, frames run in CPython, whole graphs the triton backend ran eagerly or with
aot_eager (`backends.triton.backend.STATS`), FX nodes run as aten calls that a kernel could
have run, and kernels per phase (compiled during the first forward, backward and
optimizer step).  Each model runs in its own process (a CUDA fault costs one row).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

# The checkout this script sits in, not another installed copy
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frametrace  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import last_line, run_child  # noqa: E402

MODELS = ("llama4", "llama8", "gpt2", "bert")
CNNS = ("resnet50",)   # image classifiers (not in the default list: they want --batch 64)
VARIANTS = ("eager", "frametrace", "inductor")
CHECK_STEPS = 3


# -- models -----------------------------------------------------------------------------
class Classified(torch.nn.Module):
    """An image classifier with its loss: forward(pixel_values, labels) -> the
    cross-entropy (what the step calls `.loss` of, as it does the HF models' output)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, pixel_values, labels):
        return torch.nn.functional.cross_entropy(self.net(pixel_values), labels)


def tiny_resnet(classes=10):
    """Stem, two bottleneck blocks (the second strided, with a projection) and the head,
    as ResNet-50's: the smoke run's CNN where neither timm nor torchvision is installed."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None if stride == 1 and cin == cout else \
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.down is None else self.down(x)
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            return torch.relu(self.bn3(self.conv3(y)) + idt)
    return nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), Bottleneck(8, 4, 1), Bottleneck(16, 8, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def make_cnn(name, smoke):
    """(classifier with its loss, classes)."""
    if smoke:
        return Classified(tiny_resnet()), 10
    try:
        import timm
        net = timm.create_model(name, pretrained=False)
    except ImportError:
        import torchvision
        net = getattr(torchvision.models, name)(weights=None)
    return Classified(net), 1000


def make_model(name, smoke, dropout):
    """(model, vocab size or classes): a fresh model from `name`'s config, seeded."""
    torch.manual_seed(0)
    if name in CNNS:
        return make_cnn(name, smoke)
    import transformers
    if name.startswith("llama"):
        layers = int(name[5:] or 4)
        size = dict(num_hidden_layers=layers // 4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=256, max_position_embeddings=64) if smoke else \
            dict(num_hidden_layers=layers, hidden_size=2048, intermediate_size=5632,
                 num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                 max_position_embeddings=1024)
        cfg = transformers.LlamaConfig(**size, use_cache=False)
        return transformers.LlamaForCausalLM(cfg), cfg.vocab_size
    if name == "gpt2":
        size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64) if smoke else {}
        if not dropout:
            size.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cfg = transformers.GPT2Config(**size, use_cache=False)
        return transformers.GPT2LMHeadModel(cfg), cfg.vocab_size
    if name == "bert":
        size = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    vocab_size=256, max_position_embeddings=64) if smoke else {}
        if not dropout:
            size.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        cfg = transformers.BertConfig(**size)
        return transformers.BertForMaskedLM(cfg), cfg.vocab_size
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS + CNNS)})")


def make_batch(name, vocab, batch, seq, device, seed, image_size=224, channels_last=False):
    """Keyword arguments of one step's forward: token ids (images) and labels (the
    model's loss)."""
    g = torch.Generator().manual_seed(seed)
    if name in CNNS:
        images = torch.randn(batch, 3, image_size, image_size, generator=g)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, vocab, (batch,), generator=g)
        return {"pixel_values": images.to(device), "labels": labels.to(device)}
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    if name == "bert":
        labels = torch.where(torch.rand(batch, seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        labels[:, 0] = ids[:, 0]   # at least one labelled position per row
    else:
        labels = ids.clone()
    return {"input_ids": ids.to(device), "labels": labels.to(device)}


# -- the three variants ------------------------------------------------------------------
class Phases:
    """Which part of the first step is running, so that each CompiledModule the triton
    backend makes is counted as a forward, backward or optimizer graph (a graph whose
    wrapper takes AOTAutograd's `tangents_` inputs is a backward graph, whenever it is
    compiled)."""
    current = "other"
    kernels: dict = {}

    @classmethod
    def watch(cls):
        try:
            from frametrace.backends.triton import backend
        except ImportError:
            return

        class Recording(list):
            def append(self, mod):
                mod.phase = "backward" if "tangents_" in getattr(mod, "source", "") else cls.current
                cls.kernels.setdefault(mod.phase, []).append(len(mod.kernels))
                super().append(mod)

            def remove(self, mod):
                # a graph built again (more nodes as aten, other strides): its kernels
                # are counted once, from the build that runs
                cls.kernels[mod.phase].remove(len(mod.kernels))
                super().remove(mod)
        backend.COMPILED = Recording(backend.COMPILED)


class Variant:
    """One of eager / frametrace / inductor: its model, optimizer and compiled callables."""

    def __init__(self, kind, model, args):
        self.kind, self.model, self.args = kind, model, args
        if args.optimizer == "sgd":
            self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
        else:
            self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        self.forward, self.opt_step = model, self.opt.step
        self.counter = None
        if kind == "frametrace":
            self.counter = frametrace.testing.CompileCounter(inner=args.ft_backend)
            self.forward = frametrace.optimize(backend=self.counter)(model)
            self.opt_step = frametrace.optimize(backend=self.counter)(self.opt.step)
        elif kind == "inductor":
            opt = self.opt

            def opt_step():
                opt.step()
            tc = dict(backend=args.tc_backend)
            self.forward = torch.compile(model, **tc)
            self.opt_step = torch.compile(opt_step, **tc)
        self.losses, self.times, self.peaks = [], [], []
        self.resident = 0

    def step(self, batch, phases=False, probe=None):
        """Forward, backward, optimizer step, and the gradients dropped (so that between
        steps a variant holds its weights and optimizer state only).  `probe(phase)`:
        called before each phase and at the end (memory_by_phase)."""
        probe = probe or (lambda phase: None)
        mark(phases, "forward")
        probe("forward")
        with autocast(self.args):
            out = self.forward(**batch)
            loss = getattr(out, "loss", out)   # (a CNN's Classified returns the loss)
        mark(phases, "backward")
        probe("backward")
        loss.backward()
        mark(phases, "optimizer")
        probe("optimizer")
        self.opt_step()
        mark(phases, "other")
        self.opt.zero_grad(set_to_none=True)
        probe("end")
        return loss.detach()


def memory_by_phase(v, batch, device) -> dict | None:
    """One step's memory, phase by phase (GiB, CUDA only): what is allocated when each
    phase starts (before the forward: weights and optimizer state; before the backward:
    those plus what the forward saved for it; before the optimizer: the gradients instead)
    and the allocator's peak within each phase, so a peak can be told apart: held between
    steps, saved by the forward, or the backward's or optimizer's own temporaries."""
    if device.type != "cuda":
        return None
    out, last = {}, [None]

    def probe(phase):
        torch.cuda.synchronize()
        if last[0] is not None:
            out[f"{last[0]} peak"] = torch.cuda.max_memory_allocated() / 2 ** 30
        if phase != "end":
            out[f"at {phase}"] = torch.cuda.memory_allocated() / 2 ** 30
        torch.cuda.reset_peak_memory_stats()
        last[0] = phase if phase != "end" else None
    v.step(batch, probe=probe)
    return out


def kernel_profile(v, batch, top, steps=3) -> list[str]:
    """Where a variant's step spends GPU time: torch.profiler over `steps` steps, the
    kernels summed by name (per step), the `top` largest, and totals by kind (cuDNN/cuBLAS
    convolutions and GEMMs, Triton kernels, the rest), against the step's wall time."""
    from torch.profiler import ProfilerActivity, profile
    sync(v.args.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            v.step(batch)
        sync(v.args.device)
        wall = (time.perf_counter() - t0) / steps
    per = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            t, n = per.get(e.key, (0.0, 0))
            per[e.key] = (t + e.device_time_total / steps / 1e3, n + e.count // steps)
    kinds = {}
    for name, (ms, _) in per.items():
        low = name.lower()
        kind = ("triton" if low.startswith("triton") else
                "conv/gemm" if any(w in low for w in ("conv", "gemm", "cudnn", "sm90", "cutlass", "xmma", "wgrad", "dgrad"))
                else "other")
        kinds[kind] = kinds.get(kind, 0.0) + ms
    out = [f"profile {v.kind}: step {wall * 1e3:.2f} ms wall, kernels {sum(kinds.values()):.2f} ms, "
           f"{sum(n for _, n in per.values())} launches; " +
           ", ".join(f"{k} {ms:.2f} ms" for k, ms in sorted(kinds.items(), key=lambda kv: -kv[1]))]
    for name, (ms, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"profile {v.kind}:   {ms:7.3f} ms  x{n:<4d} {name[:150]}")
    return out


def host_profile(v, batch, top, steps=5) -> list[str]:
    """Where a variant's step spends host time: each phase's time to return (no
    synchronisation inside the step, so a phase that only enqueues kernels shows its
    launch cost) averaged over `steps` steps, then cProfile over as many steps, its `top`
    functions by own time."""
    import cProfile
    import pstats
    marks = {}

    def probe(phase):
        marks[phase] = time.perf_counter()

    per = {}
    for _ in range(steps):
        sync(v.args.device)
        v.step(batch, probe=probe)
        t_end = time.perf_counter()
        sync(v.args.device)
        t_sync = time.perf_counter()
        order = ["forward", "backward", "optimizer", "end"]
        for a, b in zip(order, order[1:]):
            per[a] = per.get(a, 0.0) + (marks[b] - marks[a]) / steps
        per["gpu tail"] = per.get("gpu tail", 0.0) + (t_sync - t_end) / steps
    out = [f"host {v.kind}: " + ", ".join(f"{k} {ms * 1e3:.2f} ms" for k, ms in per.items())]
    prof = cProfile.Profile()
    sync(v.args.device)
    prof.enable()
    for _ in range(steps):
        v.step(batch)
    sync(v.args.device)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (path, line, fn), (_, calls, own, cum, _) in rows:
        where = f"{os.path.basename(path)}:{line}({fn})" if line else fn
        out.append(f"host {v.kind}:   own {own / steps * 1e3:7.3f} ms  cum {cum / steps * 1e3:7.3f} ms  "
                   f"x{calls // steps:<5d} {where[:140]}")
    return out


def mark(on, phase):
    if on:
        Phases.current = phase


def autocast(args):
    import contextlib
    if args.precision != "autocast":
        return contextlib.nullcontext()
    return torch.autocast(device_type=args.device.type, dtype=torch.bfloat16)


# -- measuring ---------------------------------------------------------------------------
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def allocated(device):
    return torch.cuda.memory_allocated() if device.type == "cuda" else 0


def setup(kind, base, batches, args):
    """A variant from a copy of `base` (the initial weights): built, compiled and run for
    the CHECK_STEPS steps whose losses and parameters are compared with eager."""
    before = allocated(args.device)
    model = copy.deepcopy(base).to(args.device)
    if args.precision == "bf16":
        model = model.to(torch.bfloat16)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    v = Variant(kind, model, args)
    t0 = time.perf_counter()
    for i, batch in enumerate(batches):
        v.losses.append(v.step(batch, phases=(i == 0 and kind == "frametrace")).float().item())
        if i == 0:
            sync(args.device)
            v.first_step_s = time.perf_counter() - t0
    sync(args.device)
    v.resident = allocated(args.device) - before
    return v


def timed_step(v, batch, device):
    """Seconds of one step and its peak bytes (what the variant keeps between steps plus
    the allocator's peak above the level at the step's start)."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start_bytes = allocated(device)
    t0 = time.perf_counter()
    v.step(batch)
    sync(device)
    seconds = time.perf_counter() - t0
    if device.type != "cuda":
        return seconds, None
    if v.args.separate:   # (alone in its process: the allocator's peak as it is)
        return seconds, torch.cuda.max_memory_allocated()
    return seconds, torch.cuda.max_memory_allocated() - start_bytes + v.resident


def compare(v, ref, names):
    """Max abs difference of v's losses and parameters `names` from ref's, and the max
    over those tensors of that difference relative to the tensor's largest magnitude
    (elementwise ratios would blow up on weights near 0)."""
    pairs = [(torch.tensor(v.losses), torch.tensor(ref.losses))]
    got, want = dict(v.model.named_parameters()), dict(ref.model.named_parameters())
    pairs += [(got[n].detach().float().cpu(), want[n].detach().float().cpu()) for n in names]
    abs_diff = max((a - b).abs().max().item() for a, b in pairs)
    rel_diff = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in pairs)
    return abs_diff, rel_diff


def checked_params(model):
    """A few parameters spread over the model: first, middle, last (by name order)."""
    names = [n for n, _ in model.named_parameters()]
    return sorted({names[0], names[len(names) // 2], names[-1]})


def frametrace_counters(v, records):
    try:
        from frametrace.backends.triton import backend
        stats = backend.STATS
    except ImportError:      # (no Triton: the smoke run's eager backend)
        stats = {"eager_graphs": 0, "fallback_nodes": 0}
    return {"graphs": v.counter.frame_count,
            "breaks": sum(r.outcome == "break" for r in records),
            "cpython_frames": sum(r.outcome == "fallback" for r in records),
            "break_reasons": sorted({str(r.reason)[:120] for r in records if r.reason})[:5],
            "eager_graphs": stats["eager_graphs"],
            "aten_fallback_nodes": stats["fallback_nodes"],
            "kernels": {k: sum(v) for k, v in Phases.kernels.items()}}


def run_model(name, args):
    base, vocab = make_model(name, args.smoke, args.dropout)
    batches = [make_batch(name, vocab, args.batch, args.seq, args.device, seed, args.image_size, args.channels_last)
               for seed in range(CHECK_STEPS)]
    records = []
    frametrace.convert.record_observers.append(records.append)
    Phases.watch()
    # torch.compile first: Dynamo patches nn.Module.__init__ when it first compiles, which
    # frametrace's guards on a module made in a forward (BERT's CrossEntropyLoss) notice
    kinds = [k for k in ("eager", "inductor", "frametrace") if not (k == "inductor" and args.tc_backend is None)
             and (args.variants is None or k in args.variants.split(","))]
    made = {k: setup(k, base, batches, args) for k in kinds}
    variants = {k: made[k] for k in VARIANTS if k in made}
    frametrace.convert.record_observers.remove(records.append)
    ref = variants.get("eager")
    names = checked_params(base)
    for v in variants.values():
        for _ in range(args.warmup):
            v.step(batches[0])
    for _ in range(args.steps):   # round-robin: noise hits every variant alike
        for v in variants.values():
            seconds, peak = timed_step(v, batches[0], args.device)
            v.times.append(seconds)
            v.peaks.append(peak)
    phases = {k: memory_by_phase(v, batches[0], args.device) for k, v in variants.items()}
    if args.profile:
        for k, v in variants.items():
            try:
                print("\n".join(kernel_profile(v, batches[0], args.profile)), flush=True)
            except Exception as e:   # (the profiler's failure costs the profile, not the row)
                print(f"profile {k}: failed: {e!r}"[:300], flush=True)
    if args.host_profile:
        for k, v in variants.items():
            print("\n".join(host_profile(v, batches[0], args.host_profile)), flush=True)
    result = {"model": name, "device": str(args.device), "precision": args.precision, "batch": args.batch,
              "seq": args.seq, "checked": names, "variants": {}}
    for k, v in variants.items():
        result["variants"][k] = {
            "ms": statistics.median(v.times) * 1e3,
            "peak_gib": None if v.peaks[0] is None else max(v.peaks) / 2 ** 30,
            "first_step_s": v.first_step_s, "losses": v.losses, "memory": phases[k],
            "diff": None if k == "eager" or args.dropout or ref is None else compare(v, ref, names)}
        if args.dump:   # (--separate: the parent compares the processes' results)
            params = dict(v.model.named_parameters())
            torch.save({"losses": v.losses, "params": {n: params[n].detach().float().cpu() for n in names}},
                       os.path.join(args.dump, f"{name}-{k}.pt"))
    result["frametrace"] = frametrace_counters(variants["frametrace"], records) if "frametrace" in variants \
        else NO_COUNTERS
    return result


NO_COUNTERS = {"graphs": 0, "breaks": 0, "cpython_frames": 0, "break_reasons": [], "eager_graphs": 0,
               "aten_fallback_nodes": 0, "kernels": {}}


# -- the table ---------------------------------------------------------------------------
HEAD = ("| model | eager ms | frametrace ms | inductor ms | ft/eager | ft/inductor | eager GiB | "
        "frametrace GiB | inductor GiB | ft GiB/inductor | ft loss+params max abs / rel diff | "
        "inductor max abs / rel diff | ft graphs / breaks / eager graphs | ft kernels fwd / bwd / opt | "
        "first step s (eager / ft / inductor) |")


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def row(r) -> str:
    v = r["variants"]
    e, f, i = (v.get(k, {}) for k in VARIANTS)
    ms = [x.get("ms") for x in (e, f, i)]
    gib = [x.get("peak_gib") for x in (e, f, i)]

    def ratio(a, b):
        return None if a is None or b is None else a / b

    def diff(x):
        d = x.get("diff")
        return "dropout" if d is None and x else ("-" if d is None else f"{d[0]:.2e} / {d[1]:.2e}")
    c = r["frametrace"]
    k = c["kernels"]
    first = " / ".join(fmt(x.get("first_step_s"), ".1f") for x in (e, f, i))
    return (f"| {r['model']} | {' | '.join(fmt(x, '.2f') for x in ms)} | {fmt(ratio(ms[1], ms[0]), '.2f')} | "
            f"{fmt(ratio(ms[1], ms[2]), '.2f')} | {' | '.join(fmt(x, '.2f') for x in gib)} | "
            f"{fmt(ratio(gib[1], gib[2]), '.2f')} | {diff(f)} | {diff(i)} | "
            f"{c['graphs']} / {c['breaks']} / {c['eager_graphs']} | "
            f"{k.get('forward', 0)} / {k.get('backward', 0)} / {k.get('optimizer', 0)} | {first} |")


def child(name, args) -> None:
    """Runs one model in this process and prints its result as a JSON line."""
    r = run_model(name, args)
    print("ROW " + json.dumps(r), flush=True)


def isolated(name, argv, timeout):
    """One model in a child process: a CUDA fault or a hang costs that row only."""
    r = run_child(__file__, ["--child", name] + argv, timeout, marker="ROW", echo_stdout=True,
                  failed_stderr=3000)
    if r.get("error") == "timed out":
        return f"| {name} | timed out after {timeout} s |", None
    if "error" not in r:
        return row(r), r
    tail = last_line(r["stderr"])
    cuda = " (CUDA error)" if "CUDA" in r["stderr"] or "cuda" in tail else ""
    return f"| {name} | failed{cuda}: {tail[:200]} |", None


def separately(name, argv, timeout):
    """One model, each variant in a process of its own (peaks that no other compiler's
    memory mixes into); the rows merged, and the checked losses and parameters compared
    with the eager process's."""
    import tempfile

    class Dumped:   # (what compare() reads of a variant)
        def __init__(self, path):
            d = torch.load(path)
            self.losses = d["losses"]
            params = d["params"]
            self.model = type("M", (), {"named_parameters": lambda _: params.items()})()
    merged, failed = None, []
    with tempfile.TemporaryDirectory() as dump:
        for kind in VARIANTS:
            if kind == "inductor" and "--no-inductor" in argv:
                continue
            with tempfile.TemporaryDirectory() as caches:   # (first steps from empty caches)
                for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                                 ("FRAMETRACE_CACHE_DIR", "frametrace")):
                    os.environ[var] = os.path.join(caches, sub)
                line, result = isolated(name, argv + ["--variants", kind, "--dump", dump], timeout)
            if result is None:
                failed.append(f"{kind}: {line}")
                continue
            if merged is None:
                merged = result
            merged["variants"][kind] = result["variants"][kind]
            if kind == "frametrace":
                merged["frametrace"] = result["frametrace"]
        if merged is None or "eager" not in merged["variants"]:
            return f"| {name} | failed: {'; '.join(failed)[:300]} |", None
        ref = Dumped(os.path.join(dump, f"{name}-eager.pt"))
        for kind, v in merged["variants"].items():
            if kind != "eager" and v.get("diff") is None and "--dropout" not in argv:
                v["diff"] = compare(Dumped(os.path.join(dump, f"{name}-{kind}.pt")), ref, merged["checked"])
    return row(merged) + (f" failed: {'; '.join(failed)[:300]}" if failed else ""), merged


def details(r) -> list[str]:
    """The lines under the table: counters and reasons a row's numbers do not show."""
    c = r["frametrace"]
    out = [f"{r['model']}: frametrace compiled {c['graphs']} graphs, {c['breaks']} graph breaks, "
           f"{c['cpython_frames']} frames in CPython, {c['eager_graphs']} graphs run eagerly by the triton "
           f"backend, {c['aten_fallback_nodes']} nodes as aten calls a kernel could run; kernels {c['kernels']}"]
    out += [f"{r['model']}: break/fallback reason: {why}" for why in c["break_reasons"]]
    losses = {k: [round(x, 4) for x in v["losses"]] for k, v in r["variants"].items()}
    out.append(f"{r['model']}: losses of the {CHECK_STEPS} checked steps {losses}; parameters compared: "
               f"{', '.join(r['checked'])}")
    v = r["variants"]
    ratios = []
    for a, b in (("frametrace", "inductor"), ("frametrace", "eager"), ("inductor", "eager")):
        if a in v and b in v:
            ratios.append(f"{a}/{b}: time {v[a]['ms'] / v[b]['ms']:.2f}x" + (
                f", peak memory {v[a]['peak_gib'] / v[b]['peak_gib']:.2f}x ({v[a]['peak_gib']:.2f} vs "
                f"{v[b]['peak_gib']:.2f} GiB)" if v[a].get("peak_gib") and v[b].get("peak_gib") else ""))
    out.append(f"{r['model']}: " + "; ".join(ratios))
    for k, x in v.items():
        if x.get("memory"):
            out.append(f"{r['model']}: {k} memory by phase (GiB): " +
                       ", ".join(f"{name} {gib:.2f}" for name, gib in x["memory"].items()))
    return out


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=20, help="timed rounds (one step of each variant per round)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant after the checked ones")
    p.add_argument("--batch", type=int, default=None, help="4 (language models), 64 (CNNs)")
    p.add_argument("--image-size", type=int, default=224, help="CNNs: images of this height and width")
    p.add_argument("--channels-last", action="store_true", help="CNNs: model and images channels-last")
    p.add_argument("--optimizer", choices=("auto", "adamw", "sgd"), default="auto",
                   help="auto: SGD with momentum for CNNs, AdamW otherwise")
    p.add_argument("--separate", action="store_true",
                   help="each variant in its own process: peak memory as the allocator's own (not interleaved)")
    p.add_argument("--variants", help=argparse.SUPPRESS)   # (a child's: which variants to run)
    p.add_argument("--dump", help=argparse.SUPPRESS)       # (a child's: where its losses and params go)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--precision", choices=("autocast", "bf16"), default="autocast")
    p.add_argument("--dropout", action="store_true", help="keep the configs' dropout (no correctness check)")
    p.add_argument("--timeout", type=int, default=540, help="seconds per model")
    p.add_argument("--smoke", action="store_true",
                   help="tiny configs, few steps; on the CPU when CUDA is absent (frametrace with the eager "
                        "backend, torch.compile with backend='eager')")
    p.add_argument("--no-inductor", action="store_true", help="leave out torch.compile's row")
    p.add_argument("--ft-backend", help="frametrace's backend (default: triton, or eager without CUDA; "
                                        "triton on the CPU needs TRITON_INTERPRET=1)")
    p.add_argument("--md", help="also write the table as markdown to this file")
    p.add_argument("--profile", type=int, default=0,
                   help="after the timed rounds, profile each variant's step: its N costliest kernels")
    p.add_argument("--host-profile", type=int, default=0,
                   help="after the timed rounds, each variant's host time by phase and its N costliest "
                        "functions (cProfile, own time)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    args.device = torch.device("cuda" if cuda else "cpu")
    args.ft_backend = args.ft_backend or ("triton" if cuda else "eager")
    args.tc_backend = None if args.no_inductor else ("inductor" if cuda else "eager")
    cnn = any(m in CNNS for m in args.models.split(","))
    if args.optimizer == "auto":
        args.optimizer = "sgd" if cnn else "adamw"
    if args.batch is None:
        args.batch = 64 if cnn else 4
    if args.smoke:
        args.batch, args.seq, args.image_size = 2, 16, 32
        if args.steps == p.get_default("steps"):
            args.steps = 2
        if args.warmup == p.get_default("warmup"):
            args.warmup = 1
    return args


def main(argv=None):
    args = parse(argv)
    if args.child:
        return child(args.child, args)
    try:
        import transformers
        versions = f"transformers {transformers.__version__}"
    except ImportError:
        versions = "no transformers"
    gpu = torch.cuda.get_device_name() if args.device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {versions}, {gpu}; "
          f"batch {args.batch} x {args.seq} (images {args.image_size}), {args.precision}, {args.optimizer} foreach, "
          f"{'each variant in its own process' if args.separate else 'variants interleaved'}, "
          f"{args.steps} timed rounds; frametrace backend {args.ft_backend!r}, "
          f"torch.compile backend {args.tc_backend!r}", flush=True)
    forwarded = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
                 "--seq", str(args.seq), "--precision", args.precision, "--ft-backend", args.ft_backend,
                 "--image-size", str(args.image_size), "--optimizer", args.optimizer,
                 "--profile", str(args.profile), "--host-profile", str(args.host_profile)]
    forwarded += [f for f, on in (("--smoke", args.smoke), ("--dropout", args.dropout),
                                  ("--no-inductor", args.no_inductor), ("--channels-last", args.channels_last),
                                  ("--separate", args.separate)) if on]
    rows, notes = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)], []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        line, result = (separately if args.separate else isolated)(name, forwarded, args.timeout)
        print(f"{name}: {time.perf_counter() - t0:.0f} s in its process", flush=True)
        rows.append(line)
        print(line, flush=True)
        if result is not None:
            notes += details(result)
            print("\n".join(details(result)), flush=True)
    print("\n".join(rows + [""] + notes))
    if args.md:
        with open(args.md, "w") as fh:
            fh.write("\n".join(rows + [""] + notes) + "\n")
    return 0 if all("failed" not in r and "timed out" not in r for r in rows[2:]) else 1


if __name__ == "__main__":
    sys.exit(main())
