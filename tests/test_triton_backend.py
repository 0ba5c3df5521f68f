"""backend="triton": generated kernels, run through Triton's interpreter on the CPU
(TRITON_INTERPRET=1), compared with eager for every lowered op, and what was compiled:
kernels per graph, fusion, fallbacks to aten, deduplication, the autotune cache."""
import logging

import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import autotune, backend, config, last_compiled  # noqa: E402


from triton_harness import triton_check  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


compiled_run = triton_check


def ints(*shape, lo=-6, hi=7):
    t = torch.randint(lo, hi, shape)
    return torch.where(t == 0, torch.ones_like(t), t)


def positive(*shape):
    return torch.rand(*shape) + 0.1


# -- every lowered pointwise op, float32 and int64 where torch allows it ---------------------
UNARY_FLOAT = {
    "exp": torch.exp, "exp2": torch.exp2, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "sigmoid": torch.sigmoid, "erf": torch.erf, "tanh": torch.tanh,
    "expm1": torch.expm1, "reciprocal": torch.reciprocal, "floor": torch.floor,
    "ceil": torch.ceil, "trunc": torch.trunc, "isnan": torch.isnan, "isinf": torch.isinf,
}
UNARY_POSITIVE = {"log": torch.log, "log2": torch.log2, "log10": torch.log10,
                  "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt}
UNARY_ANY = {"abs": torch.abs, "neg": torch.neg, "sign": torch.sign, "relu": torch.relu,
             "logical_not": torch.logical_not, "square": torch.square}


@pytest.mark.parametrize("name", sorted(UNARY_FLOAT))
def test_unary_float(name):
    x = torch.randn(5, 7) * 2
    compiled_run(lambda x: UNARY_FLOAT[name](x) * 1, x, kernels=1)


@pytest.mark.parametrize("name", sorted(UNARY_POSITIVE))
def test_unary_positive(name):
    compiled_run(lambda x: UNARY_POSITIVE[name](x), positive(5, 7), kernels=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("name", sorted(UNARY_ANY))
def test_unary(name, dtype):
    x = torch.randn(5, 7) * 3 if dtype.is_floating_point else ints(5, 7)
    compiled_run(lambda x: UNARY_ANY[name](x), x, kernels=1)


def test_bitwise_not_int64():
    compiled_run(lambda x: ~x, ints(4, 6), kernels=1)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder, "fmod": torch.fmod, "floor_divide": torch.floor_divide,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "rsub": lambda a, b: 3 - a + b,
}
INT_ONLY = {"bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
            "bitwise_xor": torch.bitwise_xor}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    if dtype.is_floating_point:
        a, b = torch.randn(6, 5) * 4, torch.randn(5) * 2
        a[0, 0] = b[0] * 2  # an exact tie for the comparisons
    else:
        a, b = ints(6, 5), ints(5)
    compiled_run(lambda a, b: BINARY[name](a, b), a, b, kernels=1, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(INT_ONLY))
def test_bitwise_int64(name):
    compiled_run(lambda a, b: INT_ONLY[name](a, b), ints(6, 5), ints(6, 5), kernels=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scalar_operands_and_where_clamp(dtype):
    x = torch.randn(4, 9) * 5 if dtype.is_floating_point else ints(4, 9)

    def f(x):
        y = torch.where(x > 1, x * 2, 3 - x)
        return torch.clamp(y, -4, 6), torch.clamp_min(y, 0) + torch.clamp_max(y, 1)
    compiled_run(f, x, kernels=1)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 0.5, -0.5, -1, 2.5, -3])
def test_pow_scalar(exponent):
    x = positive(4, 6) if exponent != int(exponent) or exponent < 0 else torch.randn(4, 6)
    compiled_run(lambda x: x ** exponent, x, kernels=1, rtol=1e-4)


