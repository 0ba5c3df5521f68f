"""Optimizer steps traced: torch.optim's AdamW/Adam/SGD (foreach and for-loop), a
hand-written AdamW, LR schedulers, zero_grad, whole training steps.

Differential over several steps: the same model and optimizer are built twice from the
same seed (a deep copy would share the LR scheduler's patched `step`, which holds the
original optimizer), one side runs in CPython and the other compiled, with the same
data; after every step parameters, gradients and optimizer state must agree.  Graph
counts: the first step differs (torch.optim initializes its state lazily, SGD its
momentum buffers in the step), so a step compiles twice and never again; a Python step
counter starting at 0 is specialized at 0 and 1 (as sizes are) and symbolic from its
third value."""
import sys

import pytest
import torch

import frametrace
from frametrace import _C, convert

from differential import Report, same


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def run_steps(make, fn, steps=4, prep=None, backend="eager", atol=1e-6):
    """`fn(*make())` for `steps` steps in CPython and compiled (prep(*objs, x) runs
    eagerly on both sides first: the forward and backward outside), compared after
    every step.  Returns the Report with `per_step`, the compiles each step made."""
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    comp = make()
    counter = frametrace.testing.CompileCounter(inner=backend)
    target = frametrace.optimize(backend=counter)(fn)
    records, before = [], convert.counters["internal_error"]
    per_step = []
    convert.record_observers.append(records.append)
    try:
        for i in range(steps):
            x = torch.randn(6, 4, generator=torch.Generator().manual_seed(i))
            args_e, args_c = (eager, comp) if prep is not None else ((*eager, x), (*comp, x))
            if prep is not None:
                prep(*eager, x)
                prep(*comp, x)
            want = fn(*args_e)
            n = len(records)
            got = target(*args_c)
            per_step.append(len(records) - n)
            diff = same(want, got, "return value", atol=atol) or \
                same(_snap(eager), _snap(comp), f"after step {i}", atol=atol)
            assert diff is None, diff
    finally:
        convert.record_observers.remove(records.append)
    report = Report(counter, records, convert.counters["internal_error"] - before)
    report.per_step = per_step
    assert report.internal_errors == 0, report
    return report


def _snap(objs):
    out = []
    for o in objs:
        if isinstance(o, torch.nn.Module):
            out.append({k: (v.detach(), v.grad) for k, v in o.named_parameters()})
        elif isinstance(o, torch.optim.Optimizer):
            sd = o.state_dict()
            out.append((sd["state"], sd["param_groups"]))
        elif isinstance(getattr(o, "state", None), dict):       # a hand-written optimizer
            out.append(({k: v for k, v in vars(o).items() if k not in ("state", "params")},
                        list(o.state.values())))
        else:
            out.append(o.state_dict())
    return out


def backward(m, opt, x):
    m(x).sum().backward()


def step(m, opt):
    opt.step()


def step_zero(m, opt):
    opt.step()
    opt.zero_grad(set_to_none=True)


def train(m, opt, x):
    loss = m(x).pow(2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


OPTIMIZERS = {
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True),
    "adamw_loop": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
    "adamw_default": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "adamw_tensor_lr": lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01), foreach=False),
    "adam_foreach_amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, amsgrad=True,
                                                        foreach=True),
    "adam_loop": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=False),
    "sgd_foreach_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True,
                                                       weight_decay=0.1, foreach=True),
    "sgd_loop_momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=False),
}
# SGD without momentum has no state: its one step compiles once.
PLAIN = {"sgd_foreach": lambda ps: torch.optim.SGD(ps, lr=0.01, foreach=True),
         "sgd_loop": lambda ps: torch.optim.SGD(ps, lr=0.01, foreach=False)}


def _make(opt_factory):
    def make():
        m = mlp()
        return m, opt_factory(m.parameters())
    return make


@pytest.mark.parametrize("name,backend", [(n, "aot_eager") for n in sorted(OPTIMIZERS)] +
                         [("adamw_foreach", "eager"), ("sgd_loop_momentum", "eager")])
