"""Programs that are right on the eager backend and went wrong through AOTAutograd
(`aot_eager`): concurrent compiles, a monkeypatched tensor method, a warning's
once-per-location rule.  Each runs on both backends, compiled vs CPython."""
import threading
import time
import warnings

import pytest
import torch

import frametrace
from differential import Then, check

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
