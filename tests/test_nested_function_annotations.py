"""A function made in the compiled frame keeps its annotations: read while tracing
(`g.__annotations__`, the same dict each time, empty when it has none) and set again
on the function the transformed code makes when it outlives the call (they were
dropped: a returned function had no annotations).
"""
import functools
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


# --- functools.wraps over functions made in the frame: their __doc__, __dict__ and
# (3.12+) __type_params__ are read and written while tracing, in one graph
def _deco(f):
    @functools.wraps(f)
    def inner(*a):
        return f(*a) + 1
    return inner


def test_functools_wraps_in_the_frame_one_graph():
    def f(x):
        def g(y):
            "doc of g"
            return y * 2
        g.tag = "t"
        h = _deco(g)
        return (h(x), h.__name__, h.__qualname__, h.__doc__, h.__wrapped__ is g, h.tag,
                sorted(h.__dict__), h.__dict__["tag"], g.__dict__ == {"tag": "t"},
                getattr(h, "__type_params__", ()))

    check(f, xs(), graphs=1, breaks=0, compiles=1)


def test_a_function_dict_written_and_returned():
    def f(x):
        def g(y):
            return y - 1
        d = g.__dict__
        d["scale"] = 3
        g.extra = [1, 2]
        d.update(more=4)
        return x * g.scale, g, d

    def run(x):
        out, g, d = f(x)
        return out, g(x), g.scale, g.extra, g.more, d is g.__dict__, sorted(d)
    check(run, xs(), breaks=0)


def test_docstrings_of_functions_made_in_the_frame():
    # (a function's first constant is its docstring only where it is one: a function
    # returning a string, or a lambda, has none)
    def f(x):
        def g(y):
            "doc of g"
            return y + 1
        def k(y):
            return "not a doc"
        return g(x), g.__doc__, k.__doc__, (lambda: "s").__doc__, _deco(k).__doc__

    check(f, xs(), graphs=1, breaks=0)
