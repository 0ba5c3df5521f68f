"""What torch says about the machine's devices, answered while tracing.

Which devices a process sees, and what each of them is, are fixed once CUDA is
initialized, so `torch.cuda.is_available()` or `torch.cuda.get_device_capability(x.device)`
is the same on every call: torch.compile folds such calls too.  Library code asks them
to pick a kernel (transformers' grouped GEMM experts check the capability on every
layer), and each such call was a graph break.

A function that asks about one device and is given none (or `"cuda"` without an index)
answers for the current device, which the program may change between calls: it is
folded only where every visible device gives the same answer, and is otherwise left to
CPython (a graph break, as before).  A call that raises (no CUDA in this build) is left
to CPython too, which raises it where the program made it.

    >>> @frametrace.optimize
    ... def f(x):
    ...     if torch.cuda.get_device_capability(x.device) >= (9, 0):   # folded, no break
    ...         return x * 2
    ...     return x
"""
from __future__ import annotations

import torch

from .base import wrap

# fn -> (_PROCESS,), or (_DEVICE, its device argument's position, its name): a device
# function's only argument is the device (None: it takes none, answering for the current)
_PROCESS = "process"    # one answer for the process
_DEVICE = "device"      # one answer per device


def _facts() -> dict:
    cuda = torch.cuda
    facts = {cuda.is_available: (_PROCESS,), cuda.device_count: (_PROCESS,),
             torch.backends.cuda.is_built: (_PROCESS,), torch.backends.cudnn.is_available: (_PROCESS,),
             cuda.get_device_capability: (_DEVICE, 0, "device"),
             cuda.get_device_name: (_DEVICE, 0, "device"),
             cuda.is_bf16_supported: (_DEVICE, None, None)}
    accelerator = getattr(torch, "accelerator", None)
    for name in ("is_available", "device_count"):
        fn = getattr(accelerator, name, None)
        if fn is not None:
            facts[fn] = (_PROCESS,)
    return facts


FACTS = _facts()


def _names_one_device(value) -> bool:
    """Whether a device argument names its device whatever the current one is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    if isinstance(value, str):
        value = torch.device(value)
    return isinstance(value, torch.device) and value.index is not None


def _device_argument(spec, args, kwargs):
    _, position, name = spec
    if name is not None and name in kwargs:
        return kwargs[name]
    return args[position] if position is not None and len(args) > position else None


def device_fact(tx, fn, args, kwargs):
    """The Var of `fn(*args, **kwargs)` answered now, for the functions in FACTS over
    constant arguments; None where it is left to CPython."""
    try:
        spec = FACTS.get(fn)
    except TypeError:   # (an unhashable callable)
        return None
    if spec is None or not all(a.is_const() for a in args) or \
            not all(v.is_const() for v in kwargs.values()):
        return None
    args = [a.as_const() for a in args]
    kwargs = {k: v.as_const() for k, v in kwargs.items()}
    try:
        value = fn(*args, **kwargs)
        if spec[0] == _DEVICE and not _names_one_device(_device_argument(spec, args, kwargs)):
            # (the current device's answer: folded where every device gives it)
            count = torch.cuda.device_count()
            if spec[1] is None:
                if count > 1:
                    return None
            elif any(fn(i) != value for i in range(count)):
                return None
    except Exception:   # (CPython raises it at the call)
        return None
    return wrap(tx, value, None, guard=False)


def fingerprint() -> tuple:
    """Every answer `device_fact` could fold in this process, for the on-disk cache's key
    (warm_cache): an entry holds the answers of the process that compiled it, and one
    that sees other devices (another machine sharing the cache folder, another
    CUDA_VISIBLE_DEVICES) must compile again instead of loading them.  A call that raises
    (folded nowhere) is keyed by its exception's type."""
    def answer(fn, *args):
        try:
            return repr(fn(*args))
        except Exception as e:
            return type(e).__name__
    try:
        count = torch.cuda.device_count()
    except Exception:
        count = 0
    out = []
    for fn, spec in FACTS.items():
        name = f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', fn)}"
        if spec[0] == _DEVICE and spec[1] is not None:
            # (a device unnamed folds only where all of them agree: each device's answer)
            out.append((name, tuple(answer(fn, i) for i in range(count))))
        else:
            out.append((name, answer(fn)))
    return tuple(sorted(out))
