"""Whole loops over ordinary models stay compiled (issue 30, item 9): a model's constant
float settings under `dynamic=True`, an LSTM over changing batch sizes, Hugging Face's
classification head writing its config, `with lock:`, activation checkpointing with
dropout, `torch.func.functional_call`.  Each test runs several calls with varied inputs
against CPython and counts what was compiled."""
import pytest
import torch
import torch.nn.functional as F

import frametrace
from differential import Call, Then, check


class Embedder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, ids):
        return self.lin(self.emb(ids)).sum(1)


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_embedding_norm_type_stays_constant_under_dynamic_true(backend):
    # nn.Embedding's norm_type (2.0) never changes: it is a constant, not a symbolic
    # input that AOTAutograd would refuse (then every length compiled again).
    torch.manual_seed(0)
    model = Embedder()
    lengths = [3, 5, 7, 9, 12]
    r = check(model, [torch.randint(0, 50, (2, n)) for n in lengths], backend=backend,
              compiled=lambda cnt: frametrace.optimize(model, backend=cnt, dynamic=True))
    assert r.compiles == 1 and r.graphs == 1 and r.breaks == 0, r


def test_module_float_that_changes_becomes_symbolic():
    # A module's float that does change is symbolic from then on (no compile per value).
    lin = torch.nn.Linear(4, 4)

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 0.5

        def forward(self, x):
            return lin(x) * self.scale

    m = Scaled()

    def set_scale(v):
        return lambda: setattr(m, "scale", v)

    calls = [torch.randn(3, 4), Then(set_scale(1.5), torch.randn(5, 4)),
             Then(set_scale(2.5), torch.randn(6, 4)), Then(set_scale(3.5), torch.randn(7, 4))]
    r = check(m, calls, backend="aot_eager",
              compiled=lambda cnt: frametrace.optimize(m, backend=cnt, dynamic=True))
    assert r.compiles == 2 and r.breaks == 0, r


def test_unused_float_argument_restart_keeps_sizes_dynamic():
    # A float argument made symbolic (dynamic=True) that the graph never uses is one
    # AOTAutograd asks to specialise: the compile restarts with floats constant, the
    # sizes still symbolic (one compile for every length).
    w = torch.randn(50, 4)

    def f(ids, p):
        return F.embedding(ids, w, norm_type=p) * 2

    r = check(f, [(torch.randint(0, 50, (2, n)), 2.0) for n in (3, 5, 7, 9)],
              backend="aot_eager", dynamic=True)
    assert r.compiles == 1 and r.breaks == 0, r