def test_optimizer_step_is_one_graph_without_recompiles(name, backend):
    r = run_steps(_make(OPTIMIZERS[name]), step, steps=4, prep=backward, backend=backend)
    assert r.breaks == 0 and r.fallbacks == 0, r
    # Step 1 initializes the state; from step 2 one graph serves every step.
    assert r.per_step == [1, 1, 0, 0] and r.graphs == 2, (r, r.per_step)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", ["Adamax", "NAdam", "Adagrad", "Adadelta", "RMSprop", "Rprop"])
def test_other_torch_optimizers_compile_without_breaks(name, foreach):
    def make():
        m = mlp()
        return m, getattr(torch.optim, name)(m.parameters(), foreach=foreach)
    r = run_steps(make, step, steps=3, prep=backward, backend="aot_eager", atol=1e-5)
    assert r.breaks == 0 and r.fallbacks == 0 and r.per_step[2] == 0, (r, r.per_step)


def test_asgd_with_data_dependent_steps_breaks_without_internal_errors():
    # ASGD's for-loop step reads its state with .item() (graph breaks) and makes a float
    # AOTAutograd cannot keep symbolic: the break's graph is rebuilt static, not given up.
    def make():
        m = mlp()
        return m, torch.optim.ASGD(m.parameters(), foreach=False)
    r = run_steps(make, step, steps=4, prep=backward, backend="aot_eager", atol=1e-5)
    assert r.graphs >= 1 and sum(r.per_step[2:]) == 0, (r, r.per_step)


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_stateless_sgd_step_compiles_once(name):
    r = run_steps(_make(PLAIN[name]), step, steps=4, prep=backward)
    assert r.breaks == 0 and r.per_step == [1, 0, 0, 0] and r.graphs == 1, (r, r.per_step)


@pytest.mark.parametrize("name", ["adamw_foreach", "sgd_loop_momentum"])
def test_step_and_zero_grad_in_one_graph(name):
    r = run_steps(_make(OPTIMIZERS[name]), step_zero, steps=4, prep=backward, backend="aot_eager")
    assert r.breaks == 0 and r.per_step == [1, 1, 0, 0] and r.graphs == 2, (r, r.per_step)


@pytest.mark.parametrize("foreach", [False, True])
def test_zero_grad_keeping_grads_zeroes_them_in_the_graph(foreach):
    def step_zero_keep(m, opt):
        opt.step()
        opt.zero_grad(set_to_none=False)

    def make():
        m = mlp()
        return m, torch.optim.AdamW(m.parameters(), lr=0.01, foreach=foreach)
    r = run_steps(make, step_zero_keep, steps=4, prep=backward, backend="aot_eager")
    assert r.breaks == 0 and r.per_step == [1, 1, 0, 0], (r, r.per_step)


def test_optimize_the_bound_step_itself():
    torch.manual_seed(0)
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True)
    ref_m = mlp()
    ref_m.load_state_dict(m.state_dict())
    ref = torch.optim.AdamW(ref_m.parameters(), lr=0.01, foreach=True)
    counter = frametrace.testing.CompileCounter()
    compiled = frametrace.optimize(backend=counter)(opt.step)
    for i in range(4):
        x = torch.randn(5, 4)
        m(x).sum().backward()
        ref_m(x).sum().backward()
        compiled()
        ref.step()
        for p, q in zip(m.parameters(), ref_m.parameters()):
            torch.testing.assert_close(p, q)
    assert counter.frame_count == 2
    # The updates are foreach ops, in place on the parameters and the state.
    code = counter.graphs[-1].code
    assert "_foreach_lerp_" in code and "_foreach_add_" in code, code


@pytest.mark.parametrize("name", ["adamw_foreach", "sgd_foreach_nesterov", "adam_loop"])
def test_training_step_compiled_whole(name):
    # backward() is a graph break (the backward runs as autograd runs it); the step
    # after it is compiled, and the parameters match CPython's after 3 steps.
    r = run_steps(_make(OPTIMIZERS[name]), train, steps=3, backend="aot_eager")
    assert r.breaks == 1 and "backward" in r.reasons()[0], r
    assert r.per_step[2] == 0, r.per_step


