"""The backends (eager, aot_eager, inductor, triton, default) and the registry's names
(kept in backend_registry.py).  A backend follows torch.compile's protocol:
``backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> callable``, where
the callable takes the graph's inputs positionally and returns a tuple of outputs.

>>> @frametrace.register_backend("my_backend")
... def my_backend(gm, example_inputs):
...     return gm.forward
>>> frametrace.optimize("my_backend")(fn)
"""
from __future__ import annotations

# (the registry is a leaf, backend_registry.py: the graph names a failing backend
# without importing the backends)
from ..backend_registry import (_BACKENDS, backend_name, list_backends,  # noqa: F401
                                lookup_backend, register_backend)


def describe(backend, gm, example_inputs) -> str:
    """Which backend compiles graph `gm` under `backend`, for people: its name, and for one
    that chooses per graph (the default) the one it chooses, and why."""
    choice = getattr(backend, "choice", None)
    if getattr(backend, "__frametrace_backend__", False) and callable(choice):
        name, why = choice(gm, example_inputs)
        return f"{name} (the {backend_name(backend)} backend's choice: {why})"
    return backend_name(backend)


from . import aot_eager, default, eager, inductor, triton  # noqa: E402,F401  (they register themselves)
