"""Backend registry.  A backend follows torch.compile's protocol:
``backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> callable``, where
the callable takes the graph's inputs positionally and returns a tuple of outputs.

>>> @frametrace.register_backend("my_backend")
... def my_backend(gm, example_inputs):
...     return gm.forward
>>> frametrace.optimize("my_backend")(fn)
"""
from __future__ import annotations

from typing import Callable

_BACKENDS: dict[str, Callable] = {}


def register_backend(name=None):
    """Register a backend under `name` (or the function's own name).  Use as
    ``@register_backend``, ``@register_backend("name")`` or ``register_backend("name")(fn)``."""
    if callable(name):
        fn = name
        _BACKENDS[fn.__name__] = fn
        fn.__frametrace_backend__ = True
        return fn

    def register(fn):
        _BACKENDS[name or fn.__name__] = fn
        try:
            fn.__frametrace_backend__ = True
        except AttributeError:
            pass
        return fn
    return register


def lookup_backend(backend) -> Callable:
    if isinstance(backend, str):
        try:
            return _BACKENDS[backend]
        except KeyError:
            raise ValueError(f"unknown frametrace backend {backend!r}; "
                             f"known: {', '.join(list_backends())}") from None
    if not callable(backend):
        raise TypeError(f"backend must be a name or a callable, not {backend!r}")
    return backend


def backend_name(backend) -> str:
    """The name a backend is registered under, else its function's name."""
    for name, fn in _BACKENDS.items():
        if fn is backend:
            return name
    inner = getattr(backend, "func", backend)           # a functools.partial
    return getattr(inner, "__frametrace_name__", None) or getattr(inner, "__name__", None) or repr(backend)


def describe(backend, gm, example_inputs) -> str:
    """Which backend compiles graph `gm` under `backend`, for people: its name, and for one
    that chooses per graph (the default) the one it chooses, and why."""
    choice = getattr(backend, "choice", None)
    if getattr(backend, "__frametrace_backend__", False) and callable(choice):
        name, why = choice(gm, example_inputs)
        return f"{name} (the {backend_name(backend)} backend's choice: {why})"
    return backend_name(backend)


def list_backends() -> list[str]:
    """Names of the registered backends."""
    return sorted(_BACKENDS)


from . import aot_eager, default, eager, inductor, triton  # noqa: E402,F401  (they register themselves)
