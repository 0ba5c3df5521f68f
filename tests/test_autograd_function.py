"""torch.autograd.Function subclasses called in a traced frame: forward and backward are
traced into subgraphs and the graph applies them as one autograd node, so the gradient
is the user's backward even where it is not the derivative of forward.  What cannot be
expressed (side effects, a backward the tracer cannot follow) is a graph break that
still gives CPython's answer and gradients."""
import pytest
import torch
from torch.autograd.function import once_differentiable

import frametrace
from differential import check, check_grads

BACKENDS = ["eager", "aot_eager"]


def rand(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


class StraightThrough(torch.autograd.Function):
    """sign() forward, identity backward: not the derivative of forward (which is 0)."""
    @staticmethod
    def forward(ctx, x):
        return torch.sign(x)

    @staticmethod
    def backward(ctx, g):
        return g


class ClippedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bound):
        ctx.save_for_backward(x)
        ctx.bound = bound
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (2 * x * g).clamp(-ctx.bound, ctx.bound), None


@pytest.mark.parametrize("backend", BACKENDS)
def test_straight_through_estimator_uses_the_custom_backward(backend):
    def f(x):
        return StraightThrough.apply(x * 3) + x
    check_grads(f, [rand(5), rand(5), rand(7)], backend=backend, fullgraph=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clipped_gradient_with_saved_tensor_and_ctx_attribute(backend):
    def f(x, b):
        return ClippedGrad.apply(x.sin() * 3, b).sum()
    check_grads(f, [(rand(6), 0.5), (rand(6), 0.25)], backend=backend, fullgraph=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_with_x_grad(backend):
    def f(x, w):
        return ClippedGrad.apply(x @ w, 0.1)
    check_grads(f, [(rand(3, 4), rand(4, 2)), (rand(3, 4), rand(4, 2))], backend=backend,
                fullgraph=True, use_backward=True)


class ScaleBy(torch.autograd.Function):
    """Tensor kept as a ctx attribute, needs_input_grad, two outputs."""
    @staticmethod
    def forward(ctx, x, y):
        ctx.y = y
        ctx.save_for_backward(x)
        return x * y, x + y

    @staticmethod
    def backward(ctx, ga, gb):
        (x,) = ctx.saved_tensors
        gx = ga * ctx.y + gb if ctx.needs_input_grad[0] else None
        gy = ga * x * 10 + gb if ctx.needs_input_grad[1] else None
        return gx, gy


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_outputs_needs_input_grad_and_a_tensor_on_ctx(backend):
    def f(x, y):
        a, b = ScaleBy.apply(x, y)
        return a * b
    check_grads(f, [(rand(4), rand(4, grad=False)), (rand(4), rand(4))], backend=backend,
                fullgraph=True)


class ArgMaxWithValue(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        idx = x.argmax(dim=-1, keepdim=True)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        return x.gather(-1, idx), idx

    @staticmethod
    def backward(ctx, g, _):
        (idx,) = ctx.saved_tensors
        return torch.zeros(ctx.shape).scatter(-1, idx, g * 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_non_differentiable(backend):
    def f(x):
        v, i = ArgMaxWithValue.apply(x)
        return v * 2, i
    check_grads(f, [rand(3, 4), rand(3, 4)], backend=backend, fullgraph=True)


def doubled(t):
    return t * 2


class CallsHelpers(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return doubled(x).cos()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return doubled(g) * x.sign()


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_calls_user_functions_and_once_differentiable_backward(backend):
    def f(x):
        return CallsHelpers.apply(x + 1)
    check_grads(f, [rand(5), rand(5)], backend=backend, fullgraph=True)


class Gate(torch.nn.Module):
    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w.t() * 0.5, x.t() @ g

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return self._Fn.apply(x, self.w).relu()


@pytest.mark.parametrize("backend", BACKENDS)
def test_function_inside_a_module_forward_with_parameter_gradients(backend):
    def f(m, x):
        return m(x)
    m = Gate()
    check_grads(f, [(m, rand(2, 4)), (m, rand(5, 4))], backend=backend, fullgraph=True,
                use_backward=True)


OFFSET = torch.randn(5)


class UsesGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x + OFFSET

    @staticmethod
    def backward(ctx, g):
        return g * OFFSET


def test_forward_and_backward_read_a_global_tensor():
    def f(x):
        return UsesGlobal.apply(x)
    check_grads(f, [rand(5), rand(5)], fullgraph=True)


class SetupContextStyle(torch.autograd.Function):
    @staticmethod
    def forward(x, k):
        return x.exp() * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * out * 0.5, None


def test_setup_context_style_function():
    def f(x):
        return SetupContextStyle.apply(x, 3)
    check_grads(f, [rand(4), rand(4)], fullgraph=True)


LOG = []


class LogsInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        LOG.append(x.shape[0])
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3


def test_side_effect_in_forward_breaks_and_keeps_the_custom_gradient():
    def f(x):
        return LogsInForward.apply(x.sin()) + 1
    r = check_grads(f, [rand(4), rand(6)], globals=("LOG",))
    assert r.breaks >= 1 and any("side effect" in s for s in r.reasons())


class PrintsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        LOG.append("backward")
        return g * 7


def test_backward_with_a_side_effect_still_gives_the_custom_gradient():
    def f(x):
        return PrintsInBackward.apply(x) * x
    r = check_grads(f, [rand(4), rand(4)], globals=("LOG",))
    assert any("PrintsInBackward.backward" in s for s in r.reasons())


class NoGradInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        return g * 4


def test_input_without_requires_grad_returns_plain_tensor():
    def f(x):
        return NoGradInput.apply(x) + 1
    check(f, [rand(3, grad=False), rand(3, grad=False)], fullgraph=True)


def test_function_under_no_grad():
    def f(x):
        with torch.no_grad():
            y = StraightThrough.apply(x)
        return y + x
    check_grads(f, [rand(3), rand(3)], fullgraph=True)


class ReadsParameter(torch.autograd.Function):
    """forward reads a module's parameter it was not given: eager runs forward without
    recording, so the parameter gets no gradient and the output needs none of its own."""
    @staticmethod
    def forward(ctx, x, m):
        return x * m.weight.sum()

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_read_inside_forward_gets_no_gradient(backend):
    lin = torch.nn.Linear(3, 3)

    def f(x):
        return ReadsParameter.apply(x, lin) + 1
    check(f, [rand(3, grad=False), rand(3, grad=False)], backend=backend, fullgraph=True)
    check_grads(f, [rand(3), rand(3)], backend=backend, fullgraph=True)


def test_setup_context_style_function_is_one_graph():
    def f(x):
        return SetupContextStyle.apply(x.cos(), 3) * 2
    check_grads(f, [rand(4), rand(4)], fullgraph=True)


def test_once_differentiable_backward_refuses_double_backward_as_in_cpython():
    def f(x):
        return CallsHelpers.apply(x) * x

    def run(fn):
        def go(x):
            y = fn(x).sum()
            (g,) = torch.autograd.grad(y, x, create_graph=True)
            return torch.autograd.grad(g.sum(), x)
        return go
    check(run(f), [rand(3)], compiled=lambda c: run(frametrace.optimize(backend=c, fullgraph=True)(f)))


class Doubler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x        # not 2x: the custom gradient, differentiable again


@pytest.mark.parametrize("backend", ["eager"])     # (AOTAutograd has no double backward)
def test_double_backward_through_a_custom_backward(backend):
    def f(x):
        return Doubler.apply(x)

    def run(fn):
        def go(x):
            (g,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
            return g.detach(), torch.autograd.grad(g.sum(), x)
        return go
    check(run(f), [rand(3), rand(3)], backend=backend,
          compiled=lambda c: run(frametrace.optimize(backend=c, fullgraph=True)(f)))


def test_function_output_used_in_python_control_flow_guards_shape():
    def f(x):
        y = StraightThrough.apply(x)
        if y.shape[0] > 3:
            return y * 2
        return y - 1
    check_grads(f, [rand(2), rand(5), rand(6)], fullgraph=True)


class Swappable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g


def test_replacing_backward_between_calls_is_seen():
    def f(x):
        return Swappable.apply(x)
    fn = frametrace.optimize(fullgraph=True)(f)
    x = rand(3)
    (g1,) = torch.autograd.grad(fn(x).sum(), x)
    old = Swappable.backward
    try:
        Swappable.backward = staticmethod(lambda ctx, g: g * 5)
        (g2,) = torch.autograd.grad(fn(x).sum(), x)
    finally:
        Swappable.backward = old
    assert torch.equal(g1, torch.ones(3)) and torch.equal(g2, torch.full((3,), 5.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_function_over_changing_sizes_compiles_once_dynamic(backend):
    def f(x):
        return ClippedGrad.apply(x * 2, 0.3) + StraightThrough.apply(x)
    r = check_grads(f, [rand(3), rand(5), rand(8)], backend=backend, fullgraph=True)
    assert r.graphs == 2


def test_function_inside_torch_func_grad_matches_cpython():
    # torch.func.grad runs a Function only through setup_context; without one it raises.
    def f(x):
        y = x * 2
        a = torch.func.grad(lambda r: SetupContextStyle.apply(r, 2).sum())(y)
        return a

    def g(x):
        return torch.func.grad(lambda r: ClippedGrad.apply(r, 0.5).sum())(x * 2)
    check(f, [rand(3, grad=False), rand(3, grad=False)], graphs=None)
    check(g, [rand(3, grad=False)], graphs=None)


class _SaveTriple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x + x + x
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (y.numel() ** 0.5)


def _instance_apply(x):
    return _SaveTriple().apply(x).sin()


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_of_an_instance_made_in_the_frame(backend):
    # `Fn().apply(x)` (older code) is the class's apply; the instance's __init__ warns
    # that instances are deprecated, at the user's line, as in CPython.
    import warnings
    from frametrace import convert
    errors = convert.counters["cache_describe_error"]
    check_grads(_instance_apply, [(rand(5),) for _ in range(3)], backend=backend, fullgraph=True)
    for fn in (_instance_apply, frametrace.optimize(_instance_apply, backend=backend, fullgraph=True)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fn(rand(5))
        assert [(w.category, w.lineno) for w in seen] == \
            [(DeprecationWarning, _instance_apply.__code__.co_firstlineno + 1)], seen
    # (an AOTAutograd result the on-disk cache cannot describe is left out of the entry:
    # that once failed the whole entry on a lambda reading an unbound exception)
    assert convert.counters["cache_describe_error"] == errors
