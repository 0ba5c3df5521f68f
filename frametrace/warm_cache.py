"""The on-disk cache of compiled entries: a process that compiled a frame once starts
the next time without tracing it (a warm start).

    >>> import frametrace
    >>> frametrace.cache_info()["entries"]     # what the cache folder holds
    0

An entry is what one compile of one frame produced: the transformed bytecode (and the
resume functions it calls, code objects among its constants), its guards as the
description `guards.GuardSet` compiles (sources, kinds, C specs, Python expressions),
and its FX graph.  Loading one never trusts the disk with a fact about the live
program:

- objects are found again by name (modules, classes, functions; a function's code must
  be the code traced, byte for byte), or bound at the first call to what the entry's
  own guards name (an nn.Module's `self`: by its source, of the class traced, with the
  same aliasing between them), and the guards are then compiled from their
  description and checked on the live arguments like any new entry's;
- every function inlined into the graph must be pinned so (edit a helper's source: its
  code no longer matches, a new compile);
- the backend compiles the cached graph again (that skips tracing, not the backend),
  except where the entry keeps the backend's result under its own key and the backend
  rebuilds it (`__frametrace_load_artifact__`): aot_eager's AOTAutograd result
  (backends/aot_cache.py, `config.cache_aot_results`), the triton backend's AOTAutograd
  result and compiled modules, no lowering or code generation
  (backends/triton/result_cache.py, `config.cache_triton_results`); the triton
  backend's autotuning choices come from backends/triton/tune_cache.py;
- anything the cache cannot describe so (an object with no name and no source, a
  symbolic size, a user's own backend) is simply not cached.

The key covers the frame's code (bytecode, constants, names, lines), frametrace's own
source, the torch and Python versions, the compile settings of `config`, the backend
and the optimize() settings, the answers of the device queries a trace folds
(variables/device_facts.py: device count, each GPU's name and capability...); for the kernel backends (triton, default) also the triton
backend's settings, Triton's version and each GPU's name and capability.  Entries this process wrote are never read back by it
(reset() means compile again); `config.cache` off or `FRAMETRACE_CACHE_DIR=` (empty)
turns it all off.  A file that cannot be read (truncated, garbage, another version)
or written (full disk, read-only folder) is a miss with one log line.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import io
import logging
import marshal
import os
import pickle
import shutil
import sys
import threading
import time
import types
import weakref

import torch

from . import _C, config, replayed_views, resume_codes
from .files import write_atomic
from .backend_registry import _BACKENDS, backend_name
from .codegen import GraphSlot, RerunState
from .guards import _CHECK_NAMES, FRESH, Guard, GuardSet, _AbcAnswers, _Symbol, guard_local_name
from .shapes import ShapePolicy
from .source import AttrSource, Source, const_sources
from .variables.device_facts import fingerprint as device_fingerprint

log = logging.getLogger("frametrace.cache")

_MAGIC = b"FTCACHE1"
# Backends whose products depend only on the graph and its inputs: their entries are
# cached under their name.  A user's callable cannot be keyed soundly.
CACHEABLE_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition", "default", "triton")
# Backends that generate Triton kernels (`default` does for CUDA graphs): their keys also
# hold the triton backend's settings, Triton's version and the devices kernels run on.
_KERNEL_BACKENDS = ("default", "triton")
# Settings that do not change what a compile produces.
# (cache_aot_results: an entry keeps AOTAutograd's result either way, used only if on.)
_SETTINGS_NOT_KEYED = {"cache", "cache_dir", "cache_max_bytes", "cache_aot_results",
                       "cache_triton_results", "cache_fingerprint_by_stat", "cache_lazy_graph",
                       "cache_graph_bytecode", "cache_skip_alias_check", "compile_status",
                       "compile_status_after", "compile_lock_timeout"}

stats = {"hits": 0, "misses": 0, "stores": 0, "not_cacheable": 0, "errors": 0,
         "backend_hits": 0, "backend_misses": 0}
_written_keys: set = set()            # keys this process stored: never read back by it
_memory: dict = {}                    # key -> [entry bytes], from load_cache()
# key -> the entries this process stored or loaded, for save_cache(): a file's path where
# one was written (a process compiling for hours keeps no copy of each), else the bytes.
_session: dict = {}
_lock = threading.Lock()
_unwritable: set = set()              # folders a write failed in


class NotCacheable(Exception):
    """The entry holds something the cache cannot describe soundly."""


class _Stale(Exception):
    """A cached entry does not fit the live program (a function's code changed...)."""


# --------------------------------------------------------------------------- where
def cache_dir() -> str | None:
    """The cache folder, or None where the cache is off."""
    return config.cache_folder()


def _own_files(root) -> list:
    """(path relative to `root`, path) of frametrace's source files and C extensions
    under `root`, sorted (the extensions of another Python than this one's, which this
    process cannot load, left out)."""
    own_tag = importlib.machinery.EXTENSION_SUFFIXES[0]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".so") and ".cpython-" in name and not name.endswith(own_tag):
                continue
            if name.endswith((".py", ".so", ".c", ".cpp", ".h")):
                path = os.path.join(dirpath, name)
                out.append((os.path.relpath(path, root), path))
    return out


