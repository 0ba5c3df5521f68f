"""Where the triton backend's first call spends its time: our own pipeline, phase by phase,
apart from Triton's (its compile of each kernel on a GPU; under TRITON_INTERPRET=1, the
interpreted kernel runs, which stand in for it on the CPU).  Issue 31 item 5: the first
call of EfficientNet-B0 with backend="triton" took 2.1x Inductor's on the H200.

    python benchmarks/triton_compile_time.py [--models hf_effnet,effnet,llama] [--train]
        [--side 64] [--batch 2] [--seq 64] [--profile N] [--skip-kernels]
        [--candidates few|all|both] [--steady N]

Models: hf_effnet (transformers' EfficientNetModel, B0's coefficients, batch x 3 x side x side;
skipped without transformers), effnet (an EfficientNet-B0 of our own: the stem, B0's 16 MBConv blocks, expand 1x1
conv + BN + SiLU, depthwise k x k conv + BN + SiLU, squeeze-excite, project 1x1 conv + BN,
residual; batch x 3 x side x side), densenet (DenseNet-121's layout, batch x 3 x side x side),
resnet50 (timm's, else torchvision's; skipped without either),
llama (transformers' LlamaForCausalLM from a small
config: 2 layers, hidden 256, batch x seq tokens; skipped without transformers).
--train: train mode, forward + loss + backward (the backward graph compiles at the first
backward); otherwise eval mode under no_grad.  On the CPU the kernels run in Triton's
interpreter (TRITON_INTERPRET=1 is set when no GPU is present).

Phases (exclusive seconds: a phase's time less the phases nested in it):
  trace      frametrace's bytecode tracer, guards, and whatever the rest of the call runs
             outside the backend (the model's own CPython where the frame runs eagerly)
  aot        AOTAutograd: functionalization, the decompositions, the joint graph
  partition  the joint graph's split into forward and backward (partition.py)
  lowering   FX nodes -> the backend's IR (lowering.py, ops.py)
  scheduler  grouping into kernels, fusion decisions (scheduler.py, foreach.py)
  kernel_source  each kernel's Triton source (kernel_source.py, tiling.py)
  wrapper    the Python wrapper's source, its exec, the fast launcher's source
  load       exec of each kernel's source into a Triton function (loader.py)
  triton     Triton: compiling (GPU) or interpreting (CPU) each kernel at its first launch,
             autotuning included
  backend    the rest of the backend (device checks, rehearsals, rebuilds)
--skip-kernels: no kernel runs (their outputs hold whatever memory held): our pipeline's
phases alone, without the interpreter's minutes on the CPU.
Triton's warnings of "tl.where with a non-boolean condition" (issue 31) met during the call
are counted, each with the kernel line that gave it (on a GPU, Triton's compiler).
--profile N: also cProfile the first call and print the N functions of frametrace with the
most own time.

Triton compiles: how many the first call makes on a GPU to pick block sizes, counted on any
device (autotune.COMPILES): a kernel whose candidates are timed (more than one, over
config.autotune_min_elements) compiles each, another one its heuristic default; by kernel
class (poi pointwise, tile tiled pointwise, per persistent reduction, red looped
reduction, combo foreach).
--candidates few|all|both: config.autotune_candidates (how many candidates a kernel gets,
autotune.few); both: each model in a child process per setting ("all" first), each with an
empty Triton cache (TRITON_CACHE_DIR) so that neither reuses the other's compiles, then a
table of the two (first call, compiles, steady time).
--steady N: after the first call, time N more calls and print their median (default 20 on
a GPU, 0 on the CPU, where the kernels run in the interpreter): the kernels' speed with
the block sizes picked.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
import warnings

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import frametrace  # noqa: E402
from frametrace.backends.triton import (  # noqa: E402
    autotune, backend, config, kernel_source, loader, lowering, partition, precompile, scheduler,
    tiling, wrapper)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import run_child  # noqa: E402

PHASES = ("trace", "aot", "partition", "lowering", "scheduler", "kernel_source", "wrapper",
          "load", "triton", "backend")


def _holders(fn, attr) -> list:
    """frametrace's modules that hold `fn` as `attr` (imported it by name)."""
    return [m for name, m in list(sys.modules.items())
            if name.startswith("frametrace") and getattr(m, attr, None) is fn]


