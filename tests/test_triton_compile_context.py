"""backend="triton": a compile's state (its shape symbols' hints, the ranges of the kernel
being generated, the record of a kernel's FX nodes) is its own CompileContext, not the
module's: a compile in another thread, or one after it, does not change what its kernels
are generated with, and regenerating a kernel to blame its nodes does not hide errors."""
import threading

import pytest
import torch

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, fallback, kernel_source, last_compiled  # noqa: E402
from frametrace.backends.triton.kernel_source import configs_for  # noqa: E402
from triton_harness import triton_check  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _col_sum(x):
    return x.sum(0)


def _symbolic_col_sum():
    """A column sum compiled with symbolic sizes (the second shape recompiles it dynamic)."""
    f = frametrace.optimize(backend="triton", dynamic=True)(_col_sum)
    for shape in [(37, 20, 9), (50, 3, 33)]:
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), _col_sum(x), atol=1e-4, rtol=1e-4)
    mod = last_compiled()
    assert mod.symbolic and len(mod.kernels) == 1, mod.source
    return mod


def _static_build(monkeypatch):
    """(gm, example_inputs, device, aten_nodes) of a static graph's build, to build again."""
    captured, real = [], backend.build

    def capture(gm, example_inputs, device=None, aten_nodes=None):
        captured.append((gm, example_inputs, device, aten_nodes))
        return real(gm, example_inputs, device, aten_nodes)
    monkeypatch.setattr(backend, "build", capture)
    mod = triton_check(lambda x: (x * 2).sum(1), torch.randn(8, 5), kernels=1)
    assert not mod.symbolic
    monkeypatch.setattr(backend, "build", real)
    return captured[-1]


def test_a_later_compile_leaves_an_earlier_ones_size_hints(monkeypatch):
    """A kernel's block sizes are chosen for its own compile's hints, also when asked
    after another graph compiled (a launch that fails is blamed after later compiles)."""
    mod = _symbolic_col_sum()
    group = mod.kernels[0].group
    before = repr(configs_for(group))  # (Configs compare by identity)
    assert mod.wrapper.lowered.hints
    _static_build(monkeypatch)  # another graph, static: no hints
    assert not last_compiled().wrapper.lowered.hints
    assert repr(configs_for(group)) == before
    assert mod.wrapper.lowered.hints


def test_a_compile_in_another_thread_does_not_see_this_ones_symbols(monkeypatch):
    """While a symbolic graph is being scheduled, another thread builds a static graph:
    each compile keeps its own hints and ranges, both build and both compute right."""
    static = _static_build(monkeypatch)
    built, errors = [], []

    def other_thread():
        try:
            built.append(backend.build(*static))
        except Exception as e:  # (reported below, in the test's thread)
            errors.append(e)
    real_schedule = backend.schedule

    def schedule(lowered):
        if lowered.hints and not built:
            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
        return real_schedule(lowered)
    monkeypatch.setattr(backend, "schedule", schedule)
    mod = _symbolic_col_sum()
    assert not errors, errors
    assert len(built) == 1 and not built[0].symbolic and len(built[0].kernels) == 1
    assert mod.wrapper.lowered.hints and not built[0].wrapper.lowered.hints


def test_regenerating_a_kernel_to_blame_it_raises_an_error_it_did_not_have(monkeypatch):
    """fallback.kernel_nodes regenerates a kernel to record the FX nodes it inlines: the
    error of a kernel that failed to generate is expected (its nodes up to the failure are
    recorded), any other error is a bug and raises instead of being dropped."""
    mod = triton_check(lambda x: torch.relu(x) * 3 + 1, torch.randn(4, 6), kernels=1)
    k = mod.kernels[0]
    nodes = fallback.kernel_nodes(k.group, k.stores)
    assert {"relu", "mul", "add"} <= {n.name for n in nodes}, nodes

    def broken(self):
        raise KeyError("a bug in code generation")
    monkeypatch.setattr(kernel_source.KernelCodegen, "_generate", broken)
    with pytest.raises(KeyError):
        fallback.kernel_nodes(k.group, k.stores)
    with pytest.raises(KeyError):  # another error than the one being blamed
        fallback.kernel_nodes(k.group, k.stores, failed=ValueError("its own failure"))
    assert fallback.kernel_nodes(k.group, k.stores, failed=KeyError("its own failure")) >= set()
    assert k.group.ctx.record is None  # (the record is set only while regenerating)
