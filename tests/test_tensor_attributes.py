"""Attributes tensors carry besides their data: Python attributes (`t.tag = 1`), the
accumulated gradient `.grad`, nn.Parameter, tensor subclasses and the legacy tensor
types.  Differential: the harness compares the tensors' __dict__ and .grad after each
call, on the arguments and on what is returned."""
import pytest
import torch
import torch.nn as nn

from differential import check


def tagged(**attrs):
    t = torch.randn(3)
    for k, v in attrs.items():
        setattr(t, k, v)
    return t


def leaf(grad=True, n=3):
    p = torch.randn(n, requires_grad=True)
    if grad:
        p.grad = torch.randn(n)
    return p


# -- Python attributes --
def test_attribute_set_on_an_input_is_seen_later_and_by_the_caller():
    def f(x):
        x.tag = 2
        return x * x.tag

    check(f, [torch.randn(3), tagged(tag=7)], graphs=1, breaks=0, fullgraph=True)


def test_attribute_set_on_a_computed_tensor_leaves_the_frame_with_it():
    def f(x):
        y = x + 1
        y.tag = "a"
        y.cache = x.sin()
        return y, getattr(y, "tag", None), hasattr(y, "other"), y.cache * 2

    check(f, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0, fullgraph=True)


def test_attributes_of_input_tensors_are_guarded():
    def f(x):
        return x * getattr(x, "scale", 1.5), hasattr(x, "label")

    r = check(f, [tagged(), tagged(scale=2.0), tagged(scale=2.0, label="a"), tagged()],
              breaks=0, fullgraph=True)
    assert r.compiles == 3, r


def test_attribute_read_modify_write_on_an_input():
    def f(x):
        x.count = getattr(x, "count", 0) + 1
        return x * x.count

    check(f, [tagged(), tagged(count=5), tagged(count=6)], breaks=0, fullgraph=True)


def test_attribute_set_on_an_op_result_that_is_its_input():
    def f(x):
        y = x.to(x.dtype)           # returns x itself
        y.tag = 1
        return x.tag + x

    check(f, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0, fullgraph=True)


def test_attribute_deleted_from_an_input():
    def f(x):
        x.tmp = x.cos()
        del x.tmp
        del x.tag
        return x + 1, hasattr(x, "tmp"), hasattr(x, "tag")

    check(f, [tagged(tag=1), tagged(tag="b")], graphs=1, breaks=0, fullgraph=True)


def test_missing_attribute_raises_attribute_error_caught_in_the_frame():
    def f(x):
        try:
            return x.missing
        except AttributeError as e:
            return x + 1, str(e)

    check(f, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0)


def test_attribute_of_a_computed_tensor_survives_a_graph_break():
    def f(x):
        y = x + 1
        y.tag = x.sin()
        print("", end="")
        return y, y.tag + 1

    check(f, [torch.randn(3), torch.randn(3)], graphs=2, breaks=1)


def test_attributes_set_on_tensors_in_a_list_argument():
    def f(xs):
        for i, x in enumerate(xs):
            x.position = i
        return [x * getattr(x, "position") for x in xs]

    check(f, [[torch.randn(2), torch.randn(2)]], graphs=1, breaks=0, fullgraph=True)


# -- .grad --
def test_grad_read_is_guarded_on_none():
    def f(p):
        g = p.grad
        return p.grad is None, (g * 2 if g is not None else p * 3)

    r = check(f, [leaf(True), leaf(False), leaf(True), leaf(False)], breaks=0, fullgraph=True)
    assert r.compiles == 2, r


def test_grad_read_is_guarded_on_metadata():
    def f(p):
        return p.grad * 2

    p = leaf(False)
    p.grad = torch.randn(3).to(torch.float64).float()
    q = leaf(False, n=3)
    q.grad = torch.randn(6)[::2]            # another stride
    check(f, [leaf(), p, q], breaks=0, fullgraph=True)


def test_grad_cleared_and_replaced():
    def f(p, g):
        old = p.grad
        p.grad = None
        first = p.grad is None
        p.grad = g * 2
        p.grad.add_(1)
        return first, old, p.grad.sum()

    check(f, [(leaf(False), torch.randn(3)), (leaf(True), torch.randn(3))], breaks=0, fullgraph=True)


def test_grad_zeroed_in_place():
    def f(p):
        if p.grad is not None:
            p.grad.zero_()
        return p * 2

    check(f, [leaf(), leaf(False), leaf()], breaks=0, fullgraph=True)


def test_grad_of_wrong_size_raises_as_in_cpython():
    def f(p):
        p.grad = torch.zeros(4)
        return p

    check(f, [leaf()], graphs=None, breaks=1)


def test_hand_written_sgd_step_is_one_graph():
    def sgd(p, lr):
        with torch.no_grad():
            p.data.add_(p.grad, alpha=-lr)
        p.grad = None
        return p

    check(sgd, [(leaf(), 0.1), (leaf(), 0.2), (leaf(), 0.3)], breaks=0, fullgraph=True)


def test_sgd_over_module_parameters_is_one_graph():
    def step(model, x, grads):
        for p, g in zip(model.parameters(), grads):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.add_(g)
        loss = model(x).sum()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
            p.grad = None
        return loss

    check(step, [(nn.Linear(3, 2), torch.randn(4, 3), [torch.randn(2, 3), torch.randn(2)])
                 for _ in range(3)], breaks=0, fullgraph=True)


def test_grad_of_a_tensor_made_in_the_frame_is_none():
    def f(x):
        y = x.detach() * 2
        return y.grad is None, y

    check(f, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0, fullgraph=True)


