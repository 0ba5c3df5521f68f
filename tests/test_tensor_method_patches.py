"""A tensor method (or operator dunder) replaced between calls, or swapped for another of
torch's, is seen by the compiled code on the eager and aot_eager backends."""
import pytest
import torch

from differential import Then, check

BACKENDS = ["eager", "aot_eager"]


class _Patch:
    """Replaces a class attribute when `on()` runs, puts it back at `off()` (and at
    the end of the test, whatever happened)."""

    def __init__(self, owner, name, value):
        self.owner, self.name, self.value = owner, name, value
        self.original = owner.__dict__[name] if name in owner.__dict__ else None

    def on(self):
        setattr(self.owner, self.name, self.value)

    def off(self):
        if self.original is None:
            if self.name in self.owner.__dict__:
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)


@pytest.fixture
def patches():
    made = []
    yield lambda *a: made.append(_Patch(*a)) or made[-1]
    for p in reversed(made):
        p.off()


def _five_like(self, *args):
    return torch.full_like(self, 5.0)


def method_call(x):
    return x.sigmoid() + 1


def bound_method_read(x):
    m = x.sigmoid
    return m() * 2


def binary_operator(x, y):
    return (x + y) * 3


def reflected_operator(x):
    return 2 - x


def parameter_method(p):
    return p.sigmoid() - 1


def unary_operator(x):
    return -x * 2


def indexing(x):
    return x[1:] * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,name,arity", [
    (method_call, "sigmoid", 1), (bound_method_read, "sigmoid", 1),
    (binary_operator, "__add__", 2), (reflected_operator, "__rsub__", 1),
    (parameter_method, "sigmoid", 1), (unary_operator, "__neg__", 1), (indexing, "__getitem__", 1)])
def test_a_tensor_method_replaced_between_calls(backend, fn, name, arity, patches):
    patch = patches(torch.Tensor, name, _five_like)

    def args():
        if fn is parameter_method:
            return (torch.nn.Parameter(torch.randn(3)),)
        return tuple(torch.randn(3) for _ in range(arity))
    r = check(fn, [args(), Then(patch.on, *args()), args(), Then(patch.off, *args()), args()],
              backend=backend)
    # traced for torch's method, again once it was replaced (the replacement is the
    # user's code: CPython runs it, and compiles it as a frame of its own), and the
    # first entry serves once it is back
    mine = [rec for rec in r.records if rec.code is fn.__code__]
    assert [rec.outcome for rec in mine][0] == "compiled" and len(mine) == 2, r
    assert mine[1].outcome in ("break", "fallback"), r
    assert r.graphs >= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_method_swapped_for_another_of_torchs(backend, patches):
    # Still a C method of TensorBase, so traced as a tensor method: by identity.
    patch = patches(torch.Tensor, "sigmoid", torch.Tensor.tanh)
    r = check(method_call, [torch.randn(3), Then(patch.on, torch.randn(3)), torch.randn(3),
                            Then(patch.off, torch.randn(3)), torch.randn(3)], backend=backend)
    assert r.compiles == 2 and r.graphs == 2 and r.breaks == 0, r
