"""PyTorch's operator database as a peer test suite for frametrace's graph passes and backends.

`torch.testing._internal.common_methods_invocations.op_db` (shipped in the torch wheel) holds
sample inputs for ~700 operator variants.  For every op and sample this script calls the op
inside a function compiled by frametrace, three times on fresh copies of the inputs, and
compares each call with the same function run in CPython:

- values (NaN positions included), dtype, shape, strides of every dim longer than 1 and
  contiguity of each output tensor;
- which inputs each output shares storage with (aliasing), and which outputs share it;
- the inputs afterwards (in-place writes) and their strides;
- the exception's type where eager raises;
- with ``--grad``, the gradients of the outputs' sum with respect to every float input.

Inputs come in layouts chosen to break layout shortcuts: ``plain`` (as the sample has them),
``transposed`` (last two dims' strides swapped), ``sliced`` (every other element of a
larger buffer), ``expanded`` (stride 0 along the last dim) and ``channels_last`` (4-D).
Each case is classified:

- right: every call matched CPython;
- wrong: a call differed (the first difference is listed);
- error: frametrace failed where CPython did not (a backend error, an internal tracer error);
- uncompiled: nothing was compiled (the frame ran in CPython; not wrong, listed);
- skipped: the op is not deterministic in eager, or has no usable sample.

Run the full sweep (long) or a part of it::

    python tests/opinfo_sweep.py                               # every op, eager and aot_eager
    python tests/opinfo_sweep.py --backends eager --ops add,mul --layouts plain,transposed
    TRITON_INTERPRET=1 python tests/opinfo_sweep.py --backends triton --samples 1
    python tests/opinfo_sweep.py --backends triton --device cuda --samples 1    # on a GPU

It prints a table (ops x backends: right / wrong / error / uncompiled / skipped) and every
wrong or error case.  `tests/test_opinfo_sweep.py` runs a fixed subset of it in CI.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import os
import sys
import time
import warnings

import torch
import torch.utils._pytree as pytree

import frametrace
from frametrace import convert

LAYOUTS = ("plain", "transposed", "sliced", "expanded", "channels_last")
RESULTS = ("right", "wrong", "error", "uncompiled", "skipped")

# Ops whose eager results cannot be compared call for call: they draw random numbers from
# generators the compiled graph may consume differently, or return uninitialized memory
# (resize_ of an expanded tensor grows its storage with it).
_NONDETERMINISTIC = {
    "bernoulli", "normal", "uniform", "rand_like", "randn_like", "randint_like",
    "randint", "randn", "rand", "multinomial", "empty", "empty_like", "empty_strided",
    "new_empty", "new_empty_strided", "empty_permuted", "resize_", "resize_as_",
    "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.rrelu", "cauchy", "exponential",
    "geometric", "log_normal", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "nn.functional.multi_head_attention_forward",
    "torch.ops.aten._efficientzerotensor", "svd_lowrank", "pca_lowrank", "lobpcg",
    "nn.functional.gumbel_softmax", "sparse.sampled_addmm",
}


@dataclasses.dataclass
class Case:
    op: object
    sample: object
    layout: str
    dtype: torch.dtype
    variant: str            # "out-of-place" or "inplace"
    grad: bool
    post: str = "none"      # what the program does with the op's outputs (make_fn)

    @property
    def name(self):
        n = self.op.name + (f".{self.op.variant_test_name}" if self.op.variant_test_name else "")
        return n + ("_" if self.variant == "inplace" else "")


@dataclasses.dataclass
class Outcome:
    result: str
    detail: str = ""


# ----------------------------------------------------------------------------- inputs

def relayout(t, layout):
    """`t`'s values in a tensor of the given layout (a fresh buffer, never `t` itself)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return t
    rg = t.requires_grad
    t = t.detach()
    if layout == "transposed" and t.dim() >= 2:
        out = t.transpose(-1, -2).clone().transpose(-1, -2)
    elif layout == "sliced" and t.dim() >= 1 and t.numel() > 0:
        big = t.new_zeros(t.shape[:-1] + (t.shape[-1] * 2,))
        out = big[..., ::2]
        out.copy_(t)
    elif layout == "expanded" and t.dim() >= 1 and t.shape[-1] > 1:
        out = t[..., :1].clone().expand(t.shape)
    elif layout == "channels_last" and t.dim() == 4:
        out = t.contiguous(memory_format=torch.channels_last)
    else:
        out = t.clone()
    return out.requires_grad_(rg) if rg and not out.requires_grad else out


