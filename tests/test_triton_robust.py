"""backend="triton" never faults and never quietly runs a graph eagerly: tensors on another
device than the kernels' (a CPU scalar tensor beside CUDA ones, a CPU constant) are read
by value, moved, or left to an aten call in the same wrapper; a kernel that cannot be
generated or fails on its first launch runs its FX nodes as aten calls while the rest of
the graph still runs as kernels; each such fallback is named, with why, in `mod.fallbacks`
and the `perf_hints` log.

There is no GPU here: kernels run in Triton's interpreter on the CPU.  A second device is
had two ways: graphs built (not run) for FakeTensors on "cuda", and graphs run on the CPU
whose chosen inputs the lowering is told live on "cpu:1", another device than the
kernels' "cpu" (`GraphLowering.device_of_input`), which exercises the same decisions."""
import logging

import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, foreach, last_compiled, lowering, ops, placement  # noqa: E402

aten = torch.ops.aten
ELSEWHERE = torch.device("cpu", 1)  # "another device" for the tests below


from triton_harness import triton_check  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


compiled_run = triton_check


@pytest.fixture
def elsewhere(monkeypatch):
    """Graph inputs and constants with 0 dims, or named in the returned set ("const": all
    constants), count as living on ELSEWHERE."""
    names = set()
    monkeypatch.setattr(lowering.GraphLowering, "device_of_input", staticmethod(
        lambda name, t: ELSEWHERE if t.dim() == 0 or name in names or name.rstrip("0123456789") in names
        else t.device))
    return names


def extern_ops(mod):
    return [str(op) for op in mod.extern_ops]


# -- tensors on another device ------------------------------------------------------------------
def test_a_host_float_scalar_is_read_once_per_call_and_passed_by_value(elsewhere):
    def f(x, s):
        return torch.softmax(x * s, -1)
    g = frametrace.optimize(backend="triton", fullgraph=True)(f)
    x = torch.randn(4, 33)
    for s in (0.5, -2.0, 3.25):  # a new value each call: read on each call, not baked in
        torch.testing.assert_close(g(x, torch.tensor(s)), f(x, torch.tensor(s)))
    mod = last_compiled()
    assert len(backend.COMPILED) == 1 and len(mod.kernels) == 1 and not mod.fallbacks
    # one host read in the wrapper, a float argument (no pointer) in the kernel
    assert extern_ops(mod) == ["aten._local_scalar_dense.default"]
    src = mod.kernels[0].source
    assert "ks0" in src and "in_ptr1" not in src
    assert mod.wrapper.lowered.off_device


def test_a_host_int_scalar_is_copied_to_the_kernels_device_once_per_call(elsewhere):
    def f(x, i):
        return (x + i) * 3
    x = torch.randint(-5, 5, (6, 7))
    mod = compiled_run(f, x, torch.tensor(4), kernels=1)
    # an int is not a kernel argument by value (Triton specializes ints on their value)
    assert extern_ops(mod) == ["aten._to_copy.default"] and not mod.fallbacks


def test_a_broadcast_host_scalar_is_read_as_one_number(elsewhere):
    elsewhere.add("arg1_1")

    def f(x, s):
        return x * s.expand(5, 8) + 1
    mod = compiled_run(f, torch.randn(5, 8), torch.randn(1, 1), kernels=1)
    assert "aten._local_scalar_dense.default" in extern_ops(mod) and not mod.fallbacks


def test_an_op_reading_a_whole_tensor_from_another_device_stays_aten_in_the_wrapper(elsewhere):
    elsewhere.add("arg1_1")

    def f(x, w):
        return (x.cos() * 2).sum(-1) + w.sum(-1)
    mod = compiled_run(f, torch.randn(3, 8), torch.randn(3, 8), kernels=2)
    # w.sum runs as an aten call between the kernels; the graph is not run eagerly
    assert [(fb.op, fb.reason) for fb in mod.fallbacks] == [
        ("aten.sum.dim_IntList", "reads arg1_1 on cpu:1 (the kernels run on cpu)")]


