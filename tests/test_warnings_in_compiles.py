"""A warning raised by compiled code fires once per location, as in CPython, across the
first compile (eager, aot_eager and a backend that silences warnings), and filters a
compile adds still count."""
import warnings

import pytest
import torch

import frametrace

BACKENDS = ["eager", "aot_eager"]


_WARNS = """
import warnings
def f(x):
    warnings.warn("careful")
    return x + 1
"""


def _warning_module(name):
    # Its own globals, so its own __warningregistry__ (the once-per-location memory).
    g = {"__name__": name}
    exec(compile(_WARNS, f"<{name}>", "exec"), g)
    return g["f"]


def _quiet_aot_eager(gm, example_inputs):
    # A backend that silences warnings while it compiles, as much of torch does: the
    # first AOT compile of a process also imports modules that do.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return frametrace.backends.lookup_backend("aot_eager")(gm, example_inputs)


@pytest.mark.parametrize("backend", BACKENDS + [_quiet_aot_eager])
def test_a_warning_fires_once_per_location_across_the_first_compile(backend):
    plain = _warning_module("warns_in_cpython")
    counter = frametrace.testing.CompileCounter(inner=backend)
    compiled = frametrace.optimize(_warning_module("warns_compiled"), backend=counter)
    counts = []
    for fn in (plain, compiled):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            for n in (3, 3, 3, 5):
                assert torch.equal(fn(torch.ones(n)), torch.ones(n) + 1)
        # (only this module's warnings: a subprocess or file of another test collected
        # meanwhile adds ResourceWarnings to the record)
        counts.append([str(w.message) for w in seen if w.filename.startswith("<warns_")])
    assert counts[0] == counts[1] == ["careful"], counts
    assert counter.frame_count >= 1


def test_filters_a_compile_adds_still_count():
    # A net change of the filters made while compiling (an import's filterwarnings) is
    # a change: the registry forgets, as it would in CPython.
    before = list(warnings.filters)
    try:
        from frametrace.convert import _warning_filters_kept
        reg = {"version": None}
        with _warning_filters_kept():
            warnings.filterwarnings("ignore", message="never-seen-message")
        warnings.warn_explicit("x", UserWarning, "f.py", 1, registry=reg)
        version = reg["version"]
        with _warning_filters_kept():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
        warnings.warn_explicit("x", UserWarning, "f.py", 1, registry=reg)
        assert reg["version"] == version     # undone inside: no change
        with _warning_filters_kept():
            warnings.filterwarnings("ignore", message="another-never-seen-message")
        warnings.warn_explicit("x", UserWarning, "f.py", 1, registry=reg)
        assert reg["version"] != version
    finally:
        warnings.filters[:] = before
        warnings._filters_mutated()
