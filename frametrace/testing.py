"""Helpers for tests: a backend that counts what it was given.

>>> cnt = frametrace.testing.CompileCounter()
>>> f = frametrace.optimize(backend=cnt)(f)
>>> f(x); cnt.frame_count, cnt.op_count
(1, 3)
"""
from __future__ import annotations
from . import _C
from .backends import lookup_backend
from .resume import resume_codes_in


class CompileCounter:
    """Backend that records each graph it compiles, then runs it eagerly."""

    __frametrace_backend__ = True

    def __init__(self, inner=None):
        self.inner = inner
        self.clear()

    def clear(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs = []

    @property
    def __frametrace_defers_input_mutations__(self):
        return self.inner is not None and \
            getattr(lookup_backend(self.inner), "__frametrace_defers_input_mutations__", False)

    @property
    def __frametrace_runs_ops_as_traced__(self):
        return self.inner is None or \
            getattr(lookup_backend(self.inner), "__frametrace_runs_ops_as_traced__", False)

    @property
    def __frametrace_recomputes_random_ops__(self):
        return self.inner is not None and \
            getattr(lookup_backend(self.inner), "__frametrace_recomputes_random_ops__", False)

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes
                             if n.op in ("call_function", "call_method", "call_module"))
        self.graphs.append(gm)
        if self.inner is not None:
            return lookup_backend(self.inner)(gm, example_inputs)
        return gm.forward


def resume_codes(code):
    """The resume functions' code objects reachable from `code`'s compiled entries
    (recursively): where its transformed code continues after graph breaks."""
    found, todo = [], [code]
    while todo:
        for entry in _C.entries(todo.pop()):
            if entry.code is None:
                continue
            for resume in resume_codes_in(entry.code):
                if resume not in found:
                    found.append(resume)
                    todo.append(resume)
    return found
