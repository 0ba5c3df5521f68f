"""`config.symbolic_views` attacked further (see test_triton_symbolic_views.py, whose
`run` and `both` these reuse): each program runs against eager over several sizes with
fresh inputs, with the switch on and off.  Regressions found while attacking the path
come first, then the strongest of the attack programs that passed, kept as guards."""
import copy

import pytest
import torch
import torch.nn.functional as F

import frametrace
from frametrace.testing import CompileCounter

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402

from test_triton_symbolic_views import both, run  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _frames(fn, make, sizes=(6, 17, 33, 40)):
    """How many graphs `fn` compiles over `sizes` (values checked against eager): 2 when
    the second size's graph, with symbolic sizes, serves every size after it."""
    frametrace.reset()
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter)(fn)
    for n in sizes:
        args = make(n)
        want, got = fn(*copy.deepcopy(args)), compiled(*copy.deepcopy(args))
        for a, b in zip(want, got):
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
            torch.testing.assert_close(b, a)
    return counter.frame_count


def test_select_at_a_positive_index_of_a_symbolic_dim(monkeypatch):
    """x.select(0, 2) with a symbolic first dim: the lowering took `2 % s0` (a sympy Mod,
    no number) for the index, raised TypeError, and the frame fell back to static sizes,
    a compile per size.  A non-negative index is the index."""
    def f(x):
        return x.select(0, 2) * 1, x.t()[3] + x[:, 1], x[2] @ x.t()
    assert _frames(f, lambda n: (torch.randn(n, 4),)) == 2
    both(f, lambda n: (torch.randn(n, 4),), monkeypatch)


def test_views_of_a_dtype_view_of_an_input_returned():
    """Views of `x.view(torch.int32)` (an extern) returned: each aliases the input, and
    AOTAutograd, with symbolic sizes, regenerated it from the output's `_base` and
    `_view_func`, replayed in the input's dtype: float32 came back where eager has int32
    (the switch on made the flatten a view of the extern's result, and the output kept
    that view's record).  A slice then flatten, and a dtype view of a view of the input,
    came back with the values of another layout with the switch on or off."""
    def f(x):
        return x.view(torch.int32).flatten(1), x.view(torch.int32)[:, 1:].flatten(1), \
            x[:, 1:].flatten(1).view(torch.int32), x.view(torch.int32).transpose(0, 2)
    run(f, lambda n: (torch.randn(n, 3, 4),))
    compiled = frametrace.optimize(backend="triton")(f)
    for n in (9, 21):
        x = torch.randn(n, 3, 4)
        outs = compiled(x)
        x.mul_(-2)   # (a write to the input shows through each output, as in eager)
        for a, b in zip(outs, f(x)):
            assert a.dtype == b.dtype and a.stride() == b.stride()
            torch.testing.assert_close(a, b)
