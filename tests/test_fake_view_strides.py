"""Strides of views with size-1 dimensions are CPython's.  FakeTensorMode computes
aten.view (reshape, flatten, unflatten, view_as) with torch._refs._reshape_view_helper,
which strides size-1 dimensions differently from the C++ kernels (computeStride): the
graph's example values follow the C++ kernels (graph.py, _kernel_view_geometry), so
`.stride()` and what depends on it answer as in CPython."""
import random

import pytest
import torch

from differential import check


def nodes(report):
    return sorted({str(n.target) for gm in report.counter.graphs for n in gm.graph.nodes
                   if n.op in ("call_function", "call_method")})


def test_split_then_view_strides():
    # FakeTensorMode alone says (192, 192, 16, 1)
    def f(x):
        y = torch.sin(x).view(1, 1, 192).split(64, dim=2)[1].view(1, 1, -1, 16)
        return y.stride(), y.is_contiguous(), y.transpose(1, 2).is_contiguous(), y * 2

    r = check(f, [torch.randn(1, 192), torch.randn(1, 192), torch.randn(1, 192)],
              graphs=1, breaks=0)
    assert "as_strided" not in nodes(r), nodes(r)    # only the example value changed


@pytest.mark.parametrize("op", [
    lambda y: y.view(1, 1, -1, 16),
    lambda y: y.reshape(1, 4, 1, 16),
    lambda y: y.view(1, 64),
    lambda y: y.flatten(),
    lambda y: y.flatten(0, 1),
    lambda y: y.unflatten(2, (1, 4, 16)),
    lambda y: y.view_as(torch.empty(1, 1, 2, 32)),
    lambda y: y.reshape(1, 1, 1, 64, 1),
    lambda y: y.view(64, 1).t(),
    lambda y: y.unsqueeze(0).view(1, 1, 8, 8),
], ids=["view", "reshape", "view_2d", "flatten", "flatten_01", "unflatten", "view_as",
        "reshape_tail_1", "view_t", "unsqueeze_view"])
def test_views_of_a_column_slice(op):
    def f(x):
        y = x.view(1, 1, 192)[:, :, 64:128]         # strides (192, 192, 1)
        z = op(y)
        return z.stride(), z.is_contiguous(), op(y.contiguous()).stride(), z + 1

    check(f, [torch.randn(1, 192), torch.randn(1, 192)], graphs=1, breaks=0)


def test_view_of_an_input_with_odd_size1_strides():
    # A size-1 dimension's stride can be anything: an input keeps its own.
    def f(x):
        a = x.view(2, 1, 3)
        b = x.reshape(1, 6)
        c = x.flatten()
        return a.stride(), b.stride(), c.stride(), b.mT.is_contiguous(), a.transpose(0, 1).stride()

    x = torch.randn(6, 5)[:, 1:2].t()               # sizes (1, 6), strides (1, 5)
    check(f, [x, x.clone().t().contiguous().t()], max_graphs=2, breaks=0)


def test_strides_flow_into_later_views():
    def f(x):
        y = x.transpose(0, 1)[2:4].reshape(1, 2, 1, 3)    # size-1 dims from a view
        z = y.permute(2, 0, 3, 1)
        return z.stride(), z.is_contiguous(), z.reshape(3, 2).stride(), z.squeeze().stride()

    check(f, [torch.randn(3, 6), torch.randn(3, 6)], graphs=1, breaks=0)


def test_empty_views():
    def f(x):
        y = x[:, 3:3].view(1, 0, 1)
        return y.stride(), y.is_contiguous(), x[1:1].reshape(0, 1, 1).stride()

    check(f, [torch.randn(4, 6), torch.randn(4, 6)], graphs=1, breaks=0)


