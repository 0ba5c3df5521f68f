"""frametrace.set_stance and torch.compiler.set_stance: force_eager runs optimized calls
as plain CPython (no compile, no entry used), eager_on_recompile uses entries that fit
and compiles nothing, fail_on_recompile raises naming the guard that failed."""
import pytest
import torch
from differential import check

import frametrace
from frametrace.testing import CompileCounter


class Runs(CompileCounter):
    """Counts compiles and the runs of the compiled graphs."""

    def clear(self):
        super().clear()
        self.runs = 0

    def __call__(self, gm, example_inputs):
        compiled = super().__call__(gm, example_inputs)

        def run(*args):
            self.runs += 1
            return compiled(*args)
        return run


def f(x, n):
    return (x * n).sin()


@pytest.fixture(autouse=True)
def _default_stances():
    yield
    frametrace.set_stance("default")
    if "torch._dynamo.eval_frame" in __import__("sys").modules:
        torch.compiler.set_stance("default")


def _loop(g, calls):
    for x, n in calls:
        torch.testing.assert_close(g(x, n), f(x, n))


def test_force_eager_uses_no_entry_and_compiles_nothing():
    cnt = Runs()
    g = frametrace.optimize(backend=cnt)(f)
    x = torch.randn(4)
    _loop(g, [(x, 2)])
    assert (cnt.frame_count, cnt.runs) == (1, 1)
    with frametrace.set_stance("force_eager"):
        _loop(g, [(x, 2), (x, 3), (torch.randn(7), 2)] * 2)
    assert (cnt.frame_count, cnt.runs) == (1, 1)
    _loop(g, [(x, 2)])
    assert (cnt.frame_count, cnt.runs) == (1, 2)      # back to default after the block


def test_plain_call_and_decorator():
    cnt = Runs()
    g = frametrace.optimize(backend=cnt)(f)
    x = torch.randn(4)
    frametrace.set_stance("force_eager")
    _loop(g, [(x, 2)] * 3)
    assert cnt.frame_count == 0
    frametrace.set_stance("default")
    _loop(g, [(x, 2)] * 3)
    assert (cnt.frame_count, cnt.runs) == (1, 3)

    @frametrace.set_stance("force_eager")
    def eager_loop():
        _loop(g, [(x, 2)] * 3)
    _loop(g, [(x, 2)])          # decorating set nothing
    assert cnt.runs == 4
    eager_loop()
    assert (cnt.frame_count, cnt.runs) == (1, 4)
    _loop(g, [(x, 2)])
    assert cnt.runs == 5


def test_unknown_stance():
    with pytest.raises(ValueError, match="unknown stance 'eager'"):
        frametrace.set_stance("eager")


def test_force_eager_of_a_module_differential():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with frametrace.set_stance("force_eager"):
        r = check(lambda x: model(x), [torch.randn(2, 4), torch.randn(3, 4)], graphs=0, compiles=0)
    r = check(lambda x: model(x), [torch.randn(2, 4), torch.randn(2, 4)], compiles=1)
    assert r.graphs == 1


def test_eager_on_recompile_runs_entries_that_fit_and_compiles_nothing():
    cnt = Runs()
    g = frametrace.optimize(backend=cnt, dynamic=False)(f)
    x = torch.randn(4)
    _loop(g, [(x, 2)])
    with frametrace.set_stance("eager_on_recompile"):
        _loop(g, [(x, 2), (torch.randn(6), 2), (x, 5), (x, 2)] * 3)
    assert cnt.frame_count == 1 and cnt.runs == 1 + 6
    _loop(g, [(torch.randn(6), 2)] * 2)                 # default again: compiles
    assert cnt.frame_count == 2


def test_fail_on_recompile_raises_naming_the_guard():
    cnt = Runs()
    g = frametrace.optimize(backend=cnt, dynamic=False)(f)
    x = torch.randn(8)
    _loop(g, [(x, 2)])
    with frametrace.set_stance("fail_on_recompile"):
        _loop(g, [(x, 2)] * 3)                          # entries that fit run
        with pytest.raises(frametrace.RecompileError) as info:
            g(torch.randn(16), 2)
    assert "fail_on_recompile" in str(info.value)
    assert f"f ({__file__}:{f.__code__.co_firstlineno}): x.size(0): 8 → 16" in str(info.value)
    assert info.value.reasons and info.value.reasons[0].startswith("x.size(0): 8 → 16")
    assert cnt.frame_count == 1 and cnt.runs == 4
    _loop(g, [(torch.randn(16), 2)])                    # default again
    assert cnt.frame_count == 2


def test_torch_compiler_set_stance_is_honoured():
    cnt = Runs()
    g = frametrace.optimize(backend=cnt, dynamic=False)(f)
    x = torch.randn(4)
    _loop(g, [(x, 2)])
    with torch.compiler.set_stance("force_eager"):
        _loop(g, [(x, 2), (torch.randn(5), 3)] * 2)
    assert (cnt.frame_count, cnt.runs) == (1, 1)
    torch.compiler.set_stance("force_eager")
    _loop(g, [(x, 2)])
    torch.compiler.set_stance("default")
    assert (cnt.frame_count, cnt.runs) == (1, 1)
    with torch.compiler.set_stance("eager_on_recompile"):
        _loop(g, [(x, 2), (torch.randn(5), 3)] * 2)
    assert (cnt.frame_count, cnt.runs) == (1, 3)
    with torch.compiler.set_stance("fail_on_recompile"):
        with pytest.raises(frametrace.RecompileError, match=r"x.size\(0\): 4 → 9"):
            g(torch.randn(9), 2)
    _loop(g, [(x, 2)])
    assert (cnt.frame_count, cnt.runs) == (1, 4)


def test_frametrace_stance_wins_over_torchs():
    cnt = Runs()
    g = frametrace.optimize(backend=cnt, dynamic=False)(f)
    x = torch.randn(4)
    _loop(g, [(x, 2)])
    with torch.compiler.set_stance("force_eager"), frametrace.set_stance("eager_on_recompile"):
        _loop(g, [(x, 2), (torch.randn(3), 2)])
    assert (cnt.frame_count, cnt.runs) == (1, 2)


def test_a_training_loop_after_warm_up_never_recompiles():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cnt = CompileCounter()
    step_model = frametrace.optimize(model, backend=cnt)
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(6)]
    losses = []
    for i, (x, y) in enumerate(data):
        stance = "default" if i < 2 else "fail_on_recompile"
        with frametrace.set_stance(stance):
            loss = torch.nn.functional.mse_loss(step_model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert cnt.frame_count == 1 and len(losses) == 6
