"""Global-state readers called inside a context the trace enters for real
(`inference_mode`, `DisableTorchFunctionSubclass`, autocast) answer as CPython does
there, and the guard names the state at frame entry, so the compiled entry is reused
and a caller in another state recompiles."""
import torch

import frametrace
from differential import check


def _torch_function_reads(x):
    with torch._C.DisableTorchFunctionSubclass():
        inside = torch._C._is_torch_function_enabled()
        y = x + 1
    return y, inside, torch._C._is_torch_function_enabled()


def test_torch_function_state_inside_disable_subclass():
    r = check(_torch_function_reads, [torch.randn(3), torch.randn(3), torch.randn(3)],
              fullgraph=True)
    assert r.graphs == 1 and r.compiles == 1


def _inference_reads(x):
    with torch.inference_mode():
        inside = torch.is_inference_mode_enabled()
        y = x * 2
    return y.clone(), inside, torch.is_inference_mode_enabled()


def test_inference_mode_read_inside_reuses_the_entry():
    # It used to guard `is_inference_mode_enabled() is True` at frame entry: a
    # recompile on every call until the cache limit.
    r = check(_inference_reads, [torch.randn(3) for _ in range(4)])
    assert r.graphs == 1 and r.compiles == 1


def test_entry_state_change_recompiles_with_the_right_answer():
    seen = []

    def f(x):
        with torch._C.DisableTorchFunctionSubclass():
            a = torch._C._is_torch_function_all_disabled()
        return x + 1, a

    cc = frametrace.testing.CompileCounter()
    g = frametrace.optimize(cc)(f)
    for outer in (False, True, False, True):
        x = torch.randn(2)
        if outer:
            with torch._C.DisableTorchFunction():
                seen.append((g(x)[1], f(x)[1]))
        else:
            seen.append((g(x)[1], f(x)[1]))
    assert all(a == b for a, b in seen), seen
    assert [a for a, _ in seen] == [False, True, False, True]
    assert cc.frame_count == 2


def _autocast_reads(a, b):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        c = torch.mm(a, b)
        if torch.is_autocast_cpu_enabled():
            c = c + 1
        dtype = torch.get_autocast_cpu_dtype()
    return c, dtype, torch.is_autocast_cpu_enabled()


def test_autocast_readers_inside_autocast():
    r = check(_autocast_reads, [(torch.rand(4, 4), torch.rand(4, 4)) for _ in range(3)],
              fullgraph=True, rtol=1e-2, atol=1e-2)
    assert r.graphs == 1 and r.compiles == 1


# -- torch state read with no argument, or set, in the frame --
def test_torch_flag_read_with_no_argument_is_guarded():
    # torch.autograd._profiler_enabled() was folded to its value at trace time, unguarded.
    def f(x):
        if torch.autograd._profiler_enabled():
            return x + 1
        return x - 1

    opt = frametrace.optimize("eager")(f)
    x = torch.zeros(2)
    assert torch.equal(opt(x), f(x))
    with torch.autograd.profiler.profile():
        assert torch.equal(opt(x), f(x))
    check(f, [torch.zeros(2), torch.ones(2)], graphs=1, breaks=0)


def test_torch_state_setter_runs_at_every_call():
    # Run at trace time only, torch.set_num_threads changed the state once.
    def f(x, n):
        torch.set_num_threads(n)
        return x * 2

    before = torch.get_num_threads()
    try:
        opt = frametrace.optimize("eager")(f)
        opt(torch.ones(2), 1)
        torch.set_num_threads(2)
        opt(torch.ones(2), 1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
