"""backend="triton" on optimizer steps written with `torch._foreach_*` ops: each tensor's
whole update chain is one sub-kernel of a combo kernel (one launch for the group, not one
per tensor), parameters and state are stored straight into the inputs' memory (no copy_,
no temporaries), and the number of launches does not grow with the number of tensors.
Kernels run in Triton's interpreter; values are compared with eager after a few steps."""

import ast
import copy
import re

import pytest
import torch

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, foreach, last_compiled, lowering  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

SHAPES = [(4, 5), (7,), (3, 2, 2), (16, 8), (1,), (33,), (2, 3, 4), (64,), (5, 5), (9, 1)]
LR, B1, B2, EPS, WD, MOMENTUM = 1e-2, 0.9, 0.999, 1e-8, 1e-2, 0.9


def adamw_capturable(params, grads, exp_avgs, exp_avg_sqs, steps):
    """torch.optim.adamw's multi-tensor step, capturable (steps on the parameters' device)."""
    torch._foreach_add_(steps, 1)
    torch._foreach_mul_(params, 1 - LR * WD)
    torch._foreach_lerp_(exp_avgs, grads, 1 - B1)
    torch._foreach_mul_(exp_avg_sqs, B2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - B2)
    bc1 = torch._foreach_pow(B1, steps)
    bc2 = torch._foreach_pow(B2, steps)
    torch._foreach_sub_(bc1, 1)
    torch._foreach_sub_(bc2, 1)
    torch._foreach_neg_(bc2)
    torch._foreach_div_(bc1, LR)
    torch._foreach_reciprocal_(bc1)
    torch._foreach_sqrt_(bc2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bc2)
    torch._foreach_add_(denom, EPS)
    torch._foreach_div_(denom, bc1)
    torch._foreach_addcdiv_(params, exp_avgs, denom)


def adam_amsgrad(params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps):
    """Adam with L2 weight decay and amsgrad, step sizes from the step tensors as 0-dim
    tensors (torch.optim's non-capturable form under a compiler)."""
    torch._foreach_add_(steps, 1)
    grads = torch._foreach_add(grads, params, alpha=WD)
    torch._foreach_lerp_(exp_avgs, grads, 1 - B1)
    torch._foreach_mul_(exp_avg_sqs, B2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - B2)
    torch._foreach_maximum_(max_sqs, exp_avg_sqs)
    bc1 = [1 - B1 ** s for s in steps]
    bc2 = [(1 - B2 ** s) ** 0.5 for s in steps]
    step_size = [(LR / bc) * -1 for bc in bc1]
    denom = torch._foreach_sqrt(max_sqs)
    torch._foreach_div_(denom, bc2)
    torch._foreach_add_(denom, EPS)
    update = torch._foreach_div(exp_avgs, denom)
    torch._foreach_mul_(update, step_size)
    torch._foreach_add_(params, update)


def sgd_momentum(params, grads, bufs):
    grads = torch._foreach_add(grads, params, alpha=WD)
    torch._foreach_mul_(bufs, MOMENTUM)
    torch._foreach_add_(bufs, grads, alpha=1 - 0.1)
    torch._foreach_add_(params, bufs, alpha=-LR)


def adamw_inputs(shapes, dtype=torch.float32, state_dtype=None):
    state_dtype = state_dtype or dtype
    return ([torch.randn(s, dtype=dtype) for s in shapes],
            [torch.randn(s, dtype=dtype) for s in shapes],
            [torch.randn(s, dtype=state_dtype) for s in shapes],
            [torch.rand(s, dtype=state_dtype) for s in shapes],
            [torch.tensor(float(i % 3)) for i in range(len(shapes))])


def amsgrad_inputs(shapes):
    p, g, m, v, steps = adamw_inputs(shapes)
    return p, g, m, v, [x + 0.5 * torch.rand_like(x) - 0.25 for x in v], steps


def sgd_inputs(shapes):
    return ([torch.randn(s) for s in shapes], [torch.randn(s) for s in shapes],
            [torch.randn(s) for s in shapes])


def run_steps(fn, inputs, steps=3, atol=1e-5, rtol=1e-5):
    """`steps` calls of fn compiled (on `inputs`) and eagerly (on a copy): every list's
    tensors match after each step and the compiled ones kept their memory."""
    expected = copy.deepcopy(inputs)
    ptrs = [[t.data_ptr() for t in ts] for ts in inputs]
    compiled = frametrace.optimize(backend="triton", fullgraph=True)(fn)
    for _ in range(steps):
        compiled(*inputs)
        fn(*expected)
        for got, want in zip(inputs, expected):
            for a, b in zip(got, want):
                torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)
    assert [[t.data_ptr() for t in ts] for ts in inputs] == ptrs
    mod = last_compiled()
    assert mod is not None and len(backend.COMPILED) == 1, "one graph, no recompiles"
    return mod


