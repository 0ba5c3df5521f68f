"""torch.compile's call shapes and markers as frametrace takes them: optimize(model,
backend=, mode=, options=, disable=), backend errors, torch's markers on tensors and
functions, copies and pickles of optimized modules, float arguments, the version."""
import copy
import io
import logging
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch._dynamo

import frametrace
from differential import check


def f(x, w):
    return torch.tanh(x @ w).sum(1)


def inputs():
    return [(torch.randn(4, 3), torch.randn(3, 2)), (torch.randn(4, 3), torch.randn(3, 2))]


# --------------------------------------------------------------------------- call shapes
def test_target_first_with_a_backend_keyword():
    r = check(f, inputs(), compiled=lambda c: frametrace.optimize(f, backend="aot_eager"),
              graphs=None, compiles=1)
    assert r.fallbacks == 0, r
    m = torch.nn.Linear(3, 2)
    r = check(m, [torch.randn(4, 3), torch.randn(4, 3)],
              compiled=lambda c: frametrace.optimize(m, backend=c, fullgraph=True), graphs=1)


def test_todays_forms_still_work():
    check(f, inputs(), compiled=lambda c: frametrace.optimize(c, fullgraph=True)(f), graphs=1)
    check(f, inputs(), compiled=lambda c: frametrace.optimize(backend=c)(f), graphs=1)
    check(f, inputs(), compiled=lambda c: frametrace.optimize(f, backend=c, dynamic=False), graphs=1)
    assert frametrace.optimize("aot_eager", fullgraph=True)(f) is not f


def test_two_backends_are_refused():
    with pytest.raises(TypeError, match="two backends"):
        frametrace.optimize("eager", backend="aot_eager")


def test_disable_returns_the_target_unchanged():
    m = torch.nn.Linear(2, 2)
    assert frametrace.optimize(f, disable=True) is f
    assert frametrace.optimize(m, backend="aot_eager", disable=True) is m
    assert frametrace.optimize(disable=True)(f) is f


def test_modes_and_options_are_checked():
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        frametrace.optimize(f, mode="fast")
    with pytest.raises(ValueError, match="not both"):
        frametrace.optimize(f, backend="triton", mode="max-autotune", options={"cudagraphs": False})
    with pytest.raises(ValueError, match="unknown triton option.*known: .*cudagraphs"):
        frametrace.optimize(f, backend="triton", options={"no_such_knob": 1})
    with pytest.raises(ValueError, match="backend 'eager' takes no mode="):
        frametrace.optimize(f, backend="eager", mode="reduce-overhead")
    # "default" is every backend's.
    check(f, inputs(), compiled=lambda c: frametrace.optimize(f, backend=c, mode="default"), graphs=1)


def test_options_reach_a_backend_that_takes_them():
    seen = []

    def tuned(gm, example_inputs, options=None):
        seen.append(options)
        return gm.forward

    r = check(f, inputs(), compiled=lambda c: frametrace.optimize(f, backend=tuned, options={"k": 1}),
              graphs=None, compiles=1)
    assert seen == [{"k": 1}], (seen, r)


@pytest.mark.parametrize("mode, want", [
    ("reduce-overhead", {"cudagraphs": True, "cudagraph_min_launches": 1}),
    ("max-autotune-no-cudagraphs", {"max_autotune": True, "cudagraphs": False}),
])
def test_a_mode_sets_the_triton_backends_settings_for_its_modules(triton_interpreter, mode, want):
    pytest.importorskip("triton")
    from frametrace.backends.triton import config, last_compiled

    def g(x):
        return (x.sin() * 2).relu()
    before = config.settings()
    r = check(g, [torch.randn(64), torch.randn(64)], graphs=None, compiles=1,
              compiled=lambda c: frametrace.optimize(g, backend="triton", mode=mode))
    assert r.fallbacks == 0, r
    assert last_compiled().settings == want
    assert config.settings() == before      # the module-wide settings are untouched


# --------------------------------------------------------------------------- backend errors
def broken(gm, example_inputs):
    raise RuntimeError("backend exploded")


def test_a_failing_backend_raises_a_wrapped_error_naming_backend_and_graph():
    def h(x):
        return x.cos() + 1
    g = frametrace.optimize(h, backend=broken)
    with pytest.raises(frametrace.BackendCompilerFailed) as info:
        g(torch.ones(3))
    e = info.value
    assert isinstance(e.__cause__, RuntimeError) and str(e.__cause__) == "backend exploded"
    assert e.backend_name == "broken" and e.graph_name.startswith("__compiled_fn_")
    assert "backend 'broken' raised RuntimeError" in str(e) and "h (" in str(e)
    # fullgraph: the same error (a backend failure is not something the tracer met)
    with pytest.raises(frametrace.BackendCompilerFailed):
        frametrace.optimize(lambda x: x * 2, backend=broken, fullgraph=True)(torch.ones(3))


def test_a_failing_backend_at_a_graph_break_raises_too():
    def h(x):
        y = x.cos()
        print("", end="")
        return y + 1
    with pytest.raises(frametrace.BackendCompilerFailed, match="backend exploded"):
        frametrace.optimize(h, backend=broken)(torch.ones(3))


