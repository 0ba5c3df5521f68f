"""Python mechanisms Hugging Face models lean on, each in a small program: classes with
their own __getattribute__ (configs with an attribute_map), methods bound while tracing
that leave the frame, ..."""
import functools

import pytest
import torch

import frametrace
from differential import Call, check


class Aliased:
    """A config-like class: some names are read through another attribute."""
    attribute_map = {"hidden": "d_model"}

    def __init__(self, d_model, scale):
        self.d_model = d_model
        self.scale = scale

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def test_own_getattribute_of_an_outside_object_is_followed():
    def f(x, cfg):
        return x * cfg.hidden + cfg.scale

    r = check(f, [(torch.randn(3), Aliased(2, 1.0)), (torch.randn(3), Aliased(2, 1.0)),
                  (torch.randn(3), Aliased(5, 3.0))], fullgraph=True)
    assert r.graphs == 2 and r.breaks == 0


def test_own_getattribute_of_an_object_made_in_the_frame_is_inlined():
    def f(x):
        cfg = Aliased(3, 0.5)
        cfg.d_model = cfg.hidden + 1
        return x * cfg.hidden + cfg.scale, cfg

    r = check(f, [torch.randn(3), torch.randn(4)], fullgraph=True)
    assert r.graphs >= 1 and r.breaks == 0


def test_own_getattribute_after_a_write_by_the_trace_sees_the_write():
    def f(x, cfg):
        cfg.d_model = cfg.d_model * 2
        return x * cfg.hidden

    r = check(f, [(torch.randn(3), Aliased(2, 1.0)), (torch.randn(3), Aliased(4, 1.0))],
              fullgraph=True)
    assert r.breaks == 0


def test_getattribute_frame_itself_compiles():
    # The hook's own frame, entered from CPython: super().__getattribute__ is the plain
    # lookup, guarded by repeating that (not by going through the hook again).
    def f(x, cfg, key):
        return x * Aliased.__getattribute__(cfg, key)

    r = check(f, [(torch.randn(3), Aliased(2, 1.0), "hidden"), (torch.randn(3), Aliased(2, 1.0), "scale"),
                  (torch.randn(3), Aliased(3, 1.0), "d_model")], fullgraph=True)
    assert r.breaks == 0


class Greeter:
    def __init__(self, k):
        self.k = k

    def scale(self, x):
        return x * self.k


def test_bound_method_made_while_tracing_is_returned():
    def f(x, g):
        m = g.scale
        return m(x), m

    g = Greeter(3)
    cnt = frametrace.testing.CompileCounter()
    out, m = frametrace.optimize(backend=cnt, fullgraph=True)(f)(torch.ones(2), g)
    assert m.__self__ is g and m.__func__ is Greeter.scale and cnt.frame_count == 1
    torch.testing.assert_close(out, torch.full((2,), 3.0))


def test_hasattr_and_getattr_default_ask_the_class_own_getattribute():
    # `hidden` exists only through the hook's alias: not in __dict__, nor the class.
    def f(x, cfg):
        return x * getattr(cfg, "hidden", 7), hasattr(cfg, "hidden"), hasattr(cfg, "other")

    r = check(f, [(torch.randn(3), Aliased(2, 1.0)), (torch.randn(3), Aliased(4, 1.0))],
              fullgraph=True)
    assert r.breaks == 0


LIMIT = [1]


@functools.lru_cache
def above_limit(v):
    return v > LIMIT[0]


def test_lru_cache_function_on_constants_is_answered_and_guarded():
    def f(x):
        return x + 1 if above_limit(2) else x - 1

    cnt = frametrace.testing.CompileCounter()
    compiled = frametrace.optimize(backend=cnt, fullgraph=True)(f)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    LIMIT[0] = 5                  # the cached answer stands: CPython still says True
    torch.testing.assert_close(compiled(x), f(x))
    above_limit.cache_clear()     # now CPython computes False: the guard sees it
    torch.testing.assert_close(compiled(x), x - 1)
    assert cnt.frame_count == 2