class HandAdamW:
    def __init__(self, params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, wd=0.01):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, wd
        self.t = 0
        self.state = {}

    def step(self):
        self.t += 1
        b1, b2 = self.betas
        with torch.no_grad():
            for p in self.params:
                if p.grad is None:
                    continue
                if p not in self.state:
                    self.state[p] = {"m": torch.zeros_like(p), "v": torch.zeros_like(p)}
                s = self.state[p]
                p.mul_(1 - self.lr * self.wd)
                s["m"].lerp_(p.grad, 1 - b1)
                s["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                bc1 = 1 - b1 ** self.t
                bc2 = 1 - b2 ** self.t
                p.addcdiv_(s["m"], (s["v"] / bc2).sqrt() + self.eps, value=-self.lr / bc1)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_hand_written_adamw_with_python_step_counter(backend):
    def make():
        m = mlp()
        return m, HandAdamW(m.parameters())
    r = run_steps(make, step, steps=6, prep=backward, backend=backend)
    assert r.breaks == 0 and r.fallbacks == 0, r
    # t = 0 and 1 are specialized; from t = 2 the counter is a symbol.
    assert r.per_step == [1, 1, 1, 0, 0, 0], r.per_step


def test_hand_written_step_skips_parameters_without_grad():
    def make():
        m = mlp()
        m[2].bias.requires_grad_(False)
        return m, HandAdamW(m.parameters())
    r = run_steps(make, step, steps=4, prep=backward)
    assert r.breaks == 0 and r.per_step[3] == 0, (r, r.per_step)


def functional_adamw(model, st, lr=0.01, b1=0.9, b2=0.999):
    st["t"] += 1
    t = st["t"]
    for p in model.parameters():
        if p.grad is None:
            continue
        if p not in st["m"]:
            st["m"][p] = torch.zeros_like(p)
            st["v"][p] = torch.zeros_like(p)
        m, v = st["m"][p], st["v"][p]
        with torch.no_grad():
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.sub_(lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + 1e-8))


def test_adamw_over_model_parameters_with_state_keyed_by_parameter(monkeypatch):
    # The state dict is made empty, filled in the first compiled call (keys: the
    # parameters) and read back, keyed by tensors, in the next ones; the step count
    # is a dict entry.
    def make():
        return mlp(), {"t": 0, "m": {}, "v": {}}

    def snap(objs):
        m, st = objs
        return [{k: v.detach() for k, v in m.named_parameters()}, st["t"],
                list(st["m"].values()), list(st["v"].values())]
    monkeypatch.setattr(sys.modules[__name__], "_snap", snap)
    r = run_steps(make, functional_adamw, steps=6, prep=lambda m, st, x: m(x).sum().backward())
    assert r.breaks == 0 and r.per_step == [1, 1, 1, 0, 0, 0], (r, r.per_step)


def _with_scheduler():
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True)
    return m, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def test_lr_scheduler_between_compiled_steps():
    def prep(m, opt, sched, x):
        m(x).sum().backward()
        if opt.state:                   # (after the first step, as a training loop does)
            sched.step()

    def opt_step(m, opt, sched):
        opt.step()
    r = run_steps(_with_scheduler, opt_step, steps=8, prep=prep)
    # Step 1 makes the state, step 2 reads it; the float lr first changes at step 3, and
    # that compile makes it symbolic.
    assert r.breaks == 0 and r.per_step == [1, 1, 1, 0, 0, 0, 0, 0], r.per_step


def test_lr_scheduler_stepped_inside_the_compiled_function():
    def prep(m, opt, sched, x):
        m(x).sum().backward()

    def opt_step(m, opt, sched):
        opt.step()
        sched.step()
    r = run_steps(_with_scheduler, opt_step, steps=8, prep=prep)
    assert r.breaks == 0 and r.graphs <= 4 and sum(r.per_step[4:]) == 0, (r, r.per_step)


def test_changed_lr_float_is_read_correctly():
    def prep(m, opt, x):
        m(x).sum().backward()
        opt.param_groups[0]["lr"] *= 0.5 if x[0, 0] > 0 else 2.0
    # (Compiled, the bias corrections are float32 tensor arithmetic on the step tensor
    # where CPython uses Python floats, as under torch.compile: a few ulps, which a
    # growing lr magnifies.)
    r = run_steps(_make(OPTIMIZERS["adamw_loop"]), step, steps=5, prep=prep, atol=1e-5)
    assert r.breaks == 0 and r.graphs <= 3, r