def _hash_files(files) -> str:
    h = hashlib.sha256()
    for rel, path in files:
        h.update(rel.encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _own_fingerprint() -> str:
    """frametrace's own source and C extensions: an edited tracer makes new keys."""
    return _fingerprint(os.path.dirname(os.path.abspath(__file__)),
                        cache_dir() if config.cache_fingerprint_by_stat else None)


def _fingerprint(root, folder) -> str:
    """The hash of the files under `root` (`_own_files`), or, where `folder` is a cache
    folder, its note of that hash for files of the same inodes, sizes, modification and
    change times (ns): a write to a file changes its change time, so an edited file is
    hashed again (hashing frametrace costs a warm start ~20 ms; the note, ~2)."""
    files = _own_files(root)
    note = prefix = None
    if folder is not None:
        try:
            stats_ = [(rel, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                      for rel, path in files for st in (os.stat(path),)]
            prefix = hashlib.sha256(root.encode()).hexdigest()[:16]
            note = os.path.join(folder, "own-fingerprint", f"{prefix}-" +
                                hashlib.sha256(repr(stats_).encode()).hexdigest())
            with open(note, "rb") as fh:
                text = fh.read().decode("ascii")
            if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
                return text
        except (OSError, UnicodeDecodeError):
            pass
    digest = _hash_files(files)      # (after the stats: a file written meanwhile is new)
    if note is not None:
        try:
            write_atomic(note, digest.encode("ascii"))
            for e in os.scandir(os.path.dirname(note)):     # (this copy's older notes)
                if e.name.startswith(prefix) and e.path != note:
                    os.unlink(e.path)
        except OSError:
            pass
    return digest


def _versions() -> tuple:
    return (sys.version, torch.__version__, _own_fingerprint(),
            torch.backends.cpu.get_cpu_capability())


def _settings() -> tuple:
    out = []
    for name in sorted(vars(config)):
        value = getattr(config, name)
        if name.startswith("_") or name in _SETTINGS_NOT_KEYED or \
                isinstance(value, types.ModuleType) or callable(value):
            continue
        out.append((name, repr(value)))
    return tuple(out)


def key_of(code, backend, fullgraph, dynamic) -> str | None:
    """The cache key of a frame compiled with these settings, or None where the backend
    cannot be keyed (or the key cannot be made: one log line, not cached)."""
    try:
        return _key_of(code, backend, fullgraph, dynamic)
    except Exception as e:
        log.warning("frametrace: cache: no key for %s (%s: %s); not cached", code.co_name,
                    type(e).__name__, e)
        return None


def _key_of(code, backend, fullgraph, dynamic) -> str | None:
    name = backend_name(backend)
    if name not in CACHEABLE_BACKENDS or _BACKENDS.get(name) is not backend:
        return None
    h = hashlib.sha256()
    h.update(repr((_versions(), _settings(), name, bool(fullgraph), dynamic,
                   torch.cuda.is_available() and torch.cuda.get_device_capability(),
                   # (what a trace folds of the machine's devices: variables/device_facts.py)
                   device_fingerprint())).encode())
    if name in _KERNEL_BACKENDS:
        h.update(repr(_kernel_facts()).encode())
    _code_digest(code, h)
    return h.hexdigest()


def _kernel_facts() -> tuple:
    """What a graph compiled to Triton kernels depends on beyond frametrace's source (the
    generator's code is in `_own_fingerprint`): the triton backend's settings (block
    size limits, fast erf, CUDA graphs...), Triton's version, whether kernels run in its
    interpreter, and each visible GPU's name and capability (a kernel tuned or compiled
    for an H100 is not one for an A100 of the same capability)."""
    # (lazy: `import frametrace` loads no module of the triton backend, which
    # test_backend_is_registered_and_import_is_lazy holds it to)
    from .backends.triton import config as triton_config
    return (sorted((k, repr(v)) for k, v in triton_config.settings().items()),
            _triton_version(), os.environ.get("TRITON_INTERPRET", "0") == "1", _devices())


@functools.lru_cache(maxsize=1)
def _triton_version():
    try:
        return importlib.metadata.version("triton")     # (importing triton costs seconds)
    except Exception:
        return None


def _devices() -> tuple:
    if not torch.cuda.is_available():
        return ()
    return _cuda_devices(torch.cuda.device_count())


@functools.lru_cache(maxsize=4)
def _cuda_devices(count) -> tuple:
    out = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        out.append((p.name, p.major, p.minor, getattr(p, "multi_processor_count", None)))
    return tuple(out)


def _code_digest(code, h):
    """Everything a code object holds, nested codes included, into `h` (marshal's
    bytes depend on reference counts: two equal codes can marshal differently)."""
    h.update(repr((code.co_filename, code.co_name, code.co_qualname, code.co_firstlineno,
                   code.co_flags, code.co_argcount, code.co_posonlyargcount,
                   code.co_kwonlyargcount, code.co_names, code.co_varnames, code.co_freevars,
                   code.co_cellvars, code.co_stacksize)).encode())
    for b in (code.co_code, code.co_linetable, code.co_exceptiontable):
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    for c in code.co_consts:
        if type(c) is types.CodeType:
            h.update(b"<code>")
            _code_digest(c, h)
        else:
            h.update(repr((type(c), c)).encode())


# --------------------------------------------------------------------------- pickling
_SIMPLE = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis), slice, range)
_OWN_TYPES = (Source, Guard, _Symbol, RerunState, GraphSlot)
_PLACEHOLDER = "\x00frametrace-const"


