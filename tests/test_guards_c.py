"""Guards run in C (frametrace/_C/guards.c): for every kind of check the C program has,
the guarded thing changes between calls and the compiled function notices (a recompile,
or CPython's answer); a garbage collection during a check is safe; the parameters of a
module are checked for every kind of change; among 1,000 entries of one function the
right one is chosen.

Each test also asserts that the check it exercises runs in C (`c_ops`), so that a
guard falling back to Python cannot pass for the C path."""
import collections
import gc
import warnings

import pytest
import torch

import frametrace
from differential import Call, Then, check
from frametrace import _C, convert

_OP_NAMES = {v: k for k, v in _C.GUARD_OPS.items()}


def c_ops(fn) -> set:
    """The C checks of every compiled entry of `fn` (a function or a module)."""
    code = (type(fn).forward if isinstance(fn, torch.nn.Module) else fn).__code__
    ops = set()
    for e in _C.entries(code):
        if isinstance(e.check, _C.GuardCheck):
            ops |= {_OP_NAMES[i[0]] for i in e.check.program}
    return ops


def x():
    return torch.arange(4.0)


# -- types and identities --
class A:
    k = 2


class B:
    k = 3


def times_k(v, o):
    return v * o.k


def test_type_change_is_seen():
    r = check(times_k, [(x(), A()), (x(), B()), (x(), A())])
    assert r.compiles == 2 and "TYPE" in c_ops(times_k)


def helper(v):
    return v + 1


def calls_helper(v):
    return helper(v) * 2


def test_identity_of_a_global_function_is_seen():
    def other(v):
        return v - 1
    old = globals()["helper"]

    def swap():
        globals()["helper"] = other
    try:
        r = check(calls_helper, [x(), Then(swap, x()), x()])
    finally:
        globals()["helper"] = old
    assert r.compiles == 2 and "WEAK" in c_ops(calls_helper)


table1, table2 = {"a": 1.0}, {"a": 5.0}
getter = table1.get


def uses_bound_builtin(v):
    return v * getter("a")


def test_bound_builtin_method_identity_is_seen():
    def swap():
        globals()["getter"] = table2.get
    try:
        r = check(uses_bound_builtin, [x(), Then(swap, x()), x()])
    finally:
        globals()["getter"] = table1.get
    assert r.compiles == 2


# -- values, lengths, keys, membership --
def scaled(v, n):
    return v * n


def test_int_value_change_recompiles():
    r = check(scaled, [(x(), 2), (x(), 3), (x(), 2)], dynamic=False)
    assert r.compiles == 2 and "EQ" in c_ops(scaled)


class Config:
    def __init__(self, eps):
        self.eps = eps


def uses_eps(v, cfg):
    return v + cfg.eps


def test_float_attribute_change_is_seen():
    cfg = Config(0.5)
    r = check(uses_eps, [(x(), cfg), Then(lambda: setattr(cfg, "eps", 0.25), x(), cfg)],
              dynamic=False)
    assert r.compiles == 2 and "EQ" in c_ops(uses_eps)


def sums(v, xs):
    return v + sum(xs)


def test_length_change_is_seen():
    r = check(sums, [(x(), (1, 2)), (x(), (1, 2, 3)), (x(), (4, 5))])
    assert "LEN" in c_ops(sums) and r.compiles >= 2


def with_kwargs(v, **kw):
    return v * len(kw) + kw.get("a", 0)


def test_dict_keys_change_is_seen():
    r = check(with_kwargs, [Call(x(), a=1), Call(x(), a=1, b=2), Call(x(), b=2, a=1), Call(x(), a=1)])
    assert r.compiles == 3 and "KEYS" in c_ops(with_kwargs)


def reads_flag(v):
    return v + (1 if "FLAG_FOR_C_GUARDS" in globals() else 2)


def test_membership_in_globals_is_seen():
    def add():
        globals()["FLAG_FOR_C_GUARDS"] = True
    try:
        r = check(reads_flag, [x(), Then(add, x()), x()])
    finally:
        globals().pop("FLAG_FOR_C_GUARDS", None)
    assert r.compiles == 2 and "IN" in c_ops(reads_flag)


