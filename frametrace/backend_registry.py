"""The backend registry: names to backend callables, and a backend's name for people.

A leaf, so that what names a backend (the graph's BackendCompilerFailed, logs) does not
import the backends themselves; backends/__init__.py re-exports it, and each backend
registers itself there.  A registered backend may carry these attributes:

- ``__frametrace_backend__``: set by `register_backend` (optimize() tells a backend
  from a function to compile by it);
- ``__frametrace_name__``: its name where it is not the registry's key (a configured copy);
- ``__frametrace_configure__(mode, options)``: the backend with optimize()'s `mode=` /
  `options=` applied; a backend without it gets them as keyword arguments.
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


def list_backends() -> list[str]:
    """Names of the registered backends."""
    return sorted(_BACKENDS)
