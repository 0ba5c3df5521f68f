"""Whole training loops with an LR scheduler (or an lr set by hand, a step pre-hook
counting calls): the hyperparameters torch.optim reads from `param_groups` change
between steps, and a float (or int) read from state that outlives the call -- a
global, a closure cell, an object's attribute, an argument -- becomes a symbolic graph
input once it has changed, so the loop compiles its warm-up entries and then never
again (issue 30, items 1 and 9).

Each program is source text executed twice into fresh namespaces built from the same
seed: one runs in CPython, the other with its training function compiled.  (The
objects are built twice rather than deep-copied: a scheduler patches `opt.step` with a
closure holding a weak reference to its optimizer, which a deep copy would share.)
After every step the parameters and optimizer state of both sides must agree; over
the loop we count the compiles made after warm-up, the graphs, the frames left to
CPython and the cache-limit warnings."""
import enum
import types
import warnings

import pytest
import torch

import frametrace
from frametrace import convert, shapes

from differential import same


def _load(src, name):
    mod = types.ModuleType(name)
    exec(compile(src, f"<{name}>", "exec"), mod.__dict__)
    return mod


def _params(mod):
    return [p.detach().clone() for p in mod.model.parameters()]


def _opt_state(mod):
    sd = mod.opt.state_dict()
    return sd["state"], sd["param_groups"]


def run_loop(src, steps=40, backend="eager", compiled=("train_step",), warmup=2,
             rtol=1e-5, atol=1e-5, exact=False):
    """Run `loop(i)` of program `src` for `steps` steps in CPython and with the names in
    `compiled` (attributes of the namespace, dotted) compiled; compare after every step.
    Returns (per-step compile counts, CompileCounter, records).  Adam's bias
    corrections are float32 tensor arithmetic compiled where CPython uses Python floats
    (as under torch.compile): a relative 1e-5 on its first steps, hence `atol`; a stale
    learning rate would be off by percents.  `exact`: bit for bit."""
    torch.manual_seed(0)
    eager = _load(src, "eager_program")
    torch.manual_seed(0)
    comp = _load(src, "compiled_program")
    counter = frametrace.testing.CompileCounter(inner=backend)
    for name in compiled:
        *path, last = name.split(".")
        holder = comp
        for p in path:
            holder = getattr(holder, p)
        setattr(holder, last, frametrace.optimize(backend=counter)(getattr(holder, last)))
    records, per_step = [], []
    errors = convert.counters["internal_error"]
    convert.record_observers.append(records.append)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(steps):
                want = eager.loop(i)
                n = len(records)
                got = comp.loop(i)
                per_step.append(len(records) - n)
                where = f"step {i}"
                if exact:
                    for a, b in zip(_params(eager), _params(comp)):
                        assert torch.equal(a, b), f"{where}: parameters differ\n{a}\n{b}"
                diff = same(want, got, f"{where}: value", rtol=rtol, atol=atol) or \
                    same(_params(eager), _params(comp), f"{where}: parameters", rtol=rtol, atol=atol) or \
                    same(_opt_state(eager), _opt_state(comp), f"{where}: optimizer", rtol=rtol, atol=atol)
                assert diff is None, diff
    finally:
        convert.record_observers.remove(records.append)
    assert convert.counters["internal_error"] == errors, "internal tracer errors"
    limit = [str(w.message) for w in caught if str(w.message).startswith("frametrace") and
             ("cache limit" in str(w.message) or "recompiled" in str(w.message))]
    assert not limit, limit
    assert not [r for r in records if r.outcome == "fallback"], \
        [(r.code.co_name, r.reason) for r in records if r.outcome == "fallback"]
    assert counter.frame_count >= 1
    # After warm-up (the first step makes the optimizer's state, the second reads it)
    # at most one compile: the one that makes the changing numbers symbolic.
    assert sum(per_step[warmup:]) <= 1, per_step
    return per_step, counter, records


BACKENDS = ["eager", "aot_eager"]

# On aot_eager, floats that reach ops AOTAutograd's float-to-tensor rewrite cannot
# handle (SGD's `add_(grad, alpha=-lr)`, Adam's `lerp_(grad, 1 - beta1)` and `beta1 **
# step`) stay Python floats (config.aot_eager_keeps_python_floats); with the rewrite
# AOTAutograd asks for them as constants and every value recompiles.