def test_new_param_group_and_new_parameter_recompile():
    def make():
        m = mlp()
        extra, more = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1)
        return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, foreach=True), extra, more

    def prep(m, opt, extra, more, x):
        extra.n = getattr(extra, "n", 0) + 1
        if extra.n == 3:
            opt.add_param_group({"params": list(extra.parameters()), "lr": 0.05})
        if extra.n == 5:
            opt.param_groups[1]["params"].append(more.weight)
        (m(x).sum() + extra(x).sum() + more(x).sum()).backward()

    def opt_step(m, opt, extra, more):
        opt.step()
        opt.zero_grad()
    r = run_steps(make, opt_step, steps=7, prep=prep)
    # Steps 1, 2 (state), 3, 4 (the new group, its state), 5, 6 (the new parameter, its
    # state); never a stale graph (the values are compared after every step).
    assert r.breaks == 0 and r.per_step[-1] == 0 and r.graphs <= 6, (r, r.per_step)


def test_lookup_in_dict_keyed_by_tensors_sees_a_key_become_the_tensor_looked_up():
    from differential import check

    def f(state, p, q):
        if p in state:
            return state[p] * 2
        return q + 1
    k, p, v, q = torch.randn(3), torch.randn(3), torch.randn(3), torch.randn(3)
    # Call 1: p is another tensor than the key; call 2: the key is p itself.
    check(f, [({k: v}, p, q), ({p: v}, p, q), ({k: v}, p, q)])


def test_optimizer_made_and_stepped_in_the_compiled_function():
    from differential import check

    def make_and_step(m, x):
        opt = torch.optim.AdamW(m.parameters(), lr=0.01)
        m(x).sum().backward()
        opt.step()
        return opt.state[m[0].weight]["exp_avg"]
    torch.manual_seed(0)
    r = check(make_and_step, [(mlp(), torch.randn(4, 4)), (mlp(), torch.randn(2, 4))])
    assert r.breaks >= 1 and all("backward" in why for why in r.reasons()), r


def test_step_traced_after_torch_dynamo_disabled_init_group():
    # Once torch._dynamo is used in the process (torch.compile beside frametrace), it
    # wraps every optimizer's _init_group in its own disable: still our plain Python.
    import torch._dynamo.eval_frame
    torch._dynamo.eval_frame.TorchPatcher.patch()
    assert getattr(torch.optim.AdamW._init_group, "_torchdynamo_disable", False)
    r = run_steps(_make(OPTIMIZERS["adamw_foreach"]), step_zero, steps=3, prep=backward)
    assert r.breaks == 0 and r.per_step == [1, 1, 0], (r, r.per_step)


def test_optimizer_state_changed_between_steps_is_seen_by_the_c_check():
    # The step's guards read the state as [*opt.state.keys()][i] and
    # [*opt.state.values()][i] in C (one list of each per check), and its hook tables
    # as their keys: each change below, made between compiled steps the same way on
    # both sides, must be seen (the values are compared after every step).
    def prep(m, opt, x):
        m(x).sum().backward()
        n = getattr(opt, "n", 0) + 1
        opt.n = n
        params = list(m.parameters())
        if n == 3:      # a state entry's tensors replaced by others
            st = opt.state[params[0]]
            opt.state[params[0]] = {k: v * 2 if k != "step" else v.clone() for k, v in st.items()}
        if n == 4:      # the state's order changed: key i is another parameter (of the same shape)
            for p in params[:2]:
                opt.state[p] = opt.state.pop(p)
        if n == 5:      # a step pre-hook registered after compiling runs
            def halve_grads(o, args, kwargs):
                for p in params:
                    p.grad.mul_(0.5)
            opt.register_step_pre_hook(halve_grads)
        if n == 7:      # a parameter's state dropped: the step makes it again
            del opt.state[params[2]]

    def opt_step(m, opt):
        opt.step()
        opt.zero_grad(set_to_none=True)
    def make():
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
        return m, torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True)
    r = run_steps(make, opt_step, steps=9, prep=prep, atol=1e-5)
    assert r.breaks == 0 and r.per_step[1] == 1 and r.per_step[3] == 1, r.per_step
    # the steady entry's guards all run in C
    names = {i: n for n, i in _C.GUARD_OPS.items()}
    entries = [e.check for e in _C.entries(opt_step.__code__)]
    assert any("DVIEW" in {names[i[0]] for i in c.program} and c.residual is None for c in entries)