def assert_no_copies(mod):
    """No aten call (no copy_, no per-tensor op) and no temporary: every kernel stores
    into graph inputs only."""
    assert mod.externs == [], mod.source
    assert "empty_strided" not in mod.source, mod.source
    assert all(foreach.in_place(k) for k in mod.kernels)


def test_adamw_step_is_two_combo_kernels_storing_into_params_and_state():
    mod = run_steps(adamw_capturable, adamw_inputs(SHAPES))
    assert_no_copies(mod)
    # the update of every parameter (and its state), then the step counters: the steps'
    # new values are read by the first kernel before the second one stores them
    assert len(mod.kernels) == 2, mod.source
    first = mod.kernels[0].source
    assert "triton_combo" in first and _sub_kernels(first) == len(SHAPES)
    # each sub-kernel stores its parameter, exp_avg and exp_avg_sq (and a 1-element
    # parameter's kernel its step too: the same lane reads the old step)
    assert first.count("tl.store(") >= 3 * len(SHAPES)


def test_adam_amsgrad_with_step_sizes_from_step_tensors():
    mod = run_steps(adam_amsgrad, amsgrad_inputs(SHAPES))
    assert_no_copies(mod)
    assert len(mod.kernels) == 2, mod.source


def test_sgd_momentum_step_is_one_combo_kernel():
    mod = run_steps(sgd_momentum, sgd_inputs(SHAPES))
    assert_no_copies(mod)
    assert len(mod.kernels) == 1 and "triton_combo" in mod.kernels[0].name, mod.source


@pytest.mark.parametrize("n", [3, 30])
def test_launches_do_not_grow_with_the_number_of_tensors(n):
    shapes = [SHAPES[i % len(SHAPES)] for i in range(n)]
    mod = run_steps(adamw_capturable, adamw_inputs(shapes), steps=1)
    assert len(mod.kernels) == 2, mod.source
    backend.COMPILED.clear()
    mod = run_steps(sgd_momentum, sgd_inputs(shapes), steps=1)
    assert len(mod.kernels) == 1, mod.source


def _sub_kernels(src) -> int:
    return len(re.findall(r"^    if .*pid < \d+\):?$|^    if pid < \d+:$", src, re.M))


def _if_depth(src) -> int:
    """The deepest nesting of `if` statements in a kernel's source."""
    def depth(node):
        inner = max((depth(c) for c in ast.iter_child_nodes(node)), default=0)
        return inner + isinstance(node, ast.If)
    return depth(ast.parse(src))


