"""The triton backend's tests compare compiled with CPython through one harness,
tests/differential.py's `check`: fresh copies of the inputs on each side, values with NaN
positions, dtypes, shapes, requires_grad, the arguments after the call, no internal tracer
error.  On top of it, what only a backend test asks: the graph went through the triton
backend (its CompiledModule, for the test to read kernels from), how many kernels it
launched, and optionally the outputs' strides.  `triton_check_grads` adds the backward:
the gradients that .backward() of the outputs' sum leaves on every argument that
requires grad; `triton_check_vjp` the vector-Jacobian products for given tangents.

Each test file keeps its own checks of the generated code (kernels, externs, layout
copies) in a thin wrapper around `triton_check`."""
import copy
import functools

import torch
import torch.utils._pytree as pytree

import frametrace
from differential import check, with_grads

_HALF = (torch.bfloat16, torch.float16)

# torch before 2.13 (the H200's 2.11) guards a pooling's or strided convolution's output
# size on the parity of its input size ((s - 1) % 2 != 0, in its shape function), as
# torch.compile meets it too: tests that count graphs over sizes allow this many more
# (a second symbolic graph for the other parity, not one per size)
TORCH_BEFORE_2_13 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13)
PARITY_GRAPHS = 1 if TORCH_BEFORE_2_13 else 0


def _observed(fn, seen, half_as_float):
    """fn, recording each output tensor's dtype, shape and strides in `seen` (per call),
    and with half-precision outputs given back in float32 when `half_as_float` (a tolerance
    for bf16 is meant for the rounded values, not for allclose computed in bf16)."""
    @functools.wraps(fn, updated=())   # (a module given as fn: its __dict__ stays its own)
    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        seen.append([(t.dtype, tuple(t.shape), t.stride()) for t in pytree.tree_leaves(out)
                     if isinstance(t, torch.Tensor)])
        if half_as_float:
            out = pytree.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in _HALF
                                  else t, out)
        return out
    return run


def triton_check(fn, *args, calls=None, kernels=None, atol=1e-5, rtol=1e-5, strides=False,
                 half_as_float=False):
    """fn compiled with backend="triton" (fullgraph) matches CPython on `args` (or on each
    argument tuple of `calls`, one call each); returns the last CompiledModule.

    `kernels`: the number of kernels it launches.  `strides`: the outputs' strides are
    CPython's too.  `half_as_float`: bf16/fp16 outputs (whose dtypes must still match)
    are compared in float32."""
    # (here, not at the top: a test file imports this before it skips without triton)
    from frametrace.backends.triton import last_compiled
    eager_seen, compiled_seen = [], []
    check(_observed(fn, eager_seen, half_as_float), [tuple(a) for a in calls] if calls is not None else [args],
          backend="triton", atol=atol, rtol=rtol,
          compiled=lambda counter: _observed(frametrace.optimize(backend=counter, fullgraph=True)(fn),
                                             compiled_seen, half_as_float))
    _compare_seen(eager_seen, compiled_seen, strides)
    mod = last_compiled()
    assert mod is not None, "the graph did not go through the triton backend"
    if kernels is not None:
        assert len(mod.kernels) == kernels, mod.source
    return mod


def _compare_seen(eager_seen, compiled_seen, strides):
    for want, got in zip(eager_seen, compiled_seen):
        assert [w[:2] for w in want] == [g[:2] for g in got], (want, got)
        if strides:
            assert [w[2] for w in want] == [g[2] for g in got], (want, got)


def triton_check_grads(fn, *args, calls=None, atol=1e-5, rtol=1e-5, half_as_float=False):
    """`triton_check` of fn's outputs and of the gradients .backward() of their sum leaves
    on each argument that requires grad (compiled: forward and backward graphs)."""
    eager_seen, compiled_seen = [], []
    check(_observed(with_grads(fn, use_backward=True), eager_seen, half_as_float),
          [tuple(a) for a in calls] if calls is not None else [args], backend="triton", atol=atol, rtol=rtol,
          compiled=lambda counter: _observed(
              with_grads(frametrace.optimize(backend=counter, fullgraph=True)(fn), use_backward=True),
              compiled_seen, half_as_float))
    _compare_seen(eager_seen, compiled_seen, strides=False)


