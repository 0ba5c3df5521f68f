"""Which sizes are symbolic: the dynamic-shape policy, and the `ShapeEnv` that holds the
symbols of one compile.

``optimize(dynamic=None)`` (the default) compiles with static sizes first.  Each code
object remembers the sizes (and int arguments) it was compiled for; when it is compiled
again and a size differs, that dimension is symbolic from then on ("automatic dynamic"),
so one more compile covers every later size.  ``dynamic=True`` makes every dimension of
every input symbolic from the first compile; ``dynamic=False`` never does.
`mark_dynamic` and `mark_static` pin single dimensions either way.

Sizes of 0 and 1 are always specialized (a size-1 dimension broadcasts, so a graph for
it is a different program), as in torch.compile.
"""
from __future__ import annotations

import math
import sys
import types

import dataclasses
import functools
import weakref

import torch
from torch._guards import GuardSource, Source as _TorchSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                   StatelessSymbolicContext)
import torch._higher_order_ops.utils as hop_utils

from .source import (AttrSource, CallMethodSource, ClosureSource, ConstSource, GetItemSource,
                     GlobalSource, LocalSource)
from . import config, interop

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(value) -> bool:
    """A symbolic value whose expression is not (yet) a constant."""
    return isinstance(value, SYM_TYPES) and not value.node.expr.is_number


def mark_dynamic(t: torch.Tensor, dim) -> None:
    """Compile `t`'s dimension(s) `dim` with symbolic sizes from the first compile.

    >>> x = torch.randn(8, 16)
    >>> frametrace.mark_dynamic(x, 0)
    >>> f(x)          # one graph for every batch size >= 2
    """
    _mark(t, dim, "_frametrace_dynamic_dims")


def marks(t: torch.Tensor, *attrs) -> set:
    """Dimensions marked on `t` by our mark_dynamic/mark_static or by torch's
    (torch._dynamo.mark_dynamic, maybe_mark_dynamic, mark_static: attributes on the
    tensor, read without importing torch._dynamo)."""
    dims = set()
    for attr in attrs:
        dims.update(getattr(t, attr, ()) or ())
    return dims


def mark_static(t: torch.Tensor, dim) -> None:
    """Never make `t`'s dimension(s) `dim` symbolic, even when its size changes
    (each size then compiles its own entry).

    >>> frametrace.mark_static(x, 1)
    """
    _mark(t, dim, "_frametrace_static_dims")


