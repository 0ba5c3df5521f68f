"""Identity of tensor results (ops returning self, a returned input, requires_grad set on
an intermediate, a leaf made in the graph) and in-place changes (metadata of an input,
views of intermediates, in-place operators on expanded tensors): each test runs a program
in CPython and compiled (tests/differential.py) and checks what was compiled."""
import operator

import pytest
import torch

import frametrace
from differential import check

# -- identity of tensor results --
def test_ops_returning_self_give_the_same_tensor():
    def f(x):
        y = x * 2
        return x.add_(1) is x, x.float() is x, x.contiguous() is x, x.to(x.dtype) is x, \
            x.type_as(x) is x, x.detach() is x, x[...] is x, x.double() is x, \
            y.mul_(2) is y, y.t() is y, y.requires_grad_(False) is y, y
    check(f, [torch.ones(2, 3), torch.randn(2, 3)], graphs=1, breaks=0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_requires_grad_set_on_intermediate_is_kept(backend):
    def f(x):
        y = x * 2
        return y.requires_grad_() is y, y, y * 3
    check(f, [torch.ones(2)], backend=backend, breaks=1)


def test_returned_self_is_the_callers_tensor():
    def f(x):
        return x.add_(1), x.float()
    for backend in ("eager", "aot_eager"):
        g = frametrace.optimize(backend)(f)
        x = torch.ones(3)
        a, b = g(x)
        assert a is x and b is x and torch.equal(x, torch.full((3,), 2.0))


# -- in-place metadata changes --
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_inplace_metadata_change_of_input_reaches_the_caller(backend):
    def resize(x):
        y = x * 2
        x.resize_(2, 2)
        return y, x.shape

    def needs_grad(x):
        x.requires_grad_()
        return x * 2

    def view_ops(x):
        x.t_()
        a = x.shape
        x.unsqueeze_(0)
        b = x.shape
        x.squeeze_()
        x.transpose_(0, 1)
        return x + 1, a, b, x.shape
    check(resize, [torch.arange(6.0), torch.arange(6.0) + 1], backend=backend, breaks=1)
    check(needs_grad, [torch.ones(3)], backend=backend, breaks=1)
    def out_resizes(x, y):
        torch.add(x, 1, out=y)
        return y.shape, y * 2
    check(view_ops, [torch.randn(2, 3), torch.randn(4, 5)], backend=backend, dynamic=True)
    check(out_resizes, [(torch.ones(3), torch.empty(0)), (torch.ones(3), torch.empty(0))],
          backend=backend, breaks=1)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_sizes_after_inplace_view_of_intermediate_are_current(backend):
    def f(x):
        y = x * 2
        y.t_()
        a = y.shape
        y.unsqueeze_(0)
        return y + 1, a, y.shape, y.size(1)
    check(f, [torch.randn(2, 3), torch.randn(4, 5), torch.randn(3, 7)], backend=backend,
          dynamic=True, graphs=1, breaks=0)


def test_operators_starting_with_i_that_do_not_write_stay_in_the_graph():
    # `~mask` of an expanded mask is operator.invert: not an in-place write (only iadd,
    # isub, ... are), so it is no reason to break on memory that elements share
    def f(x):
        mask = (x > 0)[:, None].expand(-1, 3)
        return (~mask).sum(), operator.index(2) * x, operator.is_(x, x)
    check(f, [(torch.randn(4),), (torch.randn(4),)], graphs=1, breaks=0)


def test_inplace_operator_on_an_expanded_tensor_still_breaks():
    def f(x, y):
        e = x[:, None].expand(-1, 3)
        e += y     # eager raises: elements of e share memory
        return e
    check(f, [(torch.randn(4), torch.randn(4, 3))])


def test_factory_with_requires_grad_in_the_graph_makes_a_real_leaf():
    # AOTAutograd returned the new leaf detached (requires_grad=False): backward failed.
    def f(x):
        leaf = torch.ones(2, requires_grad=True)
        return leaf, leaf * x

    r = check(f, [torch.arange(2.0), torch.arange(2.0) + 1], backend="aot_eager")
    assert r.breaks >= 1
    leaf, out = frametrace.optimize("aot_eager")(f)(torch.arange(2.0))
    out.sum().backward()
    assert torch.equal(leaf.grad, torch.arange(2.0))