def test_hundreds_of_tensors_split_into_a_few_combos_within_the_argument_limit():
    n = 120   # 5 tensors each: more arguments than one launch takes
    shapes = [SHAPES[i % len(SHAPES)] for i in range(n)]
    mod = run_steps(adamw_capturable, adamw_inputs(shapes), steps=1)
    assert_no_copies(mod)
    assert all(len(k.args) <= foreach.MAX_ARGS for k in mod.kernels)
    assert len(mod.kernels) <= -(-5 * n // foreach.MAX_ARGS) + 1, [len(k.args) for k in mod.kernels]
    # Triton's code generator recurses per nested `if` (an elif is one): a combo of
    # dozens of sub-kernels must not nest deeper as it grows (BERT's AdamW step, 200
    # parameters, hit Python's recursion limit compiling an elif chain)
    combos = [k.source for k in mod.kernels if "triton_combo" in k.name]
    assert combos and max(map(_sub_kernels, combos)) >= 40
    assert all(_if_depth(src) <= 2 for src in combos), max(map(_if_depth, combos))


def test_bfloat16_parameters_and_state():
    mod = run_steps(adamw_capturable, adamw_inputs(SHAPES, torch.bfloat16), atol=2e-2, rtol=2e-2)
    assert_no_copies(mod)
    assert len(mod.kernels) == 2


def test_tensors_of_different_dtypes_in_one_list():
    inputs = adamw_inputs(SHAPES)
    for ts in inputs[:4]:   # every other tensor's parameter, grad and state in bf16
        ts[1::2] = [t.to(torch.bfloat16) for t in ts[1::2]]
    mod = run_steps(adamw_capturable, inputs, atol=2e-2, rtol=2e-2)
    assert_no_copies(mod)
    assert len(mod.kernels) == 2


@pytest.fixture
def host_steps(monkeypatch):
    """0-dim graph inputs (the step counters) count as living on another device than the
    kernels', as torch.optim's default CPU steps beside CUDA parameters do."""
    elsewhere = torch.device("cpu", 1)
    monkeypatch.setattr(lowering.GraphLowering, "device_of_input", staticmethod(
        lambda name, t: elsewhere if t.dim() == 0 else t.device))


def test_step_tensors_on_the_host_are_never_a_kernel_pointer(host_steps):
    mod = run_steps(adam_amsgrad, amsgrad_inputs(SHAPES))
    steps = set(mod.wrapper.lowered.devices)
    assert steps and all(not (set(k.args) & steps) for k in mod.kernels), mod.source
    # the parameters' update is still one combo kernel
    assert any("triton_combo" in k.name and _sub_kernels(k.source) == len(SHAPES)
               for k in mod.kernels), mod.source


def test_an_input_read_at_another_position_is_read_before_it_is_overwritten():
    def f(xs, ys):
        torch._foreach_add_(xs, 1)
        for x, y in zip(xs, ys):
            y.copy_(x.flip(0) * 2 + y)   # reads x's new values, at other positions
            x.mul_(y.sum())               # a reduction of the new y
    xs, ys = [torch.randn(6), torch.randn(5)], [torch.randn(6), torch.randn(5)]
    run_steps(f, [xs, ys])


def test_an_input_overwritten_with_its_own_values_at_other_positions():
    def f(xs):
        for x in xs:
            x.copy_(torch.cat([x[1:], x[:1]]) * 2)   # (a kernel's lane would read another's)
    mod = run_steps(f, [[torch.randn(6), torch.randn(4, 3)]])
    # the rotated values are computed into memory first, then copied in
    assert [str(op) for op in mod.extern_ops] == ["aten.copy_.default"] * 2, mod.source


def test_inputs_that_swap_values():
    def f(a, b):
        t = a[0] * 2
        a[0].copy_(b[0] + 1)
        b[0].copy_(t)
    run_steps(f, [[torch.randn(8)], [torch.randn(8)]])


def test_a_kernel_that_writes_inputs_is_not_retuned():
    """Timing block-size candidates would launch a kernel more than once: one that updates
    its inputs in place gets exactly one candidate."""
    mod = run_steps(sgd_momentum, sgd_inputs(SHAPES[:2]), steps=1)
    for name in mod.wrapper.launchers:
        assert len(mod.namespace[name].configs) == 1


def test_a_cuda_step_with_cpu_step_counters_compiles_to_kernels_that_take_no_cpu_pointer():
    """Built (not run) for FakeTensors on "cuda" with torch.optim's default CPU steps: the
    counters are updated on the host and read by value; the parameters' update, bias
    corrections included, is one combo kernel, and no kernel takes a pointer to host memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from frametrace.backends.triton.decompositions import decompositions
    n = 4

    def f(*flat):
        lists = [list(flat[i * n:(i + 1) * n]) for i in range(6)]
        adam_amsgrad(*lists)
        return ()
    with FakeTensorMode(allow_non_fake_inputs=True):
        flat = [torch.empty(SHAPES[i], device="cuda") for _ in range(5) for i in range(n)]
        flat += [torch.tensor(float(i)) for i in range(n)]
        gm = make_fx(torch.func.functionalize(f, remove="mutations_and_views"),
                     decomposition_table=decompositions())(*flat)
        mod = backend.build(gm, flat)
    lowered = mod.wrapper.lowered
    assert lowered.device.type == "cuda" and len(lowered.devices) >= n
    pointers = {name for k in mod.kernels for name in k.args}
    assert not pointers & set(lowered.devices), "a kernel takes a pointer to CPU memory"
    assert [_sub_kernels(k.source) for k in mod.kernels] == [n], mod.source
    assert not [fb for fb in mod.fallbacks if "copy_" in fb.op]
    # per counter, on the host: its increment, its write-back, one read of its value (the
    # bias corrections are computed in the kernel from that number)
    assert sorted({str(op) for op in mod.extern_ops}) == [
        "aten._local_scalar_dense.default", "aten.add.Tensor", "aten.copy_.default"]
    assert len(mod.extern_ops) == 3 * n
    assert not mod.graphable


def test_a_functional_foreach_op_is_one_combo_kernel():
    def f(xs, ys):
        return torch._foreach_addcmul(torch._foreach_mul(xs, 2), xs, ys, 0.5)
    xs, ys = [torch.randn(s) for s in SHAPES], [torch.randn(s) for s in SHAPES]
    got = frametrace.optimize(backend="triton", fullgraph=True)(f)(xs, ys)
    torch.testing.assert_close(got, f(xs, ys))
    mod = last_compiled()
    assert len(mod.kernels) == 1 and _sub_kernels(mod.kernels[0].source) == len(SHAPES)
    assert mod.externs == []


def test_a_running_statistic_updated_in_place_beside_a_reduction():
    """A BatchNorm-style running mean: its update is a store into the input, fused with
    what else reads the reduction (no aten copy_, no temporary for it)."""
    def f(x, running):
        m = x.mean(0)
        running.mul_(0.9).add_(m * 0.1)
        return (x - m).relu(), (x - m).sigmoid()
    x, running = torch.randn(64, 8), torch.randn(8)
    expected_running = running.clone()
    got = frametrace.optimize(backend="triton", fullgraph=True)(f)(x, running)
    torch.testing.assert_close(got, f(x, expected_running))
    torch.testing.assert_close(running, expected_running)
    mod = last_compiled()
    # one kernel: the column mean, the update and the outputs (held column-major, as the
    # mean reads them); the mean is not stored
    assert mod.externs == [] and len(mod.kernels) == 1, mod.source
    assert mod.source.count("empty_strided") == 2   # the two outputs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_adamw_step_over_hundreds_of_parameters_compiles(monkeypatch):
    """Compiled by Triton for the GPU (the interpreter runs the Python function and
    never meets the code generator's recursion): BERT-base's 200 parameters."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    shapes = [SHAPES[i % len(SHAPES)] for i in range(200)]
    inputs = [[t.cuda() for t in ts] for ts in adamw_inputs(shapes)]
    mod = run_steps(adamw_capturable, inputs, steps=2)
    assert mod.namespace["device"].type == "cuda" and max(_sub_kernels(k.source) for k in mod.kernels) >= 40


def addcdiv_by_stacked_step_sizes(ps, steps):
    # torch.optim's AdamW under a compiler: per-parameter step sizes stacked into one
    # tensor (_stack_if_compiling), which the foreach op reads one per parameter
    step_size = torch.stack([(0.01 / (1 - 0.9 ** s)) * -1 for s in steps])
    torch._foreach_addcdiv_(ps, ps, [p.abs() + 1 for p in ps], step_size)


def test_a_stack_read_at_constant_positions_reads_only_the_part_there():
    n = 40
    ps = [torch.randn(SHAPES[i % len(SHAPES)]) for i in range(n)]
    steps = [torch.tensor(float(i % 5 + 1)) for i in range(n)]
    mod = run_steps(addcdiv_by_stacked_step_sizes, [ps, steps])
    # each parameter's update reads its own step size: one combo kernel, not a 40-way
    # select in every sub-kernel (7 kernels, 6,360 tl.where, and a compile 7 times
    # longer; for GPT-2's 148 parameters, quadratic)
    assert len(mod.kernels) == 1, mod.source
    assert mod.kernels[0].source.count("tl.where(") <= 4 * n, mod.source


def _writes_after_old_reads(x, y):
    x.mul_(2)
    r = y.t() @ y           # y's old value, read by an extern
    y.add_(x)
    return r, y.t()[1:] @ x


def _reduction_reads_old(x, y):
    s = y.sum(0)            # y's old value, read by a reduction kernel across rows
    r = x @ y.t()           # ...and by an extern
    y.mul_(3)
    x.sub_(r.mean())
    return s, r


def _two_externs_between(x, y):
    a = torch.mm(x, y.t())
    x.add_(1)
    b = torch.mm(y, x.t())  # x's new value
    y.copy_(y * 2 + a.sum())
    return a, b


@pytest.mark.parametrize("fn", [_writes_after_old_reads, _reduction_reads_old, _two_externs_between])
def test_input_writes_wait_for_every_read_of_the_old_value(fn):
    """Writes to inputs and externs (matmuls) that read the inputs' old values, where
    foreach.groups cannot keep each input's chain in one cluster (a cycle through an
    extern) and falls back to a flat order: the scheduler grouped that order as one run
    and fused the writes into a kernel launched before the matmul reading the old value
    (a wrong r).  Outputs and inputs after the call against eager, over calls with fresh
    values; the graph runs as kernels."""
    before = backend.STATS["eager_graphs"]
    compiled = frametrace.optimize(backend="triton")(fn)
    for seed in range(3):
        torch.manual_seed(seed)
        x, y = torch.randn(6, 4), torch.randn(6, 4)
        xa, ya, xb, yb = x.clone(), y.clone(), x.clone(), y.clone()
        got, want = compiled(xa, ya), fn(xb, yb)
        for a, b in zip(got + (xa, ya), want + (xb, yb)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert backend.STATS["eager_graphs"] == before
    assert foreach.in_place(backend.COMPILED[-1].kernels[-1]) or any(
        foreach.in_place(k) for k in backend.COMPILED[-1].kernels)