# -- legacy tensor types --
def test_legacy_tensor_types_follow_dtype():
    def f(x):
        return (isinstance(x, torch.FloatTensor), isinstance(x, torch.LongTensor),
                isinstance(x, torch.cuda.FloatTensor), isinstance(x, torch.DoubleTensor), x + 1)

    r = check(f, [torch.randn(3), torch.arange(3), torch.randn(3).double(), torch.randn(3)],
              breaks=0, fullgraph=True)
    assert r.compiles == 3, r


def test_deleting_a_missing_attribute_raises_attribute_error():
    def f(x):
        try:
            del x.tag
        except AttributeError as e:
            return x + 1, str(e)
        return x - 1

    check(f, [torch.randn(3), tagged(tag=3)], breaks=0, fullgraph=True)


# -- nn.Parameter made in the frame --
def test_parameter_of_an_input_is_made_before_the_graph_and_used_in_it():
    def f(x):
        p = nn.Parameter(x)
        q = nn.Parameter(x, requires_grad=False)
        return p, q, p is q, (p * 2).sum()

    check(f, [torch.randn(3), torch.randn(4)], breaks=0, fullgraph=True)


def test_parameter_stored_on_a_module_by_the_frame():
    class Lazy(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = None

        def forward(self, x, init):
            if self.w is None:
                self.w = nn.Parameter(init)
            return x @ self.w

    check(lambda m, x, i: m(x, i), [(Lazy(), torch.randn(2, 3), torch.randn(3))] * 2,
          breaks=0, fullgraph=True)


def test_gradient_reaches_a_parameter_made_in_the_frame():
    def f(x):
        p = nn.Parameter(x)
        y = (p * 3).sum()
        y.backward()            # a break: the backward runs in CPython
        return p.grad

    check(f, [torch.randn(3)], breaks=1)


def test_parameter_of_a_computed_tensor_is_a_graph_break():
    def f(x):
        return nn.Parameter(x + 1)

    check(f, [torch.randn(3)], breaks=1)


# -- tensor subclasses --
def two(n=3, a=None, b=None):
    from torch.testing._internal.two_tensor import TwoTensor
    return TwoTensor(torch.randn(n) if a is None else a, torch.randn(n) if b is None else b)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_wrapper_subclass_input_is_traced_through_its_dispatch(backend):
    from torch.testing._internal.two_tensor import TwoTensor

    def f(x, y):
        z = (x.sin() + y) * 2
        return z, isinstance(z, TwoTensor), type(x) is TwoTensor, x.a + 1

    r = check(f, [(two(), torch.randn(3)), (two(), torch.randn(3)), (two(4), torch.randn(4))],
              backend=backend, breaks=0, fullgraph=True)
    assert r.compiles == 2, r


def test_wrapper_subclass_inner_tensors_are_guarded():
    def f(x):
        return x.mul(3)

    r = check(f, [two(), two(a=torch.randn(6)[::2], b=torch.randn(6)[::2]), two(), torch.randn(3)],
              breaks=0)
    assert r.compiles == 3, r


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_inner_tensors_of_a_computed_wrapper_subclass_are_read_in_the_graph(backend):
    def f(x):
        y = x * 2
        return y.a + y.b

    check(f, [two(), two()], backend=backend, breaks=0, fullgraph=True)


class Tagged(torch.Tensor):
    """A wrapper over one tensor with a constant label in its flattening context."""
    @staticmethod
    def __new__(cls, data, label):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(),
                                                   dtype=data.dtype, device=data.device)

    def __init__(self, data, label):
        self.data_ = data
        self.label = label

    def __tensor_flatten__(self):
        return ["data_"], {"label": self.label}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Tagged(inner["data_"], ctx["label"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        first = next(a for a in args if isinstance(a, Tagged))
        unwrap = [a.data_ if isinstance(a, Tagged) else a for a in args]
        out = func(*unwrap, **(kwargs or {}))
        return Tagged(out, first.label + 1) if isinstance(out, torch.Tensor) else out


def test_constant_attributes_of_wrapper_subclasses_are_guarded_and_propagate():
    def f(x):
        y = x.cos() * 2
        return y.data_ + y.label, y.label, x.label

    r = check(f, [Tagged(torch.randn(3), 1), Tagged(torch.randn(3), 1), Tagged(torch.randn(3), 5)],
              breaks=0, fullgraph=True)
    assert r.compiles == 2, r


class Scaled(torch.Tensor):
    """A __torch_function__ subclass: additions come out ten times larger."""
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        r = super().__torch_function__(func, types, args, kwargs or {})
        return r * 10 if func in (torch.Tensor.add, torch.add) else r

    def __deepcopy__(self, memo):
        return self.as_subclass(torch.Tensor).clone().as_subclass(Scaled)


def test_torch_function_subclass_input_keeps_its_override():
    def f(x):
        return x.add(1) + 0

    check(f, [torch.randn(3).as_subclass(Scaled)], graphs=0)


def test_as_subclass_in_the_frame_keeps_the_override():
    def f(x):
        y = x * 2
        return y.as_subclass(Scaled).add(1)

    check(f, [torch.randn(3), torch.randn(3)], breaks=1)


def test_wrapper_subclass_overriding_a_tensor_method_is_not_traced():
    from torch.testing._internal.two_tensor import TwoTensor

    class Loud(TwoTensor):
        def sin(self):
            return self.a.sin() * 0 + 5

    def f(x):
        return x.sin()

    check(f, [Loud(torch.randn(3), torch.randn(3))], graphs=0)
