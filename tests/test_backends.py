"""Backends: eager, aot_eager (forward and backward), torch.compile-style callables, the
registry."""
import pytest
import torch

import frametrace
from differential import check



def f(x, w, b):
    return torch.tanh(x @ w + b).pow(2).sum(dim=1)


def test_list_backends():
    assert {"eager", "aot_eager", "inductor"} <= set(frametrace.list_backends())


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown frametrace backend 'nope'"):
        frametrace.optimize("nope")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_named_backends_match_eager(backend):
    cnt = frametrace.testing.CompileCounter(inner=backend)
    g = frametrace.optimize(backend=cnt, fullgraph=True)(f)
    x, w, b = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(g(x, w, b), f(x, w, b))
    torch.testing.assert_close(g(x, w, b), f(x, w, b))
    assert cnt.frame_count == 1 and cnt.op_count == 5


def test_aot_eager_gradients_match_eager():
    cnt = frametrace.testing.CompileCounter(inner="aot_eager")
    g = frametrace.optimize(backend=cnt, fullgraph=True)(f)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    g(x, w, b).sum().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    f(x, w, b).sum().backward()
    for got, t in zip(grads, (x, w, b)):
        torch.testing.assert_close(got, t.grad)
    assert cnt.frame_count == 1


def test_aot_eager_splits_forward_and_backward():
    seen = {}

    @frametrace.register_backend("spy_aot")
    def spy(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified
        from functorch.compile import make_boxed_func

        def fw(g, ins):
            seen["fw"] = g
            return make_boxed_func(g.forward)

        def bw(g, ins):
            seen["bw"] = g
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw, bw_compiler=bw)

    g = frametrace.optimize("spy_aot")(f)
    x, w, b = (torch.randn(2, 3, requires_grad=True), torch.randn(3, 5, requires_grad=True),
               torch.randn(5, requires_grad=True))
    g(x, w, b).sum().backward()
    assert "fw" in seen and "bw" in seen
    targets = {str(n.target) for n in seen["fw"].graph.nodes if n.op == "call_function"}
    assert any("aten.mm" in t or "aten.addmm" in t for t in targets)


def test_torch_compile_style_callable_backend():
    calls = []

    def my_backend(gm, example_inputs):
        calls.append((gm, [tuple(t.shape) for t in example_inputs]))
        return gm.forward

    g = frametrace.optimize(backend=my_backend)(f)
    x, w, b = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(g(x, w, b), f(x, w, b))
    torch.testing.assert_close(g(x, w, b), f(x, w, b))
    assert len(calls) == 1
    assert calls[0][1] == [(4, 3), (3, 5), (5,)]
    assert isinstance(calls[0][0], torch.fx.GraphModule)


def test_registered_backend_by_name_and_positional():
    calls = []

    @frametrace.register_backend("counting_eager")
    def counting(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    assert "counting_eager" in frametrace.list_backends()
    g = frametrace.optimize("counting_eager")(f)
    h = frametrace.optimize(counting)(lambda x: x * 3)   # a registered callable, positional
    x, w, b = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(g(x, w, b), f(x, w, b))
    torch.testing.assert_close(h(x), x * 3)
    assert len(calls) == 2


def test_decorator_forms(cnt):
    @frametrace.optimize
    def a(x):
        return x + 1

    @frametrace.optimize("eager", fullgraph=True)
    def b(x):
        return x + 2

    def c(x):
        return x + 3
    c2 = frametrace.optimize(backend=cnt)(c)
    x = torch.zeros(2)
    assert torch.equal(a(x), x + 1) and torch.equal(b(x), x + 2) and torch.equal(c2(x), x + 3)
    assert a.__name__ == "a" and a.__wrapped__.__name__ == "a"
    assert cnt.frame_count == 1
    assert len(frametrace._C.entries(a.__wrapped__.__code__)) == 1
    assert len(frametrace._C.entries(b.__wrapped__.__code__)) == 1


def test_backend_failure_is_reported(monkeypatch):
    def broken(gm, example_inputs):
        raise RuntimeError("backend exploded")

    g = frametrace.optimize(backend=broken)(f)
    x, w, b = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    # The user's backend failing is the user's error, as with torch.compile.
    with pytest.raises(frametrace.BackendCompilerFailed, match="backend exploded") as info:
        g(x, w, b)
    assert isinstance(info.value.__cause__, RuntimeError)
    # With suppress_errors: the frame runs in CPython, right values.
    monkeypatch.setattr(frametrace.config, "suppress_errors", True)
    torch.testing.assert_close(g(x, w, b), f(x, w, b))


def test_each_optimize_call_compiles_with_its_own_backend():
    def g(x):
        return x * 2 + 1
    first = frametrace.testing.CompileCounter()
    second = frametrace.testing.CompileCounter(inner="aot_eager")
    a = frametrace.optimize(backend=first, fullgraph=True)(g)
    b = frametrace.optimize(backend=second, fullgraph=True)(g)
    x = torch.randn(3)
    torch.testing.assert_close(a(x), g(x))
    torch.testing.assert_close(b(x), g(x))     # not the entry `a` compiled
    torch.testing.assert_close(a(x), g(x))
    assert first.frame_count == 1 and second.frame_count == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_autocast_region(backend):
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        return y, y.float() + 1
    cnt = frametrace.testing.CompileCounter(inner=backend)
    g = frametrace.optimize(backend=cnt, fullgraph=True)(f)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    got, expected = g(x, w), f(x, w)
    assert got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)
    assert cnt.frame_count == 1 and cnt.op_count == 5   # enter, matmul, exit, float, add


# -- aot_eager_decomp_partition --
def test_aot_eager_decomp_partition_backend_matches_eager():
    # PyTorch's own tests name this backend; it was a ValueError here.
    def f(x, w):
        y = torch.nn.functional.batch_norm(x, None, None, training=True)
        return (y @ w).relu().sum()

    check(f, [(torch.randn(4, 3), torch.randn(3, 2, requires_grad=True))],
          backend="aot_eager_decomp_partition", graphs=1)
    w = torch.randn(3, 2, requires_grad=True)
    x = torch.randn(4, 3)
    frametrace.optimize("aot_eager_decomp_partition")(f)(x, w).backward()
    expected = torch.autograd.grad(f(x, w), w)[0]
    assert torch.allclose(w.grad, expected, atol=1e-5)
