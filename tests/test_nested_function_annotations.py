"""A function made in the compiled frame keeps its annotations: read while tracing
(`g.__annotations__`, the same dict each time, empty when it has none) and set again
on the function the transformed code makes when it outlives the call (they were
dropped: a returned function had no annotations).
"""
import inspect

import torch

from differential import check


def xs(n=3):
    return [(torch.randn(3),) for _ in range(n)]


def test_annotations_read_in_the_frame():
    def f(x):
        def g(y: torch.Tensor, k: int = 2) -> torch.Tensor:
            return y + k

        def h(y):
            return y

        h.__annotations__["y"] = float
        return g(x), g.__annotations__["k"] is int, len(g.__annotations__), \
            h.__annotations__ == {"y": float}

    check(f, xs(), graphs=1, breaks=0, compiles=1)


def test_a_returned_function_keeps_them():
    def f(x):
        def g(y: torch.Tensor, k: int = 2) -> torch.Tensor:
            return y + k
        return x + 1, g

    def run(x):
        out, g = f(x)
        return out, g(x), g.__annotations__, str(inspect.signature(g))

    check(run, xs(), graphs=1, breaks=0,
          compiled=lambda counter: _calling(counter, f))


def _calling(counter, f):
    import frametrace
    compiled = frametrace.optimize(backend=counter)(f)

    def run(x):
        out, g = compiled(x)
        return out, g(x), g.__annotations__, str(inspect.signature(g))
    return run
