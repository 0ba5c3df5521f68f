"""Calls that ask torch about the machine's devices are answered while tracing
(variables/device_facts.py): no graph break, the same answer as CPython's, and left to
CPython where the answer depends on the current device and devices differ, or where the
call raises."""
import pytest
import torch

import frametrace
from frametrace.variables import device_facts
from differential import check


def uses_process_facts(x):
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        x = x * 2
    if torch.backends.cuda.is_built() or torch.backends.cudnn.is_available():
        x = x + 1
    return x - torch.cuda.device_count()


def test_process_facts_fold_without_a_break():
    check(uses_process_facts, [torch.randn(3), torch.randn(2, 2), torch.tensor([1, 2])],
          breaks=0, fallbacks=0)


def _fake_devices(monkeypatch, answers):
    """A device function answering `answers[index]` per device, registered as torch's
    capability query is, over `len(answers)` visible devices (current: 0)."""
    def capability(device=None):
        if device is None or device == "cuda" or getattr(device, "index", 0) is None:
            device = 0
        index = device if isinstance(device, int) else torch.device(device).index
        if index >= len(answers):
            raise AssertionError(f"Invalid device id {index}")
        return answers[index]
    capability.__module__ = "torch.cuda"    # (torch's own: called, not inlined)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(answers))
    monkeypatch.setitem(device_facts.FACTS, capability, (device_facts._DEVICE, 0, "device"))
    return capability


@pytest.mark.parametrize("answers", [((9, 0), (9, 0)), ((9, 0), (8, 0))])
def test_device_facts_fold_where_the_device_is_named_or_all_agree(monkeypatch, answers):
    capability = _fake_devices(monkeypatch, answers)

    def named(x):
        major, minor = capability(1)
        return x * major + (x if capability(device=torch.device("cuda", 0)) >= (9, 0) else -x)

    def current(x):
        return x * capability()[0] + capability("cuda")[1]
    check(named, [torch.randn(3), torch.randn(4)], breaks=0, fallbacks=0)
    frametrace.reset()
    agree = answers[0] == answers[1]
    # (devices that differ: the current device's answer is CPython's, at a graph break)
    report = check(current, [torch.randn(3), torch.randn(4)], graphs=None)
    assert (report.breaks == 0 and report.graphs >= 1) if agree else report.breaks >= 1, report


def test_a_device_fact_that_raises_raises_where_cpython_does(monkeypatch):
    capability = _fake_devices(monkeypatch, ((9, 0),))

    def f(x):
        y = x + 1
        return y * capability(3)[0]     # (no device 3)
    check(f, [torch.randn(3)], graphs=None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_capability_folds_on_a_gpu():
    def f(x):
        if torch.cuda.get_device_capability(x.device) >= (8, 0) and torch.cuda.is_bf16_supported():
            return (x * 2).to(torch.bfloat16)
        return x + len(torch.cuda.get_device_name(x.device))
    check(f, [torch.randn(3, device="cuda"), torch.randn(5, device="cuda")], breaks=0, fallbacks=0)



def _available(x):
    return x + 1 if torch.cuda.is_available() else x - 1


def _from_argument(x, query):
    return x + 1 if query() else x - 1


def _patched(fn):
    def action():
        torch.cuda.is_available = fn
    return action


def test_a_query_replaced_after_the_compile_is_called_again(monkeypatch):
    """The fold answers for the function object traced: a user's replacement of
    torch.cuda.is_available after the first compile (a mock, a test's monkeypatch) is
    called, as CPython calls it, by the guard on the attribute; a query passed in, by
    the guard on the argument."""
    from differential import Then
    real = torch.cuda.is_available
    monkeypatch.setattr(torch.cuda, "is_available", real)   # (put back after the test)

    def mine():
        return not real()
    check(_available, [torch.ones(2), Then(_patched(mine), torch.ones(2)), Then(_patched(real), torch.ones(2))],
          breaks=0, fallbacks=0)
    frametrace.reset()
    check(_from_argument, [(torch.ones(2), real), (torch.ones(2), mine), (torch.ones(2), real)], breaks=0, fallbacks=0)


@pytest.mark.parametrize("devices", [[0, 1, 0], ["cuda:0", "cuda:1"], [torch.device("cuda", 1), torch.device("cuda", 0)]])
def test_named_devices_from_arguments_and_attributes(monkeypatch, devices):
    """A device named by an argument, a keyword or a module's attribute: each call's
    device's own answer (the argument's guard), used as a shape, returned and stored."""
    capability = _fake_devices(monkeypatch, ((9, 0), (8, 6)))

    def by_argument(x, device):
        major, minor = capability(device=device)
        return x * major + torch.zeros(minor).sum(), capability(device)

    class Layer(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            self.device = device

        def forward(self, x):
            self.capability = capability(self.device)
            return x * self.capability[1]

    check(by_argument, [(torch.randn(3), d) for d in devices], breaks=0, fallbacks=0)
    frametrace.reset()
    check(lambda layer, x: layer(x), [(Layer(d), torch.randn(3)) for d in devices], breaks=0, fallbacks=0)


# The program of a warm start over another machine's cache: torch's own
# torch.accelerator.device_count (the function in FACTS, not a replacement) answers NGPU,
# as on a machine with that many devices (or CUDA_VISIBLE_DEVICES naming that many).
_OTHER_MACHINE = '''
import json, os, torch, frametrace
from frametrace import convert
NGPU = int(os.environ["NGPU"])
torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cuda") if NGPU else None
torch.cuda.device_count = lambda: NGPU

def shards(x):
    return x.chunk(max(torch.accelerator.device_count(), 1))

records = []
convert.record_observers.append(records.append)
got = frametrace.optimize(shards, backend=os.environ["BACKEND"])(torch.arange(4.0))
print("RESULT", json.dumps({"got": [t.tolist() for t in got],
                            "want": [t.tolist() for t in shards(torch.arange(4.0))],
                            "from_cache": sum(1 for r in records if r.from_cache)}))
'''


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_warm_start_on_other_devices_does_not_reuse_their_answers(tmp_path, backend):
    """An entry of the on-disk cache holds the answers folded where it was compiled: a
    process that sees other devices (a shared cache folder, another CUDA_VISIBLE_DEVICES)
    compiles again instead of loading it (warm_cache's key covers every device fact)."""
    import json
    import os
    import subprocess
    import sys
    (tmp_path / "prog.py").write_text(_OTHER_MACHINE)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(ngpu):
        env = dict(os.environ, NGPU=str(ngpu), BACKEND=backend, FRAMETRACE_CACHE_DIR=str(tmp_path / "cache"),
                   PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
                   PYTHONDONTWRITEBYTECODE="1")
        env.pop("FRAMETRACE_LOGS", None)
        proc = subprocess.run([sys.executable, str(tmp_path / "prog.py")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert line, proc.stdout + proc.stderr[-3000:]
        return json.loads(line[0][len("RESULT "):])
    one = run(1)
    assert one["got"] == one["want"] == [[0.0, 1.0, 2.0, 3.0]] and one["from_cache"] == 0
    two = run(2)
    assert two["got"] == two["want"] == [[0.0, 1.0], [2.0, 3.0]], two
    assert two["from_cache"] == 0
    again = run(2)      # (the same devices: the entry serves)
    assert again["got"] == again["want"] and again["from_cache"] >= 1, again