def test_tuple_constant_joins_a_traced_tuple():
    def f(x):
        acc = ()
        for i in range(3):
            acc = acc + (x * i,)
        return acc

    check(f, [torch.randn(3)], graphs=1, breaks=0)


class Scaled(torch.nn.Module):
    def __init__(self, k, act=None):
        super().__init__()
        self.k = k
        self.act = act if act is not None else torch.nn.Softmax(dim=-1)

    def forward(self, x):
        return self.act(x) * self.k


def test_modules_made_in_the_frame_are_inlined():
    def f(x, k):
        a = torch.nn.Softmax(dim=-1)(x)
        b = Scaled(k, torch.nn.GELU())(x)
        m = Scaled(2)
        m.k = m.k + 1          # a store after __init__
        return a + b + m(x)

    r = check(f, [(torch.randn(2, 3), 2), (torch.randn(2, 3), 3)], fullgraph=True)
    assert r.breaks == 0


def test_module_made_in_the_frame_with_parameters_is_not_compiled():
    # Its weights are new random tensors on every call: the frame runs in CPython there.
    def f(x):
        return torch.nn.Linear(3, 2)(x).sum()

    r = check(f, [torch.randn(2, 3), torch.randn(2, 3)], graphs=None)
    assert r.graphs == 0 or r.breaks >= 1


def test_module_made_in_the_frame_does_not_leave_it_compiled():
    def f(x):
        m = torch.nn.Softmax(dim=0)
        return m(x), m

    r = check(f, [torch.randn(3)], graphs=None)
    assert r.breaks + r.fallbacks >= 1


def test_model_output_from_outside_is_read_as_a_dict():
    transformers = pytest.importorskip("transformers")
    Out = transformers.modeling_outputs.BaseModelOutput

    def f(x, out):
        total = x
        for k, v in out.items():
            total = total + v
        return out[0] + out["last_hidden_state"], out.to_tuple(), list(out.keys()), total, len(out)

    r = check(f, [(torch.randn(2), Out(last_hidden_state=torch.randn(2), attentions=torch.randn(2))),
                  (torch.randn(2), Out(last_hidden_state=torch.randn(2), attentions=torch.randn(2))),
                  (torch.randn(2), Out(last_hidden_state=torch.randn(2)))],   # other keys: recompiled
              fullgraph=True)
    assert r.graphs == 2 and r.breaks == 0


class Settings:
    def __init__(self, n, tags):
        self.n = n
        self.tags = tags
        self.alias = tags
        self.table = {"k": [1, 2]}


class SelfCopying(Settings):
    def __deepcopy__(self, memo):
        return Settings(self.n * 10, [])


def test_deepcopy_of_a_plain_object_copies_its_state():
    import copy

    def f(x, s):
        c = copy.deepcopy(s)
        c.tags.append(len(c.table["k"]))
        c.n = c.n + 1
        d = c.__dict__
        return x * c.n + len(s.tags), c, c.alias is c.tags, d["n"]

    r = check(f, [(torch.randn(2), Settings(2, ["a"])), (torch.randn(2), Settings(2, ["a"])),
                  (torch.randn(2), Settings(3, ["a", "b"]))], fullgraph=True)
    assert r.breaks == 0 and r.graphs == 2


def test_deepcopy_follows_a_class_own_deepcopy():
    import copy

    def f(x, s):
        return x * copy.deepcopy(s).n

    check(f, [(torch.randn(2), SelfCopying(2, [])), (torch.randn(2), Settings(2, []))], graphs=None)


def test_classes_reached_without_a_path_are_returned():
    def f(x, s):
        return x + 1, type(s), s.__class__, type(x), Settings

    r = check(f, [(torch.randn(2), Settings(1, [])), (torch.randn(2), Settings(2, []))],
              fullgraph=True)
    assert r.breaks == 0


