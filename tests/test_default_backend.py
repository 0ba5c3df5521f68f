"""The default backend (issue 30, item 5): `frametrace.optimize(f)` chooses per graph, the
triton backend's kernels for graphs on CUDA tensors, the eager backend for CPU graphs;
`mode=` works with it; `backend="triton"` on CPU tensors says once that it runs them
with aot_eager, and FRAMETRACE_TRITON_STRICT=1 refuses that.

There is no GPU in CI: the CUDA path is taken here by counting the CPU as a kernel
device (`default.KERNEL_DEVICES`), with a recording stand-in for the triton backend, or
with the real one in Triton's interpreter where Triton is installed."""
import copy
import logging
import warnings

import pytest
import torch

import frametrace
from differential import check, check_grads
from frametrace.backends import _BACKENDS
from frametrace.backends import default as default_backend


def backends_of(report_or_records):
    records = getattr(report_or_records, "records", report_or_records)
    return [r.graph_module.meta.get("frametrace_backend") for r in records if r.graph_module is not None]


def with_break(x, w):
    y = (x * w).sin()
    print("", end="")
    return y.relu() + 1


INPUTS = [(torch.randn(4, 3), torch.randn(3)) for _ in range(3)]


@pytest.fixture
def kernel_cpu(monkeypatch):
    """CPU graphs count as CUDA graphs, and the triton backend is a stand-in that records
    its graphs and compiles them with aot_eager (AOTAutograd, as the real one)."""
    seen = []

    def triton_stand_in(gm, example_inputs):
        seen.append(gm)
        return _BACKENDS["aot_eager"](gm, example_inputs)
    monkeypatch.setattr(default_backend, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(default_backend, "triton_installed", lambda: True)
    monkeypatch.setitem(_BACKENDS, "triton", triton_stand_in)
    return seen


# ------------------------------------------------------------------ CPU graphs: eager
def test_optimize_without_a_backend_uses_the_default():
    f = frametrace.optimize(with_break)
    assert f.callback.backend is _BACKENDS["default"]
    assert "default" in frametrace.list_backends()
    m = frametrace.optimize(torch.nn.Linear(3, 3))
    assert m._settings["backend"] == "default"


def test_cpu_graphs_compile_with_the_eager_backend():
    r = check(with_break, INPUTS, backend="default", graphs=2, breaks=1, compiles=2)
    assert backends_of(r) == ["eager", "eager"]
    # optimize(f) as users write it: the same graphs, the same choice
    r = check(with_break, INPUTS, graphs=None, breaks=1, compiles=2,
              compiled=lambda counter: frametrace.optimize(with_break))
    assert backends_of(r) == ["eager", "eager"]
    assert all(rec.graph_module.meta["frametrace_backend_reason"] == "cpu tensors" for rec in r.records)


def test_cpu_training_with_the_default_is_eager_and_keeps_gradients():
    def step(x, w1, w2):
        return torch.nn.functional.gelu(x @ w1).tanh() @ w2

    inputs = [(torch.randn(4, 3, requires_grad=True), torch.randn(3, 5, requires_grad=True),
               torch.randn(5, 2, requires_grad=True)) for _ in range(3)]
    r = check_grads(step, inputs, backend="default", graphs=1, compiles=1)
    assert backends_of(r) == ["eager"]


def test_a_whole_cpu_training_loop_compiles_once():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ref = torch.nn.Linear(3, 2)
    ref.load_state_dict(model.state_dict())
    compiled = frametrace.optimize(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    records = []
    frametrace.convert.record_observers.append(records.append)
    try:
        for i in range(5):
            x = torch.randn(4, 3)
            for m, opt in zip((ref, compiled), opts):
                opt.zero_grad()
                m(x).square().mean().backward()
                opt.step()
            torch.testing.assert_close(model.weight, ref.weight)
    finally:
        frametrace.convert.record_observers.remove(records.append)
    assert backends_of(records) == ["eager"], records
    assert len(records) == 1


# ------------------------------------------------------------------ CUDA graphs: triton
def test_kernel_device_graphs_compile_with_the_triton_backend(kernel_cpu):
    r = check(with_break, INPUTS, backend="default", graphs=2, breaks=1, compiles=2)
    assert backends_of(r) == ["triton", "triton"]
    assert len(kernel_cpu) == 2


def test_kernel_device_training_graphs_get_a_backward(kernel_cpu):
    def f(x, w):
        return (x @ w).tanh() * x.sum()

    inputs = [(torch.randn(4, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True))
              for _ in range(3)]
    r = check_grads(f, inputs, backend="default", graphs=1, compiles=1)
    assert backends_of(r) == ["triton"] and len(kernel_cpu) == 1


def test_a_frame_whose_arguments_hold_no_cuda_tensor_is_traced_and_run_as_eager(kernel_cpu):
    # Its trace keeps what only the eager backend runs right (see the next test): the
    # graph it makes on a kernel device must not go to an AOTAutograd backend.
    def make(n):
        return torch.arange(n).float().sin() * 2

    r = check(make, [3, 3, 3], backend="default", graphs=1, compiles=1)
    assert backends_of(r) == ["eager"] and not kernel_cpu
    assert "traced for the eager backend" in r.records[0].graph_module.meta["frametrace_backend_reason"]


@torch.compiler.allow_in_graph
def _check_grad_mode_is_off():
    assert not torch.is_grad_enabled(), "grad mode is on"


def _checks_grad_mode(x):
    y = x * 2
    _check_grad_mode_is_off()
    return y + 1


def test_the_trace_is_made_for_the_backend_the_default_chooses():
    # A tensor-less allow_in_graph call stays a graph node where the eager backend
    # runs the graph (CPU), and is a break where AOTAutograd would re-trace it (CUDA).
    with torch.no_grad():
        r = check(_checks_grad_mode, [torch.ones(2), torch.ones(2)], backend="default",
                  graphs=1, breaks=0, fullgraph=True)
    assert backends_of(r) == ["eager"]


def test_the_trace_is_made_for_the_kernel_backend_on_cuda(kernel_cpu):
    with torch.no_grad():
        r = check(_checks_grad_mode, [torch.ones(2), torch.ones(2)], backend="default",
                  breaks=1, graphs=None)
    assert any("no tensor" in why for why in r.reasons()), r
    assert set(backends_of(r)) == {"triton"}


class _Trainer:
    def __init__(self, model):
        self.model = model


@pytest.mark.parametrize("make", [
    lambda t: t,
    lambda t: [1, (2, t)],
    lambda t: {"a": t},
    lambda t: torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(2, 2)),
    lambda t: _Trainer(torch.nn.Linear(2, 2)),
    lambda t: torch.optim.SGD([torch.nn.Parameter(t)], lr=0.1),
], ids=["tensor", "nested", "dict", "module", "object", "optimizer"])
def test_the_frame_s_arguments_are_searched_for_a_cuda_tensor(monkeypatch, make):
    t = torch.ones(2)
    assert not default_backend._on_kernel_device([make(t), 3])
    monkeypatch.setattr(default_backend, "KERNEL_DEVICES", ("cpu",))
    assert default_backend._on_kernel_device([3, make(t)])
    assert not default_backend._on_kernel_device([3, "x", None])


def test_cuda_graphs_without_triton_run_eager_with_one_warning(kernel_cpu, monkeypatch):
    monkeypatch.setattr(default_backend, "triton_installed", lambda: False)
    monkeypatch.setattr(default_backend, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = check(with_break, INPUTS, backend="default", graphs=2, breaks=1)
    assert backends_of(r) == ["eager", "eager"] and not kernel_cpu
    assert [str(w.message) for w in caught if "Triton is not installed" in str(w.message)] == \
        ["frametrace: the default backend runs CUDA graphs with the eager backend: Triton is "
         "not installed (pip install triton)"]


# ------------------------------------------------------------------ mode= and options=
def test_mode_with_the_default_is_a_log_note_on_cpu_graphs(caplog):
    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "default"):
        frametrace.reset()
        with caplog.at_level(logging.INFO, logger="frametrace"):
            caplog.clear()
            r = check(with_break, INPUTS, graphs=None, breaks=1, compiles=2,
                      compiled=lambda counter: frametrace.optimize(with_break, mode=mode))
        assert backends_of(r) == ["eager", "eager"]
        notes = [rec for rec in caplog.records if rec.name == "frametrace" and "tunes" in rec.getMessage()]
        if mode == "default":
            assert notes == []
        else:
            assert len(notes) == 1 and notes[0].levelno == logging.INFO, notes
            assert f"mode={mode!r}" in notes[0].getMessage() and "\n" not in notes[0].getMessage()


def test_options_with_the_default_are_checked_at_optimize():
    with pytest.raises(ValueError, match="unknown triton option"):
        frametrace.optimize(with_break, options={"no_such_setting": 1})
    f = frametrace.optimize(with_break, options={"max_autotune": True})
    x, w = INPUTS[0]
    torch.testing.assert_close(f(x, w), with_break(x, w))
    # a backend that takes no mode= still says so
    with pytest.raises(ValueError, match="takes no mode="):
        frametrace.optimize(with_break, backend="eager", mode="reduce-overhead")


def test_mode_reaches_the_triton_backend_on_cuda_graphs(triton_interpreter, monkeypatch):
    pytest.importorskip("triton")
    from frametrace.backends.triton import config, last_compiled
    monkeypatch.setattr(default_backend, "KERNEL_DEVICES", ("cuda", "cpu"))

    def f(x):
        return torch.softmax(x * 2, -1)
    r = check(f, [torch.randn(4, 8) for _ in range(3)], graphs=None, compiles=1,
              compiled=lambda counter: frametrace.optimize(f, mode="max-autotune-no-cudagraphs"))
    assert backends_of(r) == ["triton"]
    assert last_compiled().settings == config.MODES["max-autotune-no-cudagraphs"]
    assert last_compiled().kernels


def test_training_with_the_default_on_cuda_compiles_the_backward(triton_interpreter, monkeypatch):
    pytest.importorskip("triton")
    from frametrace.backends.triton import backend as tb
    monkeypatch.setattr(default_backend, "KERNEL_DEVICES", ("cuda", "cpu"))

    def f(x, w):
        return torch.nn.functional.gelu(x * w).sum(-1)
    inputs = [(torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True))
              for _ in range(3)]
    r = check_grads(f, inputs, backend="default", graphs=1, compiles=1, atol=1e-5)
    assert backends_of(r) == ["triton"]
    assert {"forward", "backward"} <= {m.kind for m in tb.COMPILED}


