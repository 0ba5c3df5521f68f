"""Logging calls and warnings in traced code, kept in the graph's frame as effects.

``log.info("shape %s", tuple(x.shape))`` and ``warnings.warn("careful")`` do nothing
a graph computes: they hand a record (a warning) to code outside the program, the
handlers and the warning filters.  The trace records the call with its arguments and
the transformed code makes it after the graph, in program order among the other
effects it replays (side_effects.py), with the user's file, line and function as the
record's (warning's) location: where CPython would have made it.  What the handlers
and filters then do is decided when the call is made, as in CPython (a logger enabled
later, a filter changed, the once-per-location registries).

What the trace cannot replay exactly it leaves to CPython (a graph break):

- arguments that are tensors (a handler formats them later than CPython would, after
  the graph's in-place writes) or values the replay cannot rebuild;
- ``exc_info``, ``stack_info``, a ``stacklevel`` above the compiled frame, a logger
  class with its own ``_log``/``findCaller``/level methods, ``logger.exception``;
- a warning the filters turn into an error now (CPython raises it at the call, before
  the rest of the frame): guarded, so a filter changed later recompiles;
- a warning inside ``warnings.catch_warnings()`` traced as part of the frame (its
  filters are gone when the replay runs);
- writes to state outside the frame after such a call in the same graph
  (side_effects.SideEffects.fence): the handlers, which run after the graph, would
  see them.

A logger disabled for the level at trace time makes no record: the call is dropped,
guarded on ``logger.isEnabledFor(level)``, so that enabling it later recompiles.
(The module functions ``logging.info`` ... are always replayed: they configure the
root logger when it has no handler, enabled or not.)
"""
from __future__ import annotations

import enum
import logging
import warnings

import torch

from .. import config
from .base import Var, unsupported, wrap
from .constant import ConstVar
from .containers import DictVar, TupleVar, key_var
from .contexts import ExitVar, NullContextVar
from .functions import BoundMethodVar
from .symbolic import FormattedVar, SymNodeVar
from .tensor import TensorVar
from ..source import CallMethodSource, ConstSource

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL, "fatal": logging.CRITICAL}
# Logger methods whose meaning the trace relies on: a subclass overriding one is traced
# as the user's code (or breaks) instead.
_OWN = ("_log", "findCaller", "isEnabledFor", "getEffectiveLevel", *_LEVELS, "log")


# --------------------------------------------------------------------------- replays
class LogReplay:
    """A logging call made after the graph, as Logger._log makes it, with the
    location the trace saw (findCaller would find the transformed frame)."""
    __slots__ = ("logger", "level", "where", "module_fn")

    def __init__(self, logger, level, where, module_fn):
        self.logger, self.level, self.where, self.module_fn = logger, level, where, module_fn

    def __call__(self, args):
        msg, fargs, extra = args
        logger = self.logger
        if self.module_fn:
            logger = logging.root
            if len(logger.handlers) == 0:
                logging.basicConfig()           # as logging.info() does, enabled or not
        if not logger.isEnabledFor(self.level):
            return
        fn, lno, func = self.where
        record = logger.makeRecord(logger.name, self.level, fn, lno, msg, fargs, None, func,
                                   extra, None)
        logger.handle(record)

    def __repr__(self):
        return f"<log replay {self.logger.name} {logging.getLevelName(self.level)} at {self.where[0]}:{self.where[1]}>"


class WarnReplay:
    """A warnings.warn made after the graph: what warnings.warn does once it has found
    the frame at `stacklevel` (its file, line and globals), the filters and registry
    consulted now."""
    __slots__ = ("category", "filename", "lineno", "f_globals")

    def __init__(self, category, filename, lineno, f_globals):
        self.category, self.filename, self.lineno, self.f_globals = category, filename, lineno, f_globals

    def __call__(self, args):
        message, = args
        g = self.f_globals
        module = g["__name__"] if "__name__" in g else "<string>"
        registry = g.setdefault("__warningregistry__", {})
        # (no module_globals: warnings.warn, in C, gives none either; a loader's source
        # lookup would differ, and fails for a __main__ read from stdin)
        warnings.warn_explicit(message, self.category, self.filename, self.lineno, module,
                               registry)

    def __repr__(self):
        return f"<warning replay {self.category.__name__} at {self.filename}:{self.lineno}>"