def uses_abs(v):
    return abs(v) + 1


def test_global_shadowing_a_builtin_is_seen():
    def shadow():
        globals()["abs"] = lambda v: v * 0
    try:
        r = check(uses_abs, [-x(), Then(shadow, -x()), -x()])
    finally:
        globals().pop("abs", None)
    assert r.compiles == 2 and "NOT_CONTAINS" in c_ops(uses_abs)


class Greeter:
    def scale(self):
        return 2


def calls_method(v, g):
    return v * g.scale()


def test_instance_attribute_shadowing_a_method_is_seen():
    g = Greeter()
    r = check(calls_method, [(x(), g), Then(lambda: setattr(g, "scale", lambda: 7), x(), g)])
    assert r.compiles == 2 and "NOT_CONTAINS" in c_ops(calls_method)


def has_k(v, o):
    return v + (1 if hasattr(o, "k") else 0)


class Plain:
    pass


def test_hasattr_answer_change_is_seen():
    o = Plain()
    r = check(has_k, [(x(), o), Then(lambda: setattr(o, "k", 1), x(), o), (x(), o)])
    assert r.compiles == 2 and "HASATTR" in c_ops(has_k)


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, v):
        return v * self.w + (1 if hasattr(self, "extra") else 0)


@pytest.mark.parametrize("how", ["attribute", "buffer", "parameter", "submodule"])
def test_hasattr_of_a_module_sees_each_kind_of_member(how):
    m = Scale()

    def add():
        if how == "attribute":
            m.extra = 1
        elif how == "buffer":
            m.register_buffer("extra", torch.zeros(1))
        elif how == "parameter":
            m.extra = torch.nn.Parameter(torch.zeros(1))
        else:
            m.extra = torch.nn.Identity()
    with torch.no_grad():
        r = check(m, [x(), Then(add, x()), x()], compiled=lambda c: frametrace.optimize(backend=c)(m))
    assert r.compiles == 2 and "HASATTR" in c_ops(m)


def with_defaults(v, k=2):
    return v * k


def calls_with_defaults(v):
    return with_defaults(v)


def test_function_defaults_change_is_seen():
    def change():
        with_defaults.__defaults__ = (5,)
    try:
        r = check(calls_with_defaults, [x(), Then(change, x()), x()])
    finally:
        with_defaults.__defaults__ = (2,)
    assert r.compiles == 2 and "FUNC" in c_ops(calls_with_defaults)


def test_closure_defaults_length_and_kwdefaults_change_is_seen():
    def make(n):
        def inner(v, k=n, *, j=1):
            return v * k + j
        return inner

    fns = [make(2)]

    def f(v):
        return fns[0](v)

    def change():
        fns[0] = make(3)
        fns[0].__kwdefaults__ = {"j": 4}
    r = check(f, [x(), Then(change, x()), x()])
    assert r.compiles == 2


# -- module hooks, aliasing, global state --
class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, v):
        return self.lin(v)


def test_forward_hook_added_is_seen():
    m = Lin()

    def hook():
        m.lin.register_forward_hook(lambda mod, inp, out: out * 0)
    with torch.no_grad():
        r = check(m, [x(), Then(hook, x()), x()], compiled=lambda c: frametrace.optimize(backend=c)(m))
    assert r.compiles == 2 and "NO_HOOKS" in c_ops(m)


def add_into(a, b):
    a.add_(1)
    return a + b


def test_aliasing_of_arguments_is_seen():
    t = torch.zeros(3)
    r = check(add_into, [(torch.zeros(3), torch.zeros(3)), (t, t), (torch.zeros(3), torch.ones(3))])
    assert r.compiles == 2 and ({"IS_REG", "IS_NOT_REG"} & c_ops(add_into) or
                                any(e.check.residual is not None for e in _C.entries(add_into.__code__)))


def double(v):
    return v * 2


def test_grad_mode_change_is_seen():
    g = frametrace.optimize("eager")(double)
    w = torch.ones(3, requires_grad=True)
    assert g(w).requires_grad
    with torch.no_grad():
        assert not g(w).requires_grad
    assert g(w).requires_grad
    assert len(_C.entries(double.__code__)) == 2 and "CALL_IS" in c_ops(double)


