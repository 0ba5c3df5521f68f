"""GPU check (CUDA only): backend="triton" on training graphs with torch.Generator inputs.

On CUDA, AOTAutograd (torch 2.11-2.15) functionalizes a random op that activation
checkpointing recomputes (SDPA with dropout, frametrace's dropout key draw) with
graph-safe RNG: the forward and the backward graph each get a Generator input per such
op, and the op runs as graphsafe_run_with_rng_state(op, ..., rng_state=generator).  The
triton backend passes the generators through its wrapper to those calls and compiles the
rest of the graph to kernels (config.generator_inputs; before, such graphs ran without
kernels).  This script trains, a few steps each:

  1. llama-p0: HF LlamaForCausalLM (2 layers, hidden 256, 4 heads, vocab 1024),
     gradient checkpointing (non-reentrant), attention_dropout=0: no random op, so the
     losses and gradients are compared with eager's (same weights, same batches).
  2. llama-p0.1: the same with attention_dropout=0.1 (SDPA with dropout, recomputed in
     the backward in a graph-safe RNG state).  Eager cannot draw the same masks, so the
     reference is the same compiled model with config.generator_inputs=False: the same
     AOTAutograd graphs and generators (seeded alike: AOTAutograd seeds them from the CPU
     generator at the first call), run as their FX code without kernels.  The same
     gradients mean the kernels' graphs drew what torch's path draws, forward and
     recompute alike; a wrong recompute shows as a gradient for another mask.  Control:
     the gradients of consecutive steps (same weights and batch, new masks) differ by
     far more.
  3. plain: a module with torch.utils.checkpoint around a dropout and a rand_like factor
     (frametrace's Philox draws from one key per call: recomputed in a graph-safe RNG
     state, or saved, as AOTAutograd's partition chooses); the masks and the noise are
     read off the outputs and the gradients computed eagerly with them: the backward's
     recompute must have drawn exactly the forward's numbers.

Note that SDPA's efficient/flash attention ops are random ops whatever their dropout, so
part 1's graphs take Generators too.  Seen on the H200 (torch 2.11, transformers 5.17,
2026-11-29): 37 s in all; llama-p0 gradients within 1.1e-6 of eager's, llama-p0.1 within
8.9e-7 of the reference against a 0.70 control, plain within 1.7e-5, eager_graphs 0.

Each part reports frames compiled, graph breaks, the triton backend's eager_graphs
(must be 0 with kernels on), the compiled modules that take Generators and the calls
that use them.  The last line is PASS or FAIL.

    python setup.py build_ext --inplace    # (the C core, for this Python)
    python benchmarks/triton_generator_check.py [--steps 3] [--seq 128] [--batch 4]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time

# a cache folder of this run's own: a cold compile, nothing served from an earlier run
os.environ["FRAMETRACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="frametrace-generator-check-")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import frametrace  # noqa: E402

HOP_NAME = "graphsafe_run_with_rng_state"
FAILURES: list[str] = []


def check(ok, what):
    if not ok:
        FAILURES.append(what)
    return "ok" if ok else "FAIL"


class Watch:
    """frametrace's counters over one part: frames, breaks, eager graphs, and the
    compiled modules that take Generators (seen after each step: COMPILED keeps 8)."""

    def __init__(self):
        from frametrace.backends.triton import backend
        self.backend = backend
        self.records = []
        self.eager0 = backend.STATS["eager_graphs"]
        self.fallback0 = backend.STATS["fallback_nodes"]
        self.modules = {}
        self.before = {id(m) for m in backend.COMPILED}   # (an earlier part's)
        frametrace.convert.record_observers.append(self.records.append)

    def seen(self):
        for m in self.backend.COMPILED:
            if id(m) not in self.before:
                self.modules[id(m)] = m

    def close(self):
        frametrace.convert.record_observers.remove(self.records.append)

    def report(self, counter):
        b = self.backend
        gen_mods = [m for m in self.modules.values() if getattr(m.wrapper.lowered, "generators", ())]
        hop_calls = sum(sum(1 for op in m.extern_ops if isinstance(op, torch._ops.HigherOrderOperator)
                            and op.name() == HOP_NAME) for m in gen_mods)
        return {"frames": counter.frame_count,
                "breaks": sum(r.outcome == "break" for r in self.records),
                "cpython_frames": sum(r.outcome == "fallback" for r in self.records),
                "eager_graphs": b.STATS["eager_graphs"] - self.eager0,
                "aten_fallback_nodes": b.STATS["fallback_nodes"] - self.fallback0,
                "modules": len(self.modules),
                "generator_modules": [(m.kind, len(m.wrapper.lowered.generators), len(m.kernels))
                                      for m in gen_mods],
                "graphsafe_calls": hop_calls}


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def grads_of(model):
    return {n.replace("_orig_mod.", ""): p.grad.detach().clone()
            for n, p in model.named_parameters() if p.grad is not None}


def max_rel(ga, gb):
    assert ga.keys() == gb.keys(), (sorted(ga)[:3], sorted(gb)[:3])
    return max(rel(ga[n], gb[n]) for n in ga)


# ----------------------------------------------------------------------------- LLaMA
def make_llama(dropout):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      attention_dropout=dropout)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").cuda().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def llama_steps(model, batch, steps, watch=None, seed=None, sgd=False):
    """(losses, gradients of each step); the RNGs seeded before the first call; `sgd`:
    an SGD update after each step (else the weights stay: consecutive steps differ only
    by their masks)."""
    if seed is not None:
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2) if sgd else None
    losses, grads = [], []
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.cuda.synchronize()
        losses.append(loss.item())
        grads.append(grads_of(model))
        if opt is not None:
            opt.step()
        model.zero_grad(set_to_none=True)
        if watch is not None:
            watch.seen()
    return losses, grads


def compiled(model, counter_inner="triton"):
    counter = frametrace.testing.CompileCounter(inner=counter_inner)
    return frametrace.optimize(model, backend=counter), counter


def part_llama_exact(args, batch):
    frametrace.reset()
    base = make_llama(0.0)
    eager = copy.deepcopy(base)
    watch = Watch()
    model, counter = compiled(copy.deepcopy(base))
    t0 = time.perf_counter()
    got_l, got_g = llama_steps(model, batch, args.steps, watch, seed=1, sgd=True)
    seconds = time.perf_counter() - t0
    watch.close()
    want_l, want_g = llama_steps(eager, batch, args.steps, seed=1, sgd=True)
    loss_diff = max(abs(a - b) for a, b in zip(got_l, want_l))
    grad_diff = max(max_rel(a, b) for a, b in zip(got_g, want_g))
    c = watch.report(counter)
    print(f"[llama-p0] attention_dropout=0, checkpointed, {args.steps} SGD steps, {seconds:.1f} s")
    print(f"  counters: {c}")
    print(f"  eager_graphs == 0: {check(c['eager_graphs'] == 0, 'llama-p0 eager graphs')}")
    print(f"  losses vs eager: max abs diff {loss_diff:.2e}  "
          f"{check(loss_diff < 1e-3, 'llama-p0 losses')}")
    print(f"  gradients vs eager: max rel diff {grad_diff:.2e} (relative to each tensor's max)  "
          f"{check(grad_diff < 2e-3, 'llama-p0 gradients')}")


def part_llama_dropout(args, batch):
    from frametrace.backends.triton import config
    frametrace.reset()
    base = make_llama(0.1)
    watch = Watch()
    model, counter = compiled(copy.deepcopy(base))
    t0 = time.perf_counter()
    got_l, got_g = llama_steps(model, batch, args.steps, watch, seed=7)
    seconds = time.perf_counter() - t0
    watch.close()
    c = watch.report(counter)
    # the reference: the same graphs and generators, run without kernels
    frametrace.reset()
    ref_watch = Watch()
    config.generator_inputs = False
    try:
        ref, ref_counter = compiled(copy.deepcopy(base))
        want_l, want_g = llama_steps(ref, batch, args.steps, ref_watch, seed=7)
    finally:
        config.generator_inputs = True
        ref_watch.close()
    rc = ref_watch.report(ref_counter)
    loss_diff = max(abs(a - b) for a, b in zip(got_l, want_l))
    grad_diff = max(max_rel(a, b) for a, b in zip(got_g, want_g))
    control = min(max_rel(got_g[i], got_g[i + 1]) for i in range(len(got_g) - 1)) if len(got_g) > 1 else float("nan")
    print(f"[llama-p0.1] attention_dropout=0.1, checkpointed, {args.steps} steps (weights fixed), {seconds:.1f} s")
    print(f"  counters: {c}")
    print(f"  eager_graphs == 0: {check(c['eager_graphs'] == 0, 'llama-p0.1 eager graphs')}")
    print(f"  graphs with Generator inputs compiled to kernels: {len(c['generator_modules'])}  "
          f"{check(len(c['generator_modules']) >= 2 and c['graphsafe_calls'] >= 2, 'llama-p0.1 generator graphs')}")
    print(f"  reference (generator_inputs=False) ran {rc['eager_graphs']} graphs without kernels")
    print(f"  losses vs reference: {['%.5f' % v for v in got_l]} vs {['%.5f' % v for v in want_l]}, "
          f"max abs diff {loss_diff:.2e}  {check(loss_diff < 1e-3, 'llama-p0.1 losses')}")
    print(f"  gradients vs reference: max rel diff {grad_diff:.2e}; control (consecutive steps, "
          f"other masks): {control:.2e}  "
          f"{check(grad_diff < 2e-3 and control > 20 * grad_diff, 'llama-p0.1 gradients')}")


# ----------------------------------------------------------------------------- plain module
class CheckpointedNoise(torch.nn.Module):
    """Two checkpointed regions that draw random numbers (dropout; a rand_like factor);
    it returns what each region computed, so that the numbers can be read off."""

    def __init__(self, n):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)

    def dropped(self, x):
        return F.dropout(self.lin(x).relu(), 0.4) * 3

    def noisy(self, h):
        return h * torch.rand_like(h) + 1

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        h = checkpoint(self.dropped, x, use_reentrant=False)
        return h, checkpoint(self.noisy, h, use_reentrant=False)


def reference_grads(model, x, h, out, g):
    """The gradients for the numbers the forward drew: the mask read off h, the factor
    off (out - 1) / h, the regions replayed eagerly with them."""
    h, out = h.detach(), out.detach()
    keep = (h != 0).float()
    noise = torch.where(h != 0, (out - 1) / h, torch.zeros_like(h))
    x = x.detach().clone().requires_grad_(True)
    w, b = (p.detach().clone().requires_grad_(True) for p in (model.lin.weight, model.lin.bias))
    h2 = F.linear(x, w, b).relu() * keep / 0.6 * 3
    torch.autograd.backward([h2 * noise + 1], [g])
    return x.grad, w.grad, b.grad


def part_plain(args):
    frametrace.reset()
    torch.manual_seed(0)
    n = 512
    model = CheckpointedNoise(n).cuda()
    watch = Watch()
    f, counter = compiled(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    worst, masks = 0.0, []
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(256, n, device="cuda", requires_grad=True)
        h, out = f(x)
        g = torch.randn_like(out)
        want = reference_grads(model, x, h, out, g)
        out.backward(g)
        for got, exp in zip((x.grad, model.lin.weight.grad, model.lin.bias.grad), want):
            worst = max(worst, rel(got, exp))
        masks.append(h != 0)
        opt.step()
        opt.zero_grad()
        watch.seen()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    watch.close()
    c = watch.report(counter)
    kept = torch.stack(masks).float().mean().item()
    print(f"[plain] torch.utils.checkpoint over dropout(0.4) and rand_like, {args.steps} steps, {seconds:.1f} s")
    print(f"  counters: {c}")
    print(f"  eager_graphs == 0: {check(c['eager_graphs'] == 0, 'plain eager graphs')}")
    # (frametrace's dropout draws one Philox key per call; whether AOTAutograd saves it or
    # recomputes it in a graph-safe RNG state is its partition's choice: either is right)
    print(f"  graphs with Generator inputs compiled to kernels: {len(c['generator_modules'])} "
          f"(the key saved instead where 0)")
    print(f"  gradients vs the forward's own masks and noise: max rel diff {worst:.2e}  "
          f"{check(worst < 1e-4, 'plain gradients')}")
    print(f"  masks: nonzero fraction {kept:.3f} (relu's half of 0.6 kept: ~0.3), steps differ: "
          f"{check(not torch.equal(masks[0], masks[1]), 'plain masks differ')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--parts", default="plain,llama-p0,llama-p0.1")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("triton_generator_check: needs CUDA (graph-safe RNG is CUDA-only); nothing to check")
        return 2
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}, steps {args.steps}, batch {args.batch}x{args.seq}")
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(123)
    batch = torch.randint(0, 1024, (args.batch, args.seq), generator=gen).cuda()
    parts = args.parts.split(",")
    for name, run in (("plain", lambda: part_plain(args)), ("llama-p0", lambda: part_llama_exact(args, batch)),
                      ("llama-p0.1", lambda: part_llama_dropout(args, batch))):
        if name in parts:
            try:
                run()
            except Exception as e:  # a part that raises is a failure, the others still run
                import traceback
                traceback.print_exc()
                FAILURES.append(f"{name}: {type(e).__name__}: {e}"[:300])
    from frametrace.backends.triton import result_cache
    print(f"result cache: {result_cache.STATS} (a module with Generator inputs is never stored)")
    print(f"total {time.perf_counter() - t0:.1f} s")
    print("PASS" if not FAILURES else f"FAIL: {FAILURES}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