# A global optimizer and scheduler; the whole step (forward, backward, step) compiled,
# the scheduler stepped after it, outside (issue 30's report).
COSINE = '''
import torch
model = torch.nn.Linear(4, 3)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7)

def train_step(x, y):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss.detach()

def loop(i):
    g = torch.Generator().manual_seed(i)
    loss = train_step(torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g))
    sched.step()
    return loss
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_cosine_schedule_with_a_global_optimizer(backend):
    per_step, counter, _ = run_loop(COSINE, steps=50, backend=backend)
    # train_step breaks at backward(): itself and its resume, twice each in warm-up.
    assert counter.frame_count <= 5, (counter.frame_count, per_step)


SGD_COSINE = COSINE.replace("torch.optim.AdamW(model.parameters(), lr=0.05)",
                            "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, "
                            "weight_decay=0.01)")


def test_cosine_schedule_on_sgd_is_exact():
    # No step counter tensor in SGD: compiled gives eager's bits, the changing lr included.
    run_loop(SGD_COSINE, steps=30, exact=True)


# Only opt.step compiled (the scheduler's patched wrapper), warm-up then a cosine
# schedule: LinearLR then CosineAnnealingLR in a SequentialLR.
WARMUP = '''
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[5])
train_step = opt.step

def loop(i):
    g = torch.Generator().manual_seed(i)
    model(torch.randn(6, 4, generator=g)).pow(2).mean().backward()
    train_step()
    opt.zero_grad()
    sched.step()
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_warmup_then_cosine_with_only_the_step_compiled(backend):
    per_step, counter, _ = run_loop(WARMUP, steps=40, backend=backend)
    assert counter.frame_count <= 3, (counter.frame_count, per_step)


# OneCycleLR on Adam cycles betas[0] as well as lr.
ONECYCLE = '''
import torch
model = torch.nn.Linear(4, 3)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=60)
train_step = opt.step

def loop(i):
    g = torch.Generator().manual_seed(i)
    model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
    train_step()
    opt.zero_grad()
    sched.step()
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_cycle_on_adam_cycles_lr_and_betas(backend):
    per_step, counter, _ = run_loop(ONECYCLE, steps=40, backend=backend)
    assert counter.frame_count <= 3, (counter.frame_count, per_step)


# An lr set by hand between steps on a global optimizer.
BY_HAND = '''
import torch
model = torch.nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)

def train_step(x):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()

def loop(i):
    opt.param_groups[0]["lr"] = 0.1 * 0.9 ** i
    return train_step(torch.randn(5, 4, generator=torch.Generator().manual_seed(i)))
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_lr_set_by_hand_on_a_global_sgd(backend):
    run_loop(BY_HAND, steps=30, backend=backend, exact=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lr_set_by_hand_on_a_global_adamw(backend):
    src = BY_HAND.replace("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)",
                          "torch.optim.AdamW(model.parameters(), lr=0.1)")
    run_loop(src, steps=30, backend=backend)


# A step pre-hook counting steps in a global dict: the count is an int that changes
# every step.
HOOK = '''
import torch
model = torch.nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = {"n": 0}

def count(optimizer, args, kwargs):
    calls["n"] += 1

opt.register_step_pre_hook(count)
train_step = opt.step

def loop(i):
    model(torch.randn(5, 4, generator=torch.Generator().manual_seed(i))).sum().backward()
    train_step()
    opt.zero_grad()
    return calls["n"]
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_pre_hook_counter(backend):
    per_step, counter, _ = run_loop(HOOK, steps=30, backend=backend, exact=True)
    assert counter.frame_count <= 3, (counter.frame_count, per_step)


# Where the optimizer lives: an argument, a closure cell, an object's attribute.
ARGUMENT = '''
import torch
model = torch.nn.Linear(4, 3)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7)

def train_step(model, opt, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()

def loop(i):
    loss = train_step(model, opt, torch.randn(5, 4, generator=torch.Generator().manual_seed(i)))
    sched.step()
    return loss
'''

CLOSURE = '''
import torch
model = torch.nn.Linear(4, 3)

def make():
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7)

    def train_step(x):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()
    return opt, sched, train_step

opt, sched, train_step = make()

def loop(i):
    loss = train_step(torch.randn(5, 4, generator=torch.Generator().manual_seed(i)))
    sched.step()
    return loss
'''

ATTRIBUTE = '''
import torch

class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(4, 3)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.05)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=7)

    def train_step(self, x):
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.detach()

trainer = Trainer()
model, opt = trainer.model, trainer.opt