class Doubling(torch.nn.Module):
    flag = None

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def __call__(self, x):
        return super().__call__(x) * 2

    def forward(self, x):
        return self.lin(x) if self.flag is None else x


DOUBLING, LINEAR = Doubling(), torch.nn.Linear(4, 4)


def test_module_class_own_call_is_followed():
    def f(x):
        return DOUBLING(x)

    check(f, [torch.randn(2, 4)], graphs=1, breaks=0)


def test_module_call_spelled_out_is_the_module_call():
    def f(x):
        return LINEAR.__call__(x) + torch.nn.Module.__call__(LINEAR, x)

    check(f, [torch.randn(2, 4)], graphs=1, breaks=0)


class WithNoneDefault:
    marker = None

    def __init__(self, k):
        self.k = k


def test_class_attribute_that_is_none_is_read():
    def f(x, obj):
        made = WithNoneDefault(2)
        return x * obj.k if obj.marker is None and made.marker is None else x

    check(f, [(torch.randn(2), WithNoneDefault(3)), (torch.randn(2), WithNoneDefault(3))],
          graphs=1, breaks=0)


def test_class_attribute_that_is_none_is_guarded():
    class Holder:
        marker = None

    def f(x, obj):
        return x + 1 if obj.marker is None else x - 1

    compiled = frametrace.optimize(fullgraph=True)(f)
    h, x = Holder(), torch.zeros(1)
    assert compiled(x, h).item() == 1
    Holder.marker = 5
    assert compiled(x, h).item() == -1


RNN = torch.nn.RNN(4, 3, batch_first=True)


def test_rnn_reads_its_weights_through_weak_references():
    def f(x):
        return RNN(x)[0].sum(-1)

    check(f, [torch.randn(2, 5, 4), torch.randn(2, 5, 4)], graphs=1, breaks=0, atol=1e-5)


def test_weak_reference_call_follows_the_referent():
    import weakref

    class Box:
        pass

    def f(x, ref):
        target = ref()
        return x + 1 if target is None else x * target.k

    alive = Box()
    alive.k = 3
    ref = weakref.ref(alive)
    compiled = frametrace.optimize()(f)
    assert compiled(torch.ones(1), ref).item() == 3
    del alive
    assert compiled(torch.ones(1), ref).item() == 2


VALIDATORS = {list: len, dict: len}


def test_dict_with_class_keys_is_read_and_guarded():
    def f(x, kind):
        if validator := VALIDATORS.get(kind):
            return x + validator([1, 2])
        return x

    check(f, [(torch.randn(2), list), (torch.randn(2), tuple)], globals=("VALIDATORS",), breaks=0)


def test_copied_object_with_own_getattribute_renames_keys():
    # What a config's get_text_config does on a deep copy: hasattr through the hook,
    # delattr and setattr of the copy; the original is left alone.
    import copy

    def f(x, cfg):
        c = copy.deepcopy(cfg)
        if hasattr(c, "hidden") and not hasattr(c, "missing"):
            value = c.scale
            delattr(c, "scale")
            setattr(c, "gain", value)
        return x * c.hidden + c.gain, hasattr(c, "scale"), dict(c.__dict__), c

    r = check(f, [(torch.randn(2), Aliased(2, 1.5)), (torch.randn(2), Aliased(3, 0.5))],
              fullgraph=True)
    assert r.breaks == 0


def test_deleting_a_missing_attribute_is_not_compiled_away():
    def f(x):
        s = Settings(1, [])
        del s.n
        del s.n           # AttributeError, in CPython too
        return x

    check(f, [torch.randn(2)], graphs=None)


def test_hasattr_of_an_object_made_in_the_frame():
    class Thing:
        kind = "t"

        def __init__(self, k):
            self.k = k

    def f(x):
        t = Thing(2)
        return x * t.k, hasattr(t, "k"), hasattr(t, "kind"), hasattr(t, "other"), \
            getattr(t, "other", 5)

    check(f, [torch.randn(2)], fullgraph=True, breaks=0)