# -- tensors --
def affine(v):
    return v * 2 + 1


@pytest.mark.parametrize("change", ["dtype", "shape", "stride", "requires_grad", "neg"])
def test_each_tensor_property_change_recompiles(change):
    base = torch.randn(3, 4, dtype=torch.complex64) if change in ("conj", "neg") else torch.randn(3, 4)
    other = {"dtype": lambda: base.double(), "shape": lambda: torch.randn(3, 5),
             "stride": lambda: torch.randn(4, 3).t(), "requires_grad": lambda: base.clone().requires_grad_(),
             "conj": lambda: base.conj(), "neg": lambda: base.conj().imag}[change]()
    first = base.imag if change == "neg" else base
    r = check(affine, [first, other, first], dynamic=False, rtol=1e-4)
    assert r.compiles == 2 and "TENSOR" in c_ops(affine)


def test_conjugate_bit_change_recompiles():
    # (called directly: a deep copy would resolve the lazy conjugate)
    g = frametrace.optimize("eager", dynamic=False)(affine)
    z = torch.randn(3, 4, dtype=torch.complex64)
    for t in (z, z.conj(), z, z.conj()):
        torch.testing.assert_close(g(t), affine(t))
    assert len(_C.entries(affine.__code__)) == 2 and "TENSOR" in c_ops(affine)


# -- parameters changed in place --
def _param_changes():
    def new_parameter(m):
        m.lin.weight = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

    def del_bias(m):
        del m.lin.bias
        m.lin.bias = None

    def register_buffer(m):
        del m.lin.bias
        m.lin.register_buffer("bias", torch.full((4,), 3.0))

    def data_new_shape(m):
        m.lin.bias.data = torch.randn(1)          # same object, new metadata

    def data_new_dtype(m):
        m.lin.weight.data = m.lin.weight.data.double()
        m.lin.bias.data = m.lin.bias.data.double()

    def data_transposed(m):
        m.lin.weight.data = m.lin.weight.data.t()  # same storage, new strides

    def requires_grad_off(m):
        m.lin.weight.requires_grad_(False)

    def set_(m):
        with torch.no_grad():
            m.lin.bias.set_(torch.randn(1))

    return {f.__name__: f for f in (new_parameter, del_bias, register_buffer, data_new_shape,
                                     data_new_dtype, data_transposed, requires_grad_off, set_)}


@pytest.mark.parametrize("change", list(_param_changes()))
def test_each_kind_of_parameter_change_is_seen(change):
    m = Lin()
    action = _param_changes()[change]

    def inputs():
        return torch.randn(2, 4)

    if change in ("new_parameter", "data_new_dtype"):
        calls = [inputs(), Then(lambda: action(m), torch.randn(2, 4, dtype=torch.float64))]
    else:
        calls = [inputs(), Then(lambda: action(m), inputs()), inputs()]
    r = check(m, calls, compiled=lambda c: frametrace.optimize(backend=c)(m))
    # (counted for Lin's forward only: after an earlier optimize(nn.Linear), Linear's own
    # forward is traced wherever it runs hooked)
    assert sum(rec.code is Lin.forward.__code__ for rec in r.records) == 2, r
    assert "TENSOR" in c_ops(m)


# -- loads answered from dict versions (guards.c's memo) --
class Knob:
    def __init__(self):
        self.k = 2.0


class OtherKnob:
    def __init__(self):
        self.k = 2.0


def reads_k(v, o):
    return v * o.k


def test_property_added_to_the_class_over_an_instance_attribute_is_seen():
    class Local:
        def __init__(self):
            self.k = 2.0
    o = Local()
    r = check(reads_k, [(x(), o), Then(lambda: setattr(Local, "k", property(lambda self: 10.0)), x(), o),
                        (x(), o)])
    assert r.compiles == 2 and "ATTR" in c_ops(reads_k)


