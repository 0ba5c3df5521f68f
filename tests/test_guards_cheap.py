"""Guards made cheap without losing what they see: global nn.Module hooks read as dict
items (not a Python function per call), and every kind of global hook registered after
compiling changes the compiled call as it changes CPython's."""
import pytest
import torch
from torch.nn.modules import module as module_mod

import frametrace
from differential import Then, check
from frametrace import _C

_OP_NAMES = {v: k for k, v in _C.GUARD_OPS.items()}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


def _registrations():
    seen = []

    def fwd(m, args, out):
        seen.append(type(m).__name__)
        return out * 2

    def pre(m, args):
        seen.append(type(m).__name__)
        return (args[0] + 1,)

    def bwd(m, gin, gout):
        seen.append(type(m).__name__)

    def bwd_pre(m, gout):
        seen.append(type(m).__name__)

    return seen, {
        "forward": lambda: module_mod.register_module_forward_hook(fwd),
        "forward_pre": lambda: module_mod.register_module_forward_pre_hook(pre),
        "full_backward": lambda: module_mod.register_module_full_backward_hook(bwd),
        "backward_pre": lambda: module_mod.register_module_full_backward_pre_hook(bwd_pre),
    }


def _step(m, seen):
    def step(x):
        before = len(seen)
        m.zero_grad(set_to_none=True)
        out = m(x)
        out.sum().backward()
        # how many hook calls this step made: the same in CPython and compiled
        return out, m.lin.weight.grad.clone(), x.grad, len(seen) - before
    return step


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "full_backward", "backward_pre"])
def test_a_global_hook_registered_after_compiling_runs(kind):
    seen, regs = _registrations()
    handles = []
    m = Net()
    try:
        calls = [torch.randn(2, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True),
                 Then(lambda: handles.append(regs[kind]()), torch.randn(2, 4, requires_grad=True)),
                 torch.randn(2, 4, requires_grad=True)]
        r = check(_step(m, seen), calls,
                  compiled=lambda c: _step(frametrace.optimize(backend=c)(m), seen))
        assert len(seen) >= 4     # two hooked calls on each side, one hook call at least each
        # the failed guard made the module's frame retrace, which declined the hooked call
        assert "global nn.Module hooks are registered" in r.reasons(), r
    finally:
        for h in handles:
            h.remove()


def test_global_hooks_are_checked_in_c():
    m = Net()
    fm = frametrace.optimize("eager")(m)
    fm(torch.randn(2, 4))
    (entry,) = [e for e in _C.entries(Net.forward.__code__) if e.code is not None]
    program = entry.check.program
    assert entry.check.residual is None
    # No Python function is called by the check: only the global-state builtins.
    calls = [i[4] for i in program if _OP_NAMES[i[0]] in ("CALL_IS", "CALL_EQ")]
    assert all(type(f).__name__ == "builtin_function_or_method" for f in calls), calls
    items = {i[4] for i in program if _OP_NAMES[i[0]] == "ITEM"}
    assert {"_global_forward_hooks", "_global_backward_pre_hooks"} <= items


# -- a module's own hooks: one NO_HOOKS check, memoized on the module's dict version --
def _module_hook_changes():
    from collections import OrderedDict

    class Loud(OrderedDict):
        pass

    def forward_hook(m):
        m.lin.register_forward_hook(lambda mod, inp, out: out * 3)

    def forward_pre_hook(m):
        m.lin.register_forward_pre_hook(lambda mod, args: (args[0] - 1,))

    def backward_hook(m):
        m.lin.register_full_backward_hook(lambda mod, gin, gout: (gin[0] * 2,))

    def backward_pre_hook(m):
        m.lin.register_full_backward_pre_hook(lambda mod, gout: (gout[0] * 5,))

    def table_replaced(m):
        # a new table object: the module's dict changes, not the old table
        m.lin._forward_hooks = OrderedDict(m.lin._forward_hooks)
        m.lin.register_forward_hook(lambda mod, inp, out: out + 1)

    def table_subclass(m):
        # not a plain table: read through getattr and truth on every call
        m.lin._forward_hooks = Loud()
        m.lin._forward_hooks[0] = lambda mod, inp, out: out - 2

    return {f.__name__: f for f in (forward_hook, forward_pre_hook, backward_hook, backward_pre_hook,
                                     table_replaced, table_subclass)}