def applies(sample, layout):
    """Whether the layout changes anything in this sample's tensors."""
    if layout == "plain":
        return True
    leaves = [t for t in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(t, torch.Tensor) and t.layout == torch.strided]
    if layout == "transposed":
        return any(t.dim() >= 2 for t in leaves)
    if layout == "sliced":
        return any(t.dim() >= 1 and t.numel() > 0 for t in leaves)
    if layout == "expanded":
        return any(t.dim() >= 1 and t.shape[-1] > 1 for t in leaves)
    if layout == "channels_last":
        return any(t.dim() == 4 for t in leaves)
    raise ValueError(layout)


def fresh(case):
    """A fresh copy of the sample's (input, args, kwargs) in the case's layout."""
    s = case.sample

    def one(x):
        if not isinstance(x, torch.Tensor):
            return x
        t = relayout(x, case.layout)
        if case.grad and t.is_floating_point() and t.is_leaf and not t.requires_grad:
            t.requires_grad_(True)
        return t
    return pytree.tree_map(one, (s.input, s.args, dict(s.kwargs)))


def _contiguous(x):
    return x.contiguous() if isinstance(x, torch.Tensor) and x.layout == torch.strided else x


def make_fn(fn_op, post="none"):
    """The compiled program: the op alone, or followed by `.contiguous()` of its outputs
    (where a pass that drops a contiguous() trusting a layout fact shows: the result must
    be contiguous and must not share memory with an input it does not in eager)."""
    if post == "contiguous":
        def program(inp, args, kwargs):
            return pytree.tree_map(_contiguous, fn_op(inp, *args, **kwargs))
    else:
        def program(inp, args, kwargs):
            return fn_op(inp, *args, **kwargs)
    return program


# ----------------------------------------------------------------------------- comparing

def _storages(t):
    try:
        return t.untyped_storage().data_ptr() if t.numel() else None
    except Exception:
        return None


def tensor_leaves(x):
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def alias_map(outputs, inputs):
    """For each output tensor, the positions of the inputs and earlier outputs sharing its storage."""
    ins = [_storages(t) for t in inputs]
    outs = [_storages(t) for t in outputs]
    return [(tuple(i for i, p in enumerate(ins) if p is not None and p == q),
             tuple(j for j, p in enumerate(outs[:k]) if p is not None and p == q))
            for k, q in enumerate(outs)]