class Phases:
    """Wraps the pipeline's functions so that each call's time, less that of the wrapped
    calls inside it, goes to its phase."""

    def __init__(self, skip_kernels=False):
        self.skip_kernels = skip_kernels
        self.times = dict.fromkeys(PHASES, 0.0)
        self.calls = {}         # "Class.method": calls, of those `count` wraps
        self.stack = []         # [phase, time of nested phases]
        self.undo = []

    def wrap(self, owner, attr, phase):
        original = getattr(owner, attr)
        phases = self
        main = threading.main_thread()
        key = f"{getattr(owner, '__name__', owner)}.{attr}"
        self.calls[key] = 0

        def timed(*args, **kwargs):
            if threading.current_thread() is not main:   # (compiles in threads: inside a
                return original(*args, **kwargs)          # phase the main thread times)
            phases.calls[key] += 1
            phases.stack.append([phase, 0.0])
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                _, nested = phases.stack.pop()
                phases.times[phase] += spent - nested
                if phases.stack:
                    phases.stack[-1][1] += spent
        timed.__wrapped__ = original
        # every module of the backend that imported the function by name
        owners = [owner] if isinstance(owner, type) else _holders(original, attr)
        for o in owners:
            setattr(o, attr, timed)
            self.undo.append((o, attr, original))

    def count(self, owner, attr):
        """Count the calls of a method (`owner` a class) in `self.calls`."""
        original = owner.__dict__[attr]
        key = f"{owner.__name__}.{attr}"
        self.calls[key] = 0
        calls = self.calls

        def counted(*args, **kwargs):
            calls[key] += 1
            return original(*args, **kwargs)
        counted.__wrapped__ = original
        setattr(owner, attr, counted)
        self.undo.append((owner, attr, original))

    def __enter__(self):
        # kernel sources made (each generation ends in one `_source`; an outer reduction's
        # is generated twice), and generations from scratch (`generate`: the others are
        # a fusion candidate's kernel continued from the kernel it joins)
        for cls in (kernel_source.KernelCodegen, tiling.TiledCodegen):
            self.count(cls, "_source")
        self.count(tiling.TiledCodegen, "generate")
        w = self.wrap
        if self.skip_kernels:
            # (launch_static: what a Launcher launches through, config.memo_launches)
            for name, stub in (("launch", None), ("build_kernel", None), ("launch_static", (None, None))):
                real = getattr(loader, name)
                for m in _holders(real, name):
                    self.undo.append((m, name, real))
                    setattr(m, name, lambda *args, _stub=stub, **kwargs: _stub)
        w(backend, "compile_graph", "aot")
        w(partition, "partition", "partition")
        w(backend, "_compile", "backend")
        w(lowering.GraphLowering, "run", "lowering")
        w(backend, "schedule", "scheduler")
        w(kernel_source.KernelCodegen, "generate", "kernel_source")
        if hasattr(kernel_source.KernelCodegen, "joined"):  # (a candidate continued from its kernel)
            w(kernel_source.KernelCodegen, "joined", "kernel_source")
        w(tiling, "generate", "kernel_source")
        w(wrapper.WrapperCodegen, "generate", "wrapper")
        w(wrapper.WrapperCodegen, "fast_source", "wrapper")
        w(loader, "load_kernel", "load")
        w(loader, "launch", "triton")
        w(loader, "build_kernel", "triton")
        w(loader, "launch_static", "triton")
        w(precompile, "precompile", "triton")
        return self

    def __exit__(self, *exc):
        for o, attr, original in reversed(self.undo):
            setattr(o, attr, original)

    def total(self, seconds):
        """`seconds` of the whole call: what no wrapped phase took is the tracer's."""
        self.times["trace"] = seconds - sum(v for k, v in self.times.items() if k != "trace")
        return self.times


