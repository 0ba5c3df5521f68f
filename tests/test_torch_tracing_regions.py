"""Code that torch itself traces (make_fx: torch.func.linearize, AOTAutograd, export)
runs in CPython even when called from a compiled frame after a graph break: it is the
tracer's input.  Compiling frames there handed transformed code to make_fx, which
crashed the process (a segfault in torch.func.linearize) or recorded grad-mode calls
into the traced graph."""
import collections
import subprocess
import sys
import textwrap

import torch

import frametrace
from differential import check

_P = collections.namedtuple("_P", "a b")


def _make_fx_inside(x):
    from torch.fx.experimental.proxy_tensor import make_fx

    def traced(t):
        _P(1, 2)                      # a namedtuple's __new__: a frame of its own
        return t.sin() * 2

    y = x.cos()
    gm = make_fx(traced, pre_dispatch=True)(y)
    assert "_set_grad_enabled" not in gm.code, gm.code
    return gm(y) + 1


def test_make_fx_called_from_a_compiled_frame():
    r = check(_make_fx_inside, [torch.randn(3), torch.randn(5), torch.randn(3)])
    assert r.breaks >= 1 and r.internal_errors == 0


def _linearize(x):
    y = x.cos()
    out, jvp_fn = torch.func.linearize(torch.sin, y)
    return out + 1, jvp_fn(y)


def test_linearize_in_a_compiled_frame_does_not_crash():
    # In a child process: the failure was a segfault.
    code = textwrap.dedent("""
        import torch, frametrace
        def f(x):
            out, jvp_fn = torch.func.linearize(torch.sin, x)
            return out, jvp_fn(x)
        x = torch.randn(3, 3)
        got = frametrace.optimize("eager")(f)(x)
        want = f(x)
        assert all(torch.allclose(a, b) for a, b in zip(got, want))
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-2000:]


def test_linearize_values_match():
    check(_linearize, [torch.randn(3), torch.randn(4), torch.randn(3)])


def test_frames_under_an_eager_functorch_transform_run_like_cpython():
    # Their tensors are the transform's wrappers, which FakeTensors cannot stand for:
    # the frame is the transform's to run (a compiled call outside it still compiles).
    def inner(x):
        return (x.sin() * x).sum()

    cc = frametrace.testing.CompileCounter()
    g = frametrace.optimize(cc)(inner)
    x = torch.randn(4)
    assert torch.allclose(torch.func.grad(g)(x), torch.func.grad(inner)(x))
    assert torch.allclose(torch.vmap(g)(x.view(2, 2)), torch.vmap(inner)(x.view(2, 2)))
    assert cc.frame_count == 0
    assert torch.allclose(g(x), inner(x)) and cc.frame_count == 1


def test_gc_callbacks_are_not_compiled(young_heap):
    import gc
    seen = []

    def on_gc(phase, info):
        seen.append(torch.ones(1) * len(seen))

    def f(x):
        y = x + 1
        gc.collect()                # a break: CPython runs it, and the callback
        return y * 2

    gc.callbacks.append(on_gc)
    try:
        r = check(f, [torch.randn(2), torch.randn(2)])
    finally:
        gc.callbacks.remove(on_gc)
    assert seen and not any(rec.code is on_gc.__code__ for rec in r.records)
    assert r.breaks >= 1
