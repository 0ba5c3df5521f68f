import atexit
import contextlib
import gc
import io
import os
import re
import shutil
import tempfile

import pytest
import torch

import frametrace

# The on-disk cache (warm starts) in a folder of this session's own, never the user's:
# no entry of another run can serve a test.  (Entries a process wrote are never read
# back by it, so tests of one session do not see each other's either.)
# FRAMETRACE_TEST_CACHE_DIR names a folder kept across sessions instead: a second run of
# the same tests is then served from the first's entries, an attack on the cache (every
# test must still pass warm).
_CACHE_DIR = os.environ.get("FRAMETRACE_TEST_CACHE_DIR") or tempfile.mkdtemp(prefix="frametrace-test-cache-")
os.environ["FRAMETRACE_CACHE_DIR"] = _CACHE_DIR
if not os.environ.get("FRAMETRACE_TEST_CACHE_DIR"):
    atexit.register(shutil.rmtree, _CACHE_DIR, True)


@pytest.fixture(autouse=True)
def _fresh_frametrace():
    frametrace.reset()
    limit = frametrace.config.cache_size_limit
    torch.manual_seed(0)
    grad = torch.is_grad_enabled()
    yield
    frametrace.config.cache_size_limit = limit
    frametrace.reset()
    # A compiled frame must leave grad mode as CPython would; a test that changes it
    # would also change what every later test traces.
    leaked = torch.is_grad_enabled() != grad
    torch.set_grad_enabled(grad)
    assert not leaked, "grad mode changed by the test"
    # Saved-tensor hooks left installed (a checkpoint whose generator a kept exception
    # holds open) refuse torch.func transforms and change what graphs may rerun in every
    # later test.
    if torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
        gc.collect()
        hooks = 0
        while torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            hooks += 1
        assert not hooks, f"the test left {hooks} saved-tensor hooks installed"


@pytest.fixture
def young_heap():
    """gc.collect() in the test walks only what the test made: everything alive before
    it is frozen (gc.freeze) until it ends.  By late in the suite the heap holds over a
    million objects and a full collection takes seconds; the cycles a test makes and
    the weakref callbacks they run are collected as before."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture
def triton_interpreter(monkeypatch):
    """The triton backend's kernels run in Triton's interpreter on CPU tensors, and an
    internal error raises instead of quietly running the graph eagerly."""
    from frametrace.backends.triton import backend
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")
    backend.COMPILED.clear()


def short_loops(monkeypatch, rblock=16):
    """The triton backend loops over rows longer than `rblock`, in blocks of `rblock`, so
    that short rows in a test take the looped path through several blocks.  (The looped
    default RBLOCK, 2048, would take a test's row in one masked step, and Triton's
    interpreter would combine 2048 lanes one Python call each: seconds a kernel.)"""
    from frametrace.backends.triton import autotune, config
    monkeypatch.setattr(config, "persistent_rblock_max", rblock)
    heuristic = autotune.candidates
    monkeypatch.setattr(autotune, "candidates", lambda *a, **kw: [
        autotune.Config(c.xblock, min(c.rblock, rblock), c.num_warps) for c in heuristic(*a, **kw)])


@pytest.fixture(params=["aot_eager", "triton"])
def training_backend(request):
    """A training test's backend name; for triton, kernels run in Triton's interpreter and
    a graph that runs eagerly as a whole (not through kernels) fails the test."""
    if request.param == "triton":
        pytest.importorskip("triton")
        request.getfixturevalue("triton_interpreter")
        from frametrace.backends.triton import backend as tb
        before = tb.STATS["eager_graphs"]
        yield "triton"
        assert tb.STATS["eager_graphs"] == before, "a graph ran eagerly instead of as kernels"
        assert tb.COMPILED, "no graph went through the triton backend"
    else:
        yield request.param


@pytest.fixture
def cnt():
    return frametrace.testing.CompileCounter()


def compile_with(cnt, fn, **kwargs):
    return frametrace.optimize(backend=cnt, **kwargs)(fn)


# -- helpers shared by the test files (import them from conftest) --
def compile_counted(fn, **kwargs):
    """fn optimized with a fresh CompileCounter backend; returns (compiled, counter)."""
    cnt = frametrace.testing.CompileCounter()
    return frametrace.optimize(backend=cnt, **kwargs)(fn), cnt


def counted(fn, backend="eager"):
    """fn optimized with a CompileCounter around `backend`; returns (compiled, counter)."""
    cnt = frametrace.testing.CompileCounter(inner=backend)
    return frametrace.optimize(backend=cnt)(fn), cnt


def code_of(fn):
    return getattr(fn, "__code__", fn)


def entries(fn):
    """Cache entries of a function's code (or of a code object)."""
    return frametrace._C.entries(code_of(fn))


def compiled_entries(fn):
    """Entries of fn's code that run transformed code (not the original in CPython)."""
    return [e for e in entries(fn) if e.code is not None]


def fallback_entries(fn):
    return [e for e in entries(fn) if e.code is None]


def resume_codes(fn):
    """The resume functions reachable from fn's compiled entries (recursively)."""
    return frametrace.testing.resume_codes(code_of(fn))


def quiet():
    return contextlib.redirect_stdout(io.StringIO())


@pytest.fixture
def capture_shapes():
    """config.capture_dynamic_output_shape_ops on for the test (data-dependent output
    sizes as unbacked symbols), restored after it."""
    cfg = frametrace.config
    saved = cfg.capture_scalar_outputs, cfg.capture_dynamic_output_shape_ops
    cfg.capture_dynamic_output_shape_ops = True
    yield
    cfg.capture_scalar_outputs, cfg.capture_dynamic_output_shape_ops = saved


# Numbers read from data: a value CPython computes that the trace never sees, and the
# check that no guard names an unbacked symbol (u0, zuf0, zub0).
@frametrace.disable
def opaque(v):
    return v


_UNBACKED = re.compile(r"\b(u|zuf|zub)\d+\b")


def no_unbacked_guards(r):
    texts = [g for rec in r.records for g in rec.guards]
    assert not [g for g in texts if _UNBACKED.search(g)], texts