def test_class_and_dict_replaced_under_an_unchanged_attribute_are_seen():
    o = Knob()

    def swap_class():
        o.__class__ = OtherKnob

    def swap_dict():
        o.__dict__ = {"k": 5.0}
    r = check(reads_k, [(x(), o), (x(), o), Then(swap_dict, x(), o), (x(), o),
                        Then(lambda: setattr(o, "k", 7.0), x(), o), Then(swap_class, x(), o)],
              dynamic=False)
    assert r.compiles == 4


def reads_item(v, d):
    return v * d["k"]


def test_dict_item_changed_and_restored_is_seen():
    d = {"k": 2.0, "j": 1}
    r = check(reads_item, [(x(), d), Then(lambda: d.update(k=3.0), x(), d),
                           Then(lambda: d.update(k=2.0), x(), d), Then(lambda: d.pop("j"), x(), d)],
              dynamic=False)
    # 3.0 recompiles, 2.0 is the first entry again; a key the trace never looked up
    # going away changes nothing (only "k" is guarded)
    assert r.compiles == 2 and "ITEM" in c_ops(reads_item)


def test_method_shadowed_after_many_passing_calls_is_seen():
    g = Greeter()
    calls = [(x(), g)] * 5 + [Then(lambda: setattr(g, "scale", lambda: 7), x(), g), (x(), g)]
    r = check(calls_method, calls)
    assert r.compiles == 2


