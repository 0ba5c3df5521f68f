"""Guards: what a compiled entry read from outside its frame (function attributes,
closure contents, the environment, tensor attributes, class attributes, module
containers, global torch state, input aliasing, values computed at graph breaks) is
guarded, so that changing it between calls recompiles or still gives CPython's answer.

Each test changes the outside state between calls with `Then`: a call that first runs
an action (seen by both the CPython and the compiled run of that call)."""
import json
import math
import os
import types
import typing

import pytest
import torch

import frametrace
from differential import Then, check


def x():
    return torch.arange(4.0)


# -- 1. attributes of function objects --
def scaled(v):
    return v * scaled.k


scaled.k = 1


def calls_scaled(v):
    return scaled(v) + scaled.k


def reads_own_attribute(v):
    return v * reads_own_attribute.k


reads_own_attribute.k = 1


def test_function_attribute_change_is_seen():
    check(calls_scaled, [x(), Then(lambda: setattr(scaled, "k", 2), x()), x()])


def test_own_function_attribute_change_is_seen():
    check(reads_own_attribute, [x(), Then(lambda: setattr(reads_own_attribute, "k", 3), x())])


def test_closure_function_attribute_change_is_seen():
    def helper(v):
        return v + helper.k
    helper.k = 1

    def f(v):
        return helper(v) * helper.k
    check(f, [x(), Then(lambda: setattr(helper, "k", 5), x())])


# -- 2. mutable containers in closures --
def test_closure_set_growth_is_seen():
    s = {1, 2}

    def f(v):
        return v * len(s)
    check(f, [x(), Then(lambda: s.add(3), x()), x()])


def test_closure_set_membership_is_seen():
    s = {1, 2}

    def f(v):
        return v + 1 if 3 in s else v - 1
    check(f, [x(), Then(lambda: s.add(3), x()), Then(lambda: s.discard(3), x())], breaks=0)


# -- 3. the environment --
def _setenv(value):
    if value is None:
        os.environ.pop("FRAMETRACE_TEST_GUARD", None)
    else:
        os.environ["FRAMETRACE_TEST_GUARD"] = value


def env_get(v):
    return v + 1 if os.environ.get("FRAMETRACE_TEST_GUARD") == "1" else v - 1


def env_getitem(v):
    return v * len(os.environ["FRAMETRACE_TEST_GUARD"])


def env_contains(v):
    return v + 1 if "FRAMETRACE_TEST_GUARD" in os.environ else v - 1


@pytest.mark.parametrize("fn", [env_get, env_getitem, env_contains])
def test_environment_change_is_seen(fn):
    _setenv("1")
    try:
        check(fn, [x(), Then(lambda: _setenv("22"), x()), Then(lambda: _setenv("1"), x())])
        check(env_get, [x(), Then(lambda: _setenv(None), x())])
    finally:
        _setenv(None)


# -- 4. Python attributes of tensors --
def test_hasattr_of_tensor_attribute():
    def f(t):
        return t + 1 if hasattr(t, "tag") else t - 1
    tagged = x()
    tagged.tag = 1
    check(f, [x(), tagged, x()])


TAGGED = torch.arange(3.0)
TAGGED.tag = 1


def reads_tensor_tag(v):
    return v * TAGGED.tag + TAGGED


def test_tensor_attribute_change_is_seen():
    check(reads_tensor_tag, [torch.ones(3), Then(lambda: setattr(TAGGED, "tag", 4), torch.ones(3))])


# -- 5. class attributes through super() --
class Parent:
    scale = 2

    def factor(self):
        return 10


class Child(Parent):
    scale = 3

    def run(self, v):
        return v * super().scale + super().factor()


CHILD = Child()


def uses_super(v):
    return CHILD.run(v)


def test_class_attribute_through_super_change_is_seen():
    try:
        check(uses_super, [x(), Then(lambda: setattr(Parent, "scale", 7), x()),
                           Then(lambda: setattr(Parent, "factor", lambda self: 20), x())])
    finally:
        Parent.scale = 2
        Parent.factor = lambda self: 10


# -- 6. replaced code, defaults, library functions and shadowed methods --
def helper_a(v, k=1):
    return v + k


def _other(v, k=1):
    return v * 100


def calls_helper_a(v):
    return helper_a(v)


