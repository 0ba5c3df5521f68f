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
