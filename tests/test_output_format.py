"""Output people read (issue 30, item 7): explain() through a pipe keeps whole lines
(on a terminal they wrap), guard texts read as facts ("autocast: off", not "autocast is
off is False"), and `print(round(t.mean().item(), 3))` is one graph break with one
reason, over a loop of calls."""
import copy
import io
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import frametrace
from frametrace import convert

from differential import check

THIS_FILE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(THIS_FILE))


class LongNames(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_with_a_rather_long_name = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.proj_with_a_rather_long_name(x).relu() * 2


WHOLE = "l_self__modules__proj_with_a_rather_long_name____parameters__bias"


def _signature(text):
    return next(l for l in text.splitlines() if "def forward(self, l_x" in l)


def test_explain_through_a_pipe_has_whole_lines():
    script = textwrap.dedent(f"""
        import sys, torch, frametrace
        sys.path.insert(0, {os.path.dirname(THIS_FILE)!r})
        from test_output_format import LongNames
        print(frametrace.explain(LongNames())(torch.randn(4, 8)))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=180, cwd=ROOT, env=dict(os.environ, COLUMNS="80"))
    assert out.returncode == 0, out.stderr
    sig = _signature(out.stdout)
    assert WHOLE in sig and sig.rstrip().endswith('"f32[8]"):'), sig
    assert max(len(l) for l in out.stdout.splitlines()) > 80      # nothing cut at 80


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_explain_str_cuts_nothing(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    report = frametrace.explain(LongNames())(torch.randn(4, 8))
    # not a terminal (pytest's capture): whole lines
    assert WHOLE in _signature(str(report))
    # a terminal of 60 columns: lines wrap there, and nothing is lost
    monkeypatch.setattr(sys, "stdout", _Terminal())
    text = str(report)
    assert max(len(l) for l in text.splitlines()) <= 60
    assert WHOLE in "".join(l.strip() for l in text.splitlines()) and "…" not in text


# Guard texts that say a statement "is False" (or 0) read as its opposite.
_CONTRADICTION = re.compile(r"(\bno\b|\bnot\b|\bis off\b|\bhas no\b|\bis on\b).* is (False|True|0|1)$")


def _texts(fn, *args, backend="eager"):
    frametrace.reset()
    g = frametrace.optimize(backend=backend)(fn)
    g(*args)
    texts = []
    for code in {fn.__code__} | {c for c in _resume_codes(fn.__code__)}:
        for entry in frametrace._C.entries(code):
            guard_set = getattr(entry.check, "guard_set", None)
            if guard_set is not None:
                texts += guard_set.texts()
    return texts


def _resume_codes(code):
    from frametrace.resume import resume_codes_in
    for entry in frametrace._C.entries(code):
        if entry.code is not None:
            for r in resume_codes_in(entry.code):
                yield r
                yield from _resume_codes(r)


class Point:
    def __init__(self, x):
        self.x = x


class WithBuffer(torch.nn.Module):
    def forward(self, x):
        self.register_buffer("scratch", x * 2)
        return self.scratch + 1


def test_guard_texts_read_as_facts():
    def plain(x):
        return x.sin() + 1

    def copies(x):
        p = Point(x)
        q = copy.deepcopy(p)
        return q.x * 2

    texts = _texts(plain, torch.randn(3))
    for fact in ("grad mode: on", "autocast: off", "torch function modes: none",
                 "default dtype: torch.float32"):
        assert fact in texts, texts
    with torch.no_grad():
        assert "grad mode: off" in _texts(plain, torch.randn(3))
    texts += _texts(copies, torch.randn(3))
    module = WithBuffer()
    frametrace.reset()
    frametrace.optimize(module)(torch.randn(3))
    for entry in frametrace._C.entries(WithBuffer.forward.__code__):
        texts += entry.check.guard_set.texts()
    bad = [t for t in texts if _CONTRADICTION.search(t)]
    assert not bad, bad
    assert not any(t.endswith((" is off is False", " mode is 0")) for t in texts)


def test_guard_failure_names_the_fact():
    # a recompile's reason quotes the guard text: it must read as the fact that changed
    import logging
    from frametrace import logs
    stream = io.StringIO()

    def f(x):
        return x * 2
    logs.set(recompiles=True)
    try:
        for h in logging.getLogger("frametrace.recompiles").handlers:
            if getattr(h, "_frametrace", False):
                h.setStream(stream)
        frametrace.reset()
        g = frametrace.optimize(f)
        g(torch.randn(2))
        with torch.no_grad():
            g(torch.randn(2))
    finally:
        logs.clear()
    logged = stream.getvalue()
    assert "grad mode: on" in logged and "is True" not in logged, logged


# --------------------------------------------------------------------------- one break
def mean_printed(x):
    h = x.relu() + 0.25
    print(round(h.mean().item(), 3))
    return h * 2


def loss_logged(x, step):
    loss = (x * x).sum()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    return loss + 1


def rounded_scale(x):
    s = round(x.sum().item(), 2) * x        # the rest stops at the product: traced again
    return s + 1


def rounded_badly(x):
    print(round(x.sum().item(), "2"))       # TypeError from round(), at this line
    return x


def two_values(x):
    print(x.sum().item(), x.mean().item())
    return x - 1


def _pairs(capsys):
    lines = capsys.readouterr().out.splitlines()
    # each call prints in CPython, then compiled: the same lines
    assert lines and len(lines) % 2 == 0 and lines[0::2] == lines[1::2], lines
    return lines[0::2]


def _inputs(n=5):
    return [torch.randn(6) * (i + 1) for i in range(n)]


def test_round_of_item_printed_is_one_break(capsys):
    frametrace.reset()
    r = check(mean_printed, _inputs(), graphs=2, breaks=1, compiles=2)   # no recompile in 5
    assert "Tensor.item() needs the tensor's data" in r.reasons()[0]
    printed = _pairs(capsys)
    assert len(printed) == 5 and len(set(printed)) == 5       # every call's own value


def test_formatted_log_line_is_one_break(capsys):
    frametrace.reset()
    # (one step number: an int formatted in the trace is guarded by value)
    check(loss_logged, [(x, 7) for x in _inputs()], breaks=1, compiles=2)
    printed = _pairs(capsys)
    assert len(printed) == 5 and all(l.startswith("step 7 loss ") for l in printed)


def test_rest_stops_where_the_trace_can_go_on():
    frametrace.reset()
    r = check(rounded_scale, _inputs(), graphs=2, breaks=1, compiles=2)
    assert r.graphs == 2                                  # the product is traced after it


def test_rest_raises_as_cpython_does(capsys):
    frametrace.reset()
    check(rounded_badly, _inputs(2), breaks=1)               # TypeError both sides
    assert capsys.readouterr().out == ""


def test_two_items_in_a_statement_are_two_breaks(capsys):
    frametrace.reset()
    check(two_values, _inputs(3), breaks=2)               # was three: print broke again
    assert len(_pairs(capsys)) == 3


def test_shadowed_builtin_is_not_run_as_the_rest(capsys):
    calls = []

    def round(value, digits):                             # noqa: A001 (the user's round)
        calls.append(value)
        return -1.0

    def f(x):
        print(round(x.sum().item(), 3))
        return x + 1
    frametrace.reset()
    check(f, _inputs(3))
    assert _pairs(capsys) == ["-1.0"] * 3 and len(calls) == 6


def test_inside_try_the_break_runs_its_call_only(capsys):
    def f(x):
        try:
            print(round(x.sum().item(), 3))
        except TypeError:
            return x
        return x + 1
    frametrace.reset()
    check(f, _inputs(3))
    assert len(_pairs(capsys)) == 3


def test_switch_off_gives_the_breaks_back(monkeypatch, capsys):
    monkeypatch.setattr(frametrace.config, "break_runs_statement_rest", False)
    frametrace.reset()
    check(mean_printed, _inputs(3), graphs=2, breaks=3)
    assert len(_pairs(capsys)) == 3


def rounded_on_the_next_line(x):
    v = x.sum().item()
    print(round(v, 3))
    return x + 1


def test_reason_names_the_value_not_the_arguments(capsys):
    frametrace.reset()
    r = check(rounded_on_the_next_line, _inputs(3), breaks=2)     # item; round (print with it)
    item, rounding = r.reasons()
    assert rounding.startswith("round() needs the value of a float"), rounding
    assert ", 3" not in rounding
    assert len(_pairs(capsys)) == 3


# ------------------------------------------------------------- numbers in f-strings
def step_logged(x, step):
    loss = (x * x).sum()
    print(f"step {step:>3} loss {loss.item():.4f}")
    return loss + step


def test_a_step_counter_in_a_printed_line_stays_symbolic(capsys):
    # f"step {step}" formats a symbolic int: CPython formats it at the break, from the
    # number's value, instead of the trace pinning it (a recompile per step)
    frametrace.reset()
    r = check(step_logged, [(torch.randn(6), i) for i in range(8)])
    # one break per compile, three compiles: 0 and 1 specialized, then symbolic
    assert r.breaks == 3 and r.compiles == 6, r
    printed = _pairs(capsys)
    assert [l.split()[1] for l in printed] == [str(i) for i in range(8)]


LAYERS = {f"layer{i}": i * 10 for i in range(6)}


def named_layer(x, i):
    name = f"layer{i}"                       # used as a key: pinned, as before
    return x + LAYERS[name] + len(name)


def scaled_label(x, i):
    label = f"{i:03d}|{i!r}|{i * 2.5:.2f}"    # joined into a string the trace returns
    return x * i, label


def test_a_formatted_number_read_as_a_constant_is_pinned():
    frametrace.reset()
    check(named_layer, [(torch.randn(3), i) for i in range(6)])
    check(scaled_label, [(torch.randn(3), i) for i in (2, 3, 11, 250)])


def size_labels(x):
    n = x.shape[0] * 2 + 1                      # computed in the graph from a symbolic size
    return x + 1, f"n={n}", [f"{x.shape[0] - 1:>3}"]


def product_printed(x, i):
    label = f"{i * 3}"                          # computed in the graph, printed at the break
    print(label, round(x.sum().item(), 3))
    return x


def test_numbers_the_graph_computes_are_formatted_from_its_outputs(capsys):
    frametrace.reset()
    r = check(size_labels, [torch.randn(3), torch.randn(5), torch.randn(7)], dynamic=True)
    assert r.compiles == 1, r                   # the sizes stay symbolic: one compile
    r = check(product_printed, [(torch.randn(3), i) for i in range(6)])
    assert r.breaks == 3, r                     # 0 and 1 specialize, then symbolic
    assert [l.split()[0] for l in _pairs(capsys)] == [str(3 * i) for i in range(6)]