def loop(i):
    loss = trainer.train_step(torch.randn(5, 4, generator=torch.Generator().manual_seed(i)))
    trainer.sched.step()
    return loss
'''


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["argument", "closure", "attribute"])
def test_optimizer_wherever_it_lives(where, backend):
    src, name = {"argument": (ARGUMENT, "train_step"), "closure": (CLOSURE, "train_step"),
                 "attribute": (ATTRIBUTE, "trainer.train_step")}[where]
    per_step, counter, _ = run_loop(src, steps=30, backend=backend, compiled=(name,))
    assert counter.frame_count <= 6, (counter.frame_count, per_step)


# The scheduler stepped inside the compiled function: its own counters (last_epoch,
# _step_count) are ints that change every step, its cosine a float computed from them,
# and the new lr a float64 computation on the old one (exact as CPython's).  (Its
# restart branch, at last_epoch == T_max + 1, would be one more entry: past the loop.)
INSIDE = COSINE.replace("T_max=7", "T_max=40").replace("    sched.step()\n    return loss\n", "    return loss\n").replace(
    "    opt.step()\n    return loss.detach()", "    opt.step()\n    sched.step()\n    return loss.detach()")


@pytest.mark.parametrize("backend", BACKENDS)
def test_scheduler_stepped_inside_the_compiled_function(backend):
    assert "sched.step()\n    return loss.detach()" in INSIDE
    per_step, counter, _ = run_loop(INSIDE, steps=40, backend=backend)
    assert counter.frame_count <= 6, (counter.frame_count, per_step)


# The mechanism is not the optimizer's: any float (or int) read from a global, a
# closure cell or what they hold is a constant until it changes, then a graph input.
SCALE = 0.5
SETTINGS = {"lr": 0.1, "steps": 3}


def _scaled(x):
    return x * SCALE + SETTINGS["lr"]


def _set(**values):
    """A `Then` action (the harness runs it once, before both sides of the call; the
    globals it sets are not in check's `globals`, which it would put back)."""
    def action():
        g = globals()
        for k, v in values.items():
            if k in SETTINGS:
                SETTINGS[k] = v
            else:
                g[k] = v
    return action


def test_global_float_becomes_symbolic_once_it_changed():
    from differential import Then, check
    x = torch.randn(4)
    calls = [Then(_set(SCALE=0.5, lr=0.1), x)] + \
        [Then(_set(SCALE=0.5 + i / 7, lr=0.1 * 0.9 ** i), x) for i in range(1, 12)]
    r = check(_scaled, calls, rtol=0, atol=0)
    # The first value, then the compile that makes both symbolic, then no more.
    assert r.graphs == 2 and r.breaks == 0 and r.fallbacks == 0, r


def _branchy(x):
    if SCALE > 0.75:            # a guard on the symbol, evaluated on the real number
        return x * SCALE
    return x - SCALE


def test_global_float_used_for_control_flow_guards_the_branch():
    from differential import Then, check
    x = torch.randn(4)
    values = [0.5, 0.6, 0.7, 0.8, 0.9, 0.75, 0.7500000000000001, 0.74, 1.0, 0.3]
    r = check(_branchy, [Then(_set(SCALE=v), x) for v in values], rtol=0, atol=0)
    # first value; symbolic below 0.75; symbolic above it
    assert r.graphs == 3 and r.fallbacks == 0, r


def test_global_float_through_special_values_and_other_types():
    from differential import Then, check
    x = torch.randn(4)
    class Half(float):
        pass

    class Level(enum.IntEnum):
        LOW = 2
    values = [0.5, 0.25, -0.0, 0.0, float("nan"), float("inf"), 2.0, 1, True, 3.0, -1.5,
              Half(0.5), Level.LOW, 2, 4.0]
    r = check(_scaled, [Then(_set(SCALE=v), x) for v in values], rtol=0, atol=0)
    # (a float subclass passed to a torch op is a break: CPython runs that call)
    assert r.fallbacks == 0 and r.graphs <= 8, r


def test_global_float_that_never_changes_stays_a_constant_with_dynamic_true():
    from differential import Then, check
    r = check(_scaled, [Then(_set(SCALE=0.5, lr=0.1), torch.randn(n)) for n in (3, 4, 5, 6)],
              dynamic=True)
    assert r.graphs == 1, r
    gm = r.counter.graphs[0]
    floats = [n for n in gm.graph.nodes if n.op == "placeholder" and
              isinstance(n.meta.get("example_value"), torch.SymFloat)]
    assert floats == [], floats


def _make_closure():
    box = {"scale": 0.5}
    factor = [2.0]

    def f(x):
        return x * box["scale"] * factor[0]
    return f, box, factor


def test_closure_cell_float_becomes_symbolic():
    f, box, factor = _make_closure()
    counter = frametrace.testing.CompileCounter()
    g = frametrace.optimize(backend=counter)(f)
    x = torch.randn(5)
    for i in range(12):
        box["scale"] = 0.5 + i / 3
        factor[0] = 2.0 ** -i
        assert torch.equal(g(x), f(x)), i
    assert counter.frame_count == 2, counter.frame_count


COUNTER = {"n": 0}


def _count_and_scale(x):
    COUNTER["n"] += 1
    return x * COUNTER["n"]


def test_global_int_counter_written_in_the_frame_becomes_symbolic():
    from differential import Call, check
    x = torch.randn(3)
    r = check(_count_and_scale, [Call(x)] * 12, globals=("COUNTER",), rtol=0, atol=0)
    # 0 and 1 are specialised, as sizes are; symbolic from the third value.
    assert r.graphs <= 3 and r.fallbacks == 0, r


def _scaled_sin(x, w):
    return (x * w * SCALE).sin() + SCALE


@pytest.mark.parametrize("backend", BACKENDS)
def test_symbolic_float_in_forward_and_backward(backend):
    from differential import Then, check_grads
    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    calls = [Then(_set(SCALE=0.5 + i / 9), x, w) for i in range(8)]
    r = check_grads(_scaled_sin, calls, backend=backend, rtol=0, atol=0)
    assert r.graphs == 2 and r.fallbacks == 0, r


def test_aot_eager_with_the_float_rewrite_still_gives_eager_values(monkeypatch):
    # The switch off: AOTAutograd's rewrite asks for the lr as a constant, which
    # recompiles per value (and past the cache limit runs in CPython); never a wrong value.
    monkeypatch.setattr(frametrace.config, "aot_eager_keeps_python_floats", False)
    with pytest.raises(AssertionError, match="cache limit|recompiled"):
        run_loop(BY_HAND, steps=14, backend="aot_eager", exact=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cosine_schedule_with_a_tensor_lr(backend):
    # A tensor lr is a graph input from the first step; the scheduler fills it in place.
    src = COSINE.replace("torch.optim.AdamW(model.parameters(), lr=0.05)",
                         "torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.05), foreach=False)")
    per_step, counter, _ = run_loop(src, steps=30, backend=backend)
    assert counter.frame_count <= 4 and sum(per_step[2:]) == 0, (counter.frame_count, per_step)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_cycle_on_sgd_cycles_lr_and_momentum(backend):
    src = ONECYCLE.replace("torch.optim.Adam(model.parameters(), lr=0.01)",
                           "torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-3)")
    per_step, counter, _ = run_loop(src, steps=40, backend=backend, exact=True)
    assert counter.frame_count <= 3, (counter.frame_count, per_step)


# A trainer that is itself an nn.Module, holding its optimizer and scheduler: ints of a
# module are constants (its sizes), not those of the optimizer and scheduler it holds.
MODULE_TRAINER = '''
import torch

class Trainer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(4, 3)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=40)

    def train_step(self, x):
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        return loss.detach()

trainer = Trainer()
model, opt = trainer.model, trainer.opt

def loop(i):
    return trainer.train_step(torch.randn(5, 4, generator=torch.Generator().manual_seed(i)))
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_scheduler_held_by_a_trainer_module(backend):
    per_step, counter, _ = run_loop(MODULE_TRAINER, steps=36, backend=backend,
                                    compiled=("trainer.train_step",), exact=True)
    assert counter.frame_count <= 6, (counter.frame_count, per_step)


@pytest.mark.parametrize("src", [COSINE, SGD_COSINE], ids=["adamw", "sgd"])
def test_scheduler_on_the_triton_backend_compiles_once_for_the_lr(triton_interpreter, src):
    # The triton backend (the default on CUDA) keeps the changing lr a Python float too:
    # the step's graph runs as aten ops instead of compiling again for every new lr
    # (config.triton_keeps_python_floats).  Values as CPython's after every step.
    per_step, counter, _ = run_loop(src, steps=12, backend="triton")
    assert counter.frame_count <= 5, (counter.frame_count, per_step)