def _where_warnings():
    """A showwarning that records each non-boolean `tl.where` with the kernel line (from
    the frame of Triton's code generator, or its interpreter's, that was running)."""
    seen = {}

    def show(message, *args, **kwargs):
        if "non-boolean" not in str(message):
            return
        import inspect
        for info in inspect.stack(0):
            gen = info.frame.f_locals.get("self")
            node = getattr(gen, "cur_node", None)
            if node is not None and hasattr(gen, "jit_fn"):
                line = gen.jit_fn.src.splitlines()[node.lineno - 1].strip()
                seen[f"{gen.jit_fn.__name__}: {line}"] = str(message)
                return
            if info.filename.startswith("<frametrace-triton"):
                seen[f"{info.filename}:{info.lineno}: {(info.code_context or [''])[0].strip()}"] = str(message)
                return
        seen[f"? {message}"] = str(message)
    return seen, show


def effnet(side, device="cpu", batch=2, seq=64):
    """EfficientNet-B0's layout (timm's stages, widths and kernel sizes), random weights."""
    nn = torch.nn

    class SqueezeExcite(nn.Module):
        def __init__(self, c, r):
            super().__init__()
            self.reduce, self.expand = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

        def forward(self, x):
            s = x.mean((2, 3), keepdim=True)
            return x * self.expand(nn.functional.silu(self.reduce(s))).sigmoid()

    class MBConv(nn.Module):
        def __init__(self, cin, cout, k, stride, expand):
            super().__init__()
            mid = cin * expand
            layers = [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()] \
                if expand != 1 else []
            self.body = nn.Sequential(
                *layers,
                nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False),
                nn.BatchNorm2d(mid), nn.SiLU(),
                SqueezeExcite(mid, max(1, cin // 4)),
                nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    # (expand, channels, repeats, stride, kernel): B0's stages, 16 blocks
    stages = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3),
              (6, 112, 3, 1, 5), (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]
    blocks, cin = [], 32
    for e, c, n, s, k in stages:
        for i in range(n):
            blocks.append(MBConv(cin, c, k, s if i == 0 else 1, e))
            cin = c
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU(), *blocks,
        nn.Conv2d(320, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000))
    x = torch.randn(batch, 3, side, side).to(device)   # (drawn on the CPU: the same values anywhere)
    labels = torch.randint(0, 1000, (batch,)).to(device)
    return model, lambda m: m(x), lambda m: torch.nn.functional.cross_entropy(m(x), labels)


def llama(side, device="cpu", batch=2, seq=64):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=688,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=1024,
                      max_position_embeddings=max(128, seq), use_cache=False)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq)).to(device)
    return model, lambda m: m(input_ids=ids).logits, lambda m: m(input_ids=ids, labels=ids).loss


def hf_effnet(side, device="cpu", batch=2, seq=64):
    """transformers' EfficientNetModel with B0's coefficients (EfficientNetConfig()'s
    defaults are B7's), batch x 3 x side x side; the loss a mean of its pooled output."""
    try:
        from transformers import EfficientNetConfig, EfficientNetModel
    except ImportError:
        return None
    cfg = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280,
                             image_size=side)
    model = EfficientNetModel(cfg)
    x = torch.randn(batch, 3, side, side).to(device)
    return (model, lambda m: m(pixel_values=x).pooler_output,
            lambda m: m(pixel_values=x).pooler_output.square().mean())


def densenet(side, device="cpu", batch=2, seq=64):
    """DenseNet-121's layout (torchvision's and timm's densenet121: growth 32, blocks
    6/12/24/16, BN-ReLU-conv1x1(128)-BN-ReLU-conv3x3(32) layers whose inputs are the cat of
    all before, transitions BN-ReLU-conv1x1-avgpool), random weights; issue 31 item 5's
    model (its cats grow to 1024 channels from up to 48 inputs)."""
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self, cin, growth=32, width=4):
            super().__init__()
            self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, width * growth, 1, bias=False)
            self.norm2 = nn.BatchNorm2d(width * growth)
            self.conv2 = nn.Conv2d(width * growth, growth, 3, 1, 1, bias=False)

        def forward(self, features):
            x = torch.cat(features, 1)
            x = self.conv1(torch.relu(self.norm1(x)))
            return self.conv2(torch.relu(self.norm2(x)))

    class Block(nn.Module):
        def __init__(self, n, cin, growth=32):
            super().__init__()
            self.layers = nn.ModuleList(Layer(cin + i * growth, growth) for i in range(n))

        def forward(self, x):
            features = [x]
            for layer in self.layers:
                features.append(layer(features))
            return torch.cat(features, 1)

    stages, c = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                 nn.MaxPool2d(3, 2, 1)], 64
    for i, n in enumerate((6, 12, 24, 16)):
        stages.append(Block(n, c))
        c += 32 * n
        if i < 3:
            stages += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                       nn.AvgPool2d(2, 2)]
            c //= 2
    model = nn.Sequential(*stages, nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(c, 1000))
    x = torch.randn(batch, 3, side, side).to(device)
    labels = torch.randint(0, 1000, (batch,)).to(device)
    return model, lambda m: m(x), lambda m: torch.nn.functional.cross_entropy(m(x), labels)


