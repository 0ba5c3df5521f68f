"""frametrace: compile PyTorch programs as they run.

    import torch, frametrace

    @frametrace.optimize
    def f(x, y):
        return (x.sin() + y).relu() * 2

    f(torch.randn(8), torch.randn(8))   # traced, compiled, cached
    f(torch.randn(8), torch.randn(8))   # guards hold: runs the cached code
"""
from . import config, interop, logs, testing
from .backends import list_backends, register_backend
from .eval_frame import OptimizedModule, disable, optimize, reset
from .exc import BackendCompilerFailed, Unsupported
from .explain import explain
from .shapes import mark_dynamic, mark_static
from .stance import RecompileError, set_stance
from .viewer import show
from .warm_cache import cache_info, clear_cache, load_cache, save_cache
from . import compile_status as _compile_status  # noqa: F401  (the status line's listener)

__version__ = "0.1.0"
interop.install()

try:
    logs.configure()
except ValueError as _e:          # a typo in FRAMETRACE_LOGS must not break the import
    import warnings as _warnings
    _warnings.warn(str(_e), stacklevel=2)

__all__ = ["explain", "show", "optimize", "mark_dynamic", "mark_static", "disable", "reset", "list_backends", "register_backend", "config",
           "Unsupported", "BackendCompilerFailed", "OptimizedModule", "testing", "__version__",
           "set_stance", "RecompileError", "cache_info", "clear_cache", "save_cache", "load_cache"]