def test_storage_offset_of_a_view():
    # storage_offset() of a tensor computed in the graph is a graph break: the read runs
    # in CPython, on the real tensor.
    def f(x):
        y = x.view(1, 1, 192)[:, :, 64:128].view(1, 1, 4, 16)
        return y.storage_offset(), y.stride()

    check(f, [torch.randn(1, 192), torch.randn(1, 192)], max_graphs=2)


def test_storage_offset_of_an_input_view():
    def f(x):
        return x.storage_offset(), x.view(1, -1).stride(), x.unsqueeze(0).stride()

    base = torch.randn(1, 64)
    check(f, [base[:, 16:32], base[:, 16:32]], graphs=1, breaks=0)


def test_dynamic_sizes():
    def f(x):
        y = x.view(1, 1, -1)[:, :, 64:128].view(1, 1, -1, 16)
        return y.stride(), y.is_contiguous()

    check(f, [torch.randn(1, n) for n in (192, 256, 320, 256)], max_graphs=2, breaks=0)
    check(f, [torch.randn(1, n) for n in (192, 256)], graphs=1, breaks=0, dynamic=True)


# (name, maker): maker(t, r) draws its arguments for `t` and returns the op
_OPS = [
    ("view", lambda t, r: (lambda s: lambda y: y.view(s))(_regroup(t, r))),
    ("reshape", lambda t, r: (lambda s: lambda y: y.reshape(s))(_regroup(t, r))),
    ("flatten", lambda t, r: (lambda d: lambda y: y.flatten(d))(r.randrange(t.dim()))),
    ("unflatten", lambda t, r: (lambda n: lambda y: y.unflatten(-1, (1, n, 1)))(t.shape[-1])),
    ("unsqueeze", lambda t, r: (lambda d: lambda y: y.unsqueeze(d))(r.randint(-t.dim() - 1, t.dim()))),
    ("squeeze", lambda t, r: lambda y: y.squeeze()),
    ("transpose", lambda t, r: lambda y: y.transpose(0, -1)),
    ("select", lambda t, r: lambda y: y.select(0, 0)),
    ("narrow", lambda t, r: lambda y: y.narrow(-1, 0, 1)),
    ("expand", lambda t, r: (lambda s: lambda y: y.expand(s))((2, *t.shape))),
]


def _regroup(t, r):
    """A shape of t's numel: t's sizes, with 1s put in and taken out at random."""
    shape = [n for n in t.shape if n != 1 or r.random() < 0.5]
    for _ in range(r.randint(0, 2)):
        shape.insert(r.randint(0, len(shape)), 1)
    return shape or [1]


def _input(shape, layout, seed):
    g = torch.Generator().manual_seed(seed)
    if layout == "contiguous":
        return torch.randn(shape, generator=g)
    if layout == "slice":
        return torch.randn([2 * n for n in shape], generator=g)[tuple(slice(0, None, 2) for _ in shape)]
    return torch.randn(list(reversed(shape)), generator=g).permute(*reversed(range(len(shape))))


@pytest.mark.parametrize("seed", range(4))
def test_random_chains_with_size1_dims(seed):
    r = random.Random(seed)
    done = 0
    while done < 6:
        shape = [r.choice([1, 1, 2, 3]) for _ in range(r.randint(2, 4))]
        layout = r.choice(["contiguous", "slice", "transposed"])
        x = _input(shape, layout, 0)
        first = r.choice(_OPS)[1](x, r)
        try:
            a = first(x)
            second = r.choice(_OPS)[1](a, r) if a.dim() else (lambda y: y)
            second(a)
        except RuntimeError:
            continue                        # (that view is not possible there)
        graph_made = layout == "contiguous"     # a view of a tensor the graph computed

        def f(x, first=first, second=second, graph_made=graph_made):
            a = first(torch.cos(x) if graph_made else x)
            b = second(a)
            return a.stride(), b.stride(), a.is_contiguous(), b.is_contiguous()

        check(f, [_input(shape, layout, 1), _input(shape, layout, 2)], graphs=1, breaks=0)
        done += 1