def resnet50(side, device="cpu", batch=2, seq=64):
    """timm's resnet50 (else torchvision's; None without either), random weights; the loss
    the cross-entropy on random labels (training.py's CNN step without the optimizer)."""
    try:
        import timm
        model = timm.create_model("resnet50", pretrained=False)
    except ImportError:
        try:
            import torchvision
        except ImportError:
            return None
        model = torchvision.models.resnet50(weights=None)
    x = torch.randn(batch, 3, side, side).to(device)
    labels = torch.randint(0, 1000, (batch,)).to(device)
    return model, lambda m: m(x), lambda m: torch.nn.functional.cross_entropy(m(x), labels)


MODELS = {"effnet": effnet, "llama": llama, "hf_effnet": hf_effnet, "densenet": densenet, "resnet50": resnet50}


def compiles() -> dict:
    """The Triton compiles of the block-size choices made since autotune.COMPILES was
    cleared: in all, by kernel class, and how many kernels were timed."""
    by_class = {}
    for (name, _, _), n in autotune.COMPILES.items():
        cls = name.split("_")[1] if name.startswith("triton_") else "other"
        got = by_class.setdefault(cls, [0, 0, 0])  # kernels, timed, compiles
        got[0] += 1
        got[1] += n > 1
        got[2] += n
    return {"compiles": sum(v[2] for v in by_class.values()),
            "timed": sum(v[1] for v in by_class.values()), "by_class": by_class}


def first_call(name, train, side, profile, skip_kernels=False, steady=0, batch=2, seq=64):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    made = MODELS[name](side, device, batch, seq)   # (the inputs on the model's device)
    if made is None:
        print(f"{name}: skipped (transformers, or timm and torchvision, not installed)")
        return None
    model, forward, loss = made
    model = model.to(device).train(train)
    frametrace.reset()
    backend.COMPILED.clear()    # (this model's graphs alone in the counts)
    autotune.TUNED.clear()
    autotune.COMPILES.clear()
    compiled = frametrace.optimize(model, backend="triton")
    prof = cProfile.Profile() if profile else None
    where, show = _where_warnings()

    def step():
        """One call: forward + loss + backward, or the forward under no_grad; synchronized."""
        if train:
            loss(compiled).backward()
        else:
            with torch.no_grad():
                forward(compiled)
        if device == "cuda":
            torch.cuda.synchronize()
    with Phases(skip_kernels) as phases, warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        step()
        if prof:
            prof.disable()
        seconds = time.perf_counter() - t0
    times = phases.total(seconds)
    kernels = sum(len(m.kernels) for m in backend.COMPILED)
    ours = sum(v for k, v in times.items() if k not in ("triton", "trace"))
    print(f"{name} ({'train' if train else 'eval'}, {device}): first call {seconds:.2f} s, "
          f"graphs {len(backend.COMPILED)}, kernels {kernels}; the backend's own pipeline "
          f"{ours:.2f} s, Triton {times['triton']:.2f} s")
    for k in PHASES:
        print(f"  {k:14s} {times[k]:7.2f} s")
    count = compiles()
    print(f"  Triton compiles on a GPU (autotune_candidates={config.autotune_candidates!r}): "
          f"{count['compiles']}, {count['timed']} kernels timed; by class (kernels, timed, compiles): "
          + ", ".join(f"{k} {tuple(v)}" for k, v in sorted(count["by_class"].items())))
    calls = phases.calls
    sources = calls["KernelCodegen._source"] + calls["TiledCodegen._source"]
    scratch = calls["KernelCodegen.generate"] + calls["TiledCodegen.generate"]
    print(f"  kernel sources generated: {sources} ({sources / max(kernels, 1):.1f} a kernel), "
          f"{scratch} of them from scratch")
    print(f"  compiled ahead of first launches (precompile_kernels={config.precompile_kernels}): "
          f"{precompile.STATS['compiles']} compiles for {precompile.STATS['graphs']} graphs in "
          f"{precompile.STATS['seconds']:.2f} s")
    print(f"  tl.where with a non-boolean condition: {len(where)} kernel lines")
    for line, message in where.items():
        print(f"    {line}  ({message[-20:]})")
    if prof:
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime")
        width = [(f, s) for f, s in stats.stats.items() if "frametrace" in f[0]]
        width.sort(key=lambda fs: -fs[1][2])
        print(f"  the {profile} functions of frametrace with the most own time:")
        for (path, line, fn), (_, ncalls, tt, ct, _) in width[:profile]:
            print(f"    {tt:6.2f} s own {ct:6.2f} s cum {ncalls:8d} calls  "
                  f"{path.split('frametrace/', 1)[-1]}:{line} {fn}")
    steady_ms = None
    if steady and not skip_kernels:
        runs = []
        for _ in range(steady):
            t0 = time.perf_counter()
            step()
            runs.append(time.perf_counter() - t0)
        steady_ms = 1000 * statistics.median(runs)
        print(f"  steady call (median of {steady}): {steady_ms:.3f} ms")
    print("RESULT " + json.dumps({
        "model": name, "train": train, "candidates": config.autotune_candidates,
        "first_call_s": seconds, "triton_s": times["triton"], "ours_s": ours,
        "kernels": kernels, "steady_ms": steady_ms, **count}))
    return times