# ------------------------------------------------------------------ backend="triton" on CPU
@pytest.fixture
def triton_on_cpu(monkeypatch):
    """backend="triton" as a user names it on a machine without a GPU: no interpreter."""
    pytest.importorskip("triton")
    from frametrace.backends.triton import backend as tb
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT", raising=False)
    monkeypatch.setattr(tb, "_warned_cpu", False)
    return tb


def test_triton_on_cpu_tensors_warns_once_naming_its_fallback(triton_on_cpu):
    def g(x):
        return x.cos() * 3

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(with_break, INPUTS, backend="triton", graphs=2, breaks=1)
        check(g, [torch.randn(3) for _ in range(3)], backend="triton", graphs=1)
    said = [str(w.message) for w in caught if "backend='triton'" in str(w.message)]
    assert len(said) == 1, said
    assert "CPU tensors" in said[0] and "aot_eager" in said[0]


def test_triton_strict_refuses_cpu_tensors(triton_on_cpu, monkeypatch):
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")
    with pytest.raises(frametrace.BackendCompilerFailed, match="FRAMETRACE_TRITON_STRICT=1"):
        frametrace.optimize(backend="triton")(lambda x: x.sin() + 1)(torch.randn(3))


# ------------------------------------------------------------------ what reports the choice
def test_explain_and_the_graph_log_name_the_backend_of_each_graph(caplog):
    x, w = INPUTS[0]
    report = frametrace.explain(frametrace.optimize(with_break))(x, w)
    assert report.backends == ["eager (the default backend's choice: cpu tensors)"] * 2
    assert "backend: eager (the default backend's choice: cpu tensors)" in " ".join(str(report).split())
    assert frametrace.explain(frametrace.optimize(with_break, backend="aot_eager"))(x, w).backends == \
        ["aot_eager", "aot_eager"]
    frametrace.reset()
    with caplog.at_level(logging.INFO, logger="frametrace.graph"):
        frametrace.optimize(lambda x: x.exp() + 1)(x)
    assert any("compiled by eager (the default backend's choice: cpu tensors)" in rec.getMessage()
               for rec in caplog.records), caplog.records


