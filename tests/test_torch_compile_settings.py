"""torch.compile's own settings, set by a program written for it: with torch._dynamo
imported by the program and ``torch._dynamo.config.capture_scalar_outputs`` /
``capture_dynamic_output_shape_ops`` on, numbers read out of tensors and data-dependent
sizes stay in frametrace's graph too, as with frametrace.config's switches
(``config.honour_torch_compile_config = False`` reads only ours).  And the unbacked
numbers they make trace through the ops that take them: tolist() of 0-d and k-d
tensors, torch.tensor() of them, arange / repeat / zeros / cat of unbacked sizes, and
the foreach ops that read a 0-d tensor as their scalar.
"""
import pytest
import torch
import torch._dynamo.config as dynamo_config     # the program's import, not frametrace's

import frametrace
from differential import check


@pytest.fixture
def theirs():
    """The settings as a torch.compile user turns them on; frametrace's left off."""
    assert not frametrace.config.capture_scalar_outputs
    assert not frametrace.config.capture_dynamic_output_shape_ops
    with dynamo_config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        yield


def k(v):
    return torch.tensor(v)


def test_item_stays_in_the_graph_when_torch_compile_config_says_so(theirs):
    def f(x):
        return x + x.sum().item()

    inputs = [k([1., 2, 3]), k([4., 5, -6]), k([0.5, 0, 0])]
    check(f, inputs, graphs=1, breaks=0, compiles=1)


def test_data_dependent_sizes_stay_in_the_graph_when_torch_compile_config_says_so(theirs):
    def f(x):
        return x.nonzero() * 2, x[x > 0].sum()

    inputs = [k([1., 0, 3]), k([0., 0, 6]), k([0., 0, 0]), k([1., 2, 3])]
    check(f, inputs, graphs=1, breaks=0, compiles=1)


def test_item_breaks_without_either_setting():
    def f(x):
        return x + x.sum().item()

    with dynamo_config.patch(capture_scalar_outputs=False):
        r = check(f, [k([1., 2, 3]), k([4., 5, 6])], graphs=2, breaks=1)
    assert "item()" in r.reasons()[0]


def test_honouring_them_can_be_switched_off(theirs, monkeypatch):
    monkeypatch.setattr(frametrace.config, "honour_torch_compile_config", False)

    def f(x):
        return x.nonzero() + x.sum().item()

    r = check(f, [k([1., 0, 3]), k([0., 0, 6])], graphs=None)
    assert r.breaks >= 1, r


def test_tolist_of_0d_and_2d_tensors(theirs):
    def f(x, m):
        a = x.tolist()
        rows = m.tolist()
        return x + a, torch.tensor(rows[0]) * rows[1][1], len(rows)

    inputs = [(k(3.), k([[1, 2], [3, 4]])), (k(-4.5), k([[5, 6], [7, 8]])),
              (k(0.), k([[0, 0], [1, -1]]))]
    check(f, inputs, graphs=1, breaks=0, compiles=1)


def test_bool_and_float_of_symbolic_numbers(theirs):
    def f(x, n):
        s = n.sum().item()          # an int
        return x * float(s), x * float(x.sum().item())

    inputs = [(k([1., 2]), k([1, 2])), (k([3., -4]), k([5, 6])), (k([0., 1]), k([0, 0]))]
    check(f, inputs, graphs=1, breaks=0, compiles=1)


def test_tensor_of_items(theirs):
    def f(x):
        return torch.tensor([x.sum().item(), x.max().item()]) + x[:2]

    inputs = [k([1., 2, 3]), k([4., 5, 6]), k([-1., 0, 1])]
    check(f, inputs, graphs=1, breaks=0, compiles=1)


def test_unbacked_lengths_and_sizes(theirs):
    def f(n, fl, y):
        m = n.item()
        torch._check(m >= 0)
        return torch.arange(m), torch.arange(fl.item()), y.repeat(m), torch.zeros(m, 2)

    inputs = [(k(3), k(2.5), torch.ones(2)), (k(5), k(4.0), torch.arange(2.)),
              (k(0), k(1.5), torch.ones(2))]
    check(f, inputs, graphs=1, breaks=0, compiles=1)


def test_cat_with_an_unbacked_size_and_an_empty_tensor(theirs):
    def f(x, y):
        z = x.nonzero().flatten().float()
        return torch.cat([z, y]), torch.cat([torch.empty(0), z])

    inputs = [(k([1., 0, 3]), torch.ones(2)), (k([0., 0, 6]), torch.arange(2.)),
              (k([0., 0, 0]), torch.ones(2))]
    check(f, inputs, graphs=1, breaks=0, compiles=1)


@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch before 2.13 reads the 0-d scalar of _foreach_pow as data: a break")
def test_foreach_ops_with_a_0d_tensor_scalar(theirs):
    def f(xs, ys, e, w):
        p = torch._foreach_pow(xs, e)
        torch._foreach_lerp_(xs, ys, w)
        torch._foreach_add_(ys, xs, alpha=2)
        return p

    def inputs(e, w):
        return ([torch.arange(3.), torch.ones(2) * 2], [torch.zeros(3), torch.ones(2)], k(e), k(w))

    check(f, [inputs(2., 0.5), inputs(3., 0.25), inputs(0.5, 0.75)], graphs=1, breaks=0, compiles=1)


def test_foreach_with_a_0d_tensor_scalar_breaks_without_the_settings():
    def f(xs, e):
        return torch._foreach_pow(xs, e)

    with dynamo_config.patch(capture_scalar_outputs=False):
        r = check(f, [([torch.ones(3)], k(2.)), ([torch.ones(3) * 2], k(3.))], graphs=None)
    assert r.breaks == 1, r
