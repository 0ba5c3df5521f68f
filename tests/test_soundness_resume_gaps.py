"""Resume functions, guards and builtins: gaps where a compiled frame (or a resume
function run in CPython) answered differently from CPython.  Differential tests."""
import torch

import frametrace
from differential import check


@frametrace.disable
def opaque(t):
    return t


def test_locals_in_a_resume_function_run_in_cpython_lists_only_user_names():
    def f(x):
        y = x + 1
        z = [opaque(y), 2]
        try:                      # no break inside a try: the resume frame runs in CPython
            opaque(y)
        except ValueError:
            pass
        return sorted(locals())
    r = check(f, [torch.ones(2), torch.zeros(2)], breaks=1)
    assert r.fallbacks == 1