def warning_action(warnings_module, message, category, module, lineno):
    """The action the filters give a warning now ('error', 'ignore', 'default' ...):
    what the guard of a replayed warning checks."""
    for action, msg, cat, mod, ln in warnings_module.filters:
        if (msg is None or msg.match(message)) and issubclass(category, cat) and \
                (mod is None or mod.match(module)) and (ln == 0 or lineno == ln):
            return action
    return warnings_module.defaultaction


# --------------------------------------------------------------------------- tracing
def _frame_at(tx, stacklevel: int, what: str):
    """The traced frame `stacklevel - 1` callers up (1: the caller of the logging
    function itself); refused above the compiled frame."""
    if type(stacklevel) is not int or stacklevel < 1:
        unsupported(f"{what} with stacklevel={stacklevel!r}")
    frame = tx
    for _ in range(stacklevel - 1):
        frame = frame.parent
        if frame is None:
            unsupported(f"{what} with a stacklevel above the compiled frame")
    return frame


def _replayable(tx, v: Var, what: str):
    """Arguments the replay rebuilds as CPython passed them: constants, numbers the
    graph computed, tuples of them, and objects read from the frame's inputs."""
    if isinstance(v, TensorVar):
        unsupported(f"{what} with a tensor argument (its handlers would format it after "
                    "the graph)", hint="log a Python value (x.shape, t.item() outside the "
                    "compiled code) or call it outside the compiled function")
    if isinstance(v, TupleVar):
        for item in v.items:
            _replayable(tx, item, what)
        return
    if type(v) in (SymNodeVar, FormattedVar):
        return                       # (formatted by the replay, from the number's value)
    if v.is_const() and _immutable(v.as_const()):
        return
    if v.source is not None and v.python_type() in _IMMUTABLE:
        return
    unsupported(f"{what} with an argument the trace cannot pass on ({v})")


_IMMUTABLE = (str, int, float, complex, bool, type(None), bytes, torch.dtype, torch.device,
              torch.layout, torch.memory_format)


def _immutable(value) -> bool:
    """A value the replay may hand to the handlers as the trace saw it (no later change
    of it can be missed)."""
    if isinstance(value, tuple):
        return all(map(_immutable, value))
    return isinstance(value, _IMMUTABLE) or isinstance(value, enum.Enum)


_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)))


def _const(v, what, name):
    if v is None:
        return None
    if not v.is_const():
        unsupported(f"{what} with a {name} that is not a constant")
    return v.as_const()


def _record(tx, replay, items):
    tx.side_effects.record_call(replay, TupleVar(list(items)))
    return ConstVar(None)


def log_call(tx, logger_var, method: str, args, kwargs, module_fn=False):
    """``logger.<method>(...)`` (or ``logging.<method>(...)`` with `module_fn`)."""
    logger = logging.root if module_fn else logger_var.value
    what = f"logging.{method}()" if module_fn else f"{type(logger).__name__}.{method}()"
    if not config.trace_logging_calls:
        unsupported(f"calling {what} (config.trace_logging_calls is off)")
    args = list(args)
    if method == "log":
        if not args:
            unsupported(f"{what} without a level")
        level = _const(args.pop(0), what, "level")
        if type(level) is not int:
            unsupported(f"{what} with a level that is not an int (TypeError)")
    elif method in _LEVELS:
        level = _LEVELS[method]
    else:
        unsupported(f"calling {what}", hint="logger.exception and logger.warn are left to CPython")
    if not args:
        unsupported(f"{what} without a message (TypeError)")
    msg, fargs = args[0], args[1:]
    kwargs = dict(kwargs)
    if _const(kwargs.pop("exc_info", None), what, "exc_info"):
        unsupported(f"{what} with exc_info")
    if _const(kwargs.pop("stack_info", None), what, "stack_info"):
        unsupported(f"{what} with stack_info")
    stacklevel = _const(kwargs.pop("stacklevel", None), what, "stacklevel")
    extra = kwargs.pop("extra", None)
    if kwargs:
        unsupported(f"{what} with argument(s) {', '.join(kwargs)}")
    if not module_fn:
        cls = type(logger)
        if any(getattr(cls, name, None) is not getattr(logging.Logger, name) for name in _OWN):
            unsupported(f"{what} of a logger class with its own logging methods")
        if not logger.isEnabledFor(level):
            if logger_var.source is None:
                unsupported(f"{what} on a logger the guards cannot reach")
            # Dropped: no record now, and a recompile once it would make one.
            wrap(tx, False, CallMethodSource(logger_var.source, "isEnabledFor", (level,)))
            return ConstVar(None)
    frame = _frame_at(tx, 1 if stacklevel is None else stacklevel, what)
    for v in (msg, *fargs):
        _replayable(tx, v, what)
    if extra is not None and not (extra.is_const() and extra.as_const() is None):
        if not isinstance(extra, DictVar):
            unsupported(f"{what} with extra={extra}")
        keys = [key_var(k) for k in extra.items]
        if any(not k.is_const() or not isinstance(k.as_const(), str) for k in keys):
            unsupported(f"{what} with an extra key that is not a string")
        if any(k.as_const() in ("message", "asctime") or k.as_const() in _RECORD_ATTRS for k in keys):
            unsupported(f"{what} with an extra key that overwrites a record attribute (KeyError)")
        for v in extra.items.values():
            _replayable(tx, v, what)
    else:
        extra = ConstVar(None)
    where = (frame.code.co_filename, frame.lineno, frame.code.co_name)
    return _record(tx, LogReplay(logger, level, where, module_fn), [msg, TupleVar(fargs), extra])


