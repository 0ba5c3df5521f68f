"""Guards on attributes read through a class's own __getattribute__ (a config with an
attribute_map): the hook is followed while tracing, and the guards check what it read
(the instance dict past the hook, the class's map), so a check never runs the hook
and still notices every change the hook would see."""
import pytest
import torch

from differential import Call, Then, check
# Config-like: some names read through a class-level map of aliases (attribute_map).
from test_hf_idioms import Aliased as Mapped  # noqa: E402

CALLS = []      # what the hooks below saw, in order (compared after each call)


class Noisy(Mapped):
    """A hook with an effect: a check that ran it would add to CALLS."""

    def __getattribute__(self, key):
        if not key.startswith("__"):    # (the tracer itself asks for __class__, __dict__)
            CALLS.append(key)
        return super().__getattribute__(key)


class Spec(Mapped):
    """A hook that looks up one optional key of the instance dict (dict.get)."""

    def __getattribute__(self, key):
        spec = object.__getattribute__(self, "__dict__").get("_spec")
        if spec is not None and key in spec:
            return spec[key]
        return super().__getattribute__(key)


class Fallback(Mapped):
    """A hook that raises AttributeError for some names: __getattr__ answers them."""

    def __getattribute__(self, key):
        if key.startswith("opt_"):
            raise AttributeError(key)
        return super().__getattribute__(key)

    def __getattr__(self, key):
        return 0.5


def _uses(cfg):
    def f(x):
        y = x * cfg.hidden + cfg.scale
        if hasattr(cfg, "extra"):
            y = y + cfg.extra
        return y
    return f


def test_check_does_not_run_the_hook():
    # CPython runs the hook once per read; a compiled call runs it as often (the
    # replayed CALLS.append), not once per guarded name in its check.
    import frametrace
    cfg = Noisy(2, 1.0)

    def f(x):
        return x * cfg.hidden + cfg.scale * cfg.hidden, hasattr(cfg, "extra")

    r = check(f, [Then(CALLS.clear, torch.randn(3)) for _ in range(3)])
    assert r.graphs == 1 and r.breaks == 0 and r.compiles == 1
    compiled = frametrace.optimize("eager")(f)
    for _ in range(3):
        CALLS.clear()
        compiled(torch.randn(3))
        assert CALLS == ["hidden", "scale", "hidden", "extra"]


def _changes():
    def set_attr(c):
        c.d_model = 5

    def set_other(c):
        c.scale = 3.0

    def remap(c):
        type(c).attribute_map["hidden"] = "scale"

    def replace_map(c):
        type(c).attribute_map = {"hidden": "scale"}

    def add_extra(c):
        c.extra = 7.0

    def class_extra(c):
        type(c).extra = 2.0

    def shadow_with_property(c):
        type(c).d_model = property(lambda self: 11)

    def new_hook(c):
        type(c).__getattribute__ = lambda self, key: object.__getattribute__(self, key) \
            if key != "hidden" else 13

    def add_getattr(c):
        type(c).__getattr__ = lambda self, key: 4.0

    return [set_attr, set_other, remap, replace_map, add_extra, class_extra,
            shadow_with_property, new_hook, add_getattr]


@pytest.mark.parametrize("change", _changes(), ids=lambda c: c.__name__)
def test_change_after_compiling_is_noticed(change):
    # A fresh class per test: the changes patch it.
    cls = type("Cfg", (Mapped,), {"attribute_map": {"hidden": "d_model"}})
    cfg = cls(2, 1.0)
    f = _uses(cfg)
    r = check(f, [torch.randn(3), torch.randn(3), Then(lambda: change(cfg), torch.randn(3)),
                  torch.randn(3)])
    assert r.breaks == 0 and r.compiles == 2


def test_optional_key_of_the_instance_dict_is_guarded():
    cfg = Spec(2, 1.0)

    def f(x):
        return x * cfg.hidden + cfg.scale

    def set_spec():
        cfg._spec = {"scale": 10.0}

    def change_spec():
        cfg._spec["scale"] = 20.0

    r = check(f, [torch.randn(3), torch.randn(3), Then(set_spec, torch.randn(3)),
                  Then(change_spec, torch.randn(3))])
    assert r.breaks == 0 and r.compiles == 3


