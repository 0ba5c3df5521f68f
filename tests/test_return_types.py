"""Results of torch ops that return a torch.return_types structseq keep their class:
returned to the caller, across a graph break, and under isinstance in the frame (they
came back as plain tuples: a wrong answer)."""
import torch

from differential import check


def _returned(x):
    return x.topk(2), x.max(0), x.sort(), torch.linalg.slogdet(x.view(2, 2).exp())


def _named_fields_and_isinstance(x):
    r = x.max(0)
    kinds = (isinstance(r, torch.return_types.max), isinstance(r, tuple), type(r).__name__)
    v, i = r
    return r.values + v, r.indices, kinds, len(r)


def _across_a_break(x):
    r = x.sort(descending=True)
    print("break")
    return r, r.values[0]


def test_return_types_are_returned_as_their_class():
    r = check(_returned, [torch.randn(4), torch.randn(4)], fullgraph=True)
    assert r.graphs == 1


def test_return_types_fields_and_isinstance_in_the_frame():
    check(_named_fields_and_isinstance, [torch.randn(3, 2), torch.randn(5, 2)], fullgraph=True)


def test_return_types_across_a_graph_break():
    r = check(_across_a_break, [torch.randn(5), torch.randn(5)])
    assert r.breaks == 1


def test_asdict_of_a_structseq_is_an_attribute_error():
    def f(x):
        return x.max(0)._asdict()
    check(f, [torch.randn(3)], graphs=None)


def test_built_in_the_frame():
    # torch.return_types.max((values, indices)): the class called on a sequence, as a
    # function that wraps its own results does
    def f(x):
        v, i = x.max(0)
        r = torch.return_types.max((v * 2, i))
        s = torch.return_types.sort([x, x.argsort()])
        return r, r.values + 1, r.indices, s.indices, isinstance(r, torch.return_types.max), len(r)

    check(f, [torch.randn(3, 2) for _ in range(3)], graphs=1, breaks=0, compiles=1)