def warn_call(tx, args, kwargs):
    """``warnings.warn(message, category=None, stacklevel=1, source=None)``."""
    if not config.trace_logging_calls:
        unsupported("calling warnings.warn (config.trace_logging_calls is off)")
    params = ("message", "category", "stacklevel", "source")
    if len(args) > len(params):
        return None
    bound = dict(zip(params, args))
    for k, v in kwargs.items():
        if k not in params or k in bound:
            unsupported(f"warnings.warn() with argument {k!r}")
        bound[k] = v
    if "message" not in bound:
        return None
    message = bound["message"]
    if not (message.is_const() and isinstance(message.as_const(), str)):
        _replayable(tx, message, "warnings.warn()")
        if message.python_type() is not str:
            unsupported("warnings.warn() of a message that is not a string")
    if "source" in bound and not (bound["source"].is_const() and bound["source"].as_const() is None):
        unsupported("warnings.warn() with a source object")
    category = bound.get("category")
    category = None if category is None or (category.is_const() and category.as_const() is None) \
        else getattr(category, "value", None)
    if category is None:
        category = UserWarning
    if not (isinstance(category, type) and issubclass(category, Warning)):
        unsupported("warnings.warn() with a category that is not a Warning subclass (TypeError)")
    stacklevel = _const(bound.get("stacklevel"), "warnings.warn()", "stacklevel")
    frame = _frame_at(tx, 1 if stacklevel is None else stacklevel, "warnings.warn()")
    if _inside_catch_warnings(tx):
        unsupported("warnings.warn() inside warnings.catch_warnings() in the compiled code "
                    "(the replay after the graph would be outside it)")
    filename, lineno, g = frame.code.co_filename, frame.lineno, frame.f_globals
    if message.is_const():
        # What the filters do with it is guarded: an "error" raises at the call (CPython
        # runs the frame from the break), anything else is the replay's to decide.
        module = g["__name__"] if "__name__" in g else "<string>"
        action = warning_action(warnings, message.as_const(), category, module, lineno)
        if action == "error":
            unsupported(f"warnings.warn() of a {category.__name__} the warning filters turn "
                        "into an error")
        if not (isinstance(module, str) and CallMethodSource.supports([category])):
            unsupported("warnings.warn() from a module the guards cannot name")
        wrap(tx, action, CallMethodSource(ConstSource(warnings, "warnings"), "filters",
                                          (message.as_const(), category, module, lineno),
                                          through=warning_action))
    else:
        unsupported("warnings.warn() of a message that is not a constant")
    return _record(tx, WarnReplay(category, filename, lineno, g), [message])