def test_attribute_error_of_the_hook_goes_to_getattr():
    cfg = Fallback(2, 1.0)

    def f(x):
        return x * cfg.hidden + cfg.opt_gain, hasattr(cfg, "opt_other")

    def change():
        type(cfg).__getattr__ = lambda self, key: 1.5

    r = check(f, [torch.randn(3), torch.randn(3), Then(change, torch.randn(3))], fullgraph=True)
    assert r.breaks == 0 and r.compiles == 2


class Opaque(Mapped):
    """A hook the tracer cannot follow (a builtin it does not model)."""

    def __getattribute__(self, key):
        if key == "hidden":
            return len(memoryview(b"abcd")) // 2 * object.__getattribute__(self, "d_model")
        return super().__getattribute__(key)


def test_hook_the_trace_cannot_follow_is_run_and_rechecked():
    # Neither the trace nor a guard runs a hook it cannot follow (it may count or log:
    # CPython runs it once per read): the read is a graph break, made by CPython.
    cfg = Opaque(2, 1.0)
    f = _uses(cfg)

    def change():
        cfg.d_model = 3

    r = check(f, [torch.randn(3), torch.randn(3), Then(change, torch.randn(3))])
    assert r.breaks >= 1 and r.graphs >= 1


SCALES = [1.0, 2.0]


def test_hooked_config_entry_checks_in_c():
    # Nothing of the config's reads (nor that it is another object than the list
    # read beside it) is left to the Python part of the check.
    import frametrace
    from frametrace import _C
    cfg = Spec(2, 1.0)

    def g(x):
        return x * cfg.hidden + cfg.scale * SCALES[1]

    check(g, [torch.randn(3), torch.randn(3)], fullgraph=True)
    frametrace.reset()
    frametrace.optimize("eager")(g)(torch.randn(3))
    (entry,) = [e for e in _C.entries(g.__code__) if e.code is not None]
    assert entry.check.residual is None, entry.check.residual.source


# -- a dict from outside, looked up by key: that key is guarded, not the whole dict --

REGISTRY = {"a": 1.0, "b": 2.0}


def _lookups(x):
    return x * REGISTRY.get("a", 0.0) + ("c" in REGISTRY) + REGISTRY.get("z", 5.0)


def test_other_keys_of_a_dict_looked_up_by_key_do_not_recompile():
    def add_other():
        REGISTRY["other"] = 9.0

    def change_other():
        REGISTRY["b"] = 7.0

    REGISTRY.clear()
    REGISTRY.update(a=1.0, b=2.0)
    r = check(_lookups, [torch.randn(3), Then(add_other, torch.randn(3)),
                         Then(change_other, torch.randn(3))])
    assert r.graphs == 1 and r.compiles == 1


def _registry_changes():
    def change_value():
        REGISTRY["a"] = 3.0

    def add_absent():
        REGISTRY["c"] = 0.0

    def add_defaulted():
        REGISTRY["z"] = -1.0

    def remove_present():
        del REGISTRY["a"]

    def replace():
        globals()["REGISTRY"] = {"a": 4.0}

    return [change_value, add_absent, add_defaulted, remove_present, replace]


@pytest.mark.parametrize("change", _registry_changes(), ids=lambda c: c.__name__)
def test_change_of_a_key_looked_up_is_noticed(change):
    globals()["REGISTRY"] = {"a": 1.0, "b": 2.0}
    r = check(_lookups, [torch.randn(3), torch.randn(3), Then(change, torch.randn(3)),
                         torch.randn(3)])
    assert r.breaks == 0 and r.compiles == 2


def test_dict_used_whole_after_a_lookup_guards_its_keys():
    def f(x):
        return x * REGISTRY.get("a", 0.0) + len(REGISTRY)

    def add_other():
        REGISTRY["other"] = 9.0

    globals()["REGISTRY"] = {"a": 1.0, "b": 2.0}
    r = check(f, [torch.randn(3), Then(add_other, torch.randn(3)), torch.randn(3)])
    assert r.compiles == 2


