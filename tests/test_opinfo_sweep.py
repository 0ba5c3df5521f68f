"""PyTorch's operator database through frametrace, a fixed-seed part of `opinfo_sweep.py`.

Every op of op_db runs once (one seeded sample) on the eager backend, with its graph passes
on, in plain layout and in one other layout (transposed, sliced, expanded or channels-last,
taking turns), alone and followed by `.contiguous()` of its outputs, and on aot_eager in
plain layout with gradients.  Each case is compared with eager over three calls (values,
NaN positions, strides, contiguity, aliasing, input writes, exception types); a case that
compiled nothing is fine, a wrong one fails the test.  The whole sweep is the script.
"""
import pytest
import torch

import opinfo_sweep

CHUNKS = 6
_OPS = None


def _ops():
    global _OPS
    if _OPS is None:
        _OPS = [op for op in opinfo_sweep.select_ops() if op.name not in opinfo_sweep._NONDETERMINISTIC]
    return _OPS


def _chunk(i):
    ops = _ops()
    return ops[i::CHUNKS]


def _run(ops, backend, layouts_for, grad, posts):
    failures, compiled = [], 0
    for k, op in enumerate(ops):
        table, bad = opinfo_sweep.sweep([op], [backend], layouts_for(k), samples=1, grad=grad,
                                        seed=k, posts=posts)
        failures += bad
        compiled += sum(row["right"] for row in table.values())
    return failures, compiled


def _report(failures):
    return "\n".join(f"{o.result} {b} {c.name} [{c.layout}{', grad' if c.grad else ''}"
                     f"{', then ' + c.post if c.post != 'none' else ''}] {o.detail}"
                     for c, b, o in failures)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_opinfo_eager_backend_with_layouts(chunk):
    others = opinfo_sweep.LAYOUTS[1:]
    failures, compiled = _run(_chunk(chunk), "eager",
                              lambda k: ("plain", others[(k + chunk) % len(others)]), False,
                              ("none", "contiguous"))
    assert not failures, _report(failures)
    assert compiled > 100, "most cases must compile a graph"


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_opinfo_aot_eager_with_gradients(chunk):
    failures, compiled = _run(_chunk(chunk), "aot_eager", lambda k: ("plain",), True, ("none",))
    assert not failures, _report(failures)
    assert compiled > 50, "most cases must compile a graph"
