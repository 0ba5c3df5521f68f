"""min() and max() of 0-d tensors: picked in the graph (one graph, NaN as CPython) where
nothing can tell the new tensor from the item CPython returns, and run in CPython where
something could (identity, a hash, an in-place write, gradients, an input returned).
Differential (tests/differential.py), with the graphs and breaks counted."""
import torch

from differential import check


def min_max_used_inside(x):
    a, b = x.sum(), x.mean()
    return x * min(a, b) + max(a, b, x[0]) - max(b, a)


def min_max_returned(x):
    return min(x.sum(), x.amax()), max([x.sum(), x.mean() * 3, x.amin()])


def min_max_of_inputs(a, b):
    return max(a, b)                # CPython returns `a` or `b` itself


def min_max_written(x):
    a, b = x.sum(), x.mean()
    m = max(a, b)
    m += 1                          # writes a or b
    return a, b, m


def min_max_returned_with_an_item(x):
    a, b = x.sum(), x.mean()
    return a, min(a, b)


NAN = float("nan")


def test_min_max_of_0d_tensors():
    inputs = [torch.randn(3), torch.tensor([1.0, NAN, 2.0]), torch.tensor([NAN, 1.0, 1.0]),
              torch.tensor([2.0, 2.0, 2.0])]
    r = check(min_max_used_inside, inputs)
    assert r.breaks == 0 and r.graphs == 1
    r = check(min_max_returned, inputs)
    assert r.breaks == 0 and r.graphs == 1


def test_min_max_that_could_tell_the_new_tensor_apart_refused():
    # (the frame runs in CPython: values as CPython's, the objects too)
    r = check(min_max_of_inputs, [(torch.tensor(1.0), torch.tensor(2.0))], graphs=0)
    assert r.fallbacks == 1
    r = check(min_max_written, [torch.randn(3), torch.tensor([1.0, 1.0, 1.0])], graphs=0)
    r = check(min_max_returned_with_an_item, [torch.randn(3)], graphs=0)


def test_min_max_of_mixed_tensors_not_picked():
    # different dtypes, shapes, or a key: compared in Python as before
    def f(x):
        return min(x.sum(), x.sum().int()), max(x[0], x[1:2])
    check(f, [torch.randn(3)], graphs=None)


def test_identity_of_a_min_max_result_not_guessed():
    def f(x):
        a, b = x.sum(), x.mean()
        m = max(a, b)
        return x * m, m is a, id(m) == id(b)
    r = check(f, [torch.randn(3), torch.tensor([1.0, -1.0, 3.0])], graphs=None)
    assert r.fallbacks >= 1


def _is(p, q):
    return p is q


def test_identity_of_a_min_max_result_in_an_inlined_call():
    # (a break at the call would run it in CPython on the new tensor)
    def f(x):
        a, b = x.sum(), x.mean()
        m = min(a, b)
        return x * m, _is(m, a)
    r = check(f, [torch.randn(3), torch.tensor([1.0, -1.0, 3.0])], graphs=None)
    assert r.fallbacks >= 1



def test_min_max_of_tensors_that_require_grad_not_picked():
    # (the item not chosen gets no gradient in CPython; where() would give it zeros)
    def f(w, v):
        m = max(w.sum(), v.sum())
        m.backward()
        return w.grad is None, v.grad is None
    check(f, [(torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True))], graphs=None)


def test_min_max_result_hashed_not_guessed():
    # (a dict keyed by tensors finds the chosen item by identity in CPython)
    def f(x):
        a, b = x.sum(), x.mean()
        table = {a: "a", b: "b"}
        return x * 2, table[max(a, b)]
    r = check(f, [torch.randn(3), torch.tensor([3.0, -1.0, 0.0])], graphs=None)
    assert r.fallbacks >= 1