def test_kwargs_dict_written_after_a_lookup_keeps_its_key_guards():
    # The frame's own **kw dict becomes the trace's container when written; the keys
    # the call passed are still guarded (a call with other keywords recompiles).
    def f(x, **kw):
        scale = kw.get("a", 1.0)
        kw["seen"] = True
        return x * scale + len(kw)

    r = check(f, [Call(torch.randn(3), a=2.0), Call(torch.randn(3), a=3.0, b=1), Call(torch.randn(3))])
    assert r.compiles == 3


def test_dict_looked_up_before_and_inside_a_checkpointed_body():
    # A dict wrapped key by key outside a subgraph body, and read by another key inside
    # it: reading a key is not a side effect of the body (one graph, no break).
    def body(x):
        return x * OPTIONS["a"]

    def f(x):
        x = x + OPTIONS.get("b", 0.0)
        return torch.utils.checkpoint.checkpoint(body, x, use_reentrant=False)

    def change():
        OPTIONS["a"] = 5.0

    globals()["OPTIONS"] = {"a": 2.0, "b": 3.0}
    r = check(f, [torch.randn(3), Then(change, torch.randn(3)), torch.randn(3)], breaks=0)
    assert r.compiles == 2


class Registry(dict):
    """A registry keyed by name whose get() goes through dict.get (super().get)."""

    def get(self, key):
        return super().get(key) or {}


TABLE = Registry(m={"scale": 2.0})


def test_dict_subclass_get_through_dict_get_is_guarded_in_c():
    from frametrace import _C

    def f(x):
        return x * TABLE.get("m").get("scale", 1.0)

    def change():
        TABLE["m"] = {"scale": 3.0}

    def remove():
        del TABLE["m"]

    r = check(f, [torch.randn(3), torch.randn(3), Then(change, torch.randn(3)),
                  Then(remove, torch.randn(3))])
    assert r.breaks == 0 and r.compiles == 3
    for entry in [e for e in _C.entries(f.__code__) if e.code is not None]:
        assert entry.check.residual is None, entry.check.residual.source


# -- class attributes and function state, read by the check without a lookup --

def _scaled_class():
    meta = type("Meta", (type,), {})

    class Scaled:
        factor = 2.0

        def apply(self, x, k=1.0):
            return x * self.factor * k

    return Scaled, meta("Tagged", (), {"factor": 1.5})


def _class_changes():
    def set_factor(cls, tagged):
        cls.factor = 3.0

    def replace_method(cls, tagged):
        cls.apply = lambda self, x, k=1.0: x - self.factor

    def method_defaults(cls, tagged):
        cls.apply.__defaults__ = (2.0,)

    def method_code(cls, tagged):
        cls.apply.__code__ = (lambda self, x, k=1.0: x + self.factor).__code__

    def metaclass_property(cls, tagged):
        type(tagged).factor = property(lambda c: 5.0)

    def metaclass_value_under_class_value(cls, tagged):
        type(tagged).factor = 9.0      # the class's own value still wins

    return [set_factor, replace_method, method_defaults, method_code, metaclass_property,
            metaclass_value_under_class_value]


@pytest.mark.parametrize("change", _class_changes(), ids=lambda c: c.__name__)
def test_class_attribute_change_is_noticed(change):
    cls, tagged = _scaled_class()

    def f(x):
        return cls.factor * x, cls().apply(x), tagged.factor * x

    quiet = change.__name__ == "metaclass_value_under_class_value"
    r = check(f, [torch.randn(3), torch.randn(3), Then(lambda: change(cls, tagged), torch.randn(3)),
                  torch.randn(3)])
    # (A changed float read from outside state is a graph input after the change: where a
    # metaclass property gives it, the getter runs when the compiled code reads it, and
    # the getter's own frame compiles once, with no graph.)
    assert r.breaks == 0 and r.graphs == (1 if quiet else 2)
    assert r.compiles == (1 if quiet else 3 if change.__name__ == "metaclass_property" else 2)
