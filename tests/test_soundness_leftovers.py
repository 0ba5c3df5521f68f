"""Leftover soundness gaps: tensor layouts in the tensor guard, tensors swapped in place
(torch.utils.swap_tensors) under a compiled entry, and a compiled function or module
called from another compiled function."""

import pytest
import torch

import frametrace

from differential import Call, check
from test_leaks import Scale  # (a module multiplying by one parameter)
from test_soundness_guards import Then

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


# -- tensors swapped in place under a compiled entry --

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x):
        return torch.relu(self.norm(self.lin(x))) * self.scale


@pytest.fixture
def swap_on_conversion():
    was = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    yield
    torch.__future__.set_swap_module_params_on_conversion(was)


def _twins(cls):
    """Two equal modules, one for each side.  Their parameters need no grad: the
    harness keeps the last outputs alive, and an output's autograd graph holding a
    parameter makes swap_tensors refuse it in CPython too."""
    torch.manual_seed(0)
    eager = cls().requires_grad_(False)
    torch.manual_seed(0)
    return eager, cls().requires_grad_(False)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_module_params_swapped_by_a_dtype_conversion_after_a_compiled_call(swap_on_conversion, backend):
    eager, twin = _twins(Block)
    def convert(dtype):
        return lambda: [m.to(dtype) for m in (eager, twin)]
    r = check(eager, [torch.randn(3, 4), torch.randn(3, 4),
                      Then(convert(torch.float64), torch.randn(3, 4, dtype=torch.float64)),
                      torch.randn(3, 4, dtype=torch.float64),
                      Then(convert(torch.float32), torch.randn(3, 4))], backend=backend,
              compiled=lambda counter: frametrace.optimize(backend=counter)(twin))
    assert r.graphs == 2 and r.compiles == 2, r      # float64 recompiles; float32 again reuses


def test_params_swapped_with_same_shaped_tensors_give_the_new_values():
    eager, twin = _twins(Block)
    def swap():
        for m in (eager, twin):
            torch.manual_seed(1)
            for p in m.parameters():
                torch.utils.swap_tensors(p, torch.nn.Parameter(torch.randn_like(p), requires_grad=False))
    r = check(eager, [torch.randn(3, 4), Then(swap, torch.randn(3, 4)), torch.randn(3, 4)],
              compiled=lambda counter: frametrace.optimize(backend=counter)(twin))
    assert r.graphs == 1, r


# -- an optimize() wrapper called from a compiled function --

torch.manual_seed(0)
opt_linear = frametrace.optimize(torch.nn.Linear(4, 4))
opt_scale = frametrace.optimize(Scale())


@frametrace.optimize(backend="eager")
def opt_sin(x):
    return x.sin() + 1


@frametrace.disable
def logged(x):
    return x.cos()


@frametrace.optimize(backend="eager")
def opt_with_disabled(x):
    return logged(x + 1) * 2


def calls_optimized(x):
    return opt_linear(x).relu() + opt_sin(x) + opt_scale(x)


def test_optimized_module_and_function_called_from_a_compiled_function_are_traced_into_its_graph():
    check(calls_optimized, [torch.randn(2, 4), torch.randn(2, 4)], graphs=1, breaks=0)


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = frametrace.optimize(Scale())

    def forward(self, x):
        return self.inner(x) + self.inner.w


def test_optimized_submodule_is_traced_into_the_outer_modules_graph():
    eager, twin = _twins(Holder)
    r = check(eager, [torch.randn(4), torch.randn(4)], graphs=1,
              compiled=lambda counter: frametrace.optimize(backend=counter)(twin))
    assert r.breaks == 0, r


def test_disable_inside_an_optimized_function_still_breaks_the_outer_graph():
    outer = lambda x: opt_with_disabled(x) - 1     # noqa: E731
    r = check(outer, [torch.randn(4), torch.randn(4)])
    assert [(rec.outcome, rec.reason) for rec in r.records if rec.code is outer.__code__] == \
        [("break", "calling test_soundness_leftovers.logged")], r


def test_optimized_module_swapped_between_calls_is_noticed():
    box = {"m": opt_scale}
    def use(x):
        return box["m"](x)
    other = frametrace.optimize(torch.nn.Linear(4, 4))
    check(use, [torch.randn(4), Then(lambda: box.update(m=other), torch.randn(4))], graphs=2)


opt_disabled_scale = frametrace.disable(frametrace.optimize(Scale()))


def test_disabled_optimized_module_called_from_a_compiled_function_runs_in_cpython():
    outer = lambda x: opt_disabled_scale(x) + 1     # noqa: E731
    r = check(outer, [torch.randn(4), torch.randn(4)])
    assert [rec.outcome for rec in r.records if rec.code is outer.__code__] == ["break"], r


def test_optimized_wrappers_stay_themselves_as_values():
    def f(x):
        kinds = (isinstance(opt_scale, frametrace.OptimizedModule), type(opt_sin).__name__,
                 opt_scale.w is opt_scale._orig_mod.w, opt_sin.__name__)
        return kinds, opt_sin, opt_scale, opt_scale(x) + opt_sin(x)
    check(f, [torch.randn(4), torch.randn(4)], graphs=1, breaks=0)
