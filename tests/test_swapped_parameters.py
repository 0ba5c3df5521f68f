"""Tensors swapped in place (torch.utils.swap_tensors, or module parameters swapped by a
dtype conversion) under a compiled entry: the compiled code sees the new tensors."""

import pytest
import torch

import frametrace

from differential import check
from test_outside_state_guards import Then


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