# ------------------------------------------------------------------ on a GPU (skipped in CI)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def strict_triton(monkeypatch):
    """A CUDA graph must become kernels: a quiet eager fallback fails the test."""
    pytest.importorskip("triton")
    from frametrace.backends.triton import backend as tb
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    tb.COMPILED.clear()
    before = tb.STATS["eager_graphs"]
    yield tb
    assert tb.STATS["eager_graphs"] == before, "a CUDA graph ran eagerly"


@cuda
def test_gpu_default_compiles_cuda_graphs_to_triton_kernels(strict_triton):
    def f(x, w):
        return torch.nn.functional.gelu(x * w).softmax(-1)
    inputs = [(torch.randn(64, 1024, device="cuda"), torch.randn(1024, device="cuda")) for _ in range(3)]
    r = check(f, inputs, backend="default", graphs=1, compiles=1, rtol=1e-4, atol=1e-5)
    assert backends_of(r) == ["triton"]
    assert strict_triton.COMPILED and strict_triton.COMPILED[-1].kernels


@cuda
def test_gpu_default_training_loop_compiles_forward_and_backward_once(strict_triton):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 8)).cuda()
    ref = copy.deepcopy(model)
    compiled = frametrace.optimize(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    records = []
    frametrace.convert.record_observers.append(records.append)
    try:
        for _ in range(5):
            x = torch.randn(32, 64, device="cuda")
            for m, opt in zip((ref, compiled), opts):
                opt.zero_grad()
                m(x).square().mean().backward()
                opt.step()
            for a, b in zip(ref.parameters(), model.parameters()):
                torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)
    finally:
        frametrace.convert.record_observers.remove(records.append)
    assert backends_of(records) == ["triton"] and len(records) == 1, records
    assert {"forward", "backward"} <= {m.kind for m in strict_triton.COMPILED}