def test_replaced_code_and_defaults_are_seen():
    code, defaults = helper_a.__code__, helper_a.__defaults__
    try:
        check(calls_helper_a, [x(), Then(lambda: setattr(helper_a, "__defaults__", (5,)), x()),
                               Then(lambda: setattr(helper_a, "__code__", _other.__code__), x())])
    finally:
        helper_a.__code__, helper_a.__defaults__ = code, defaults


def make_closure(k):
    def inner(a, b=[k * 2][0]):     # a computed default: a new tuple per closure
        return a * b + k
    return inner


def test_closure_defaults_guarded_by_value():
    def f(v, fn):
        return fn(v)
    # Fresh closures with equal defaults share an entry; other defaults recompile.
    check(f, [(x(), make_closure(2)), (x(), make_closure(2)), (x(), make_closure(3))], compiles=2)


def uses_sqrt(v):
    return v * math.sqrt(4.0)


def test_monkeypatched_library_function_is_seen():
    real = math.sqrt
    try:
        check(uses_sqrt, [x(), Then(lambda: setattr(math, "sqrt", lambda a: 7.0), x())])
    finally:
        math.sqrt = real


def uses_abs(v):
    return v * abs(-2)


def test_monkeypatched_builtin_is_seen():
    import builtins
    real = builtins.abs
    try:
        check(uses_abs, [x(), Then(lambda: setattr(builtins, "abs", lambda a: 7), x())])
    finally:
        builtins.abs = real


class Greeter:
    def method(self):
        return 1


GREETER = Greeter()


def uses_method(v):
    return v * GREETER.method()


def test_method_shadowed_by_instance_attribute_is_seen():
    check(uses_method, [x(), Then(lambda: setattr(GREETER, "method", lambda: 9), x())])


# -- 7. module containers changed after the first call --
class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 4))
        self.table = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4)})
        self.sub = torch.nn.Linear(4, 4)

    def forward(self, v):
        for layer in self.layers:
            v = layer(v)
        v = self.seq(v)
        for k in self.table:
            v = self.table[k](v)
        return self.sub(v) + len(self.layers)


STACK = Stack()


def uses_stack(v):
    return STACK(v)


def test_module_containers_changed_after_the_first_call_are_seen():
    torch.manual_seed(0)
    inp = torch.randn(2, 4)
    check(uses_stack, [
        inp,
        Then(lambda: STACK.layers.append(torch.nn.Linear(4, 4)), inp),
        Then(lambda: STACK.layers.__delitem__(0), inp),
        Then(lambda: STACK.seq.append(torch.nn.Tanh()), inp),
        Then(lambda: STACK.table.update({"b": torch.nn.Linear(4, 4)}), inp),
        Then(lambda: setattr(STACK, "sub", torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())), inp),
    ], atol=1e-5)


# -- 8. global torch state, tensor bits --
def factory_device(v):
    return v + 1, torch.ones(2).device.type


def test_default_device_change_is_seen():
    try:
        check(factory_device, [x(), Then(lambda: torch.set_default_device("meta"), x())])
    finally:
        torch.set_default_device(None)


def matmul(v):
    y = v @ v
    return y, y.dtype


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_autocast_entered_outside_is_seen(backend):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    entered = []

    def enter():
        ctx.__enter__()
        entered.append(True)

    def leave():
        ctx.__exit__(None, None, None)
        entered.pop()
    m = torch.eye(4)
    try:
        check(matmul, [m, Then(enter, m), Then(leave, m)], backend=backend, atol=1e-2, rtol=1e-2)
    finally:
        if entered:
            leave()


