"""Where a traced optimizer step keeps its step counters.

torch.optim keeps them on the CPU; traced as they are, the bias corrections of a GPU
model would be host-side ops in the middle of the device graph.  As torch.compile does,
an optimizer whose parameters are all on the GPU gets its counters there, and a group
with no state yet runs torch.optim's `capturable` path.  These tests compare the
compiled step with CPython's over several steps and check where the graph's ops run."""
import copy

import pytest
import torch

import frametrace

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                               torch.nn.Linear(16, 4)).to(device)


def train(m, opt, step, device, steps=3):
    torch.manual_seed(1)
    for _ in range(steps):
        m(torch.randn(5, 8, device=device)).pow(2).sum().backward()
        step()
        opt.zero_grad()


class Recorder:
    """A backend that keeps each graph's FakeTensor values and runs it eagerly."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def devices(self, i):
        """The devices of graph i's computed tensors."""
        out = set()
        for node in self.graphs[i].graph.nodes:
            val = node.meta.get("val", node.meta.get("example_value"))
            if node.op == "call_function" and isinstance(val, torch.Tensor):
                out.add(val.device.type)
        return out


def compare(device, make_opt, before=0, backend=None, tol=(1e-5, 1e-6)):
    """3 steps in CPython and compiled (after `before` uncompiled steps on both);
    returns (compiled optimizer, recorder)."""
    rtol, atol = tol
    eager_m, comp_m = model(device), model(device)
    eager_opt, comp_opt = make_opt(eager_m), make_opt(comp_m)
    train(eager_m, eager_opt, eager_opt.step, device, before)
    train(comp_m, comp_opt, comp_opt.step, device, before)
    rec = Recorder()
    step = frametrace.optimize(comp_opt.step, backend=backend or rec)
    train(eager_m, eager_opt, eager_opt.step, device)
    train(comp_m, comp_opt, step, device)
    for a, b in zip(eager_m.parameters(), comp_m.parameters()):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol)
    for p, q in zip(eager_m.parameters(), comp_m.parameters()):
        for k, v in eager_opt.state[p].items():
            torch.testing.assert_close(comp_opt.state[q][k].cpu(), v.cpu(), rtol=rtol, atol=atol)
    return comp_opt, rec


def adamw(m):
    return torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)


def test_cpu_parameters_keep_cpu_counters_and_flags():
    opt, rec = compare("cpu", adamw)
    assert [g["capturable"] for g in opt.param_groups] == [False]
    assert all(s["step"].device.type == "cpu" for s in opt.state.values())
    assert len(rec.graphs) == 2           # the first step (state made) and the steady one


@cuda
@pytest.mark.parametrize("make_opt", [adamw,
                                      lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, foreach=False),
                                      lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, amsgrad=True)])
def test_new_gpu_optimizer_runs_its_capturable_path_on_the_device(make_opt):
    opt, rec = compare("cuda", make_opt)
    assert [g["capturable"] for g in opt.param_groups] == [True]
    assert all(s["step"].device.type == "cuda" for s in opt.state.values())
    assert len(rec.graphs) == 2
    assert rec.devices(1) == {"cuda"}     # no host-side op in the steady step


@cuda
def test_gpu_optimizer_with_state_moves_its_counters_and_keeps_its_flag():
    opt, rec = compare("cuda", adamw, before=1)
    assert [g["capturable"] for g in opt.param_groups] == [False]
    assert all(s["step"].device.type == "cuda" for s in opt.state.values())
    assert rec.devices(len(rec.graphs) - 1) == {"cuda"}


@cuda
def test_gpu_capturable_step_with_the_triton_backend():
    pytest.importorskip("triton")
    # (fused kernels round differently: the bias corrections are computed on the device)
    opt, _ = compare("cuda", adamw, backend="triton", tol=(1e-4, 1e-5))
    assert all(s["step"].device.type == "cuda" for s in opt.state.values())
