"""Which FakeTensors' strides are the real kernel's.

A FakeTensor's strides come from Python meta functions and decompositions, not from
the kernels that run: for most ops they agree, for some they do not.  Found by
comparing fake and real CPU strides over torch's OpInfo samples with transposed,
sliced, expanded and channels-last inputs (`tests/layout_sweep.py`): the ops in
`UNTRUSTED` give, for some layouts, strides the real kernel does not (batch_norm of a
transposed input: the kernel's result is contiguous, the fake keeps the input's
order; roll and channel_shuffle of a channels-last one: the other way round).

The layout of a tensor is *sure* when it is a graph input (its strides are guarded),
or the result of an op whose result's layout is fixed whatever its input's
(``clone(memory_format=torch.channels_last)``), or of an op on tensors whose layouts
are sure, unless the op is in `UNTRUSTED` and one of them is not contiguous (on
contiguous, non-empty inputs the sweep finds every fake right).  An op of no OpInfo
is not swept: it is trusted as the ops like it are.  What the trace
answers from a layout -- ``stride()``, ``is_contiguous()``, and whether
``contiguous()`` gives its argument back (graph.py's no-op elision) -- it answers only
for sure layouts; otherwise it is a graph break and CPython reads the real tensor.
(``contiguous()`` of an unsure layout cannot stay in the graph either: whether its
result is its argument, which writes through it reach, AOTAutograd would decide from
the fake; reshape() and flatten() likewise, which view or copy by the layout.)"""
from __future__ import annotations

import weakref

import torch

# Ops whose fake strides differ from the real kernel's for some input layouts (names
# as traced: a Tensor method's, a torch function's __name__, an operator's).
UNTRUSTED = frozenset({
    "copysign", "copysign_", "floor_divide", "floor_divide_", "floordiv", "ifloordiv",
    "__floordiv__", "__rfloordiv__", "__ifloordiv__",
    "flip", "fliplr", "flipud", "frexp", "roll",
    "batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update",
    "_batch_norm_impl_index", "instance_norm", "rms_norm", "_fused_rms_norm",
    "max_pool1d", "max_pool1d_with_indices", "max_unpool1d", "max_unpool2d", "max_unpool3d",
    "prelu", "_prelu_kernel", "hardtanh", "relu6", "nan_to_num", "isreal",
    "xlogy", "xlogy_", "special_xlogy", "xlog1py", "special_xlog1py",
    "native_dropout_backward", "pixel_shuffle", "pixel_unshuffle",
    "channel_shuffle", "native_channel_shuffle", "one_hot", "binary_cross_entropy", "glu",
    "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d",
})
# From torch 2.14 (its layout_sweep.py run): group norm's meta kernel gives the result of
# a channels-last input contiguous, where the CPU kernel keeps it channels-last (2.13's
# kept it too).
if torch.__version__ >= (2, 14):
    UNTRUSTED |= {"group_norm", "native_group_norm"}
# Ops whose fake strides differ from the kernel's even on contiguous inputs, by torch
# version: torch 2.11's ihfft along a dimension not last returns a transposed result
# where its meta function says contiguous (the OpInfo sweep on the H200, torch 2.11;
# 2.13's agree).
_UNTRUSTED_ANY_LAYOUT = frozenset({"fft_ihfft", "ihfft"}) if torch.__version__ < (2, 13) else frozenset()
# Ops untrusted only on CUDA tensors: upsampling, whose meta functions store a CUDA
# image of few channels contiguous where aten's kernels keep a channels-last input's
# format (the OpInfo sweep on the H200; backends/kernel_formats.py fixes the compiled
# graph's layout, this the trace's reads of it).
_UNTRUSTED_ON_CUDA = frozenset({
    "interpolate", "upsample", "upsample_bilinear", "upsample_nearest",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
})
# Ops untrusted only with an argument (keyword, or positional at that index) that
# changes their kernel: (name, index, the values that keep it trusted).
_UNTRUSTED_WITH = {"div": ("rounding_mode", 2, (None,)), "div_": ("rounding_mode", 2, (None,)),
                   "divide": ("rounding_mode", 2, (None,)),
                   "pad": ("mode", 2, ("constant",))}

# Ops whose result has a layout fixed by their arguments alone, whatever their input's:
# with a `memory_format` other than preserve_format.
_FORMATTING = frozenset({"contiguous", "clone", "to", "type", "empty_like", "zeros_like",
                         "ones_like", "full_like", "rand_like", "randn_like", "randint_like"})

# The fakes whose layout is not sure (by id: == of tensors is elementwise).
_UNSURE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def is_unsure(fake) -> bool:
    return bool(_UNSURE) and _UNSURE.get(id(fake)) is fake


def mark_unsure(fake):
    if isinstance(fake, torch.Tensor):
        _UNSURE[id(fake)] = fake
    elif isinstance(fake, (tuple, list)):
        for f in fake:
            mark_unsure(f)


# Ops that give their argument itself back where it has the layout asked for, and a
# copy where not; and ops that give a view where the layout allows one, and a copy
# where not.
_RETURN_ARG_BY_LAYOUT = frozenset({"contiguous", "to"})
_VIEW_BY_LAYOUT = frozenset({"reshape", "reshape_as", "flatten", "ravel"})


def copies_by_layout(what: str, fake_args, fake_kwargs) -> str | None:
    """Whether `what` copies or not by the layout of its argument, whose layout is not
    sure: which it does decides where writes through its result go, and the trace
    cannot tell (the eager backend runs the kernel, which knows; AOTAutograd would
    decide it from the fake, and write the argument or not as the kernel does not).
    "identity": it gives its argument itself, or a copy; "memory": a view of it, or a
    copy (a new tensor either way); None: neither, or a sure layout."""
    if not fake_args or not isinstance(fake_args[0], torch.Tensor) or not is_unsure(fake_args[0]):
        return None
    if what in _VIEW_BY_LAYOUT:
        return "memory"
    if what in _RETURN_ARG_BY_LAYOUT and fixed_format(what, fake_args, fake_kwargs) is not None:
        return "identity"
    return None


