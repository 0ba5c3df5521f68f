"""`warnings.simplefilter` / `filterwarnings` in the compiled frame: inside a traced
`with warnings.catch_warnings()` they change nothing anyone sees after the block, so
they are dropped (config.trace_warning_filters_in_catch_warnings); an "error" filter,
which turns a warning into an exception, and any outside such a block are breaks that
CPython runs.
"""
import warnings

import pytest
import torch

import frametrace
from differential import check


def xs(n=3):
    return [(torch.randn(3),) for _ in range(n)]


@pytest.fixture
def filters_kept():
    saved = list(warnings.filters)
    yield
    warnings.filters[:] = saved
    warnings._filters_mutated()


def ignoring(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("ignore", category=DeprecationWarning, message="old")
        y = x + 1
    return y * 2


def test_filters_inside_catch_warnings_trace(filters_kept):
    before = list(warnings.filters)
    check(ignoring, xs(), graphs=1, breaks=0, compiles=1)
    assert warnings.filters == before


def test_an_error_filter_breaks(filters_kept):
    def f(x):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = x + 1
        return y

    r = check(f, xs(), graphs=None)
    assert r.breaks >= 1 and any("filters" in why for why in r.reasons()), r


def test_a_filter_outside_catch_warnings_breaks(filters_kept):
    def f(x):
        warnings.simplefilter("ignore", category=ResourceWarning)
        return x + 1

    r = check(f, xs(), graphs=None)
    assert r.breaks >= 1, r


def test_switched_off(filters_kept, monkeypatch):
    monkeypatch.setattr(frametrace.config, "trace_warning_filters_in_catch_warnings", False)
    r = check(ignoring, xs(), graphs=None)
    assert r.breaks >= 1, r