@pytest.mark.parametrize("change", list(_module_hook_changes()))
def test_a_module_hook_added_after_many_calls_is_seen(change):
    m = Net()
    seen = []

    def inputs():
        return torch.randn(2, 4, requires_grad=True)

    # (ten passing calls first: the check answers from its memo by then)
    calls = [inputs() for _ in range(10)]
    calls += [Then(lambda: _module_hook_changes()[change](m), inputs()), inputs()]
    r = check(_step(m, seen), calls, compiled=lambda c: _step(frametrace.optimize(backend=c)(m), seen))
    assert r.compiles >= 2 or r.fallbacks or r.breaks, r
    first = [e for e in _C.entries(Net.forward.__code__) if e.code is not None][-1]
    assert "NO_HOOKS" in {_OP_NAMES[i[0]] for i in first.check.program}


def test_a_hook_removed_again_passes_the_first_entry():
    m = Net()
    fm = frametrace.optimize("eager")(m)
    x = torch.randn(2, 4)
    for _ in range(5):
        fm(x)
    h = m.lin.register_forward_hook(lambda mod, inp, out: out * 0)
    assert fm(x).abs().sum() == 0
    h.remove()
    torch.testing.assert_close(fm(x), m(x))
    entries = [e for e in _C.entries(Net.forward.__code__) if e.code is not None]
    assert entries[-1].check(m, x, Net.forward)   # the first entry holds again


# -- a fixed function's code and defaults: one FUNC check --
def scale(v, k=2, *, j=1):
    return v * k + j


def calls_scale(v):
    return scale(v)


@pytest.mark.parametrize("change", ["code", "defaults", "kwdefaults"])
def test_a_fixed_functions_state_changed_after_many_calls_is_seen(change):
    def other(v, k=2, *, j=1):
        return v - k - j
    saved = (scale.__code__, scale.__defaults__, scale.__kwdefaults__)

    def act():
        if change == "code":
            scale.__code__ = other.__code__
        elif change == "defaults":
            scale.__defaults__ = (7,)
        else:
            scale.__kwdefaults__ = {"j": 9}
    try:
        calls = [torch.randn(3) for _ in range(10)] + [Then(act, torch.randn(3)), torch.randn(3)]
        r = check(calls_scale, calls)
    finally:
        scale.__code__, scale.__defaults__, scale.__kwdefaults__ = saved
    assert r.compiles == 2, r
    ops = {_OP_NAMES[i[0]] for e in _C.entries(calls_scale.__code__) if e.code is not None
           for i in e.check.program}
    assert "FUNC" in ops