def _resolve(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# Builtin classes whose own names find nothing (`function`, `cell`): found in `types`.
_TYPES_NAMES = {v: ("types", k) for k, v in vars(types).items()
                if isinstance(v, type) and not k.startswith("_")}


def _global_name(obj):
    """(module, qualname) that finds `obj` again, or None."""
    try:
        if obj in _TYPES_NAMES:
            return _TYPES_NAMES[obj]
    except TypeError:
        pass
    owner = getattr(obj, "__objclass__", None)      # (a C method descriptor)
    if isinstance(owner, type) and isinstance(getattr(obj, "__name__", None), str):
        module, qualname = owner.__module__, f"{owner.__qualname__}.{obj.__name__}"
    else:
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    for name in (qualname, getattr(obj, "__name__", None)):    # (torch.arange: by its name)
        try:
            if isinstance(name, str) and _resolve(module, name) is obj:
                return module, name
        except Exception:
            pass
    return None


def _wrapped_name(obj):
    """(module, qualname, n) where `obj` is the function found by name after n steps
    down `__wrapped__` (a decorated method's own function), or None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    try:
        found = _resolve(module, qualname)
    except Exception:
        return None
    for n in range(4):
        if found is obj:
            return module, qualname, n
        found = getattr(found, "__wrapped__", None)
    return None


def _module_name(d):
    name = d.get("__name__") if type(d) is dict else None
    mod = sys.modules.get(name) if isinstance(name, str) else None
    return name if mod is not None and getattr(mod, "__dict__", None) is d else None


def _marshalable(c) -> bool:
    if type(c) in (tuple, frozenset):
        return all(map(_marshalable, c))
    return type(c) in (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


def _encode_code(code):
    consts, extracted = [], []
    for c in code.co_consts:
        if _marshalable(c):
            consts.append(c)
        else:
            consts.append((_PLACEHOLDER, len(extracted)))
            extracted.append(c)
    return marshal.dumps(code.replace(co_consts=tuple(consts))), tuple(extracted)


def _decode_code(data, extracted):
    code = marshal.loads(data)
    consts = tuple(extracted[c[1]] if type(c) is tuple and len(c) == 2 and c[0] == _PLACEHOLDER
                   else c for c in code.co_consts)
    return code.replace(co_consts=consts)


def _same_code(a, b) -> bool:
    return a == b and a.co_filename == b.co_filename


def _function_by_name(module, qualname, code, unwrap=0):
    fn = _resolve(module, qualname)
    for _ in range(unwrap):
        fn = fn.__wrapped__
    if _loading.pinned is not None:
        _loading.pinned.append(fn)
    if code is not None and not _same_code(getattr(fn, "__code__", None), code):
        raise _Stale(f"{module}.{qualname} has changed")
    return fn


def _module_dict(name):
    return importlib.import_module(name).__dict__


def _make_function(code, globals_, name):
    return types.FunctionType(code, globals_, name)


def _make_weakref(obj):
    gs = _loading.guard_set
    return weakref.ref(obj, gs._on_death if gs is not None else None)


def _make_abc_answers(answers):
    out = _AbcAnswers(None)          # (token unknown here: the answers are asked again)
    for cls, classes in answers:
        out.add(cls, classes)
    return out


_HELPERS = (_resolve, _decode_code, _function_by_name, _module_dict, _make_function, _make_weakref,
            _make_abc_answers)


class _Loading(threading.local):
    guard_set = None
    pinned = None


_loading = _Loading()


class _Pickler(pickle.Pickler):
    """Pickles an entry's description: plain values by value, modules, classes and
    functions by name (a function with its code, compared when loaded), bound objects
    by label, and refuses anything else (NotCacheable)."""

    def __init__(self, file, binds=None, graph_fn=None, cells=None):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.binds = binds or {}
        self.cells = cells or {}        # id(cell) -> the pid of the function it closes, index
        self.graph_fn = graph_fn
        self.codes: list = []           # code objects pickled by content (pinned)
        self.weakrefs = 0               # weak references pickled (tied to the guard set)
        self.bound = 0                  # references to bound objects and their cells

    def persistent_id(self, obj):
        label = self.binds.get(id(obj))
        if label is not None:
            self.bound += 1
            return ("bind", label)
        if self.graph_fn is not None and obj is self.graph_fn:
            return ("graph",)
        cell = self.cells.get(id(obj))
        if cell is not None:
            self.bound += 1
            return ("cell", *cell)
        if type(obj) is dict:       # (pickle never asks reducer_override about a dict)
            name = _module_name(obj)
            if name is not None:
                return ("moddict", name)
        return None

    def reducer_override(self, obj):
        t = type(obj)
        if t in _SIMPLE or t in (tuple, frozenset, list):
            return NotImplemented
        if t is types.CodeType:
            self.codes.append(obj)
            data, extracted = _encode_code(obj)
            for c in extracted:
                if isinstance(c, (dict, list, set, bytearray)) and id(c) not in self.binds and \
                        _module_name(c) is None:
                    raise NotCacheable(f"the code holds a {type(c).__name__} of the program ({c!r:.60})")
            return _decode_code, (data, extracted)
        if t is types.ModuleType:
            if sys.modules.get(obj.__name__) is obj:
                return importlib.import_module, (obj.__name__,)
            raise NotCacheable(f"module {obj.__name__} not in sys.modules")
        if t is types.FunctionType:
            if obj in _HELPERS:
                return NotImplemented
            name = _wrapped_name(obj)
            if name is not None:
                self.codes.append(obj.__code__)
                return _function_by_name, (name[0], name[1], obj.__code__, name[2])
            if obj.__closure__ is None and not obj.__defaults__ and not obj.__kwdefaults__ \
                    and _module_name(obj.__globals__) is not None:
                return _make_function, (obj.__code__, obj.__globals__, obj.__name__)
            raise NotCacheable(f"function {obj.__qualname__} has no name to find it by")
        if t is weakref.ref:
            target = obj()
            if target is None:
                raise NotCacheable("a dead weak reference")
            self.weakrefs += 1
            return _make_weakref, (target,)
        if t is _AbcAnswers:
            return _make_abc_answers, ([(r(), c) for r, c in obj.answers],)
        if t is _C.Unhooked:
            return _C.Unhooked, (obj.fn,)
        if isinstance(obj, type) or t in (types.BuiltinFunctionType, types.WrapperDescriptorType,
                                          types.MethodDescriptorType, types.BuiltinMethodType,
                                          types.ClassMethodDescriptorType):
            name = _global_name(obj)
            owner = getattr(obj, "__self__", None)
            if name is None and t is types.BuiltinMethodType and isinstance(owner, (type, types.ModuleType)):
                return getattr, (owner, obj.__name__)       # (object.__new__, dict.fromkeys)
            if name is None:
                raise NotCacheable(f"{obj!r} has no name to find it by")
            if name[0] == "types":
                return _resolve, name
            return NotImplemented       # (pickle finds it by name)
        if t is super:
            return super, (obj.__thisclass__, obj.__self__)
        if t is types.MethodType:
            return getattr, (obj.__self__, obj.__name__)
        if isinstance(obj, _OWN_TYPES) or t in _TORCH_VALUES or t is collections.OrderedDict or \
                isinstance(obj, (torch.fx.GraphModule, torch._ops.OpOverload, torch._ops.OpOverloadPacket)) \
                or t is torch.nn.Module:
            return NotImplemented
        if isinstance(obj, enum.Enum) and _global_name(t) is not None or \
                t.__module__.startswith("sympy.") and not callable(obj):
            return NotImplemented       # (sympy: a size's hint, as text of a guard)
        if callable(obj) and not isinstance(obj, torch.nn.Module):
            name = _global_name(obj)        # (an lru_cache wrapper, a callable singleton)
            if name is not None:
                return _function_by_name, (*name, None)
        raise NotCacheable(f"an object of type {t.__qualname__} ({obj!r:.60})")


# What the trace notes in a graph's meta for the backends (graph.py): kept with the entry.
_GRAPH_META = ("frametrace_functionalizes", "frametrace_sources")
_TORCH_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, binds=None):
        super().__init__(file)
        self.binds = binds or {}
        self.graph_slot = GraphSlot("__compiled_fn")

    def persistent_load(self, pid):
        if pid[0] == "bind":
            return self.binds[pid[1]]
        if pid[0] == "graph":
            return self.graph_slot
        if pid[0] == "cell":
            fn = self.binds[pid[1]] if pid[1] is not None else _resolve(*pid[2])
            return fn.__closure__[pid[3]]
        if pid[0] == "moddict":
            return _module_dict(pid[1])
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


def _dumps(obj, binds=None, graph_fn=None, cells=None, pickler=None):
    buf = io.BytesIO()
    p = _Pickler(buf, binds, graph_fn, cells)
    try:
        p.dump(obj)
    except NotCacheable:
        raise
    except Exception as e:
        raise NotCacheable(f"{type(e).__name__}: {e}") from None
    if pickler is not None:
        pickler.append(p)
    return buf.getvalue(), p.codes


# --------------------------------------------------------------------------- storing
def _identity_objects(guards):
    """(object, source) for each object the guards compare by identity."""
    for g in guards:
        for check in g.spec or ():
            source, op, a = check[0], check[1], check[2]
            if source is None:
                continue
            if op == "WEAK":
                yield a(), source
            elif op == "IS":
                yield a, source
            elif op == "FUNC":
                code, d, kw = a
                yield code, AttrSource(source, "__code__")
                yield d, AttrSource(source, "__defaults__")
                yield kw, AttrSource(source, "__kwdefaults__")


def _plain(x) -> bool:
    """A value equal to another only where it is the same for a program: a constant, a
    class or function found by name (its code compared when loaded), a tuple of them."""
    if type(x) is tuple:
        return all(map(_plain, x))
    return type(x) in _SIMPLE or type(x) in _TORCH_VALUES or isinstance(x, type) or \
        type(x) in (types.FunctionType, types.BuiltinFunctionType) and _global_name(x) is not None


def _facts(x, depth=0):
    """`x` as plain values, to compare with the live object at the same source: equal
    facts, the same object for a program (NotCacheable where that cannot be said)."""
    if depth > 8:
        raise NotCacheable("a value nested too deep")
    if _plain(x) and type(x) is not tuple:
        return x
    if x is dataclasses.MISSING:
        return ("MISSING",)
    if type(x) in (tuple, list):
        return (type(x).__name__, tuple(_facts(v, depth + 1) for v in x))
    if type(x) is dict:
        return ("dict", tuple((_facts(k, depth + 1), _facts(v, depth + 1)) for k, v in x.items()))
    if type(x) is dataclasses.Field:
        return ("field", tuple(_facts(getattr(x, a), depth + 1) for a in _FIELD_ATTRS),
                _facts(dict(x.metadata), depth + 1))
    if type(x) is types.UnionType or type(x).__module__ == "typing":
        return ("annotation", repr(x))
    raise NotCacheable(f"{type(x).__qualname__} object compared by identity ({x!r:.80})")


_FIELD_ATTRS = ("name", "type", "default", "default_factory", "init", "repr", "hash", "compare",
                "kw_only")


def _bind_kind(obj):
    """How an object compared by identity is found in another process: None (by name or
    value), "equal" (the live object at its source, equal to it), "enum" (the live member
    at its source, of the same class, name and value), "instance" (the live object at
    its source, of its class); NotCacheable otherwise."""
    if isinstance(obj, enum.Enum):
        # One object per member in a process, so the trace read its value as a constant
        # with an identity guard; another process may define the member with another
        # value (computed, an edited class body).
        return "enum"
    if obj is None or type(obj) in _SIMPLE or isinstance(obj, (types.ModuleType, type)) or \
            type(obj) in _TORCH_VALUES or (type(obj) is not types.FunctionType and
                                           _global_name(obj) is not None):
        return None
    if type(obj) in (property, staticmethod, classmethod):
        for fn in _descriptor_parts(obj):
            if fn is not None and (type(fn) is not types.FunctionType or
                                   _global_name(fn) is None and _bind_kind(fn) != "function"):
                raise NotCacheable(f"a {type(obj).__name__} of {fn!r}")
        return "descriptor"
    if type(obj) is types.FunctionType and _global_name(obj) is None:
        # (a decorator's inner function, reached through its wrapper's closure)
        if _module_name(obj.__globals__) is not None and \
                all(map(_plain, (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()))):
            return "function"
        raise NotCacheable(f"function {obj.__qualname__} has no name to find it by")
    if type(obj) in (types.FunctionType, types.BuiltinFunctionType):
        if _global_name(obj) is not None:
            return None
        raise NotCacheable(f"function {obj!r} has no name to find it by")
    if type(obj) is types.CodeType:
        return "equal"
    if type(obj) in (tuple, dict, list):
        _facts(obj)             # (defaults, an MRO, a dataclass's fields: NotCacheable if not)
        return "deep"
    module = type(obj).__module__
    if isinstance(obj, torch.nn.Module) or (not module.startswith(("builtins", "torch", "frametrace"))
                                            and _global_name(type(obj)) is not None):
        return "instance"
    raise NotCacheable(f"{type(obj).__qualname__} object compared by identity ({obj!r:.80})")


def describe(code, func, check, new_code, gm, graph_fn, inlined, outcome, backend) -> bytes:
    """The bytes of a cache entry for this compile; NotCacheable where it cannot be."""
    gs = check.guard_set
    guards = list(gs.guards.values())
    # A graph with symbolic sizes or numbers is compiled again from its code for a
    # backend that runs its ops as traced (eager): the same ops, which read the sizes
    # at run time.  Any other backend (AOTAutograd) would need the trace's ShapeEnv to
    # compile it for all the sizes its guards admit, which the cache does not keep.
    symbolic = bool(gs.sym_reads or any(g.symbols for g in guards))
    if symbolic and getattr(backend, "__frametrace_runs_ops_as_traced__", False) is not True:
        raise NotCacheable("symbolic sizes or numbers, for a backend that re-traces the graph")
    binds: dict = {}            # id(obj) -> label
    bind_list = []              # (kind, [sources], recorded)
    for obj, source in _identity_objects(guards):
        kind = _bind_kind(obj)
        if kind is None:
            continue
        if FRESH in source.guard_expr():
            raise NotCacheable("an identity of an object the code makes")
        label = binds.get(id(obj))
        if label is None:
            label = binds[id(obj)] = len(bind_list)
            bind_list.append((kind, [], obj if kind == "equal" else _facts(obj) if kind == "deep" else
                              _function_facts(obj) if kind == "function" else
                              _descriptor_facts(obj) if kind == "descriptor" else
                              _enum_facts(obj) if kind == "enum" else type(obj)))
        if source not in bind_list[label][1]:
            bind_list[label][1].append(source)
    inputs = list(gm.meta.get("frametrace_input_sources", ())) if gm is not None else []
    if any(FRESH in s.guard_expr() for s in inputs):
        raise NotCacheable("a graph input the code makes")
    # Closure cells the entry names (an inlined closure's, as constants): found again
    # in the function they belong to, bound or found by name.
    cells = {}
    for obj, _ in _identity_objects(guards):
        if type(obj) is types.FunctionType and obj.__closure__:
            label = binds.get(id(obj))
            name = _global_name(obj) if label is None else None
            if label is not None or name is not None:
                for i, c in enumerate(obj.__closure__):
                    cells.setdefault(id(c), (label, name, i))
    binds_bytes, codes1 = _dumps(bind_list)
    # What the backend made of the graph (AOTAutograd's graphs and metadata), with its own
    # key, where it can say one: (key, bytes), or (None, why not).
    artifact = getattr(getattr(graph_fn, "fn", None), "__frametrace_artifact__", None)
    artifact = artifact() if artifact is not None else None
    if artifact is not None and artifact[0] is None:
        log.info("frametrace: cache: the backend's result for %s is not cached (%s); a warm "
                 "start compiles the cached graph", code.co_name, artifact[1])
        artifact = None
    # The graph, pickled on its own: a warm start whose backend's result comes from the
    # cache unpickles it only when asked (config.cache_lazy_graph), unless it names the
    # program's functions by their code, holds weak references or names the live
    # objects the entry binds (`graph_pins`: then it is unpickled with the rest, its
    # functions compared with the live ones; a graph left pickled keeps nothing of the
    # program alive).
    graph_pickler = []
    graph_bytes, codes3 = _dumps(gm, binds, graph_fn, cells, graph_pickler) if gm is not None \
        else (None, [])
    body = {"backend_artifact": artifact, "guards": guards, "constants": gs.constants,
            "code": new_code, "graph": graph_bytes,
            # (torch's own functions, reduce_graph_module among them, are pinned by its
            # version, as an inlined function of torch's is)
            "graph_pins": any(not _torch_code(c) for c in codes3) or
            bool(graph_pickler and (graph_pickler[0].weakrefs or graph_pickler[0].bound)),
            "op_count": sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method",
                                                                  "call_module"))
            if gm is not None else 0,
            "inputs": inputs, "resume": _resume_meta(new_code), "outcome": outcome,
            "texts": gs.texts(), "name": graph_fn.__name__ if graph_fn is not None else None,
            "graph_meta": {k: gm.meta[k] for k in _GRAPH_META if k in gm.meta} if gm is not None else {}}
    body_bytes, codes2 = _dumps(body, binds, graph_fn, cells)
    codes2 = [*codes2, *codes3]
    pinned = {id(c) for c in (*codes1, *codes2)}
    for c in inlined:
        if id(c) not in pinned and not _torch_code(c) and not any(c == p for p in (*codes1, *codes2)):
            raise NotCacheable(f"inlined {c.co_qualname} is not pinned by a guard")
    return pickle.dumps({"versions": _versions(), "binds": binds_bytes, "body": body_bytes},
                        protocol=pickle.HIGHEST_PROTOCOL)


def _enum_facts(member) -> tuple:
    """An enum member as its class (by name), name and value (as plain values)."""
    return type(member), member.name, _facts(member.value)


def _function_facts(fn) -> tuple:
    """What makes a function found at a source in another process the function traced:
    its code (byte for byte), module, names, defaults and number of closure cells (the
    cells' contents the trace read are guarded through their own sources)."""
    return (fn.__code__, _module_name(fn.__globals__), fn.__name__, fn.__qualname__,
            len(fn.__closure__ or ()), fn.__defaults__, fn.__kwdefaults__)


def _descriptor_parts(d):
    return (d.fget, d.fset, d.fdel) if type(d) is property else (d.__func__,)


def _descriptor_facts(d) -> tuple:
    """A property's (staticmethod's, classmethod's) functions, as `_function_facts`."""
    return (type(d), tuple(None if fn is None else _function_facts(fn)
                           for fn in _descriptor_parts(d)))


def _torch_code(c) -> bool:
    root = os.path.dirname(torch.__file__)
    return os.path.realpath(c.co_filename).startswith(root + os.sep)


def _resume_meta(code):
    out = []
    for c in code.co_consts:
        if type(c) is types.FunctionType:
            c = c.__code__
        if type(c) is types.CodeType and c in resume_codes._origin:
            out.append((c, resume_codes._origin[c], resume_codes._opaque.get(c),
                        resume_codes._private.get(c)))
    return out


def store(code, key, entry: bytes):
    """Write an entry for `key` (atomically: a temporary file renamed)."""
    with _lock:
        _written_keys.add(key)
    stats["stores"] += 1
    folder = cache_dir()
    if folder is None:
        _remember(key, entry)
        return
    path = os.path.join(folder, key[:2], key)
    digest = hashlib.sha256(entry).digest()
    data = _MAGIC + digest + entry
    name = digest.hex()[:16] + ".entry"
    try:
        write_atomic(os.path.join(path, name), data)
    except OSError as e:
        stats["errors"] += 1
        # (a warning once per folder; the next ones on the cache log)
        (log.info if folder in _unwritable else log.warning)(
            "frametrace: cache: cannot write an entry of %s to %s (%s); not cached",
            code.co_name, folder, e)
        _unwritable.add(folder)
        _remember(key, entry)
        return
    _remember(key, os.path.join(path, name))
    log.info("frametrace: cache: stored an entry of %s (%s:%d)", code.co_name,
             code.co_filename, code.co_firstlineno)
    _evict(folder)


def _remember(key, entry_or_path):
    with _lock:
        known = _session.setdefault(key, [])
        if entry_or_path not in known:
            known.append(entry_or_path)


def _session_entries() -> dict:
    """key -> [entry bytes] of what this process stored or loaded (files evicted
    meanwhile left out)."""
    out = {}
    with _lock:
        items = [(k, list(v)) for k, v in _session.items()]
    for key, entries in items:
        for e in entries:
            if isinstance(e, str):
                try:
                    with open(e, "rb") as fh:
                        data = fh.read()
                except OSError:
                    continue
                head = len(_MAGIC) + 32
                if data[len(_MAGIC):head] != hashlib.sha256(data[head:]).digest():
                    continue
                e = data[head:]
            out.setdefault(key, []).append(e)
    return out


def _evict(folder):
    """Least recently used entries go until the folder is under config.cache_max_bytes
    (a hit touches its file)."""
    files = []
    total = 0
    try:
        for sub in os.scandir(folder):
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for keydir in os.scandir(sub.path):
                if not keydir.is_dir():
                    continue
                for f in os.scandir(keydir.path):
                    if f.name.endswith(".entry"):
                        st = f.stat()
                        files.append((st.st_mtime, st.st_size, f.path))
                        total += st.st_size
    except OSError:
        return
    if total <= config.cache_max_bytes:
        return
    for _, size, path in sorted(files):
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        if total <= config.cache_max_bytes:
            break


# --------------------------------------------------------------------------- loading
def _candidates(key):
    """(label, bytes) of the entries stored under `key`: those from load_cache(), then
    the folder's (most recently used first)."""
    for i, entry in enumerate(_memory.get(key, ())):
        yield f"loaded #{i}", entry, None
    folder = cache_dir()
    if folder is None:
        return
    path = os.path.join(folder, key[:2], key)
    try:
        names = [e for e in os.scandir(path) if e.name.endswith(".entry")]
    except OSError:
        return
    def used(e):
        try:
            return -e.stat().st_mtime
        except OSError:
            return 0
    names.sort(key=used)
    for e in names:
        try:
            with open(e.path, "rb") as fh:
                data = fh.read()
        except OSError as err:
            log.warning("frametrace: cache: cannot read %s (%s); a miss", e.path, err)
            continue
        head = len(_MAGIC) + 32
        if len(data) < head or data[:len(_MAGIC)] != _MAGIC or \
                hashlib.sha256(data[head:]).digest() != data[len(_MAGIC):head]:
            stats["errors"] += 1
            log.warning("frametrace: cache: %s is damaged or of another version; a miss", e.path)
            continue
        yield e.path, data[head:], e.path


def _env(code, func, args):
    params = [guard_local_name(n) for n in code.co_varnames[:len(args)]]
    env = dict(zip(params, args))
    env.update(_CHECK_NAMES)
    env.update(___func=func, ___G=func.__globals__, ___B=func.__builtins__)
    return env


def _eval(source, env):
    local = dict(env)
    for anchor in const_sources(source):
        local[anchor.guard_expr()] = anchor.obj
    return eval(source.guard_expr(), local)


def _same_function(fn, facts) -> bool:
    if fn is None or facts is None:
        return fn is None and facts is None
    return type(fn) is types.FunctionType and _same_code(fn.__code__, facts[0]) and \
        _function_facts(fn)[1:] == facts[1:]


def _bind(bind_list, env) -> dict:
    live = {}
    seen = {}
    for label, (kind, sources, recorded) in enumerate(bind_list):
        try:
            values = [_eval(s, env) for s in sources]
        except Exception as e:
            raise _Stale(f"{sources[0].name()} cannot be read ({type(e).__name__})") from None
        obj = values[0]
        if any(v is not obj for v in values):
            raise _Stale("objects traced as one are now several")
        if kind == "equal":
            if type(obj) is not type(recorded) or (
                    not _same_code(obj, recorded) if type(obj) is types.CodeType else obj != recorded):
                raise _Stale(f"{sources[0].name()} has changed")
        elif kind == "deep":
            try:
                same = _facts(obj) == recorded
            except NotCacheable:
                same = False
            if not same:
                raise _Stale(f"{sources[0].name()} has changed")
        elif kind == "descriptor":
            if type(obj) is not recorded[0] or len(_descriptor_parts(obj)) != len(recorded[1]) or \
                    any(not _same_function(fn, facts)
                        for fn, facts in zip(_descriptor_parts(obj), recorded[1])):
                raise _Stale(f"{sources[0].name()} has changed")
        elif kind == "function":
            if not _same_function(obj, recorded):
                raise _Stale(f"{sources[0].name()} has changed")
        elif kind == "enum":
            try:
                same = isinstance(obj, enum.Enum) and _enum_facts(obj) == recorded
            except NotCacheable:
                same = False
            if not same:
                raise _Stale(f"{sources[0].name()} has changed")
        elif type(obj) is not recorded:
            raise _Stale(f"{sources[0].name()} is of another class")
        if kind == "instance":
            if id(obj) in seen:
                raise _Stale("objects traced as distinct are now one")
            seen[id(obj)] = label
        live[label] = obj
    return live


def lookup(code, func, args, key, backend, install):
    """The (check, code) of a cached entry whose guards hold for this call, installed
    by `install` (convert's, as a compile's entry would be); None on a miss."""
    if key in _written_keys:
        return None
    try:
        return _lookup(code, func, args, key, backend, install)
    except Exception as e:     # (the folder changing under us: never the program's failure)
        stats["errors"] += 1
        log.warning("frametrace: cache: lookup of %s failed (%s: %s); a miss", code.co_name,
                    type(e).__name__, e)
        return None


def _lookup(code, func, args, key, backend, install):
    for label, entry, path in _candidates(key):
        try:
            got = _materialize(code, func, args, entry, backend, install)
        except _Stale as e:
            log.info("frametrace: cache: an entry of %s does not fit (%s)", code.co_name, e)
            continue
        except Exception as e:
            stats["errors"] += 1
            log.warning("frametrace: cache: cannot load an entry of %s from %s (%s: %s); a miss",
                        code.co_name, label, type(e).__name__, e)
            continue
        if got is None:
            continue
        if path is not None:
            try:
                os.utime(path)
            except OSError:
                pass
        _remember(key, path if path is not None else entry)
        stats["hits"] += 1
        log.info("frametrace: cache: %s (%s:%d) from the cache (%s)", code.co_name,
                 code.co_filename, code.co_firstlineno, label)
        return got
    stats["misses"] += 1
    return None


def _materialize(code, func, args, entry, backend, install):
    outer = pickle.loads(entry)
    if outer.get("versions") != _versions():
        raise _Stale("written by another version")
    _loading.pinned = []
    try:
        bind_list = _Unpickler(io.BytesIO(outer["binds"])).load()
        env = _env(code, func, args)
        live = _bind(bind_list, env)
        gs = GuardSet(code, func)
        _loading.guard_set = gs
        up = _Unpickler(io.BytesIO(outer["body"]), live)
        body = up.load()
        pins = body["graph_pins"]
        graph = _GraphBytes(body["graph"], live if pins else {}, up.graph_slot,
                            body.get("graph_meta", {})) if body["graph"] is not None else None
        if graph is not None and (pins or not config.cache_lazy_graph):
            graph.load()    # (functions it names by their code: compared now, _Stale if not)
    finally:
        _loading.guard_set = None
        _loading.pinned = None
    gs.guards = {(g.source, g.kind): g for g in body["guards"]}
    gs.constants = body["constants"]
    check = gs.compile()
    check.guard_set = gs
    if check(*args, func) is not True:
        return None
    t0 = time.perf_counter()
    compiled = None
    if graph is not None:
        example = [_eval(s, env) for s in body["inputs"]]
        # The sizes this call has, as a compile would have noted them: a later call
        # with other sizes compiles with those dimensions symbolic, as after a cold start.
        policy = ShapePolicy(code, None)
        for source, value in zip(body["inputs"], example):
            if isinstance(value, torch.Tensor):
                policy.dynamic_dims(source, value)
        compiled = _from_artifact(code, backend, example, body.get("backend_artifact"))
        if compiled is None:
            try:
                compiled = replayed_views.compile_graph(backend, graph.load(), example)
            except _Stale:
                raise
            except Exception as e:
                raise _Stale(f"the backend failed on the cached graph ({type(e).__name__}: {e})")
    for c, origin, opaque, private in body["resume"]:
        resume_codes._origin.setdefault(c, origin)
        if opaque is not None:
            resume_codes._opaque.setdefault(c, opaque)
        if private is not None:
            resume_codes._private.setdefault(c, private)
    return install(code, func, check, body["code"], up.graph_slot, compiled, graph, body["outcome"],
                   body["texts"], time.perf_counter() - t0, body["op_count"])


class _GraphBytes:
    """A cached entry's FX graph, unpickled at the first `load()` (its functions found
    by name then; one that names the entry's bound objects is loaded with the entry)."""

    def __init__(self, data, live, graph_slot, meta):
        self.data, self.live, self.graph_slot, self.meta = data, live, graph_slot, meta
        self.gm = None

    def load(self):
        if self.gm is None:
            up = _Unpickler(io.BytesIO(self.data), self.live)
            up.graph_slot = self.graph_slot
            gm = up.load()
            # (a pickled GraphModule comes back without its meta: what the trace noted
            # for the backend, the default backend's choice of triton or eager among it)
            gm.meta.update(self.meta)
            self.gm, self.data, self.live = gm, None, None
        return self.gm


def _from_artifact(code, backend, example, artifact):
    """The backend's compiled function rebuilt from what it stored (no AOTAutograd
    trace), or None where there is none, it is off, or the backend refuses it (its key
    differs: other input metadata, grad mode, settings)."""
    load = getattr(backend, "__frametrace_load_artifact__", None)
    switch = getattr(backend, "__frametrace_artifact_switch__", "cache_aot_results")
    if artifact is None or load is None or not getattr(config, switch):
        return None
    try:
        compiled = load(None, example, artifact)      # (the loaders read no graph)
    except Exception as e:
        stats["errors"] += 1
        log.warning("frametrace: cache: cannot rebuild the backend's result for %s (%s: %s); "
                    "it compiles the cached graph", code.co_name, type(e).__name__, e)
        compiled = None
    if compiled is None:
        stats["backend_misses"] += 1
        return None
    stats["backend_hits"] += 1
    log.info("frametrace: cache: %s: the backend's result (%s) from the cache", code.co_name,
             getattr(backend, "__frametrace_artifact_what__", "AOTAutograd's graphs"))
    return compiled


# --------------------------------------------------------------------------- public
def save_cache(path):
    """Write what this process compiled (and loaded) to one file, to ship elsewhere::

        frametrace.save_cache("model.ftcache")      # after the first calls
        frametrace.load_cache("model.ftcache")      # in another process, before them
    """
    payload = _session_entries()
    data = pickle.dumps({"versions": _versions(), "entries": payload}, protocol=pickle.HIGHEST_PROTOCOL)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(_MAGIC + hashlib.sha256(data).digest() + data)
    os.replace(tmp, path)
    return sum(len(v) for v in payload.values())


def load_cache(path) -> int:
    """Read a file `save_cache` wrote: its entries serve this process's first calls
    (their guards checked on the live objects as always).  Returns how many it holds;
    0 with one log line for a file of another version or a damaged one."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        head = len(_MAGIC) + 32
        if data[:len(_MAGIC)] != _MAGIC or hashlib.sha256(data[head:]).digest() != data[len(_MAGIC):head]:
            raise ValueError("damaged or not a frametrace cache file")
        outer = pickle.loads(data[head:])
        if outer.get("versions") != _versions():
            raise ValueError("written by another version of frametrace, torch or Python")
    except Exception as e:
        log.warning("frametrace: cache: cannot load %s (%s)", path, e)
        return 0
    n = 0
    with _lock:
        for key, entries in outer["entries"].items():
            for entry in entries:
                if entry not in _memory.setdefault(key, []):
                    _memory[key].append(entry)
                    n += 1
    return n


def cache_info() -> dict:
    """What the cache folder holds::

        >>> frametrace.cache_info()
        {'dir': '/home/me/.cache/frametrace', 'enabled': True, 'entries': 12, 'bytes': 81920, ...}
    """
    folder = cache_dir()
    entries = total = 0
    if folder is not None and os.path.isdir(folder):
        for dirpath, _, filenames in os.walk(folder):
            for name in filenames:
                if name.endswith(".entry"):
                    entries += 1
                    try:
                        total += os.path.getsize(os.path.join(dirpath, name))
                    except OSError:
                        pass
    return {"dir": folder, "enabled": folder is not None, "entries": entries, "bytes": total,
            "max_bytes": config.cache_max_bytes, **stats}


def clear_cache():
    """Delete every entry of the cache folder."""
    folder = cache_dir()
    if folder is not None and os.path.isdir(folder):
        for sub in os.listdir(folder):
            shutil.rmtree(os.path.join(folder, sub), ignore_errors=True)
