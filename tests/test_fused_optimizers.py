"""Fused, foreach and for-loop optimizer steps compiled, compared with CPython over
several steps: parameters, gradients and optimizer state.  The fused kernels
(`torch._fused_adamw_` ...) return None and write their arguments only through tensor
lists (`Tensor(a!)[]`): a graph that dropped them would move the step counters and
leave the parameters as they were, so each test also checks that the parameters moved
and that the fused kernel is in the graph that was compiled."""
import pytest
import torch

import frametrace

from test_optimizer_step import backward, run_steps
from differential import check

OPTIMIZERS = {
    "AdamW": lambda ps, **kw: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, **kw),
    "Adam": lambda ps, **kw: torch.optim.Adam(ps, lr=0.05, amsgrad=True, **kw),
    "SGD": lambda ps, **kw: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, **kw),
    "Adagrad": lambda ps, **kw: torch.optim.Adagrad(ps, lr=0.1, **kw),
}
MODES = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}


def model():
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def graph_targets(report):
    return {str(getattr(n.target, "__name__", n.target)) for gm in report.counter.graphs
            for n in gm.graph.nodes if n.op in ("call_function", "call_method")}


def _least_graphs(mode):
    # torch.optim's fused step functions (_fused_sgd ...) are torch.compiler.disable'd by
    # torch itself, lazily: once one ran in the process (the full suite's order), a step
    # that is only the fused call has no graph left around its break.
    return 0 if mode == "fused" else 1


def _check_compiled(report, name, mode, before, after):
    assert report.graphs >= _least_graphs(mode), report
    moved = [not torch.equal(a, b) for a, b in zip(before, after)]
    assert all(moved), "the parameters did not change"
    if mode == "fused":
        _fused_kernel_ran(report, name)


def _fused_kernel_ran(report, name):
    """The fused kernel ran in CPython at a break (AOTAutograd does not functionalize
    these soundly on torch 2.13: no meta kernels, an empty max_exp_avg_sqs, wrong
    values for a sliced parameter), around graphs for the rest of the step."""
    fused = f"_fused_{name.lower()}_"
    # The break is at the aten kernel, or at torch.optim's `_fused_adam` ... around it
    # once an earlier torch.compile in the process has applied torch's own
    # torch.compiler.disable to it (the full suite's order).
    # (AdamW's kernel is _fused_adamw_, its Python function torch.optim's _fused_adam on
    # torch 2.11)
    stem = fused.rstrip("_").replace("adamw", "adam")
    assert any(stem in r for r in report.reasons()), report
    assert fused not in graph_targets(report), graph_targets(report)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_step_compiled_alone(name, mode, backend):
    def make():
        m = model()
        return m, OPTIMIZERS[name](m.parameters(), **MODES[mode])

    r = run_steps(make, lambda m, opt: opt.step(), steps=3, prep=backward, backend=backend, atol=1e-5)
    _check_compiled(r, name, mode, *_params_moved(make, backend))


def _params_moved(make, backend):
    """The parameters before and after three compiled steps."""
    torch.manual_seed(0)
    m, opt = make()
    before = [p.detach().clone() for p in m.parameters()]
    step = frametrace.optimize(opt.step, backend=backend)
    for i in range(3):
        backward(m, opt, torch.randn(6, 4, generator=torch.Generator().manual_seed(i)))
        step()
    return before, [p.detach() for p in m.parameters()]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_step_with_the_step_inside(name, mode, backend):
    def make():
        m = model()
        return m, OPTIMIZERS[name](m.parameters(), **MODES[mode])

    def train(m, opt, x):
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    r = run_steps(make, train, steps=3, backend=backend, atol=1e-5)
    assert r.graphs >= 1, r
    if mode == "fused":
        _fused_kernel_ran(r, name)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_step_on_odd_layouts(name, mode, backend):
    # Parameters that are transposed, sliced or channels-last views: the kernel writes
    # each through its strides.
    def make():
        base = torch.randn(6, 8)
        ps = torch.nn.ParameterList([
            torch.randn(5, 3).t(), base[:, 1:5],
            torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)])
        return ps, OPTIMIZERS[name](ps.parameters(), **MODES[mode])

    def prep(ps, opt, x):
        g = torch.Generator().manual_seed(int(x.abs().sum() * 1000))
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
            if p.dim() == 4:
                p.grad = p.grad.to(memory_format=torch.channels_last)

    r = run_steps(make, lambda ps, opt: opt.step(), steps=3, prep=prep, backend=backend, atol=1e-5)
    assert r.graphs >= _least_graphs(mode), r
    if mode == "fused":
        _fused_kernel_ran(r, name)


_LIB = torch.library.Library("ft_fused_test", "DEF")
_LIB.define("scale_all(Tensor(a!)[] xs, float k) -> ()")


def _scale_all(xs, k):
    for x in xs:
        x.mul_(k)


_LIB.impl("scale_all", _scale_all, "CompositeExplicitAutograd")
torch.library.register_fake("ft_fused_test::scale_all", lambda xs, k: None, lib=_LIB)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_none_results_that_write_a_list_stay(backend):
    # The rule itself: an op that returns None and writes tensors only through a list
    # (no tensor argument of its own) stays in the graph, on inputs and on tensors
    # made in the graph, transposed and sliced ones too.
    from differential import check

    def f(xs, ys):
        torch.ops.ft_fused_test.scale_all(xs, 2.0)
        zs = [y.clone() for y in ys]
        torch.ops.ft_fused_test.scale_all.default(zs, -1.5)
        torch._foreach_add_(zs, xs)
        return zs

    base = torch.randn(4, 6)
    r = check(f, [([torch.randn(3), torch.randn(2, 2).t()], [torch.randn(3), base[1:3, 2:4]])] * 3,
              backend=backend, graphs=1, breaks=0)
    assert sum("scale_all" in str(n.target) for gm in r.counter.graphs for n in gm.graph.nodes) == 2, \
        graph_targets(r)


# -- stepped after backward in the frame (found by the program fuzzer) --
def steps_with_backward(ps, opt, t):
    for _ in range(3):
        loss = sum((p * t.mean()).sum() for p in ps)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ps[0].sum().item()


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1, fused=True),
], ids=["Adam", "SGD", "Adagrad"])
def test_fused_optimizer_stepped_after_backward_in_the_frame(make):
    # (optimizers family; 13 of 80 programs on 32f4331, none on main) the fused kernels
    # write their arguments through tensor lists and return None: the graph dropped them
    def call(warm):
        ps = [torch.tensor([-3.0, 0.0], requires_grad=True), torch.tensor([-2.0, 0.0, 1.0], requires_grad=True)]
        opt = make(ps)
        if warm:            # state made by an eager step first
            for p in ps:
                p.grad = torch.ones_like(p)
            opt.step()
        return ps, opt, torch.tensor([-1.0, 2.0])

    r = check(steps_with_backward, [call(True), call(False)])
    assert r.graphs >= 1