def _vjp(f, tangents):
    """f, returning its outputs (detached) and torch.autograd.grad of them, weighted by
    `tangents` (one function of each output), for each argument that requires grad."""
    @functools.wraps(f, updated=())
    def run(*args):
        out = f(*args)
        outs = out if isinstance(out, tuple) else (out,)
        wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        grads = torch.autograd.grad(outs, wrt, [t(o) for t, o in zip(tangents, outs)], allow_unused=True)
        return [o.detach() for o in outs], list(grads)
    return run


def triton_check_vjp(fn, *args, tangents, atol=1e-5, rtol=1e-5, half_as_float=False):
    """`triton_check` of fn's outputs and of their vector-Jacobian products for `tangents`
    (None where an argument that requires grad is unused: on both sides)."""
    eager_seen, compiled_seen = [], []
    check(_observed(_vjp(fn, tangents), eager_seen, half_as_float), [args], backend="triton",
          atol=atol, rtol=rtol,
          compiled=lambda counter: _observed(
              _vjp(frametrace.optimize(backend=counter, fullgraph=True)(fn), tangents),
              compiled_seen, half_as_float))
    _compare_seen(eager_seen, compiled_seen, strides=False)


def compare_leaves(want, got, where, atol, rtol, strides=False):
    """Every leaf of `got` against `want`'s: tensors by dtype, shape, values (NaN where
    eager's are) and, with `strides`, the strides of dims longer than 1; others by ==."""
    w, g = pytree.tree_leaves(want), pytree.tree_leaves(got)
    assert len(w) == len(g), (where, want, got)
    for a, b in zip(w, g):
        if not isinstance(a, torch.Tensor):
            assert a == b, (where, a, b)
            continue
        assert isinstance(b, torch.Tensor), (where, a, b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (where, a.dtype, a.shape, b.dtype, b.shape)
        if strides:
            kept = [(s, t) for n, s, t in zip(a.shape, a.stride(), b.stride()) if n > 1]
            assert all(s == t for s, t in kept), (where, "strides", a.stride(), b.stride())
        torch.testing.assert_close(b, a, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{where}: {m}")


def eager_and_compiled(fn, compiled, args, where, atol, rtol, backward=False, strides=False) -> bool:
    """fn and compiled each on a deep copy of `args` (with `backward`, the floating inputs
    require grad and a weighted sum of the output is differentiated: the gradients are
    compared too), then compared: the same exception type, or the outputs and the inputs
    after the call (`compare_leaves`).  Returns whether eager returned."""
    if backward:
        args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in args)
    results = []
    for f, call in ((fn, copy.deepcopy(args)), (compiled, copy.deepcopy(args))):
        try:
            out = f(*call)
            if backward:
                weights = torch.arange(out.numel(), dtype=out.dtype).view(out.shape).cos()
                (out * weights).sum().backward()
                out = [out.detach()] + [a.grad for a in call if isinstance(a, torch.Tensor) and a.requires_grad]
            results.append((out, None, [a.detach() if isinstance(a, torch.Tensor) else a for a in call]))
        except Exception as e:      # (eager's error: the compiled one must raise it too)
            results.append((None, e, None))
    (want, want_exc, want_args), (got, got_exc, got_args) = results
    assert type(want_exc) is type(got_exc), f"{where}: eager {want_exc!r}, compiled {got_exc!r}"
    if want_exc is None:
        compare_leaves(want, got, where, atol, rtol, strides)
        compare_leaves(want_args, got_args, f"{where} (inputs after the call)", atol, rtol, strides)
    return want_exc is None


def sample_program(op, leaves, spec, slots):
    """OpInfo `op` called on a sample's flattened (input, args, kwargs) `leaves` (of the
    pytree `spec`), the leaves at `slots` being the program's arguments instead."""
    def program(*tensors):
        got = list(leaves)
        for i, t in zip(slots, tensors):
            got[i] = t
        inp, args, kwargs = pytree.tree_unflatten(got, spec)
        return op.op(inp, *args, **kwargs)
    return program
