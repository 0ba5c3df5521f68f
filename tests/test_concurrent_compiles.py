"""Compiles that run concurrently, on the eager and aot_eager backends: eight threads
compiling at once, a backend that calls compiled code in its own thread, a compile that
waits on a thread that compiles."""
import threading
import time

import pytest
import torch

import frametrace

BACKENDS = ["eager", "aot_eager"]


def _closures(n):
    # Distinct code objects: eight frames compiling at the same time, none sharing a
    # cache (one code would hit the cache limit, which is not what is tested here).
    fns = []
    for i in range(n):
        ns = {}
        exec(f"def f{i}(x):\n    return (x * {i}).sin() + x.cos() * 2 - {i}\n", {"torch": torch}, ns)
        fns.append(ns[f"f{i}"])
    return fns


@pytest.mark.parametrize("backend", BACKENDS)
def test_eight_threads_compiling_at_once(backend):
    fns = _closures(8)
    counter = frametrace.testing.CompileCounter(inner=backend)
    compiled = [frametrace.optimize(f, backend=counter) for f in fns]
    shared = frametrace.optimize(_closures(1)[0], backend=counter)
    barrier = threading.Barrier(8)
    errors = []

    def run(i):
        try:
            barrier.wait(timeout=60)
            for n in range(2):
                x = torch.randn(4, requires_grad=bool(n))
                got = compiled[i](x)
                want = fns[i](x)
                assert torch.allclose(got, want), (i, n)
                if n:
                    got.sum().backward()
                    g = x.grad.clone()
                    x.grad = None
                    fns[i](x).sum().backward()
                    assert torch.allclose(g, x.grad), (i, "grad")
                # every thread also calls one function that all of them compile
                assert torch.allclose(shared(x.detach()), x.detach().cos() * 2)
        except BaseException as e:           # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(8)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, 240 - (time.monotonic() - start)))
    assert not any(t.is_alive() for t in threads), "compiles deadlocked"
    assert not errors, errors[0]
    # each function compiled once per grad mode, the shared one at most twice (one
    # thread compiled it; a thread that waited meanwhile ran that call in CPython)
    assert 16 <= counter.frame_count <= 18, counter.frame_count


# -- a backend, or a compile, waiting on compiled code in another thread --
def _run_bounded(target, seconds):
    errors = []

    def run():
        try:
            target()
        except BaseException as e:          # noqa: BLE001 (reported below)
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "deadlocked"
    assert not errors, errors[0]


def test_a_backend_that_calls_compiled_code_in_its_thread(monkeypatch):
    # No deadlock on the lock this thread holds (it is re-entrant, and the hook runs
    # the callback's own calls unhooked).
    def helper(x):
        return x * 3
    inner = frametrace.optimize(helper)
    seen = []

    def backend(gm, example_inputs):
        seen.append(inner(torch.ones(2)).tolist())
        return gm.forward

    def f(x):
        return x + 1
    compiled = frametrace.optimize(f, backend=backend)
    _run_bounded(lambda: seen.append(compiled(torch.zeros(2)).tolist()), 120)
    assert seen == [[3.0, 3.0], [1.0, 1.0]]


def test_a_compile_that_waits_on_a_thread_that_compiles(monkeypatch):
    # The other thread cannot take the lock while this compile holds it: after
    # config.compile_lock_timeout its call runs in CPython, and both finish.
    monkeypatch.setattr(frametrace.config, "compile_lock_timeout", 1.0)

    def helper(x):
        return x * 3
    inner = frametrace.optimize(helper)
    seen = []

    def backend(gm, example_inputs):
        t = threading.Thread(target=lambda: seen.append(inner(torch.ones(2)).tolist()))
        t.start()
        t.join(60)
        return gm.forward

    def f(x):
        return x + 1
    compiled = frametrace.optimize(f, backend=backend)
    _run_bounded(lambda: seen.append(compiled(torch.zeros(2)).tolist()), 120)
    assert seen == [[3.0, 3.0], [1.0, 1.0]]
    assert not frametrace._C.entries(helper.__code__)      # that call ran in CPython
    assert inner(torch.ones(2)).tolist() == [3.0, 3.0]
    assert frametrace._C.entries(helper.__code__)          # the next one compiled