def test_pow_tensor_and_int64_pow():
    compiled_run(lambda x, y: torch.pow(x, y) + torch.pow(2.0, y), positive(4, 6), torch.randn(4, 6),
                 kernels=1, rtol=1e-4)
    compiled_run(lambda x: x ** 2 + x ** 3, ints(4, 6), kernels=1)


def test_type_conversions():
    def f(x, i, b):
        return x.to(torch.int64) + i, (i.float() / 3).to(torch.float64), b.to(torch.float32) * x
    compiled_run(f, torch.randn(4, 5) * 10, ints(4, 5), torch.rand(4, 5) > 0.5, kernels=1)


# -- reductions ---------------------------------------------------------------------------------
REDUCTIONS = {
    "sum": lambda x: x.sum(-1), "sum_keepdim": lambda x: x.sum(1, keepdim=True),
    "sum_all": lambda x: x.sum(), "sum_dim0": lambda x: x.sum(0),
    "amax": lambda x: x.amax(-1), "amin": lambda x: x.amin(0),
    "max_all": lambda x: x.max(), "argmax": lambda x: x.argmax(-1),
    "argmin": lambda x: x.argmin(0), "argmax_flat": lambda x: x.argmax(),
    "max_dim": lambda x: x.max(1), "min_dim": lambda x: x.min(0, keepdim=True),
    "any": lambda x: (x > 2).any(-1), "sum_dims": lambda x: x.sum((0, 2)),
}
FLOAT_REDUCTIONS = {
    "mean": lambda x: x.mean(-1), "var": lambda x: x.var(-1),
    "var_mean": lambda x: torch.var_mean(x, 1, correction=0),
    "std": lambda x: x.std(0, keepdim=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction(name, dtype):
    shape = (3, 5, 6) if name == "sum_dims" else (6, 11)
    x = torch.randn(*shape) * 3 if dtype.is_floating_point else ints(*shape, lo=-50, hi=50)
    compiled_run(REDUCTIONS[name], x, kernels=1 if name != "max_dim" and name != "min_dim" else None,
                 rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(FLOAT_REDUCTIONS))
def test_float_reduction(name):
    compiled_run(FLOAT_REDUCTIONS[name], torch.randn(7, 13), kernels=1, rtol=1e-4, atol=1e-5)


def test_looped_reduction_row_larger_than_a_block():
    n = config.persistent_rblock_max + 1000
    x = torch.randn(2, n)

    def f(x):
        return torch.softmax(x, -1), x.argmax(-1), x.amin(-1), (x > 4).any(-1), x.var(-1)
    mod = compiled_run(f, x, atol=1e-6, rtol=1e-4)
    assert any("for roffset in range" in k.source for k in mod.kernels)
    assert len(mod.kernels) == 1, mod.source


def test_masks_with_odd_sizes():
    def f(x, y):
        return torch.softmax(x, -1) * 2, torch.tanh(y) + 1, y.sum(0)
    mod = compiled_run(f, torch.randn(13, 37), torch.randn(3, 17, 5))
    assert any("xmask" in k.source or "rmask" in k.source for k in mod.kernels)


def test_masks_dropped_when_sizes_divide_blocks():
    mod = compiled_run(lambda x: torch.softmax(x, -1), torch.randn(64, 256), kernels=1)
    assert "mask" not in mod.kernels[0].source


# -- fusion ---------------------------------------------------------------------------------------
def test_pointwise_chain_is_one_kernel():
    mod = compiled_run(lambda x, w, b: F.gelu(x * w + b).sigmoid() * 3 - x, torch.randn(16, 32),
                       torch.randn(32), torch.randn(32), kernels=1)
    assert "xindex % 32" in mod.kernels[0].source.replace("(", "").replace(")", "")


def test_softmax_is_one_kernel():
    compiled_run(lambda x: torch.softmax(x, -1), torch.randn(16, 100), kernels=1)
    compiled_run(lambda x: F.log_softmax(x, 1), torch.randn(16, 100), kernels=1)


@pytest.mark.parametrize("functional", [True, False])
def test_layer_norm_is_one_kernel(functional):
    x = torch.randn(4, 6, 32)
    if functional:
        w, b = torch.randn(32), torch.randn(32)
        compiled_run(lambda x: F.layer_norm(x, (32,), w, b), x, kernels=1)
    else:
        ln = torch.nn.LayerNorm(32)
        torch.nn.init.normal_(ln.weight)
        with torch.no_grad():
            compiled_run(ln, x, kernels=1)


def rms_norm(h, w, eps=1e-6):
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * w


def test_add_rms_norm_is_one_kernel():
    def f(x, residual, w):
        h = x + residual
        return h, rms_norm(h, w)
    mod = compiled_run(f, torch.randn(8, 64), torch.randn(8, 64), torch.randn(64), kernels=1)
    assert len(mod.kernels[0].stores) == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_compute_in_float32(dtype):
    def f(x, residual, w):
        h = x + residual
        return h, rms_norm(h, w), torch.softmax(h, -1), F.silu(x) * residual
    args = [torch.randn(8, 64, dtype=dtype) for _ in range(2)] + [torch.randn(64, dtype=dtype)]
    mod = compiled_run(f, *args, atol=2e-2, rtol=2e-2)
    assert "tl.float32" in mod.kernels[0].source


def test_mm_with_epilogue():
    def f(x, w, b):
        return torch.tanh(x @ w + b) * 2
    mod = compiled_run(f, torch.randn(8, 16), torch.randn(16, 12), torch.randn(12), kernels=1)
    assert any("addmm" in e or "mm" in e for e in mod.externs)


def test_fallback_op_inside_the_same_graph():
    def f(x):
        return torch.sort(x.exp(), 1).values.sin() + 1
    mod = compiled_run(f, torch.randn(5, 9), kernels=2, rtol=1e-4)
    assert any("sort" in op for op in mod.fallback_ops)


def test_kernels_deduplicated_by_source():
    def f(a, b):
        m = (a * 2 + 1).relu() @ b
        return (m * 2 + 1).relu()
    mod = compiled_run(f, torch.randn(8, 8), torch.randn(8, 8), rtol=1e-4)
    assert len(mod.kernels) == 2 and len(mod.unique_kernels) == 1, mod.source


# -- views and indexing ---------------------------------------------------------------------------
def test_views_transposes_and_broadcasting():
    def f(x, y):
        a = x.view(4, 3, 5).permute(2, 0, 1).reshape(5, 12)
        b = y.t().unsqueeze(0).expand(3, 5, 4)
        c = x[1:, ::2].transpose(0, 1) + 1
        d = torch.cat([x[:, :2], -x[:, 2:]], 1)
        return a * 2, b.sum(0) + x.view(4, 15)[:, :5].t(), c, d.squeeze(), x[2].unsqueeze(1)
    compiled_run(f, torch.randn(12, 5), torch.randn(4, 5))


def test_split_unbind_select_pad():
    def f(x):
        a, b = x.split([2, 3], dim=1)
        p, q = x.unbind(0)[:2]
        return a.sum(1) + b[:, 0], p - q, F.pad(x, (1, 2, 0, 1), value=-1.0), x.select(1, -1)
    compiled_run(f, torch.randn(4, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_embedding_and_gather(dtype):
    table = torch.randn(10, 6) if dtype.is_floating_point else ints(10, 6)
    idx = torch.randint(0, 10, (3, 4))
    gather_idx = torch.randint(-6, 6, (10, 3))
    sel = torch.tensor([3, -1, 0])

    def f(table, idx, gi):
        return (F.embedding(idx, table) * 2, table.gather(1, gi + (gi < 0).long() * 6),
                table.index_select(0, sel.abs()), table[idx[0]], table[:, sel])
    compiled_run(f, table, idx, gather_idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_constants_and_ranges(dtype):
    def f(x):
        return (x + torch.arange(6, dtype=dtype), torch.full((2, 6), 7, dtype=dtype) * x[:2],
                torch.zeros_like(x) + torch.ones(6, dtype=dtype))
    compiled_run(f, torch.randn(3, 6) if dtype.is_floating_point else ints(3, 6))


# -- runtime, logs, fallbacks ----------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True])
def test_autotune_choice_cached_per_shape(dynamic):
    """Symbolic kernels too: per actual size (the row length varies here)."""
    autotune.TUNED.clear()
    f = frametrace.optimize(backend="triton", dynamic=dynamic)(lambda x: torch.softmax(x, -1))
    for shape in [(4, 32), (4, 64), (4, 32)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(f(x), torch.softmax(x, -1))
    assert {(n, r) for (_, n, r) in autotune.TUNED} == {(4, 32), (4, 64)}
    tuned = autotune.STATS["tuned"]
    f(torch.randn(4, 64))
    assert autotune.STATS["tuned"] == tuned
    assert last_compiled().symbolic == dynamic


def test_output_code_log(caplog):
    with caplog.at_level(logging.INFO, logger="frametrace.output_code"):
        compiled_run(lambda x: torch.softmax(x, -1) + 1, torch.randn(4, 8))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "def call(args)" in text and "@triton.jit" in text and "tl.reduce" in text


def test_cpu_without_interpreter_uses_aot_eager(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")   # (which refuses it: test_default_backend.py)
    monkeypatch.setattr(backend, "_warned_cpu", False)
    with caplog.at_level(logging.INFO, logger="frametrace.output_code"), \
            pytest.warns(UserWarning, match="CPU tensors: it runs with aot_eager"):
        f = frametrace.optimize(backend="triton")(lambda x: x.sin() + 1)
        x = torch.randn(4)
        torch.testing.assert_close(f(x), x.sin() + 1)
    assert last_compiled() is None
    assert "aot_eager" in caplog.text


def test_gradients_match_eager():
    def f(x, w):
        return torch.softmax(x @ w, -1).pow(2).sum()
    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 6, requires_grad=True)
    frametrace.optimize(backend="triton")(f)(x, w).backward()
    got = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).backward()
    torch.testing.assert_close(got, (x.grad, w.grad))
    assert last_compiled() is not None


def test_backend_is_registered_and_import_is_lazy():
    assert "triton" in frametrace.list_backends()
    import subprocess
    import sys
    code = ("import frametrace, sys; "
            "assert not [m for m in sys.modules if m.startswith('frametrace.backends.triton.')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_transformers_models_run_on_triton_kernels():
    transformers = pytest.importorskip("transformers")
    import test_transformers
    for name in ("gpt2", "llama"):
        torch.manual_seed(0)
        model = test_transformers.MODELS[name]().eval()
        ids = torch.randint(0, 100, (1, 8))
        with torch.no_grad():
            got = frametrace.optimize(backend="triton", fullgraph=True)(model)(ids)
            expected = model(ids)
        torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state,
                                   atol=1e-4, rtol=1e-4)
        assert len(last_compiled().kernels) > 5
    del transformers


def test_views_of_a_stored_value_feed_matmuls_without_copies():
    def f(x, w, a, b):
        h = (x * w).relu()  # stored once: three matmuls read views of it
        return h.view(-1, 8) @ a, h.view(-1, 8) @ b, h.view(-1, 8).t() @ h.view(-1, 8)
    mod = compiled_run(f, torch.randn(2, 3, 8), torch.randn(8), torch.randn(8, 4),
                       torch.randn(8, 4), kernels=1, rtol=1e-4)
    assert len(mod.kernels[0].stores) == 1, mod.source


def test_scalar_load_under_a_mask():
    compiled_run(lambda x: torch.cat([x[:1] - 1, x[1:] * 2]), torch.randn(9), kernels=1)


# -- dynamic shapes: symbolic sizes become kernel arguments -------------------------------------
def _layer_norm(x, w, b):
    return F.layer_norm(x, (32,), w, b)


def _add_rms_norm(x, residual, w):
    h = x + residual
    return h, rms_norm(h, w)


DYNAMIC = {  # fn, inputs for a size n (the batch, or rows, that varies)
    "pointwise_chain": (lambda x, w, b: F.gelu(x * w + b).sigmoid() * 3 - x,
                        lambda n: (torch.randn(n, 32), torch.randn(32), torch.randn(32))),
    "softmax": (lambda x: torch.softmax(x, -1), lambda n: (torch.randn(n, 100),)),
    "softmax_row_length": (lambda x: torch.softmax(x, -1), lambda n: (torch.randn(6, 7 * n),)),
    "layer_norm": (_layer_norm, lambda n: (torch.randn(n, 3, 32), torch.randn(32), torch.randn(32))),
    "add_rms_norm": (_add_rms_norm, lambda n: (torch.randn(n, 64), torch.randn(n, 64), torch.randn(64))),
}


def _symbolic_kernels(mod):
    """The module is a symbolic graph's, launching generated kernels with size arguments."""
    assert mod is not None and mod.symbolic, mod and mod.source
    assert len(mod.kernels) == 1, mod.source
    src = mod.kernels[0].source
    # (the source names its size parameters by position: config.canonical_symbols)
    assert mod.kernels[0].symbols and all(f"sym{i}," in src for i in range(len(mod.kernels[0].symbols))), src
    assert "xmask = xindex < xnumel" in src
    return mod


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_dynamic_sizes_compile_twice_into_symbolic_kernels(name):
    from frametrace.testing import CompileCounter
    fn, make = DYNAMIC[name]
    counter = CompileCounter(inner="triton")
    f = frametrace.optimize(backend=counter)(fn)
    for i, n in enumerate((3, 5, 8, 13)):
        args = make(n)
        torch.testing.assert_close(f(*args), fn(*args), atol=1e-5, rtol=1e-5)
        mod = last_compiled()
        if i == 0:
            assert not mod.symbolic
        else:
            _symbolic_kernels(mod)
    assert counter.frame_count == 2
    assert sum(m.symbolic for m in backend.COMPILED) == 1
    if name == "softmax_row_length":  # a row of symbolic length: looped, masked
        assert "triton_red_" in mod.kernels[0].name and "rmask" in mod.kernels[0].source


def test_dynamic_true_compiles_symbolic_kernels_on_the_first_call():
    from frametrace.testing import CompileCounter
    fn, make = DYNAMIC["layer_norm"]
    counter = CompileCounter(inner="triton")
    f = frametrace.optimize(backend=counter, dynamic=True)(fn)
    for n in (2, 7, 4, 9):
        args = make(n)
        torch.testing.assert_close(f(*args), fn(*args), atol=1e-5, rtol=1e-5)
        _symbolic_kernels(last_compiled())
    assert counter.frame_count == 1 and len(backend.COMPILED) == 1


def test_dynamic_views_slices_cat_externs_and_int_inputs():
    cases = [
        (lambda x, n: x * n + n, lambda n: (torch.randn(4, 3), n)),
        (lambda x: x[:, 1:].sum(-1) + x.shape[1], lambda n: (torch.randn(3, n),)),
        (lambda x, y: torch.cat([x, y], 1).var(-1) @ torch.ones(3, 2),
         lambda n: (torch.randn(3, n), torch.randn(3, n))),
        (lambda x, w: (x.transpose(0, 1) * w).reshape(-1, 8).mean(0),
         lambda n: (torch.randn(8, n), torch.randn(n, 1))),
    ]
    for fn, make in cases:
        f = frametrace.optimize(backend="triton", dynamic=True)(fn)
        for n in (5, 6, 11):
            args = make(n)
            torch.testing.assert_close(f(*args), fn(*args), atol=1e-5, rtol=1e-5)
            assert last_compiled().symbolic


def test_symbolic_sizes_it_cannot_express_fall_back_to_aot_eager_with_a_log_line(caplog, monkeypatch):
    # (a size s0 // 2: a derived size, unless config.derived_sizes is off)
    monkeypatch.setattr(config, "derived_sizes", False)
    fn = lambda x: (x.reshape(-1, 2) * 2).sum(1)  # noqa: E731
    f = frametrace.optimize(backend="triton", dynamic=True)(fn)
    with caplog.at_level(logging.INFO, logger="frametrace.output_code"):
        for n in (6, 8, 10):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), fn(x))
    assert "symbolic shapes" in caplog.text and "aot_eager" in caplog.text
    assert last_compiled() is None


def test_symbolic_shapes_can_be_turned_off(monkeypatch, caplog):
    monkeypatch.setattr(config, "dynamic_shapes", False)
    f = frametrace.optimize(backend="triton", dynamic=True)(lambda x: torch.softmax(x, -1) * 2)
    with caplog.at_level(logging.INFO, logger="frametrace.output_code"):
        for n in (5, 7):
            x = torch.randn(3, n)
            torch.testing.assert_close(f(x), torch.softmax(x, -1) * 2)
    assert "symbolic shapes" in caplog.text
    assert last_compiled() is None


def test_a_failing_launch_runs_the_kernels_nodes_as_aten_calls(monkeypatch, caplog):
    from frametrace.backends.triton import wrapper

    def broken(self, *args):
        raise RuntimeError("no such kernel")
    monkeypatch.setattr(wrapper.Launcher, "__call__", broken)
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    f = frametrace.optimize(backend="triton")(lambda x: x.cos() * 2)
    x = torch.randn(6)
    with caplog.at_level(logging.WARNING, logger="frametrace"):
        torch.testing.assert_close(f(x), x.cos() * 2)
        torch.testing.assert_close(f(x), x.cos() * 2)
    # the graph is built again with the failing kernel's nodes as aten calls, not run eagerly
    assert "runs eagerly" not in caplog.text
    mod = last_compiled()
    assert not mod.kernels and sorted(f.op for f in mod.fallbacks) == ["aten.cos.default", "aten.mul.Tensor"]
    assert all("no such kernel" in f.reason for f in mod.fallbacks)


# -- half-precision erf, fast launches ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_on_half_inputs_uses_the_half_erf_within_torch_tolerances(dtype):
    x = torch.linspace(-9, 9, 8191).to(dtype)
    x = torch.cat([x, torch.tensor([float("nan"), 0.0, -0.0, 1e-3], dtype=dtype)])
    w, b = torch.rand(8195, dtype=dtype) + 0.5, torch.randn(8195, dtype=dtype) * 0.1

    def f(x, w, b):
        return F.gelu(x * w + b), torch.erf(x)
    got = frametrace.optimize(backend="triton", fullgraph=True)(f)(x, w, b)
    mod = last_compiled()
    assert "tl.exp2" in mod.kernels[0].source and "0.3275911" not in mod.kernels[0].source
    # eager computes x * w + b rounded to `dtype`; the kernel keeps it in fp32 (as Inductor
    # does): compare with gelu of the same fp32 value, rounded once, at torch's tolerances
    h = x.float() * w.float() + b.float()
    torch.testing.assert_close(got[0], F.gelu(h).to(dtype), equal_nan=True)
    torch.testing.assert_close(got[1], torch.erf(x), equal_nan=True)


def test_float32_gelu_keeps_the_accurate_erf():
    mod = compiled_run(lambda x: F.gelu(x), torch.linspace(-9, 9, 4099), kernels=1)
    assert "0.3275911" in mod.kernels[0].source and "tl.exp2" not in mod.kernels[0].source


def test_fast_wrapper_source_launches_compiled_kernels_directly(monkeypatch):
    """The fast wrapper (GPU only) is generated here with stand-ins for what Triton
    compiled: literal grids and block sizes, alignment and hook checks, no Launcher."""
    import types
    import triton.runtime

    def f(x, w, a):
        h = F.gelu(x * w)
        return torch.softmax(h @ a, -1), h.t()[1:]
    x, w, a = torch.randn(8, 16), torch.randn(16), torch.randn(16, 32)
    compiled_run(f, x, w, a, kernels=2, rtol=1e-4)
    W = last_compiled().wrapper
    for name in W.launchers:
        W.ns[name].compiled = types.SimpleNamespace(run=None, function=None, packed_metadata=None)
    assert W.fast_source([x, w, a]) is None  # CPU
    monkeypatch.setattr(W.lowered, "device", torch.device("cuda", 0))
    monkeypatch.setattr(autotune, "interpreted", lambda: False)
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(get_current_stream=None))
    src = W.fast_source([x, w[1:], a])
    assert "kernel" not in src.replace("run_kernel", "").replace("fn_kernel", "").replace(
        "meta_kernel", "").replace("# triton", ""), src
    assert "(arg0_1.data_ptr() | arg2_1.data_ptr()) & 15" in src
    assert "arg1_1.data_ptr() % 16 != 4" in src and "return call(args)" in src
    assert "stream, fn_kernel" in src and ", 128)" in src and ", 8, 32)" in src


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("static", [True, False])
def test_gpu_fast_launches_and_moved_or_misaligned_inputs(monkeypatch, static):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "cudagraphs", False)
    monkeypatch.setattr(config, "static_launch", static)  # torch's launcher, or Triton's

    def f(x, w):
        return torch.softmax(x * w, -1) + 1, (x - w).sum(-1)
    x, w = torch.randn(64, 1000, device="cuda"), torch.randn(1000, device="cuda")
    cf = frametrace.optimize(backend="triton")(f)
    close = dict(rtol=1e-4, atol=1e-4)  # sums of 1000 in another order
    torch.testing.assert_close(cf(x, w), f(x, w), **close)
    mod = last_compiled()
    assert mod.fast is not None and ("static_launch(fn_kernel" if static else "run_kernel") in mod.fast_source
    for _ in range(2):
        torch.testing.assert_close(cf(x, w), f(x, w), **close)
        y = torch.randn(64 * 1000 + 3, device="cuda")[3:].view(64, 1000)  # misaligned
        torch.testing.assert_close(cf(y, w), f(y, w), **close)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_symbolic_sizes(monkeypatch):
    """On the GPU: kernels with size arguments (rows and row lengths that change, sizes
    not multiples of 16) compiled once, right for every size; then a small GPT-2 over
    several sequence lengths compiles twice."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    transformers = pytest.importorskip("transformers")

    def f(x, r, w):
        h = x + r
        return torch.softmax(x, -1), h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    cnt = frametrace.testing.CompileCounter(inner="triton")
    g = frametrace.optimize(backend=cnt, dynamic=True)(f)
    for rows, cols in ((64, 1000), (3, 77), (130, 4096), (1000, 17)):
        x, r = torch.randn(rows, cols, device="cuda"), torch.randn(rows, cols, device="cuda")
        w = torch.randn(cols, device="cuda")
        torch.testing.assert_close(g(x, r, w), f(x, r, w), rtol=1e-4, atol=1e-4)
    assert cnt.frame_count == 1 and last_compiled().kernels

    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64)).cuda().eval()
    mcnt = frametrace.testing.CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=mcnt)(model)
    with torch.no_grad():
        for seq in (8, 13, 16, 29):
            ids = torch.randint(0, 100, (2, seq), device="cuda")
            torch.testing.assert_close(compiled(ids).last_hidden_state,
                                       model(ids).last_hidden_state, rtol=1e-3, atol=1e-3)
    assert mcnt.frame_count == 2
