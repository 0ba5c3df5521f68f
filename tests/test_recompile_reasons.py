"""Recompiles: an identical call never recompiles (state frametrace changes while it
compiles does not fail its own guards), and each recompile says, for every cached
entry, which guard failed, in plain words."""
import abc
import collections.abc
import logging
import warnings

import pytest
import torch
from differential import Then, check

import frametrace
from frametrace import _C, convert
from frametrace.backends import lookup_backend
from frametrace.testing import CompileCounter

BACKENDS = frametrace.list_backends()     # (triton on CPU tensors: its fallback, warned)


class _Reason(abc.ABC):
    """An ABC no program here asks about: registering with it bumps the ABC token, as
    torch's lazily imported modules do while a backend compiles."""


def registering(backend):
    """`backend`, which also registers a new class with an unrelated ABC while it
    compiles (what AOTAutograd's first compile does through torch's lazy imports)."""
    inner = lookup_backend(backend)

    def compile_and_register(gm, example_inputs):
        _Reason.register(type("Fresh", (), {}))
        return inner(gm, example_inputs)
    for flag in ("__frametrace_runs_ops_as_traced__", "__frametrace_defers_input_mutations__"):
        if hasattr(inner, flag):
            setattr(compile_and_register, flag, getattr(inner, flag))
    return compile_and_register


class _Own:
    """A counter of compiles and of entries that failed their own guard."""

    def __enter__(self):
        self.records = []
        self.failed_before = convert.counters["failed_own_guard"]
        convert.record_observers.append(self.records.append)
        return self

    def __exit__(self, *exc):
        convert.record_observers.remove(self.records.append)
        self.failed_own = convert.counters["failed_own_guard"] - self.failed_before
        return False


def _needs_inductor(backend):
    if backend == "inductor":
        pytest.importorskip("torch._inductor")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_abc_registration_made_while_compiling_does_not_recompile(backend):
    _needs_inductor(backend)

    def f(x, d):
        if isinstance(d, collections.abc.Mapping):     # False: rests on the ABC token
            return x + 1
        return (x * d[0]).sin()

    x = torch.randn(4)
    with _Own() as own, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = check(f, [(x, [2.0])] * 4, backend=registering(backend))
    assert r.graphs == 1 and r.compiles == 1 and own.failed_own == 0, r


def test_without_the_refresh_the_token_guard_fails_on_the_next_call(monkeypatch):
    # (what the test above tells apart: the switch off, the same program recompiles)
    monkeypatch.setattr(frametrace.config, "refresh_abc_token", False)

    def f(x, d):
        if isinstance(d, collections.abc.Mapping):
            return x + 1
        return (x * d[0]).sin()

    with _Own() as own:
        r = check(f, [(torch.randn(4), [2.0])] * 3, backend=registering("eager"))
    assert r.compiles == 3 and own.failed_own == 3, r     # every call compiles again


def test_a_registration_after_the_compile_that_changes_no_answer_does_not_recompile():
    # Another frame's compile, or a library's first use, registers classes the entry
    # never asked about: the entry's answers still hold, so it still holds.
    def f(x, d):
        if isinstance(d, collections.abc.Mapping):
            return x + 1
        return (x * d[0]).sin()

    def other(x):
        return x.cos()

    x = torch.randn(4)
    r = check(f, [(x, [2.0]),
                  Then(lambda: _Reason.register(type("Fresh", (), {})), x, [2.0]),
                  Then(lambda: frametrace.optimize(backend=registering("eager"))(other)(x), x, [2.0]),
                  (x, [2.0])])
    # (compiles counts `other`'s too; graphs only f's)
    assert r.compiles == 2 and r.graphs == 1, r


def test_without_revalidation_a_registration_after_the_compile_recompiles(monkeypatch):
    monkeypatch.setattr(frametrace.config, "refresh_abc_token", False)

    def f(x, d):
        if isinstance(d, collections.abc.Mapping):
            return x + 1
        return (x * d[0]).sin()

    x = torch.randn(4)
    r = check(f, [(x, [2.0]), Then(lambda: _Reason.register(type("Fresh", (), {})), x, [2.0])])
    assert r.compiles == 2, r


class Point:
    def __init__(self, v):
        self.v = v


def test_a_registration_between_calls_that_changes_isinstance_recompiles():
    Local = type("Local", (Point,), {})       # registered only by this test
    Virtual = type("Virtual", (abc.ABC,), {})

    def g(x, p):
        if isinstance(p, Virtual):
            return x + p.v
        return x - p.v

    x = torch.randn(3)
    r = check(g, [(x, Local(2.0)), (x, Local(2.0)),
                  Then(lambda: Virtual.register(Local), x, Local(2.0)), (x, Local(2.0))])
    assert r.compiles == 2 and r.graphs == 2, r


def test_a_registration_while_compiling_that_changes_the_answer_is_not_trusted():
    Local = type("Local", (Point,), {})
    Virtual = type("Virtual", (abc.ABC,), {})
    inner = lookup_backend("eager")

    def backend(gm, example_inputs):
        Virtual.register(Local)         # the trace's False is now True
        return inner(gm, example_inputs)
    backend.__frametrace_runs_ops_as_traced__ = True

    def g(x, p):
        if isinstance(p, Virtual):
            return x + p.v
        return x - p.v

    cnt = CompileCounter(backend)
    h = frametrace.optimize(backend=cnt)(g)
    x = torch.randn(3)
    # The first call's trace (x - v) is stale once compiled: that call runs in CPython,
    # after the registration, as the program now is.
    torch.testing.assert_close(h(x, Local(2.0)), x + 2.0)
    torch.testing.assert_close(h(x, Local(2.0)), x + 2.0)
    torch.testing.assert_close(h(x, Local(2.0)), x + 2.0)
    assert cnt.frame_count == 2
    assert len(_C.entries(g.__code__)) == 1


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    return transformers.GPT2Model(cfg).eval()


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=100, max_position_embeddings=32)
    return transformers.BertModel(cfg).eval()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("make", [_tiny_gpt2, _tiny_bert], ids=["gpt2", "bert"])