def test_a_constant_on_another_device_is_moved_once_at_compile_time(elsewhere):
    elsewhere.add("const")

    def f(x):
        return x * torch.tensor([1.0, 2.0, 3.0]) + torch.tensor(0.5)
    mod = compiled_run(f, torch.randn(4, 3), kernels=1)
    moved = sorted(k for k in mod.namespace if k.startswith("const") and k.endswith("_cpu"))
    assert len(moved) == 2 and not mod.extern_ops and not mod.fallbacks
    assert all(k in mod.kernels[0].args for k in moved)


def test_a_cuda_graph_with_cpu_tensors_compiles_to_kernels_that_take_no_cpu_pointer(monkeypatch):
    """Built (not run) for FakeTensors on "cuda": a CPU float scalar input is read by value,
    an int one copied once per call, a CPU constant moved at compile time, a CPU arange
    read only by CUDA ops made in their kernel; the CPU values the graph returns are made on
    the CPU by aten calls (fallbacks), and a CPU vector reaches CUDA by an aten copy."""
    import contextlib
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from frametrace.backends.triton.decompositions import decompositions
    # a constant's move to the GPU gives a FakeTensor here
    monkeypatch.setattr(placement, "unset_fake_temporarily", contextlib.nullcontext)

    def f(x, s, i, v):
        c = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(x.device) + torch.arange(4.0).to(x.device)
        return torch.softmax(x * s, -1) + i + c, (v.to(x.device) * x).cos(), (s * 2).exp()
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(3, 4, device="cuda")
        inputs = [x, torch.tensor(0.5), torch.tensor(2), torch.randn(4)]
        gm = make_fx(f, decomposition_table=decompositions())(*inputs)
        device = backend._graph_device(gm, inputs)
        assert device.type == "cuda" and backend._why_not(inputs, device) is None
        mod = backend.build(gm, inputs)
    lowered = mod.wrapper.lowered
    pointers = {name for k in mod.kernels for name in k.args}
    assert not pointers & set(lowered.devices), "a kernel takes a pointer to CPU memory"
    assert sorted(extern_ops(mod)) == ["aten._local_scalar_dense.default", "aten._to_copy.default",
                                       "aten._to_copy.default", "aten.exp.default", "aten.mul.Tensor"]
    assert mod.namespace["const1_cuda"].device.type == "cuda"
    assert [fb.op for fb in mod.fallbacks] == ["aten.mul.Tensor", "aten.exp.default"]
    assert all("its result is on cpu" in fb.reason for fb in mod.fallbacks)
    assert len(mod.kernels) == 2 and not mod.graphable


def test_no_kernel_takes_a_pointer_to_another_device(monkeypatch, elsewhere):
    """The check before any launch: were the lowering to let a kernel read memory on
    another device, the nodes of that kernel run as aten calls instead."""
    elsewhere.add("arg1_1")
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    monkeypatch.setattr(lowering.GraphLowering, "on_device", lambda self, b, added: b)
    mod = compiled_run(lambda x, w: x.exp() + w.sin(), torch.randn(8), torch.randn(8), kernels=0)
    assert sorted(fb.op for fb in mod.fallbacks) == ["aten.add.Tensor", "aten.exp.default", "aten.sin.default"]
    assert all("would read arg1_1 on cpu:1" in fb.reason for fb in mod.fallbacks)


# -- kernels that cannot be generated or launched -----------------------------------------------
def _broken_cos(message):
    """A lowering of cos whose code generation raises."""
    def lower(L, node, x):
        def fn(k, idx):
            raise RuntimeError(message)
        return ops.pointwise(x.shape, x.dtype, fn, x)
    return lower


def test_a_kernel_that_cannot_be_generated_runs_only_its_node_as_aten(monkeypatch):
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    monkeypatch.setitem(ops.LOWERINGS, aten.cos.default, _broken_cos("no code for cos"))

    def f(x):
        return (x.sin() * 2).cos() + x.exp()
    mod = compiled_run(f, torch.randn(4, 8), kernels=2)
    assert extern_ops(mod) == ["aten.cos.default"]
    assert [(fb.op, fb.reason) for fb in mod.fallbacks] == [
        ("aten.cos.default", "kernel code generation failed: RuntimeError: no code for cos")]