def test_suppress_errors_runs_the_frame_in_cpython_with_one_log_line(monkeypatch, caplog):
    monkeypatch.setattr(frametrace.config, "suppress_errors", True)

    def h(x):
        return x.cos() + 1
    with caplog.at_level(logging.WARNING, logger="frametrace"):
        r = check(h, [torch.ones(3)], graphs=0, compiled=lambda c: frametrace.optimize(h, backend=broken))
    assert r.fallbacks == 1, r
    lines = [rec for rec in caplog.records if "backend 'broken'" in rec.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None


def test_strict_triton_errors_are_backend_errors(triton_interpreter, monkeypatch):
    """FRAMETRACE_TRITON_STRICT=1 makes the triton backend raise where it would run a
    graph eagerly: that error reaches the user as a BackendCompilerFailed (and with
    suppress_errors the frame runs in CPython)."""
    pytest.importorskip("triton")
    from frametrace.backends.triton import backend as tb

    def fail(*args, **kwargs):
        raise RuntimeError("lowering failed")
    monkeypatch.setattr(tb, "compile_forward", fail)

    def h(x):
        return x.exp() + 1
    with pytest.raises(frametrace.BackendCompilerFailed, match="'triton'.*lowering failed"):
        frametrace.optimize(h, backend="triton")(torch.ones(8))
    monkeypatch.setattr(frametrace.config, "suppress_errors", True)
    check(h, [torch.ones(8)], graphs=0, compiled=lambda c: frametrace.optimize(h, backend="triton"))


# --------------------------------------------------------------------------- torch's markers
def test_torch_mark_dynamic_makes_the_first_compile_symbolic():
    def h(x):
        return x.sum(0) * x.shape[0]

    def marked(n):
        t = torch.randn(n, 3)
        torch._dynamo.mark_dynamic(t, 0)
        return t
    check(h, [marked(4), marked(5), marked(7)], graphs=1, compiles=1)


def test_torch_mark_static_keeps_a_dimension_static():
    def h(x):
        return x.sum(0) * x.shape[0]

    def marked(n):
        t = torch.randn(n, 3)
        torch._dynamo.mark_static(t, 0)
        return t
    check(h, [marked(4), marked(5), marked(7)], graphs=3, compiles=3, dynamic=True)


def numpy_double(x):
    return x * 2 + 1


torch.compiler.allow_in_graph(numpy_double)


def test_allow_in_graph_makes_one_graph_node():
    def h(x):
        return numpy_double(x.cos()) + 1

    r = check(h, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0)
    gm = r.records[0].graph_module
    assert numpy_double in [n.target for n in gm.graph.nodes], gm.code


SCALE = {"v": 3}


@torch.compiler.assume_constant_result
def scale():
    return SCALE["v"]


def test_assume_constant_result_is_called_once_and_not_guarded():
    def h(x):
        return x * scale()

    r = check(h, [torch.ones(2), torch.ones(2)], graphs=1, compiles=1)
    assert len(r.records[0].guards) > 0 and not any("SCALE" in g for g in r.records[0].guards)
    # As with torch.compile, the user promised the result never changes: a change is
    # not seen by the compiled code (no guard, no recompile).
    g = frametrace.optimize(h)
    g(torch.ones(2))
    SCALE["v"] = 5
    try:
        assert g(torch.ones(2)).tolist() == [3.0, 3.0]
    finally:
        SCALE["v"] = 3


# --------------------------------------------------------------------------- copies
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x).relu()


def test_deepcopy_of_an_optimized_module_is_an_optimized_copy():
    m = Net()
    om = frametrace.optimize(m, backend="aot_eager")
    ema = copy.deepcopy(om)
    assert isinstance(ema, frametrace.OptimizedModule) and ema._orig_mod is not m
    assert ema._settings["backend"] == "aot_eager"
    with torch.no_grad():
        ema.lin.weight.mul_(0.5)           # an EMA update touches the copy only
    assert not torch.equal(ema.lin.weight, m.lin.weight)
    r = check(ema._orig_mod, [torch.randn(2, 3), torch.randn(2, 3)], graphs=None, compiles=1,
              compiled=lambda c: ema)
    assert r.fallbacks == 0, r


def test_torch_save_and_load_of_an_optimized_module():
    om = frametrace.optimize(Net(), backend="eager", dynamic=False)
    buf = io.BytesIO()
    torch.save(om, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert isinstance(loaded, frametrace.OptimizedModule)
    assert loaded._settings["dynamic"] is False
    check(loaded._orig_mod, [torch.randn(2, 3)], graphs=None, compiles=1, compiled=lambda c: loaded)


# --------------------------------------------------------------------------- floats
def test_a_changing_float_argument_becomes_symbolic_on_the_second_compile():
    def h(x, a):
        return x * a + a / 3

    r = check(h, [(torch.ones(3), a) for a in (0.5, 1.25, 2.5, 3.75, 7.0, -1.5)],
              rtol=0, atol=0, compiles=2)
    assert r.fallbacks == 0, r


def test_a_float_deciding_a_branch_or_a_size_is_still_guarded():
    def h(x, a):
        if a > 1.0:
            x = x + 1
        return x.repeat(int(a) + 1) * a

    check(h, [(torch.ones(2), a) for a in (0.5, 1.5, 2.5, 0.25, 2.75, 3.5)], rtol=0, atol=0)


# --------------------------------------------------------------------------- version
def test_version_everywhere():
    pyproject = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == frametrace.__version__
    out = subprocess.run([sys.executable, "-m", "frametrace", "--version"], capture_output=True,
                         text=True, check=True, cwd=pathlib.Path(__file__).parents[1])
    assert out.stdout.strip() == f"frametrace {frametrace.__version__}"