class Doubling(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.Tensor.add else out


def adds(v):
    return v + 1


def test_torch_function_mode_entered_outside_is_seen():
    backend = "aot_eager"       # (the eager backend replays the ops under the mode)
    mode = Doubling()
    entered = []

    def enter():
        mode.__enter__()
        entered.append(True)

    def leave():
        mode.__exit__(None, None, None)
        entered.pop()
    try:
        check(adds, [x(), Then(enter, x()), Then(leave, x())], backend=backend)
    finally:
        if entered:
            leave()


class Made:
    """An argument made fresh for each run by `make()` (deepcopy would drop a lazy
    conjugate or negative bit)."""

    def __init__(self, make):
        self.make = make

    def __deepcopy__(self, memo):
        return self.make()


def _z():
    return torch.tensor([1 + 2j, 3 - 1j])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_conj_and_neg_bits_are_guarded(backend):
    def f(t):
        return t * 1, t.is_conj(), t.is_neg(), (t + 1 if t.is_conj() else t - 1)
    plain, conj, neg = Made(_z), Made(lambda: _z().conj()), Made(lambda: torch._neg_view(_z()))
    real_neg = Made(lambda: _z().conj().imag)
    check(f, [plain, conj, plain, neg, conj, real_neg, Made(lambda: _z().imag)], backend=backend)


# -- beyond the list: other outside state read at trace time --
class Registry(dict):
    pass


REGISTRY = Registry(a=1)


class Defaults(dict):
    def get(self, key, default=None):
        return super().get(key, default) * 10


DEFAULTS = Defaults(a=1)


def reads_through_super(v):
    return v * DEFAULTS.get("a")


def test_dict_subclass_read_through_super_is_seen():
    check(reads_through_super, [x(), Then(lambda: DEFAULTS.update(a=4), x())])


def reads_registry(v):
    return v * REGISTRY["a"] + len(REGISTRY)


def test_dict_subclass_contents_change_is_seen():
    check(reads_registry, [x(), Then(lambda: REGISTRY.update(a=5), x()),
                           Then(lambda: REGISTRY.update(b=2), x())])


_BACKING = {"scale": 2.0}
SETTINGS = types.MappingProxyType(_BACKING)     # a read-only view of a dict that changes


def reads_with_a_traced_default(v, name):
    # the default is a value of the trace's (a tensor), not a constant
    return v * SETTINGS.get(name, v)


def test_mapping_get_with_a_traced_default_follows_the_mapping():
    check(reads_with_a_traced_default,
          [(x(), "scale"), (x(), "shift"), Then(lambda: _BACKING.update(shift=-1.0), (x(), "shift")),
           Then(lambda: _BACKING.update(scale=3.0), (x(), "scale")),
           Then(lambda: _BACKING.pop("scale"), (x(), "scale"))], breaks=0)


def _check_list(v, args):
    return v * len(args)


def _check_union(v, args):
    return v + len(args)


# keyed by typing's forms and classes (huggingface_hub's type validators)
BY_ORIGIN = {typing.Union: _check_union, list: _check_list}


def validated(v, hint):
    check_fn = BY_ORIGIN.get(typing.get_origin(hint))
    if check_fn is None:
        return v - 1
    return check_fn(v, typing.get_args(hint))


def test_mapping_get_keyed_by_a_typing_form_or_a_class():
    check(validated, [(x(), typing.Optional[int]), (x(), list[int]), (x(), int),
                      Then(lambda: BY_ORIGIN.pop(list), (x(), list[int])),
                      Then(lambda: BY_ORIGIN.update({list: _check_union}), (x(), list[int]))],
          breaks=0)


STATE = {}
HISTORY = []


def records_progress(v, step):
    STATE["step"] = step                         # existing keys: updated in place
    STATE["name"] = f"s{step}"
    STATE["new"] = [step]                        # a new key: after the others
    return v + step


def reads_after_storing(v, step):
    STATE["late"] = step
    total = len(STATE) + sum(1 for k in STATE if k.startswith("seen"))   # read whole
    STATE.pop("name", None)
    return v + total


def appends_history(v, step):
    y = v * 2
    HISTORY.append(y.sum())                      # a tensor of the graph's
    HISTORY.append(f"step {step}")
    HISTORY.extend([y.mean(), step])
    return y


def reads_history_after_appending(v, step):
    HISTORY.append(v.sum())
    return v + len(HISTORY)                      # read whole: its length guarded


def _snapshot():
    def plain(h):
        return h.tolist() if isinstance(h, torch.Tensor) else repr(h)
    return [(k, plain(v)) for k, v in STATE.items()], [plain(h) for h in HISTORY]


def _steps(fn, between, compiled):
    """STATE and HISTORY after each of 8 calls of `fn` (compiled or not), with
    between[i] applied before call i; and the compile count."""
    STATE.clear()
    STATE.update(step=0, name="start", kept=[1, 2])
    HISTORY[:] = ["start"]
    counter = frametrace.testing.CompileCounter()
    run = frametrace.optimize(fn, backend=counter) if compiled else fn
    seen = []
    for i in range(8):
        if i in between:
            between[i]()
        seen.append((run(x(), i).tolist(), _snapshot()))
    return seen, counter.frame_count


@pytest.mark.parametrize("fn,between", [
    (records_progress, {}),
    (records_progress, {3: lambda: STATE.clear(), 5: lambda: STATE.update(name=1, extra=2)}),
    (reads_after_storing, {2: lambda: STATE.update(seen9=1), 4: lambda: STATE.update(name="back")}),
    (appends_history, {}),
    (appends_history, {2: lambda: HISTORY.clear(), 4: lambda: HISTORY.insert(0, "x")}),
    (reads_history_after_appending, {3: lambda: HISTORY.pop()}),
], ids=["dict_stores", "dict_changed_outside", "dict_read_whole",
        "list_appends", "list_changed_outside", "list_read_whole"])
@pytest.mark.parametrize("lazy", [True, False])
def test_writes_into_containers_from_outside(fn, between, lazy, monkeypatch):
    # Stores of constant keys into a plain dict from outside, and appends to a plain
    # list, are replayed as such: what the container held is not read nor guarded (a
    # string a step stored, a history appended to every step, recompiled every step).
    # The switches off read them whole at once.
    monkeypatch.setattr(frametrace.config, "lazy_dict_guards", lazy)
    monkeypatch.setattr(frametrace.config, "lazy_list_appends", lazy)
    want, _ = _steps(fn, between, compiled=False)
    got, compiles = _steps(fn, between, compiled=True)
    assert got == want
    if fn in (records_progress, appends_history) and lazy and not between:
        assert compiles == 3, compiles          # 0 and 1 specialize, then symbolic


# -- 9. aliasing of inputs --
def test_aliasing_of_mutable_inputs_is_guarded():
    def f(v, a, b):
        a.append(1)
        return v + len(b)
    o = [0]
    check(f, [(x(), o, o), (x(), [0], [0]), (x(), o, o)])


def test_aliasing_of_user_objects_is_guarded():
    class Box:
        def __init__(self):
            self.n = 1

    def f(v, a, b):
        a.n = a.n + 1
        return v * b.n
    o = Box()
    check(f, [(x(), o, o), (x(), Box(), Box()), (x(), o, o)])


def test_identity_of_tensor_inputs_is_guarded():
    def f(a, b):
        return a * 3 if a is b else a + b
    t = x()
    check(f, [(t, x()), (t, t), (x(), x())])


def test_tensor_alias_guard_checks_view_geometry():
    def f(a, view):
        view.add_(1)
        return a * 2
    b = torch.zeros(3, 2)
    check(f, [(b, b[0]), (b, b[1]), (b, b[:, 0]), (b, b[0])], backend="aot_eager", dynamic=False)


# -- 10. values computed in CPython at a graph break --
def test_type_of_value_from_graph_break_is_guarded():
    def f(v, text):
        v = v * 2
        y = json.loads(text)        # breaks the graph: y is computed in CPython
        if isinstance(y, int):
            return v + 1
        return v - 1, type(y).__name__
    r = check(f, [(x(), "1"), (x(), "1.5"), (x(), '"s"'), (x(), "2")])
    assert r.breaks >= 1


def test_none_check_of_value_from_graph_break_is_guarded():
    def f(v, text):
        v = v * 2
        y = json.loads(text)
        if y is None:
            return v + 1
        return v - 1
    r = check(f, [(x(), "1"), (x(), "null"), (x(), "2"), (x(), "null")])
    assert r.breaks >= 1


# -- a value computed at a graph break, tested against None --
def test_none_test_of_a_value_computed_at_a_graph_break_is_guarded():
    # re.match breaks the graph; its Match result went on to the resume function as
    # unguarded data, and `if m is not None` was decided once for all later calls.
    import re

    def f(t):
        m = re.match(r"^(.+)\?$", t)
        if m is not None:
            return "optional"
        m = re.match(r"^(.+)\[([0-9]+)?\]$", t)
        if m is not None:
            return m.group(1)
        return "base"

    r = check(f, ["Tensor", "int[]", "Tensor?", "int[2]", "Tensor", "int[]"], graphs=0)
    assert r.breaks >= 1 and r.fallbacks == 0