# -- garbage collection during a check --
class CollectingKey:
    """A dict key whose __hash__ and __eq__ collect garbage (and so run weakref
    callbacks that drop entries) while a guard compares it."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        gc.collect()
        return hash(self.name)

    def __eq__(self, other):
        gc.collect()
        return isinstance(other, CollectingKey) and other.name == self.name

    def __deepcopy__(self, memo):
        return CollectingKey(self.name)


def walks_keys(v, d):
    out = v
    for k in d:
        out = out + len(k.name)
    return out


def test_gc_inside_a_key_comparison_is_safe(young_heap):
    g = frametrace.optimize("eager")(walks_keys)
    keys = [CollectingKey("a"), CollectingKey("bb")]
    d = dict.fromkeys(keys)
    for _ in range(3):
        torch.testing.assert_close(g(x(), d), walks_keys(x(), d))
    # equal keys that are other objects: the key guard compares them with __eq__
    d2 = dict.fromkeys([CollectingKey("a"), CollectingKey("bb")])
    torch.testing.assert_close(g(x(), d2), walks_keys(x(), d2))
    d3 = dict.fromkeys([CollectingKey("a"), CollectingKey("ccc")])
    torch.testing.assert_close(g(x(), d3), walks_keys(x(), d3))


class Holder:
    def __init__(self, k):
        self.k = k


def test_entry_dropped_by_a_collection_during_its_own_check_is_safe(young_heap):
    """A weakly guarded object dies in a cycle that a collection inside the check
    frees: the entry is removed while it is being checked."""
    def f(v, h, d):
        out = v * h.k
        for k in d:
            out = out + len(k.name)
        return out
    g = frametrace.optimize("eager")(f)
    for i in range(5):
        h = Holder(float(i))
        h.self = h                      # only a collection frees it
        d = dict.fromkeys([CollectingKey("a")])
        torch.testing.assert_close(g(x(), h, d), f(x(), h, d))
        del h
    h = Holder(2.0)
    d = dict.fromkeys([CollectingKey("a")])
    torch.testing.assert_close(g(x(), h, d), f(x(), h, d))


# -- many entries --
def plus(v):
    return v + 1


def test_thousand_entries_pick_the_matching_one():
    limit = frametrace.config.cache_size_limit
    frametrace.config.cache_size_limit = 1100
    frametrace.reset()
    records = []
    convert.record_observers.append(records.append)
    try:
        g = frametrace.optimize("eager", dynamic=False)(plus)
        xs = [torch.full((n,), float(n)) for n in range(1, 1001)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for t in xs:
                g(t)
        assert len(_C.entries(plus.__code__)) == 1000
        compiled = len(records)
        for n in (1, 2, 500, 999, 1000):        # the oldest first
            torch.testing.assert_close(g(xs[n - 1]), xs[n - 1] + 1)
        torch.testing.assert_close(g(torch.full((3,), 1.0, dtype=torch.float64)),
                                   torch.full((3,), 2.0, dtype=torch.float64))
        assert len(records) == compiled + 1     # only the new dtype compiled
    finally:
        convert.record_observers.remove(records.append)
        frametrace.config.cache_size_limit = limit
        frametrace.reset()


def test_dispatch_key_never_hides_the_matching_entry():
    """Entries keyed on an int argument: a call equal to an old entry's value, and
    one whose tensor differs, each get the right answer."""
    g = frametrace.optimize("eager", dynamic=False)(scaled)
    for n in (2, 3, 4, 2, 3):
        torch.testing.assert_close(g(x(), n), x() * n)
    torch.testing.assert_close(g(torch.arange(3.0), 3), torch.arange(3.0) * 3)
    assert len(_C.entries(scaled.__code__)) == 4


def weighted(state, key, x):
    for k, v in state.items():
        x = x + k * v
    return x * state[key]   # (a lookup by a tensor: which value is the key's matters)


@pytest.mark.parametrize("kind", [dict, collections.OrderedDict, collections.defaultdict])
def test_a_dict_keyed_by_tensors_is_read_in_c_and_its_changes_are_seen(kind):
    # [*state.keys()][i] and [*state.values()][i] are C loads (DVIEW; an OrderedDict's
    # own keys() and values() are called, as Python would): the order of the entries
    # (move_to_end included), a value or a key replaced, each changes what the graph reads
    ks = [torch.randn(3) for _ in range(3)]

    def make(order=(0, 1, 2), scale=1.0, swap_key=False):
        d = kind(list) if kind is collections.defaultdict else kind()
        for i in order:
            d[ks[i] if not (swap_key and i == 1) else torch.randn(3)] = \
                torch.full((3,), float(i + 1) * scale, dtype=torch.float64)
        return d, ks[0], torch.randn(3)
    inputs = [make(), make(), make(scale=2.0), make(order=(2, 0, 1)), make(swap_key=True), make()]
    if kind is collections.OrderedDict:
        moved = make()
        moved[0].move_to_end(ks[0])
        inputs.insert(3, moved)
    r = check(weighted, inputs, breaks=0)
    # the first call and the reordered entries compile (and the OrderedDict moved to
    # its end); the other calls (new values, a key the lookup does not use) reuse them
    assert r.graphs == (3 if kind is collections.OrderedDict else 2), r
    assert "DVIEW" in c_ops(weighted)


def test_one_entry_is_checked_without_the_dispatch_key():
    """With one entry the hook skips the cheap key (the check reads the same dtype and
    sizes): a call it does not fit still misses, compiles its own entry, and from then
    on, with two entries, each call finds its own."""
    g = frametrace.optimize("eager", dynamic=False)(scaled)
    torch.testing.assert_close(g(x(), 2), x() * 2)
    assert len(_C.entries(scaled.__code__)) == 1
    for t in (x().double(), torch.arange(5.0)):     # another dtype, another size
        torch.testing.assert_close(g(t, 2), t * 2)
    assert len(_C.entries(scaled.__code__)) == 3
    for t in (x(), x().double(), torch.arange(5.0)):
        torch.testing.assert_close(g(t, 2), t * 2)
    assert len(_C.entries(scaled.__code__)) == 3


def test_entries_of_another_optimize_do_not_count_for_the_dispatch_key():
    """Two optimize() wrappers of one function (static and dynamic) keep their entries in
    one list: each wrapper's one entry is checked without the key, and neither call
    takes the other's entry or compiles again."""
    static = frametrace.optimize("eager", dynamic=False)(scaled)
    dynamic = frametrace.optimize("eager", dynamic=True)(scaled)
    for _ in range(3):
        for g in (static, dynamic):
            torch.testing.assert_close(g(x(), 3), x() * 3)
    assert len(_C.entries(scaled.__code__)) == 2
    torch.testing.assert_close(static(x().double(), 3), x().double() * 3)
    assert len(_C.entries(scaled.__code__)) == 3
