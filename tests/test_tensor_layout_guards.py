"""Tensor layouts in the tensor guard: a sparse (COO, CSR) or mkldnn tensor whose strides
equal a dense entry's is not given the dense graph, and a dense input after one of another
layout compiles."""

import pytest
import torch

from differential import Call, check

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


class Converted(Call):
    """One argument, `convert(dense)` made afresh for each side (an mkldnn or CSR
    tensor has no storage to deep-copy)."""

    def __init__(self, dense, convert):
        super().__init__(convert(dense))
        self.__dict__["make"] = lambda: convert(dense.clone())

    def __deepcopy__(self, memo):
        return Call(self.__dict__["make"]())


def _expanded(*sizes):
    """A dense 4x4 tensor viewed from one of `sizes`: strides with zeros."""
    return torch.randn(*sizes).expand(4, 4)


def is_sparse(x):
    return x.is_sparse, x * 2


def layout_of(x):
    return x.layout, x * 2


# A sparse COO tensor answers stride() with zeros, an mkldnn one with (1, 0): the same
# as these expanded dense views, so only the layout tells them apart.
@pytest.mark.parametrize("dense,other", [
    (lambda: _expanded(1, 1), lambda: Converted(torch.randn(4, 4), torch.Tensor.to_sparse)),
    (lambda: _expanded(4, 1), lambda: Converted(torch.randn(4, 4), torch.Tensor.to_mkldnn)),
    (lambda: torch.randn(4, 4), lambda: Converted(torch.randn(4, 4), torch.Tensor.to_sparse_csr)),
], ids=["coo", "mkldnn", "csr"])
@pytest.mark.parametrize("fn", [is_sparse, layout_of])
def test_other_layout_with_a_dense_entrys_strides_is_not_given_the_dense_graph(fn, dense, other):
    r = check(fn, [dense(), other(), dense()], graphs=1)
    assert r.fallbacks == 1, r      # the other layout runs in CPython, the dense one compiled


@pytest.mark.parametrize("other", [lambda: Converted(torch.randn(4, 4), torch.Tensor.to_sparse),
                                   lambda: Converted(torch.randn(4, 4), torch.Tensor.to_mkldnn),
                                   lambda: Converted(torch.randn(4, 4), torch.Tensor.to_sparse_csr)],
                         ids=["coo", "mkldnn", "csr"])
def test_dense_input_after_one_of_another_layout_compiles(other):
    r = check(layout_of, [other(), torch.randn(4, 4), other(), torch.randn(4, 4)], graphs=1)
    assert r.fallbacks == 1 and r.compiles == 2, r