def _tol(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype in (torch.float32, torch.complex64):
        return 1.3e-5, 1e-5
    return 1e-7, 1e-7


def diff_tensor(a, b, path):
    if type(a) is not type(b) and not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return f"{path}: type {type(a).__name__} vs {type(b).__name__}"
    if a.dtype != b.dtype or a.shape != b.shape or a.layout != b.layout:
        return f"{path}: {a.dtype}{tuple(a.shape)} {a.layout} vs {b.dtype}{tuple(b.shape)} {b.layout}"
    if a.requires_grad != b.requires_grad:
        return f"{path}: requires_grad {a.requires_grad} vs {b.requires_grad}"
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    a, b = a.detach().resolve_conj().resolve_neg(), b.detach().resolve_conj().resolve_neg()
    if a.is_floating_point() or a.is_complex():
        rtol, atol = _tol(a.dtype)
        ok = torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if ok and a.numel():       # NaN positions too (allclose matches them already) and infs' signs
            ok = torch.equal(torch.isinf(a), torch.isinf(b))
    else:
        ok = torch.equal(a, b)
    if not ok:
        return f"{path}: values differ"
    sa = [st for st, n in zip(a.stride(), a.shape) if n > 1]
    sb = [st for st, n in zip(b.stride(), b.shape) if n > 1]
    if a.numel() > 1 and sa != sb:
        return f"{path}: strides {a.stride()} vs {b.stride()}"
    if a.is_contiguous() != b.is_contiguous():
        return f"{path}: is_contiguous {a.is_contiguous()} vs {b.is_contiguous()}"
    return None


def diff_values(a, b, path="output"):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        return diff_tensor(a, b, path)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{path}: {type(a).__name__}[{len(a)}] vs {type(b).__name__}[{len(b)}]"
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff_values(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        eq = bool(a == b)
    except Exception:
        eq = a is b
    return None if eq else f"{path}: {a!r} vs {b!r}"


class Run:
    __slots__ = ("out", "exc", "inputs", "grads")

    def __init__(self, out, exc, inputs, grads):
        self.out, self.exc, self.inputs, self.grads = out, exc, inputs, grads


def run_once(fn, case):
    inp, args, kwargs = fresh(case)
    leaves = tensor_leaves((inp, args, kwargs))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(inp, args, kwargs)
    except Exception as e:          # compared by type with the other side's
        return Run(None, e, leaves, None)
    grads = None
    if case.grad:
        wrt = [t for t in leaves if t.requires_grad and t.is_leaf]
        outs = [o for o in tensor_leaves(out) if o.requires_grad and (o.is_floating_point() or o.is_complex())]
        if wrt and outs:
            total = sum(o.abs().sum() if o.is_complex() else o.sum() for o in outs)
            try:
                grads = torch.autograd.grad(total, wrt, allow_unused=True)
            except Exception as e:
                grads = type(e)
    return Run(out, None, leaves, grads)


def compare(want, got):
    if (want.exc is None) != (got.exc is None):
        return f"CPython {'raised ' + type(want.exc).__name__ if want.exc else 'returned'}, " \
               f"compiled {'raised ' + type(got.exc).__name__ + ': ' + str(got.exc)[:200] if got.exc else 'returned'}"
    if want.exc is not None:
        return None if type(want.exc) is type(got.exc) else \
            f"exception {type(want.exc).__name__} vs {type(got.exc).__name__}: {str(got.exc)[:200]}"
    d = diff_values(want.out, got.out)
    if d:
        return d
    wo, go = tensor_leaves(want.out), tensor_leaves(got.out)
    wa, ga = alias_map(wo, want.inputs), alias_map(go, got.inputs)
    if wa != ga:
        return f"aliasing (inputs, earlier outputs) per output: {wa} vs {ga}"
    for i, (a, b) in enumerate(zip(want.inputs, got.inputs)):
        d = diff_tensor(a, b, f"input {i} after the call")
        if d:
            return d
    if isinstance(want.grads, type) or isinstance(got.grads, type):
        return None if want.grads is got.grads else f"gradient: {want.grads} vs {got.grads}"
    if (want.grads is None) != (got.grads is None):
        return f"gradients {want.grads is not None} vs {got.grads is not None}"
    if want.grads is not None:
        for i, (a, b) in enumerate(zip(want.grads, got.grads)):
            if (a is None) != (b is None):
                return f"gradient {i}: {a is None} vs {b is None}"
            if a is not None:
                d = diff_tensor(a, b, f"gradient {i}")
                if d and "strides" not in d and "contiguous" not in d:
                    return d
    return None


# ----------------------------------------------------------------------------- running

# Kernels whose result on a layout is garbage that can repeat, so comparing two eager runs
# or eager with a contiguous copy does not always catch them (torch 2.11-2.13: the sort
# behind median/nanmedian along a stride-0 dimension reads uninitialized memory).
_LAYOUT_BROKEN_IN_EAGER = {"median": ("expanded",), "nanmedian": ("expanded",),
                           "masked.median": ("expanded",)}


def _layout_changes_eager_values(program, case, first):
    """Whether eager gives other values for the same values in plain contiguous tensors.

    Some eager kernels read memory they do not own on an odd layout (median and nanmedian
    along a dimension of stride 0 read past an expanded tensor's storage), so two eager runs
    can agree by chance and a compiled run that differs is not wrong.
    """
    if case.layout == "plain" or case.variant != "out-of-place" or first.exc is not None:
        return False
    if case.layout in _LAYOUT_BROKEN_IN_EAGER.get(case.op.name, ()):
        return True

    def plain(x):
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
            return x
        t = x.detach().clone(memory_format=torch.contiguous_format)
        return t.requires_grad_(x.requires_grad) if x.requires_grad else t
    inp, args, kwargs = pytree.tree_map(plain, fresh(case))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = program(inp, args, kwargs)
    except Exception:
        return False
    d = diff_values(first.out, out)
    return d is not None and "values differ" in d


def run_case(case, backend, calls=3):
    fn_op = case.op.get_inplace() if case.variant == "inplace" else case.op.op
    program = make_fn(fn_op, case.post)
    torch.manual_seed(0)
    first = run_once(program, case)
    again = run_once(program, case)
    if compare(first, again) is not None:
        return Outcome("skipped", "eager is not deterministic")
    if _layout_changes_eager_values(program, case, first):
        return Outcome("skipped", "eager's values depend on the input layout")
    frametrace.reset()
    counter = frametrace.testing.CompileCounter(inner=backend)
    compiled = frametrace.optimize(backend=counter)(program)
    errors = convert.counters["internal_error"]
    records = []
    convert.record_observers.append(records.append)
    try:
        return _compare_calls(case, program, compiled, counter, first, records, errors, calls)
    finally:
        convert.record_observers.remove(records.append)


def _compare_calls(case, program, compiled, counter, first, records, errors, calls):
    for i in range(calls):
        want = first if i == 0 else run_once(program, case)
        try:
            got = run_once(compiled, case)
        except BaseException as e:      # the harness's own bug must not stop the sweep
            return Outcome("error", f"harness: {type(e).__name__}: {e}")
        d = compare(want, got)
        if d is not None:
            if got.exc is not None and want.exc is None and isinstance(
                    got.exc, (frametrace.BackendCompilerFailed, frametrace.Unsupported)):
                return Outcome("error", f"call {i}: {d}")
            return Outcome("wrong", f"call {i}: {d}")
    if convert.counters["internal_error"] != errors:
        return Outcome("error", "internal tracer error (ran in CPython)")
    if counter.frame_count == 0:
        return Outcome("uncompiled", "; ".join(sorted({str(r.reason) for r in records if r.reason})))
    return Outcome("right")


def pick_dtype(op, wanted, device="cpu"):
    dtypes = op.supported_dtypes(device)
    for d in (wanted, torch.float32, torch.float64, torch.int64, torch.bool):
        if d in dtypes:
            return d
    return None


def cases_for(op, layouts, samples, dtype, grad, rng, posts=("none",), device="cpu"):
    dt = pick_dtype(op, dtype, device)
    if dt is None:
        return
    variants = ["out-of-place"]
    if op.get_inplace() is not None:
        variants.append("inplace")
    grad_ok = grad and op.supports_autograd and dt.is_floating_point
    torch.manual_seed(rng.randrange(2 ** 31))     # the same values whatever ran before
    try:
        all_samples = list(itertools.islice(op.sample_inputs(device, dt, requires_grad=False), 64))
    except Exception:
        return
    if not all_samples:
        return
    chosen = all_samples if samples is None else rng.sample(all_samples, min(samples, len(all_samples)))
    for sample in chosen:
        for layout in layouts:
            if not applies(sample, layout):
                continue
            for variant in variants:
                for post in posts:
                    yield Case(op, sample, layout, dt, variant, False, post)
                if grad_ok and variant == "out-of-place":
                    yield Case(op, sample, layout, dt, variant, True)


def sweep(ops, backends, layouts, samples=None, dtype=torch.float32, grad=False, seed=0,
          verbose=False, out=sys.stdout, posts=("none",), device="cpu"):
    """Run every case; returns {(op name, backend): {result: count}} and the failures."""
    import random
    table, failures = {}, []
    limit = frametrace.config.cache_size_limit
    for op in ops:
        if op.name in _NONDETERMINISTIC:
            continue
        # (each op's own generator: its cases do not depend on which ops ran before it,
        # so a sweep split into shards runs the same cases as one run)
        rng = random.Random(f"{seed}:{op.name}:{op.variant_test_name}")
        op_cases = list(cases_for(op, layouts, samples, dtype, grad, rng, posts, device))
        for backend in backends:
            row = table.setdefault((op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
                                    backend), dict.fromkeys(RESULTS, 0))
            if not op_cases:
                row["skipped"] += 1
            for case in op_cases:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    outcome = run_case(case, backend)
                row[outcome.result] += 1
                if outcome.result in ("wrong", "error"):
                    failures.append((case, backend, outcome))
                if outcome.result in ("wrong", "error") and verbose or \
                        outcome.result == "uncompiled" and verbose == "all":
                        print(f"{outcome.result.upper():6} {backend:9} {case.name} [{case.layout}"
                              f"{', grad' if case.grad else ''}{', then ' + case.post if case.post != 'none' else ''}]"
                          f" {outcome.detail}", file=out, flush=True)
    frametrace.reset()
    frametrace.config.cache_size_limit = limit
    return table, failures


def summary(table, backends, out=sys.stdout):
    totals = {b: dict.fromkeys(RESULTS, 0) for b in backends}
    for (_, b), row in table.items():
        for k, v in row.items():
            totals[b][k] += v
    print(f"{'backend':12}" + "".join(f"{r:>12}" for r in RESULTS), file=out)
    for b in backends:
        print(f"{b:12}" + "".join(f"{totals[b][r]:>12}" for r in RESULTS), file=out)
    ops_wrong = {b: sorted({name for (name, bb), row in table.items() if bb == b and row["wrong"]})
                 for b in backends}
    for b in backends:
        print(f"ops with a wrong case on {b}: {len(ops_wrong[b])} {ops_wrong[b]}", file=out)
    return totals


def select_ops(names=None):
    from torch.testing._internal.common_methods_invocations import op_db
    if not names:
        return list(op_db)
    wanted = set(names)
    return [op for op in op_db if op.name in wanted or
            f"{op.name}.{op.variant_test_name}" in wanted]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="eager,aot_eager")
    p.add_argument("--ops", default="", help="comma list of op names (default: all)")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--samples", type=int, default=None, help="samples per op (default: all, up to 64)")
    p.add_argument("--grad", action="store_true", help="also compare gradients")
    p.add_argument("--posts", default="none,contiguous",
                   help="what the program does after the op: none, contiguous (of every output)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the samples live (cuda: the GPU)")
    p.add_argument("--start", type=int, default=0, help="skip the first N ops of op_db")
    p.add_argument("--count", type=int, default=None, help="run N ops")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--show-uncompiled", action="store_true", help="list uncompiled cases and why")
    a = p.parse_args(argv)
    ops = select_ops([n for n in a.ops.split(",") if n])
    ops = ops[a.start:None if a.count is None else a.start + a.count]
    backends = [b for b in a.backends.split(",") if b]
    t0 = time.time()
    table, failures = sweep(ops, backends, [l for l in a.layouts.split(",") if l], a.samples,
                            grad=a.grad, seed=a.seed, posts=tuple(a.posts.split(",")), device=a.device, verbose="all" if a.show_uncompiled else not a.quiet)
    print(f"\n{len(ops)} ops, {time.time() - t0:.0f} s")
    summary(table, backends)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