def test_an_internal_error_in_code_generation_raises_under_strict(monkeypatch):
    monkeypatch.setitem(ops.LOWERINGS, aten.cos.default, _broken_cos("no code for cos"))
    with pytest.raises(RuntimeError, match="no code for cos"):
        frametrace.optimize(backend="triton", fullgraph=True)(lambda x: x.cos() + 1)(torch.randn(4))


def test_an_op_found_unsupported_while_its_kernel_is_generated_runs_as_aten():
    """An integer power above 4 is found unsupported only when the kernel is generated:
    that node becomes an aten call, even under FRAMETRACE_TRITON_STRICT (not an error)."""
    x = torch.randint(-3, 4, (4, 6))
    mod = compiled_run(lambda x: (x.abs() + 1) ** 5 - x, x, kernels=2)
    assert extern_ops(mod) == ["aten.pow.Tensor_Scalar"]
    assert [(fb.op, fb.reason) for fb in mod.fallbacks] == [("aten.pow.Tensor_Scalar", "integer pow")]


@pytest.fixture
def sin_kernels_fail(triton_interpreter, monkeypatch):
    """Every kernel computing a sine fails its first launch, as a ptxas error would."""
    from frametrace.backends.triton import loader, wrapper
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    launch = wrapper.Launcher.__call__

    def failing(self, *args):
        source = next(src for src, fn in loader._JITTED.items() if fn is self.fn)
        if "tl.sin(" in source:
            raise RuntimeError("ptxas failed")
        return launch(self, *args)
    monkeypatch.setattr(wrapper.Launcher, "__call__", failing)


@pytest.mark.usefixtures("sin_kernels_fail")
def test_a_kernel_failing_its_first_launch_runs_its_nodes_as_aten_and_the_rest_as_kernels():

    def f(x, y):
        return (y * 2 + 1).sin(), F.softmax(x, -1)  # two kernels; the first fails
    g = frametrace.optimize(backend="triton", fullgraph=True)(f)
    x, y = torch.randn(4, 16), torch.randn(5, 7)
    torch.testing.assert_close(g(x, y), f(x, y))
    torch.testing.assert_close(g(x * 2, y * 2), f(x * 2, y * 2))
    mod = last_compiled()
    assert len(backend.COMPILED) == 1 and len(mod.kernels) == 1 and "tl.sin(" not in mod.kernels[0].source
    assert extern_ops(mod) == ["aten.mul.Tensor", "aten.add.Tensor", "aten.sin.default"]
    assert [fb.op for fb in mod.fallbacks] == ["aten.mul.Tensor", "aten.add.Tensor", "aten.sin.default"]
    assert all(fb.reason == "kernel failed to compile or launch: RuntimeError: ptxas failed"
               for fb in mod.fallbacks)


@pytest.mark.usefixtures("sin_kernels_fail")
def test_a_failing_kernel_in_a_graph_that_writes_its_input_writes_it_once():

    def f(x):
        y = x.sin() * 2
        x.mul_(3)
        return y + x
    x = torch.randn(9)
    expected_x = x.clone()
    expected = f(expected_x)
    got = frametrace.optimize(backend="triton", fullgraph=True)(f)(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, expected_x)  # written once, not again by a second run
    assert "aten.sin.default" in [fb.op for fb in last_compiled().fallbacks]


def test_an_output_read_from_an_input_before_the_graph_writes_it_sees_the_old_value():
    """The write of an in-place op on an input (AOTAutograd's `copy_` at the end) runs after
    every kernel, including those of outputs realized only at the end."""
    def f(x):
        y = x.cos()
        x.add_(1)
        return y
    x = torch.randn(8)
    expected_x = x.clone()
    expected = f(expected_x)
    got = frametrace.optimize(backend="triton", fullgraph=True)(f)(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, expected_x)
    assert len(last_compiled().kernels) == 1


def test_only_what_nothing_else_helps_runs_the_whole_graph_eagerly_with_a_warning(monkeypatch, caplog):
    from frametrace.backends.triton import wrapper
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")

    def broken(self):
        raise RuntimeError("no wrapper today")
    monkeypatch.setattr(wrapper.WrapperCodegen, "generate", broken)
    f = frametrace.optimize(backend="triton")(lambda x: x.cos() * 2)
    x = torch.randn(6)
    before = backend.STATS["eager_graphs"]
    with caplog.at_level(logging.WARNING, logger="frametrace"):
        torch.testing.assert_close(f(x), x.cos() * 2)
    assert "no wrapper today" in caplog.text and "this graph runs eagerly" in caplog.text
    assert last_compiled() is None and backend.STATS["eager_graphs"] == before + 1