def _mark(t, dim, attr):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, not {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not -t.dim() <= d < t.dim():
            raise IndexError(f"dimension {d} out of range for a {t.dim()}-d tensor")
    marked = set(getattr(t, attr, ()))
    marked.update(d % t.dim() for d in dims)
    setattr(t, attr, marked)


@dataclasses.dataclass(frozen=True)
class ShapeSource(_TorchSource):
    """Our source's name, in the form the ShapeEnv wants (it names symbols with it)."""
    label: str

    @property
    def _name_template(self) -> str:
        return self.label

    @functools.cached_property
    def guard_source(self):
        return GuardSource.LOCAL


def new_fake_mode() -> FakeTensorMode:
    # Scalars read from tensors and data-dependent output sizes are "unbacked" symbols
    # (no guard can check them; the graph asserts facts about them at run time), and
    # only where the config lets them into graphs; otherwise they are graph breaks.
    env = ShapeEnv(specialize_zero_one=True, duck_shape=True,
                   allow_dynamic_output_shape_ops=interop.capture_dynamic_output_shape_ops(),
                   allow_scalar_outputs=interop.capture_scalar_outputs())
    mode = _FakeMode(shape_env=env)
    _modes_made.append(weakref.ref(mode))
    return mode


# The fake modes of the compiles under way.  A mode maps each real tensor it faked to
# an id through weak references, and the entry (its graph's fakes) keeps the mode
# alive: a weak reference on a tensor makes torch.utils.swap_tensors refuse it (a
# module's `.to()` with swap_module_params_on_conversion).  The map only keeps one
# tensor's fakes consistent within a compile, so each compile clears its own at the end.
_modes_made: list = []


def compile_started() -> int:
    return len(_modes_made)


def forget_real_tensors(start: int) -> None:
    """The end of the compile that began at `start`: its fake modes let go of the real
    tensors they faked (a nested compile's modes are its own)."""
    for ref in _modes_made[start:]:
        mode = ref()
        if mode is not None:
            describer = mode.fake_tensor_converter.meta_converter.describer
            describer.lookup_tensor.clear()
            describer.lookup_storage.clear()
    del _modes_made[start:]


class _FakeMode(FakeTensorMode):
    """FakeTensorMode that notes what a trace's ops do beyond computing: whether one
    draws random numbers, and which storages ops write to.  A graph that did neither
    to its inputs can be run again from its start (see codegen's failure path)."""
    used_rng = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.written_storages = set()
        # The last aten op that wrote a tensor whose elements share memory (an expanded
        # running mean): eager may accept it, functionalization cannot copy it back.
        self.overlapping_write = None

    # Higher-order ops (cond, while_loop ...) dispatch on the mode's exact type: ours
    # takes FakeTensorMode's rule for each.
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            if func in getattr(hop_utils, "registered_hop_fake_fns", {}):
                # Its FakeTensorMode rule only re-dispatches to the mode (map_impl):
                # FakeTensorMode's own dispatch runs the registered fake function.
                return super().__torch_dispatch__(func, types, args, kwargs)
            rule = func.python_key_table.get(FakeTensorMode)
            return NotImplemented if rule is None else rule(self, *args, **kwargs)
        if not self.used_rng and _draws_random(func, args, kwargs):
            self.used_rng = True
        for i, name in _written_args(func) or _undeclared_writes(func, args, kwargs):
            t = args[i] if i < len(args) else kwargs.get(name)
            for v in (t if isinstance(t, (list, tuple)) else (t,)):
                if isinstance(v, torch.Tensor):
                    self.written_storages.add(v.untyped_storage()._cdata)
                    if overlaps_itself(v):
                        self.overlapping_write = func
        return super().__torch_dispatch__(func, types, args, kwargs)


def overlaps_itself(t) -> bool:
    """Whether some elements of `t` may share memory (an expanded view, an as_strided
    whose rows overlap).  Symbolic strides: only a literal 0 stride counts (symbolic
    sizes are at least 2)."""
    sizes, strides = t.shape, t.stride()
    if all(type(v) is int for v in (*sizes, *strides)):
        # torch answers "too hard" for overlaps without a zero stride (as_strided
        # (2, 3), (2, 1)): that is not "no".
        found = torch._debug_has_internal_overlap(t)
        return found == 1 or (found == 2 and _offsets_repeat(sizes, strides))
    return any(type(st) is int and st == 0 and not (type(sz) is int and sz <= 1)
               for sz, st in zip(sizes, strides))


# Past this many elements an undecided layout counts as overlapping, unlisted.
_OVERLAP_ENUMERATION_LIMIT = 1 << 20


def _offsets_repeat(sizes, strides) -> bool:
    """Whether two indices of this geometry reach one storage offset: False where the
    strides, sorted, each step past everything the smaller ones reach; else decided by
    listing the offsets (small tensors), else True."""
    if 0 in sizes:
        return False
    dims = sorted((abs(st), sz) for sz, st in zip(sizes, strides) if sz != 1)
    reach = 0
    for st, sz in dims:
        if st <= reach:
            break
        reach += st * (sz - 1)
    else:
        return False
    if math.prod(sizes) > _OVERLAP_ENUMERATION_LIMIT:
        return True
    import numpy as np      # (not torch: this runs inside a fake mode's dispatch)
    offsets = np.zeros(1, dtype=np.int64)
    for st, sz in dims:
        offsets = (offsets[:, None] + np.arange(sz, dtype=np.int64) * st).ravel()
    return len(np.unique(offsets)) < len(offsets)


def _draws_random(func, args, kwargs) -> bool:
    """Whether this call draws from the random generator: an op tagged as seeded, except
    attention with a dropout probability of 0 (the tag is on the op, whatever the
    probability; the kernels draw no numbers and advance no offset then)."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    schema = getattr(func, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    if "dropout_p" in names:
        i = names.index("dropout_p")
        p = args[i] if i < len(args) else kwargs.get("dropout_p", schema.arguments[i].default_value)
        return not (type(p) in (int, float) and p == 0)
    return True


@functools.lru_cache(maxsize=None)
def _written_args(func) -> tuple:
    """(position, name) of the arguments an ATen op writes to (its schema's `(a!)`)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return ()
    return tuple((i, a.name) for i, a in enumerate(schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


# Ops that write arguments their schemas do not mark written: the batch norms that take
# running stats, which they update when training (argument 5).  The fake mode's cache
# can answer them without running the copy_ their meta functions make.
_BATCH_NORM_STATS = ((3, "running_mean"), (4, "running_var"))
_UNDECLARED = frozenset({"native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm",
                         "_batch_norm_impl_index"})


def _undeclared_writes(func, args, kwargs) -> tuple:
    packet = getattr(func, "_overloadpacket", None)
    if getattr(packet, "__name__", None) not in _UNDECLARED:
        return ()
    training = args[5] if len(args) > 5 else kwargs.get("training", False)
    return _BATCH_NORM_STATS if training is not False else ()


_ENV_CACHES = [v for k, v in vars(ShapeEnv).items() if hasattr(v, "cache_clear")]


def release_shape_env_caches() -> None:
    """ShapeEnv's methods memoize in caches shared by all instances, keyed by the
    instance: without this, every compile's ShapeEnv (and its symbols) would stay
    alive for good.  The caches only help within one compile."""
    for cache in _ENV_CACHES:
        cache.cache_clear()


# Per code object: source name -> the sizes seen (None where a dimension has changed),
# and ("int", source name) -> the int argument seen (None once it has changed).
_frame_sizes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_STATIC = "<static>"     # a key of _frame_sizes[code]: symbolic sizes failed there
_STATIC_FLOATS = "<static floats>"  # a key too: AOTAutograd could not keep a float symbolic


def forget_sizes() -> None:
    """reset(): no code remembers the sizes it was compiled for."""
    _frame_sizes.clear()


def saved_sizes():
    """What every code remembers, to put back with `restore_sizes` (explain() compiles
    without changing what later compiles make symbolic)."""
    return {code: dict(seen) for code, seen in _frame_sizes.items()}


def restore_sizes(saved) -> None:
    _frame_sizes.clear()
    _frame_sizes.update(saved)


class ShapePolicy:
    """Decides, for one compile of `code`, which input dimensions and ints are
    symbolic; records what it saw for the next compile of the same code.  `used` says
    whether it made anything symbolic."""
    __slots__ = ("dynamic", "seen", "used", "used_float")

    def __init__(self, code, dynamic):
        try:
            self.seen = _frame_sizes.setdefault(code, {})
        except TypeError:
            self.seen = {}
        self.dynamic = False if self.seen.get(_STATIC) else dynamic
        self.used = False
        self.used_float = False

    def stay_static(self):
        """Tracing this code with symbolic sizes failed: from now on it is compiled
        with static sizes (a compile per shape beats running it in CPython)."""
        self.seen[_STATIC] = True

    def dynamic_dims(self, source, t: torch.Tensor) -> list[int]:
        dims = self._dynamic_dims(source, t)
        self.used |= bool(dims)
        return dims

    def _dynamic_dims(self, source, t: torch.Tensor) -> list[int]:
        if self.dynamic is False or t.dim() == 0 or _is_parameter(source, t):
            return []
        static = marks(t, "_frametrace_static_dims", "_dynamo_static_indices")
        marked = marks(t, "_frametrace_dynamic_dims", "_dynamo_dynamic_indices",
                       "_dynamo_weak_dynamic_indices")
        shape = tuple(t.shape)
        key = source.name()
        before = self.seen.get(key)
        if before is None or len(before) != len(shape):
            sizes = shape
        else:
            # A dimension stays symbolic once it has changed.
            sizes = tuple(None if b is None or b != s else s for b, s in zip(before, shape))
        self.seen[key] = sizes
        return [i for i, size in enumerate(sizes)
                if i not in static and shape[i] not in (0, 1) and
                (self.dynamic is True or i in marked or size is None)]

    def data_numbers(self) -> bool:
        """Whether numbers computed at a graph break may be symbolic graph inputs."""
        return self.dynamic is not False

    def dynamic_int(self, source, value: int) -> bool:
        if type(value) is not int:
            return False
        if value in (0, 1):
            # Specialized, as sizes 0 and 1 are; but seen, so that a counter starting
            # at 0 (a step count) is symbolic from its third value, not its fourth.
            if self.dynamic is not False and (_is_argument(source) or _is_outside_state(source)):
                key = ("int", source.name())
                self.seen[key] = None if self.seen.get(key, value) != value else value
            return False
        return self._dynamic_number(source, value, "int")

    def dynamic_module_int(self, source, value: int) -> bool:
        """An int an nn.Module holds is a constant of the model (a size, a count of
        heads), as torch.compile has it; one that has changed twice is a counter
        (`self.step += 1` in forward) and symbolic from then on, so that a loop does
        not compile once per step up to the cache limit and then run in CPython."""
        if type(value) is not int or self.dynamic is False or not config.dynamic_module_counters:
            return False
        key = ("module int", source.name())
        last, changes = self.seen.get(key, (value, 0))
        if last != value:
            changes += 1
        self.seen[key] = (value, changes)
        symbolic = changes >= 2 and value not in (0, 1)
        self.used |= symbolic
        return symbolic

    def dynamic_float(self, source, value: float, held_by_module: bool = False) -> bool:
        """A float argument is symbolic once it has changed (torch.compile's automatic
        dynamic floats), so a learning rate or a scale does not compile per value.
        NaN and infinities stay constants: a symbol needs a finite hint.  So do 0.0 and
        -0.0: a symbol pinned to 0.0 (``m == 0.0``) would pass -0.0, which `1 / m`,
        `math.copysign` and `str` tell apart; their constant guards check the sign.
        A float an nn.Module holds (an Embedding's norm_type, a dropout's p) is a
        constant of the model until it changes, `dynamic=True` or not: that asks for
        dynamic sizes, and a symbol for a setting the graph may never use is one that
        AOTAutograd cannot keep (its restart would cost the dynamic sizes).  After a
        restart for a float AOTAutograd could not keep, every float stays constant."""
        if type(value) is not float or not math.isfinite(value) or value == 0.0:
            return False
        if self.seen.get(_STATIC_FLOATS):
            return False
        return self._dynamic_number(source, value, "float", automatic_only=held_by_module)

    def floats_static(self) -> bool:
        """Whether this policy made a float symbolic, and from now on makes none
        (AOTAutograd asked for a restart with that float specialised): the compile is
        retried with the sizes still symbolic."""
        if not self.used_float or self.seen.get(_STATIC_FLOATS):
            return False
        self.seen[_STATIC_FLOATS] = True
        return True

    def _dynamic_number(self, source, value, kind, automatic_only=False) -> bool:
        if self.dynamic is False:
            return False
        if not _is_argument(source):
            if not _is_outside_state(source):
                return False
            # Not the caller's: symbolic only once it has changed, dynamic=True or not.
            automatic_only = True
        key = (kind, source.name())
        before = self.seen.get(key, value)
        changed = before is None or before != value
        self.seen[key] = None if changed else value
        symbolic = (self.dynamic is True and not automatic_only) or changed
        if kind == "float":
            self.used_float |= symbolic
        self.used |= symbolic
        return symbolic


def _is_parameter(source, t) -> bool:
    # Weights keep static shapes (torch.compile's force_parameter_static_shapes).
    if isinstance(t, torch.nn.Parameter):
        return True
    while isinstance(source, (AttrSource, GetItemSource)):
        if isinstance(source, AttrSource) and source.attr == "_buffers":
            return True
        source = source.base
    return False


def _is_argument(source) -> bool:
    """Numbers reached from the frame's arguments: passed to it, held in its
    tuple/list/dict arguments, or attributes of objects it was passed (`cfg.max_len`,
    `self.config.scale`), as torch.compile's automatic dynamic has them.  Globals and
    dunder attributes (a function's __defaults__, a class's __dict__) stay constants;
    ints of nn.Modules are the caller's concern (builder.wrap)."""
    while isinstance(source, (GetItemSource, AttrSource, CallMethodSource)):
        if isinstance(source, AttrSource) and source.attr.startswith("__"):
            return False
        if isinstance(source, CallMethodSource) and source.method not in _CONTAINER_VIEWS:
            return False
        source = source.base
    return isinstance(source, LocalSource)


def _is_outside_state(source) -> bool:
    """Numbers the frame reads from state that outlives the call: globals (of its own
    module or of a function inlined from another), closure cells, and what is reached
    from them by attributes, items and container views, and through a weak reference
    (an LR scheduler holds its optimizer so).  Such a number that changes between calls
    is state the program updates (a learning rate a scheduler sets, a step counter):
    automatic dynamic covers it as it does arguments, once it has changed."""
    while isinstance(source, (GetItemSource, AttrSource, CallMethodSource)):
        if isinstance(source, AttrSource) and source.attr.startswith("__") and \
                source.attr not in _CELL_ATTRS:
            return False
        if isinstance(source, CallMethodSource) and source.method not in _CONTAINER_VIEWS and \
                not (source.method == "__call__" and not source.args and source.through is None):
            return False
        source = source.base
    if isinstance(source, (GlobalSource, ClosureSource)):
        return True
    return isinstance(source, ConstSource) and (
        type(source.obj) is types.CellType or
        (type(source.obj) is dict and _is_module_globals(source.obj)))


# A function's closure cells and their contents (`f.__closure__[0].cell_contents`).
_CELL_ATTRS = frozenset({"__closure__"})


def _is_module_globals(d) -> bool:
    # (a module's dict, or the globals a script or exec() ran in)
    if "__builtins__" in d and isinstance(d.get("__name__"), str):
        return True
    module = sys.modules.get(d.get("__name__")) if isinstance(d.get("__name__"), str) else None
    return module is not None and getattr(module, "__dict__", None) is d


# Views of a container that hold its numbers (an optimizer's per-parameter state, keyed
# by tensors, is read through `state.values()`): still the argument's numbers.
_CONTAINER_VIEWS = frozenset({"values", "items", "keys"})


def symbolic_fake(fake_mode, t: torch.Tensor, source, dims: list[int]):
    """A FakeTensor for `t` whose dimensions `dims` have fresh symbolic sizes."""
    sizes = [DimDynamic.DUCK if i in dims else DimDynamic.STATIC for i in range(t.dim())]
    context = StatelessSymbolicContext(dynamic_sizes=sizes, constraint_sizes=[None] * t.dim())
    return fake_mode.from_tensor(t, source=ShapeSource(source.name()), symbolic_context=context)


def symbolic_float(fake_mode, value: float, source):
    env = fake_mode.shape_env
    sym = env.create_unspecified_symbol(value, ShapeSource(source.name()), DimDynamic.DYNAMIC)
    return env.create_symfloatnode(sym, hint=value, source=ShapeSource(source.name()))


def symbolic_int(fake_mode, value: int, source, any_value: bool = False):
    """A SymInt for an int input.  Unless `any_value`, 0 and 1 stay constants (guarded),
    as sizes do; a number computed from data takes any value, so it is never pinned."""
    env = fake_mode.shape_env
    return env.create_symintnode(
        env.create_symbol(value, ShapeSource(source.name()), DimDynamic.DYNAMIC, positive=None,
                          do_not_specialize_zero_one=any_value),
        hint=value, source=ShapeSource(source.name()))


def static_geometry(t):
    """(sizes, strides, storage offset) of strided tensor `t` when all are plain ints
    (no symbol), else None."""
    if t.layout is not torch.strided:
        return None
    sizes, strides, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
    if type(offset) is int and all(type(v) is int for v in (*sizes, *strides)):
        return sizes, strides, offset
    return None


def meta_like(t):
    """A meta tensor of `t`'s dtype and static geometry (a view into a storage just
    large enough), on which the C++ kernels run as they would on `t`'s device; None
    where the geometry is symbolic or the layout not strided."""
    geometry = static_geometry(t)
    if geometry is None:
        return None
    sizes, strides, offset = geometry
    extent = offset + (1 + sum((n - 1) * st for n, st in zip(sizes, strides)) if all(sizes) else 0)
    return torch.empty(extent, dtype=t.dtype, device="meta").as_strided(sizes, strides, offset)