@cuda
def test_gpu_default_takes_mode(strict_triton):
    from frametrace.backends.triton import config

    def f(x):
        return (x.sin() + 1).relu() * 2
    r = check(f, [torch.randn(8, 256, device="cuda") for _ in range(4)], graphs=None, compiles=1,
              compiled=lambda counter: frametrace.optimize(f, mode="reduce-overhead"))
    assert backends_of(r) == ["triton"]
    assert strict_triton.COMPILED[-1].settings == config.MODES["reduce-overhead"]


@cuda
def test_gpu_default_is_faster_than_the_eager_backend(strict_triton):
    # The point of the default: a swap from torch.compile speeds a pointwise chain up.
    def f(x):
        for _ in range(8):
            x = torch.nn.functional.gelu(x) * 1.01 + 0.1
        return x
    x = torch.randn(4096, 4096, device="cuda")

    def timed(g):
        for _ in range(3):
            g(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            g(x)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 20
    eager_ms = timed(frametrace.optimize(f, backend="eager"))
    default_ms = timed(frametrace.optimize(f))
    print(f"eager backend {eager_ms:.3f} ms, default {default_ms:.3f} ms")
    assert default_ms < eager_ms * 0.7, (eager_ms, default_ms)


def test_explain_traces_as_the_default_backend_would():
    # explain() of the default on CPU tensors reports the graph optimize() makes: the
    # tensor-less allow_in_graph check stays in it (a re-tracing backend's trace breaks).
    with torch.no_grad():
        report = frametrace.explain(_checks_grad_mode)(torch.ones(2))
        assert (report.graph_count, report.graph_break_count) == (1, 0), report
        report = frametrace.explain(frametrace.optimize(_checks_grad_mode, backend="aot_eager"))(torch.ones(2))
        assert report.graph_break_count == 1, report


def test_a_graph_the_kernel_backend_cannot_compile_runs_eager_with_a_warning(kernel_cpu, monkeypatch, caplog):
    def refuses(gm, example_inputs):
        kernel_cpu.append(gm)
        raise NotImplementedError("no lowering for this")
    monkeypatch.setitem(_BACKENDS, "triton", refuses)
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT", raising=False)
    with caplog.at_level(logging.WARNING, logger="frametrace"):
        r = check(with_break, INPUTS, backend="default", graphs=2, breaks=1, compiles=2)
    assert backends_of(r) == ["eager", "eager"] and len(kernel_cpu) == 2
    assert "the triton backend failed (NotImplementedError: no lowering for this)" in \
        r.records[0].graph_module.meta["frametrace_backend_reason"]
    assert sum("runs with the eager backend" in rec.getMessage() for rec in caplog.records) == 2
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")
    frametrace.reset()
    with pytest.raises(frametrace.BackendCompilerFailed, match="no lowering for this"):
        frametrace.optimize(with_break)(*INPUTS[0])


def test_the_kernels_switch_runs_every_default_graph_eager(kernel_cpu, monkeypatch):
    monkeypatch.setattr(frametrace.config, "default_backend_kernels", False)
    with torch.no_grad():   # (traced for eager too: the check stays in the graph)
        r = check(_checks_grad_mode, [torch.ones(2), torch.ones(2)], backend="default",
                  graphs=1, breaks=0)
    assert backends_of(r) == ["eager"] and not kernel_cpu