# The fakes of a reshape of an unsure layout and of its argument, which the real tensors
# may or may not share memory as these do: a write to one of them (or a view of one,
# found by storage) is a graph break (graph.py).  By id: == of tensors is elementwise.
_MEMORY_UNSURE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def mark_memory_unsure(*fakes):
    for f in fakes:
        if isinstance(f, torch.Tensor):
            _MEMORY_UNSURE[id(f)] = f


def memory_unsure(fake) -> bool:
    if not _MEMORY_UNSURE:
        return False
    try:
        key = fake.untyped_storage()._cdata
        return any(f.untyped_storage()._cdata == key for f in list(_MEMORY_UNSURE.values()))
    except Exception:
        return True


def fixed_format(what: str, fake_args, fake_kwargs):
    """The memory format `what` gives its result whatever its input's layout, or None."""
    if what not in _FORMATTING:
        return None
    fmt = fake_kwargs.get("memory_format")
    if fmt is None and what == "contiguous":
        fmt = fake_args[1] if len(fake_args) > 1 else torch.contiguous_format
    if isinstance(fmt, torch.memory_format) and fmt is not torch.preserve_format:
        return fmt
    return None


def result_unsure(what: str, fake_args, fake_kwargs, out=None) -> bool:
    """Whether the layout of what `what` returns is not sure: an op on a tensor whose
    layout is not sure (its result's strides follow the input's) unless the op fixes
    its result's layout, or an untrusted op on a tensor that is not contiguous.  (On
    contiguous, non-empty tensors the sweep found every op's fake strides right.)
    An empty tensor's layout reaches no result that is not empty, but through cat
    (which skips only the legacy 1-d ones: a DynamicCache's first keys)."""
    if _UNSURE and fixed_format(what, fake_args, fake_kwargs) is None:
        nonempty = isinstance(out, torch.Tensor) and _static_numel(out) != 0
        glued = what in _CONCATENATING
        if any(_any_unsure(a, nonempty, glued) for a in (*fake_args, *fake_kwargs.values())):
            return True
    if what in _UNTRUSTED_ANY_LAYOUT:
        return True
    if what in _UNTRUSTED_WITH:
        key, index, fine = _UNTRUSTED_WITH[what]
        value = fake_kwargs[key] if key in fake_kwargs else \
            fake_args[index] if len(fake_args) > index else fine[0]
        if any(value is f or value == f for f in fine):
            return False
    elif what not in UNTRUSTED and not (what in _UNTRUSTED_ON_CUDA and _on_cuda(fake_args)):
        return False
    also = _SWEPT_RIGHT.get(what)
    return not all(_plainly_laid_out(a, also) for a in (*fake_args, *fake_kwargs.values()))


# Untrusted ops whose fakes the sweep found right on inputs dense in this memory format
# too (a CNN's batch norms run on channels-last activations).
_SWEPT_RIGHT = dict.fromkeys(("batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                              "_batch_norm_with_update", "_batch_norm_impl_index"),
                             torch.channels_last)


def _on_cuda(fake_args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in fake_args)


def _plainly_laid_out(v, also=None) -> bool:
    """No tensor in `v` but non-empty ones of static sizes, contiguous (or dense in the
    memory format `also`, for a 4-d one)."""
    if isinstance(v, torch.Tensor):
        n = _static_numel(v)
        return bool(n) and (v.is_contiguous() or
                            also is not None and v.dim() == 4 and v.is_contiguous(memory_format=also))
    if isinstance(v, (tuple, list)):
        return all(_plainly_laid_out(x, also) for x in v)
    if isinstance(v, dict):
        return all(_plainly_laid_out(x, also) for x in v.values())
    return True


_CONCATENATING = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack",
                            "column_stack", "row_stack"})


def _any_unsure(v, nonempty_result=False, glued=False) -> bool:
    if isinstance(v, torch.Tensor):
        if nonempty_result and _static_numel(v) == 0 and (not glued or v.dim() == 1):
            return False
        return is_unsure(v)
    if isinstance(v, (tuple, list)):
        return any(_any_unsure(x, nonempty_result, glued) for x in v)
    if isinstance(v, dict):
        return any(_any_unsure(x, nonempty_result, glued) for x in v.values())
    return False


def mark_new_empty(out, fake_args, fake_kwargs):
    """Kernels stride the empty tensors they make as they like (zeros_like, flip,
    nan_to_num of a sliced empty one), unlike their fakes: such a result's layout is
    not sure.  (An empty view's strides are the view kernel's: graph.py replays it.)"""
    if isinstance(out, (tuple, list)):
        for o in out:
            mark_new_empty(o, fake_args, fake_kwargs)
        return
    if not isinstance(out, torch.Tensor) or _static_numel(out) != 0:
        return
    args = [a for a in (*fake_args, *fake_kwargs.values()) if isinstance(a, torch.Tensor)]
    if not any(torch._C._is_alias_of(out, a) for a in args):
        mark_unsure(out)


def read_unsure(what: str, fake, is_input: bool) -> str | None:
    """Why a layout read `what` (stride, is_contiguous ...) of `fake` cannot be answered
    from the fake, or None."""
    if is_unsure(fake) and not is_input:
        return "its strides come from an op whose fake strides may not be the kernel's"
    return None


def _static_numel(fake):
    n = 1
    for s in fake.shape:
        if type(s) is not int:
            return None
        n *= s
    return n
