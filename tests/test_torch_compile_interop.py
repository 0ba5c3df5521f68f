"""frametrace beside torch.compile: each compiler leaves the other's frames alone, both
ways round, with right values and nothing printed (no tracer tracebacks)."""
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import frametrace
from differential import check


@pytest.fixture(autouse=True)
def quiet(capfd):
    """Both compilers start fresh, and the test prints nothing on stderr: no traceback,
    no 'internal error' line from either compiler."""
    torch._dynamo.reset()
    yield
    err = capfd.readouterr().err
    torch._dynamo.reset()
    for bad in ("Traceback", "internal error", "InternalTorchDynamoError"):
        assert bad not in err, err


def dynamo_counter():
    return torch._dynamo.testing.CompileCounter()


def g(x):
    return x.sin() + 1


def test_optimized_function_calling_a_torch_compiled_one():
    counter = dynamo_counter()
    cg = torch.compile(g, backend=counter)

    def f(x):
        y = cg(x * 2)
        return y * 3

    r = check(f, [torch.randn(4), torch.randn(4), torch.randn(4)])
    # Our graphs on both sides of the call; torch.compile compiled g, once.
    assert r.breaks == 1 and r.graphs == 2, r
    assert any("compiled by torch.compile" in reason for reason in r.reasons()), r
    assert counter.frame_count == 1


def test_a_user_backend_of_torch_compile_is_not_traced_by_us():
    seen = []

    def my_backend(gm, example_inputs):      # user code that torch.compile's compiler runs
        seen.append(len(gm.graph.nodes))
        return gm.forward

    cg = torch.compile(g, backend=my_backend)

    def f(x):
        return cg(x + 1) * 2

    r = check(f, [torch.randn(4), torch.randn(4)])
    assert len(seen) == 1, seen
    assert {rec.code.co_name for rec in r.records} <= {"f"} | {
        rec.code.co_name for rec in r.records if rec.code.co_name.startswith("__resume")}, r.records


def test_optimize_of_a_torch_compiled_function_leaves_it_to_torch_compile():
    counter = dynamo_counter()

    def h(x):
        return x.cos() * 2

    compiled = torch.compile(h, backend=counter)
    r = check(h, [torch.randn(3), torch.randn(3)], graphs=0,
              compiled=lambda c: frametrace.optimize(compiled, backend=c))
    assert r.compiles == 0 and counter.frame_count == 1, r


def test_torch_compile_of_an_optimized_function_leaves_it_to_frametrace():
    counter = dynamo_counter()

    def h(x):
        return x.cos() * 2 + x

    r = check(h, [torch.randn(3), torch.randn(3)],
              compiled=lambda c: torch.compile(frametrace.optimize(h, backend=c), backend=counter))
    assert r.graphs == 1 and r.compiles == 1, r
    assert counter.frame_count == 0       # torch.compile saw no frame of ours


def test_torch_compiled_function_calling_an_optimized_one():
    counter = dynamo_counter()

    def run(c):
        inner = frametrace.optimize(lambda x: x.relu() * 2, backend=c)

        def outer(x):
            return inner(x + 1) - 1
        return torch.compile(outer, backend=counter)

    def plain(x):
        return (x + 1).relu() * 2 - 1

    r = check(plain, [torch.randn(5), torch.randn(5)], compiled=run)
    assert r.graphs == 1, r                # frametrace compiled the inner function
    assert counter.frame_count >= 1         # torch.compile the outer one, around a break


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.sub = torch.compile(torch.nn.Linear(4, 4), backend="eager")
        self.scale = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.sub(x * self.scale).relu()


def test_module_holding_a_torch_compiled_submodule():
    m = Holder()
    r = check(m, [torch.randn(2, 4), torch.randn(2, 4)],
              compiled=lambda c: frametrace.optimize(m, backend=c))
    assert r.breaks == 1 and r.graphs == 2, r
    assert any("compiled by torch.compile" in reason for reason in r.reasons()), r


def test_we_still_compile_after_torch_compile_raised():
    """torch.compile can leave its hook installed after an error (an eager torch.cond
    whose branch has a side effect): ours is installed over it all the same."""
    log = []

    def branch(a):
        log.append(1)
        return a.sin()
    with pytest.raises(Exception):
        torch.cond(torch.tensor(True), branch, lambda a: a.cos(), (torch.ones(2),))

    def f(x):
        return x.sin() + 1
    check(f, [torch.randn(3), torch.randn(3)], graphs=1, compiles=1)


def test_fullgraph_names_the_torch_compiled_call():
    cg = torch.compile(g, backend="eager")
    f = frametrace.optimize(lambda x: cg(x) + 1, fullgraph=True)
    with pytest.raises(frametrace.Unsupported, match="compiled by torch.compile"):
        f(torch.randn(3))


# --------------------------------------------------------------------------- torch.compiler.disable
def helper(x):
    return x * 5


@torch.compiler.disable
def disabled(x):
    return helper(x) + 1


def test_a_torch_compiler_disabled_function_and_its_callees_run_unhooked():
    def f(x):
        return disabled(x.cos()) * 2

    r = check(f, [torch.randn(3), torch.randn(3)])
    assert r.breaks == 1 and r.graphs == 2, r
    names = {rec.code.co_name for rec in r.records}
    assert "disabled" not in names and "helper" not in names, names
    assert any("torch.compiler.disable" in reason for reason in r.reasons()), r


def test_a_non_recursively_disabled_function_leaves_its_callees_to_us():
    @torch.compiler.disable(recursive=False)
    def shallow(x):
        return helper(x) + 1

    def f(x):
        return shallow(x.cos()) * 2

    r = check(f, [torch.randn(3), torch.randn(3)])
    names = [rec.code.co_name for rec in r.records]
    assert "shallow" not in names and "helper" in names, names


def test_is_compiling_is_true_in_the_trace_and_false_at_run_time():
    def f(x):
        return x + (1 if torch.compiler.is_compiling() else 0)

    g_ = frametrace.optimize(f)
    assert g_(torch.zeros(1)).item() == 1
    assert torch.compiler.is_compiling() is False


def test_the_interop_example_runs_clean():
    import os
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).parents[1]
    paths = [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # (torch warns on CPython 3.13.0 itself that its guards may run slower: not ours)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
           "PYTHONWARNINGS": "ignore:Guards may run slower:RuntimeWarning"}
    out = subprocess.run([sys.executable, str(root / "examples" / "torch_compile_interop.py")],
                         capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "all values equal under both compilers" in out.stdout