# -- hasattr() of a module: memoized on its dict and its three tables' versions --
class Optional(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if hasattr(self, "extra"):
            y = y + 1
        if hasattr(self.lin, "scale"):
            y = y * 3
        return y


def _hasattr_changes():
    def attribute(m):
        m.extra = 1.0

    def buffer(m):
        m.register_buffer("extra", torch.zeros(()))

    def parameter(m):
        m.extra = torch.nn.Parameter(torch.zeros(()))

    def submodule(m):
        m.extra = torch.nn.Identity()

    def child_attribute(m):
        m.lin.scale = 2

    def class_attribute(m):
        # on the module's class: the type's version changes
        type(m).extra = 5

    return {f.__name__: f for f in (attribute, buffer, parameter, submodule, child_attribute,
                                     class_attribute)}


@pytest.mark.parametrize("change", list(_hasattr_changes()))
def test_hasattr_of_a_module_after_many_calls_sees_each_kind_of_member(change):
    class Local(Optional):      # (a class of its own: class_attribute patches it)
        pass
    m = Local()
    calls = [torch.randn(2, 4) for _ in range(10)]
    calls += [Then(lambda: _hasattr_changes()[change](m), torch.randn(2, 4)), torch.randn(2, 4)]
    with torch.no_grad():
        r = check(m, calls, compiled=lambda c: frametrace.optimize(backend=c)(m))
    assert r.compiles == 2, r


def test_a_member_removed_again_passes_the_first_entry():
    m = Optional()
    fm = frametrace.optimize("eager")(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(5):
            fm(x)
        m.register_buffer("extra", torch.zeros(()))
        torch.testing.assert_close(fm(x), m(x))
        del m.extra
        torch.testing.assert_close(fm(x), m(x))
    entries = [e for e in _C.entries(Optional.forward.__code__) if e.code is not None]
    assert len(entries) == 2
    with torch.no_grad():
        assert entries[-1].check(m, x, Optional.forward)


# -- an instance's __dict__ (ODICT): memoized on its type's version --
def test_an_instance_attribute_shadowing_forward_after_many_calls_is_seen():
    m = Net()
    calls = [torch.randn(2, 4) for _ in range(10)]
    calls += [Then(lambda: setattr(m.lin, "forward", lambda x: x * 0), torch.randn(2, 4)),
              torch.randn(2, 4)]
    with torch.no_grad():
        r = check(m, calls, compiled=lambda c: frametrace.optimize(backend=c)(m))
    assert r.compiles >= 2 or r.breaks or r.fallbacks, r


def test_a_replaced_instance_dict_after_many_calls_is_seen():
    m = Net()

    def replace():
        d = dict(m.lin.__dict__)
        d["forward"] = lambda x: x + 100
        m.lin.__dict__ = d
    calls = [torch.randn(2, 4) for _ in range(10)] + [Then(replace, torch.randn(2, 4)), torch.randn(2, 4)]
    with torch.no_grad():
        r = check(m, calls, compiled=lambda c: frametrace.optimize(backend=c)(m))
    assert r.compiles >= 2 or r.breaks or r.fallbacks, r


def test_a_class_whose_dict_is_a_property_is_read_every_call():
    class Box:
        def __init__(self):
            self.k = 2.0

    class Odd(Box):
        @property
        def __dict__(self):         # not the plain getter: never memoized
            return {"k": 100.0}

    box = Box()

    def f(x, o):
        return x * o.k

    boxes = [box] * 5 + [Odd()] * 2 + [box]
    r = check(f, [(torch.randn(3), b) for b in boxes])
    assert r.compiles >= 1


def test_check_lines_substitution_is_the_regex_one():
    """guards._replace_whole (the shared-prefix locals of the Python check, put in place
    of each occurrence of a source's text) replaces exactly what the regex it stands
    for did: not after a word character, a dot or a quote, not before a word character
    (Unicode letters and digits included)."""
    import random
    import re

    from frametrace.guards import _replace_whole
    rng = random.Random(0)
    pieces = ["a", "b", "_", ".", "'", '"', "[", "]", "(", ")", " ", "1", "é", "٣", "x.y", "a.b"]
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
        expr = "".join(rng.choice(pieces + [text] * 3) for _ in range(rng.randint(0, 12)))
        want = re.sub(r"(?<![\w.'\"])" + re.escape(text) + r"(?!\w)", "___v0", expr)
        assert _replace_whole(expr, text, "___v0") == want, (expr, text)
    expr = "self._modules['h']._modules['0'].x is not None and self._modules['h']._modules['0x']"
    assert _replace_whole(expr, "self._modules['h']._modules['0']", "___v1") == \
        "___v1.x is not None and self._modules['h']._modules['0x']"