def test_hf_model_second_identical_call_compiles_nothing(backend, make):
    torch.manual_seed(0)
    model = make()
    ids = torch.randint(0, 100, (2, 8))
    want = model(ids).last_hidden_state
    # registering(): the ABC token moves during every compile, whether or not this
    # process already imported what AOTAutograd imports lazily.
    g = frametrace.optimize(model, backend=CompileCounter(registering(backend)))
    with _Own() as own:
        torch.testing.assert_close(g(ids).last_hidden_state, want)
        first = len(own.records)
        for _ in range(3):
            torch.testing.assert_close(g(ids).last_hidden_state, want)
    assert first >= 1 and any(r.graph_module is not None for r in own.records)
    assert len(own.records) == first and own.failed_own == 0, \
        [(r.code.co_name, r.outcome) for r in own.records]


def test_inductor_hf_model_second_identical_call_compiles_nothing():
    pytest.importorskip("torch._inductor")
    test_hf_model_second_identical_call_compiles_nothing("inductor", _tiny_gpt2)


def test_inductor_function_twice_compiles_once():
    pytest.importorskip("torch._inductor")

    def f(x, d):
        if isinstance(d, collections.abc.Mapping):
            return x + 1
        return (x * d[0]).sin() + x.cos()

    with _Own() as own:
        r = check(f, [(torch.randn(8), [2.0])] * 3, backend="inductor")
    assert r.graphs == 1 and r.compiles == 1 and own.failed_own == 0, r


# ------------------------------------------------------------ reasons, in words
class _Log:
    """The messages of the recompiles log."""

    def __enter__(self):
        self.messages = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        self.logger = logging.getLogger("frametrace.recompiles")
        self.logger.addHandler(self.handler)
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)
        return False


def scaled(x, mode):
    y = x * 2
    return y if mode == "a" else y - 2


def test_each_recompile_names_every_entrys_failed_guard_most_recent_first():
    x8, x16 = torch.randn(8), torch.randn(16)
    with _Log() as log:
        r = check(scaled, [(x8, "a"), (x16, "a"), (x16, "b"), (x16, "b"),
                           (x16.double(), "a"), (x8, "a")], dynamic=False)
    assert r.compiles == 4 and r.graphs == 4, r
    m = log.messages
    assert len(m) == 3, m
    assert m[0].startswith(f"recompiling scaled ({__file__}:{scaled.__code__.co_firstlineno}): "
                           "x.size(0): 8 → 16 (guard failed: x: Tensor float32[8]"), m[0]
    assert "none of its 2 entries fits (most recent first):\n" \
           "  1. mode: 'a' → 'b' (guard failed: mode == 'a' (now: mode = 'b'))\n" \
           "  2. x.size(0): 8 → 16" in m[1], m[1]
    lines = m[2].split("\n")
    assert "none of its 3 entries fits" in lines[0] and len(lines) == 4, m[2]
    assert all(line.startswith(f"  {i}. x.dtype: float32 → float64 (guard failed: ")
               for i, line in enumerate(lines[1:], 1)), m[2]


def test_a_float_in_words():
    def f(x, lr):
        return x * lr

    with _Log() as log:
        r = check(f, [(torch.ones(3), 0.001), (torch.ones(3), 0.00099)], dynamic=False)
    assert r.compiles == 2, r
    assert "f (" in log.messages[0] and ": lr: 0.001 → 0.00099 (guard failed: " in log.messages[0]


def test_explain_of_a_compiled_function_is_not_a_recompile():
    def f(x):
        return x.sin() + 1

    cnt = CompileCounter()
    g = frametrace.optimize(backend=cnt)(f)
    x = torch.randn(4)
    g(x)
    with _Log() as log:
        report = frametrace.explain(g)(x)
        torch.testing.assert_close(g(x), x.sin() + 1)
    assert report.graph_count == 1 and cnt.frame_count == 1
    # (explain's compile is under its own settings: no entry of g's failed)
    assert log.messages == [], log.messages


class Scale(torch.nn.Module):
    def forward(self, x, n):
        return x * n


def test_the_cache_limit_warning_names_the_function_and_the_users_line(monkeypatch):
    monkeypatch.setattr(frametrace.config, "cache_size_limit", 2)
    model = frametrace.optimize(Scale(), backend=CompileCounter())
    x = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(4):
            out = model(x, n)       # CALL_LINE
            torch.testing.assert_close(out, x * n)
    limit = [w for w in caught if "cache limit" in str(w.message)]
    assert len(limit) == 1, [str(w.message) for w in caught]
    w = limit[0]
    text = str(w.message)
    assert f"Scale.forward ({__file__}:{Scale.forward.__code__.co_firstlineno})" in text, text
    assert "The last miss: n: 1 → 2 (guard failed: n == 1" in text, text
    assert "FRAMETRACE_LOGS=recompiles" in text and "cache_size_limit = 2" in text
    # at the call, in this file: not torch's module.py, not frametrace's
    call_line = next(i for i, line in enumerate(open(__file__), 1) if "# CALL_LINE" in line)
    assert (w.filename, w.lineno) == (__file__, call_line), (w.filename, w.lineno)