# -- saying why ----------------------------------------------------------------------------------
def test_perf_hints_name_each_fallback_once_and_not_ops_meant_to_be_aten(monkeypatch, caplog):
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    monkeypatch.setitem(ops.LOWERINGS, aten.cos.default, _broken_cos("no code for cos"))

    def f(x, w):
        h = (x @ w).cos() + 1                         # mm: aten by design; cos: fails
        return torch.sort(h, -1).values * 2, h.exp()  # sort: no lowering
    before = backend.STATS["fallback_nodes"]
    with caplog.at_level(logging.INFO, logger="frametrace.perf_hints"):
        mod = compiled_run(f, torch.randn(4, 8), torch.randn(8, 6))
    assert backend.STATS["fallback_nodes"] == before + 2
    hints = [r.getMessage() for r in caplog.records if r.name == "frametrace.perf_hints"]
    assert len(hints) == len(mod.fallbacks) == 2, hints
    assert any("aten.cos.default" in h and "no code for cos" in h for h in hints)
    assert any("aten.sort.default" in h and "no lowering for aten.sort.default" in h for h in hints)
    assert not any("aten.mm" in h for h in hints) and "aten.mm.default" in extern_ops(mod)


def test_output_code_lists_the_fallbacks(caplog):
    with caplog.at_level(logging.INFO, logger="frametrace.output_code"):
        compiled_run(lambda x: torch.sort(x, -1).values + 1, torch.randn(3, 5))
    assert "(aten.sort.default) runs as an aten call: no lowering for aten.sort.default" in caplog.text


def test_perf_hints_is_a_log_kind():
    from frametrace import logs
    assert "perf_hints" in logs.KINDS


# -- a whole model --------------------------------------------------------------------------------
def test_t5_encoder_decoder_runs_as_kernels_with_no_fallback():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_decoder_layers=2, num_heads=4, dropout_rate=0.0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    ids, dec = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        expected = model(input_ids=ids, decoder_input_ids=dec).logits
        got = frametrace.optimize(backend="triton")(model)(input_ids=ids, decoder_input_ids=dec).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert len(backend.COMPILED) == 1
    mod = last_compiled()
    # (every norm, softmax and residual as kernels: fusion decides how many exactly)
    assert len(mod.kernels) > 20 and not mod.fallbacks
    assert set(extern_ops(mod)) <= {"aten.mm.default", "aten.bmm.default",
                                    "aten._scaled_dot_product_flash_attention_for_cpu.default"}


@pytest.mark.usefixtures("sin_kernels_fail")
def test_a_failing_kernel_after_a_kernel_that_wrote_an_input_is_replaced_before_any_write():
    # The first kernel writes ps[0] and reduces it; the second (failing: a sine) writes
    # ps[1] from that sum.  The first call rehearses on copies of the inputs, so that
    # every kernel compiles (or is replaced by aten calls) before one writes the
    # caller's memory: an optimizer step's later kernel failing no longer reaches the
    # user, and nothing is written twice.
    def f(ps, gs):
        ps[0].add_(gs[0])
        t = (ps[0] * 3).sum()
        ps[1].add_(t.sin() * gs[1])
        return t
    ps, gs = [torch.randn(7, 5), torch.randn(11)], [torch.randn(7, 5), torch.randn(11)]
    want = [p.clone() for p in ps]
    g = frametrace.optimize(backend="triton", fullgraph=True)(f)
    for step in range(3):
        torch.testing.assert_close(g(ps, gs), f(want, gs))
        for a, b in zip(ps, want):
            torch.testing.assert_close(a, b)
    mod = last_compiled()
    assert len(backend.COMPILED) == 1 and "aten.sin.default" in [fb.op for fb in mod.fallbacks]
    assert any(foreach.in_place(k) for k in mod.kernels), mod.source   # the first kernel stayed