def both(args):
    """Each model in a child per autotune_candidates setting, each with an empty Triton
    cache; then the two side by side."""
    rows = []
    for name in args.models.split(","):
        for candidates in ("all", "few"):
            argv = ["--models", name, "--candidates", candidates, "--side", str(args.side),
                    "--batch", str(args.batch), "--seq", str(args.seq),
                    "--steady", str(args.steady)] + (["--train"] if args.train else []) + \
                (["--skip-kernels"] if args.skip_kernels else [])
            with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
                got = run_child(__file__, argv, args.timeout, env={"TRITON_CACHE_DIR": cache},
                                echo_stdout=True)
            rows.append((name, candidates, got))
    print(f"\n{'model':10s} {'candidates':10s} {'first call s':>12s} {'Triton s':>9s} "
          f"{'compiles':>9s} {'timed':>6s} {'steady ms':>10s}")
    for name, candidates, r in rows:
        if "error" in r:
            print(f"{name:10s} {candidates:10s} error: {r['error'][-300:]}")
            continue
        steady = "-" if r["steady_ms"] is None else f"{r['steady_ms']:.3f}"
        print(f"{name:10s} {candidates:10s} {r['first_call_s']:12.2f} {r['triton_s']:9.2f} "
              f"{r['compiles']:9d} {r['timed']:6d} {steady:>10s}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="hf_effnet,effnet,llama")
    p.add_argument("--train", action="store_true")
    p.add_argument("--side", type=int, default=64, help="effnet's image side")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64, help="llama's tokens a sequence")
    p.add_argument("--profile", type=int, default=0)
    p.add_argument("--skip-kernels", action="store_true")
    p.add_argument("--no-precompile", action="store_true",
                   help="config.precompile_kernels off: each kernel compiles at its first launch")
    p.add_argument("--candidates", choices=("few", "all", "both"), default=config.autotune_candidates)
    p.add_argument("--steady", type=int, default=20 if torch.cuda.is_available() else 0)
    p.add_argument("--timeout", type=int, default=3600, help="seconds a child may run (--candidates both)")
    args = p.parse_args()
    if args.candidates == "both":
        return both(args)
    config.autotune_candidates = args.candidates
    config.precompile_kernels = not args.no_precompile
    torch.set_num_threads(1)
    frametrace.config.cache = False     # (a cold first call: no warm start from the disk)
    for name in args.models.split(","):
        first_call(name, args.train, args.side, args.profile, args.skip_kernels, args.steady,
                   args.batch, args.seq)


if __name__ == "__main__":
    main()
