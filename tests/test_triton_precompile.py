"""Kernels compiled ahead of a graph's first call (config.precompile_kernels): the dry run
of the wrapper records, for every launch, what Triton specializes its arguments on
(dtype, device, 16-byte alignment, ints' values) exactly as the real first call passes
them, and does nothing else: no kernel or aten op runs, no input is written, no
generator advances.  Attacked with views at odd offsets, in-place updates of inputs,
random draws, aten results (matmul, convolution) read by kernels, and ints."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, precompile  # noqa: E402
from frametrace.backends.triton.foreach import in_place  # noqa: E402
from frametrace.backends.triton.wrapper import Launcher  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _spec(a):
    if isinstance(a, torch.Tensor):
        return ("tensor", a.dtype, a.device, a.data_ptr() % 16 == 0)
    return a


def _specs(recorded):
    return {name: tuple(("tensor", s.dtype, s.device, s.aligned) if isinstance(s, precompile._Spec) else s
                        for s in specs) for name, specs in recorded.items()}


def _real_launches(mod, args):
    """{launcher name: the specs of its first launch's arguments} in a real call."""
    seen = {}
    ns = mod.namespace
    saved = {n: ns[n] for n in mod.wrapper.launchers}

    def spy(name, launcher):
        def run(*a):
            seen.setdefault(name, tuple(_spec(x) for x in a))
            return launcher(*a)
        return run
    try:
        for n, launcher in saved.items():
            ns[n] = spy(n, launcher)
        exec(compile(mod.source, "<test>", "exec"), ns)
        ns["call"](list(args))
    finally:
        ns.update(saved)
    return seen


def _views(x, w):
    y = (x[1:, 3:] * 2).sin()             # a view at an odd offset, read by a kernel
    z = torch.mm(y, w[1:]).relu()         # an aten result read by a kernel
    return z + y.sum(1, keepdim=True)[:, :1], x.t()[2:].exp()


def _conv(x, w):
    return F.relu(F.conv2d(x * 2, w, padding=1)).mean((2, 3))


def _in_place(x, y):
    x.add_(y * 2)                         # an input written in place
    return (x * y).sum()


def _dropout(x):
    return F.dropout(x.sin(), 0.5, training=True) * 3


CASES = {
    "views": (_views, lambda: (torch.randn(9, 11), torch.randn(9, 5))),
    "conv": (_conv, lambda: (torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3))),
    "in_place": (_in_place, lambda: (torch.randn(6, 7), torch.randn(6, 7))),
    "dropout": (_dropout, lambda: (torch.randn(64, 33),)),
}


def _compiled(fn, args):
    backend.COMPILED.clear()
    frametrace.optimize(backend="triton")(fn)(*[a.clone() for a in args])
    return backend.COMPILED[-1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_records_each_launch_as_the_real_call_passes_it_and_changes_nothing(case):
    fn, make = CASES[case]
    args = make()
    mod = _compiled(fn, args)
    assert len(mod.kernels) >= 1
    before = [a.clone() for a in args]
    rng = torch.get_rng_state()
    recorded = precompile._dry_run(mod, args)
    assert recorded is not None
    # nothing ran: the inputs and the generator are as they were
    for a, b in zip(args, before):
        assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), rng)
    assert _specs(recorded) == _real_launches(mod, [a.clone() for a in args])


def test_misaligned_inputs_are_recorded_misaligned():
    # the graph compiled for aligned inputs, called with one at an odd offset
    x, w = torch.randn(9, 11), torch.randn(9, 5)
    mod = _compiled(_views, (x, w))
    odd = torch.randn(9 * 11 + 1)[1:].view(9, 11)
    recorded = precompile._dry_run(mod, (odd, w))
    assert _specs(recorded) == _real_launches(mod, (odd, w))
    assert any(not s.aligned for specs in recorded.values() for s in specs if isinstance(s, precompile._Spec))


def test_what_a_launcher_compiles_is_what_its_first_launch_would(monkeypatch):
    # one candidate where the kernel is not timed (the CPU's interpreter, a small kernel),
    # the choice already made where there is one, nothing once it has launched
    mod = _compiled(*[CASES["views"][0], CASES["views"][1]()])
    launchers = [mod.namespace[n] for n in mod.wrapper.launchers]
    assert all(isinstance(launcher, Launcher) for launcher in launchers)
    for launcher in launchers:
        assert precompile._to_compile(launcher) == []      # (launched by the first call)
        launcher.kwargs = None
        got = precompile._to_compile(launcher)
        assert len(got) == 1 and repr(got[0]) in map(repr, launcher.configs)


def test_no_precompile_without_a_gpu_or_when_switched_off(monkeypatch):
    fn, make = CASES["views"]
    mod = _compiled(fn, make())
    assert precompile.precompile(mod, make()) == 0          # (the interpreter: nothing to compile)
    monkeypatch.setattr(precompile.autotune, "_timed", lambda: True)
    monkeypatch.setattr(precompile.config, "precompile_kernels", False)
    assert not precompile._qualifies(mod)


def test_dry_run_of_an_optimizer_step_writes_no_parameter_and_no_state():
    # foreach kernels that update parameters and momentum in place: recorded, not run
    torch.manual_seed(0)
    params = [torch.randn(5, 3, requires_grad=True), torch.randn(7, requires_grad=True)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)
    opt.step()                                     # (momentum buffers exist: the compiled step reads them)
    backend.COMPILED.clear()
    frametrace.optimize(backend="triton")(opt.step)()
    mod = backend.COMPILED[-1]
    assert any(in_place(k) for k in mod.kernels)
    state = [opt.state[p]["momentum_buffer"] for p in params]
    before = [t.detach().clone() for t in params + state]
    assert precompile._dry_run(mod, _step_inputs(mod, params, state))
    for t, b in zip(params + state, before):
        assert torch.equal(t.detach(), b)


def _step_inputs(mod, params, state):
    """The compiled optimizer step's arguments: the params, their grads and momentum
    buffers (and numbers), each placeholder given a tensor of its shape (which of two of
    one shape does not matter: none may be written)."""
    examples = mod.wrapper.lowered.example_inputs
    pool = {}
    for t in [p.detach() for p in params] + [p.grad for p in params] + state:
        pool.setdefault(tuple(t.shape), []).append(t)
    out = []
    for ex in examples:
        if isinstance(ex, torch.Tensor):
            out.append(pool[tuple(ex.shape)].pop(0) if pool.get(tuple(ex.shape)) else torch.zeros_like(ex))
        else:
            out.append(ex)
    return out