def filter_call(name):
    """``warnings.simplefilter(action, ...)`` / ``filterwarnings``: nothing, inside a
    catch_warnings block the trace holds (config.trace_warning_filters_in_catch_warnings);
    else a break.  An "error" filter would turn a kernel's warning into an exception:
    that one CPython runs."""
    def handler(tx, args, kwargs):
        action = args[0] if args else kwargs.get("action")
        if not config.trace_warning_filters_in_catch_warnings or action is None or \
                not all(v.is_const() for v in (*args, *kwargs.values())) or \
                action.as_const() == "error" or not _inside_catch_warnings(tx):
            unsupported(f"warnings.{name}() changes the warning filters")
        return ConstVar(None)
    return handler


def _inside_catch_warnings(tx) -> bool:
    """Whether a `with warnings.catch_warnings()` traced in this graph is open: its
    __exit__ waits on some traced frame's stack."""
    frame = tx
    while frame is not None:
        for v in frame.stack:
            ctx = v.ctx if isinstance(v, ExitVar) else None
            if isinstance(ctx, NullContextVar) and ctx.factory is warnings.catch_warnings:
                return True
            # (a resumed frame: the block was entered by CPython, its __exit__ handed over)
            if isinstance(v, BoundMethodVar) and isinstance(getattr(v.obj, "value", None),
                                                            warnings.catch_warnings):
                return True
        frame = frame.parent
    return False


class LoggerVar(Var):
    """A logging.Logger from outside the frame (guarded by identity): its level
    methods are calls replayed after the graph; isEnabledFor / getEffectiveLevel are
    answered now and guarded; the rest is the plain object's."""
    __slots__ = ("obj",)

    def __init__(self, obj, source):
        super().__init__(source)
        self.obj = obj

    @property
    def value(self):
        return self.obj.value

    def python_type(self):
        return type(self.obj.value)

    def getattr(self, tx, name):
        if name in _LEVELS or name in ("log", "isEnabledFor", "getEffectiveLevel"):
            return LoggerMethodVar(self, name)
        return self.obj.getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)

    def setattr(self, tx, name, value):
        return self.obj.setattr(tx, name, value)

    def reconstruct(self, cg):
        self.obj.reconstruct(cg)

    def truth(self, tx):
        return True

    def __repr__(self):
        return f"LoggerVar({self.obj.value.name})"


class LoggerMethodVar(Var):
    __slots__ = ("logger", "name")

    def __init__(self, logger: LoggerVar, name: str):
        super().__init__(None)
        self.logger = logger
        self.name = name

    def call(self, tx, args, kwargs):
        if self.name in ("isEnabledFor", "getEffectiveLevel"):
            return _read(tx, self.logger, self.name, args, kwargs)
        return log_call(tx, self.logger, self.name, args, kwargs)

    def reconstruct(self, cg):
        # (at a break on the call itself: CPython makes it, through the logger)
        self.logger.reconstruct(cg)
        cg.load_attr(self.name)

    def __repr__(self):
        return f"{self.logger!r}.{self.name}"


def _read(tx, logger_var, name, args, kwargs):
    consts = [_const(a, f"Logger.{name}()", "level") for a in args]
    if kwargs or (name == "isEnabledFor" and (len(consts) != 1 or type(consts[0]) is not int)) or \
            (name == "getEffectiveLevel" and consts):
        return logger_var.obj.getattr(tx, name).call(tx, args, kwargs)
    cls = type(logger_var.value)
    if getattr(cls, name) is not getattr(logging.Logger, name) or logger_var.source is None:
        return logger_var.obj.getattr(tx, name).call(tx, args, kwargs)
    result = getattr(logger_var.value, name)(*consts)
    return wrap(tx, result, CallMethodSource(logger_var.source, name, tuple(consts)))


def logger_var(obj_var, value):
    """The Var for a logger read from the frame (`obj_var`, its plain object Var), or
    None for anything else."""
    if isinstance(value, logging.Logger):
        return LoggerVar(obj_var, obj_var.source)
    return None


def _module_fn(method):
    def handler(tx, args, kwargs):
        return log_call(tx, None, method, args, kwargs, module_fn=True)
    return handler


HANDLERS = {warnings.warn: warn_call, warnings.simplefilter: filter_call("simplefilter"),
            warnings.filterwarnings: filter_call("filterwarnings"),
            **{getattr(logging, m): _module_fn(m) for m in (*_LEVELS, "log")}}
