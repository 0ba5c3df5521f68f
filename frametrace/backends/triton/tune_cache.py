"""Autotuning choices on disk: a process that timed a kernel's block-size candidates
once takes the same choice the next time without timing (a warm start's first call
would otherwise compile and time every candidate again).

A choice is one small file under the on-disk cache's folder (config.cache_folder(),
in `triton-autotune/`), named by the hash of its key: the kernel's name (which holds a
hash of its source), its extents (xnumel, rnumel), the candidates it was picked among
(block sizes and warps: `max_autotune` or another Triton's heuristics give others), the
GPU's name, capability and SM count, Triton's and torch's versions.  The file holds the
key again and the choice; it is used only where both match and the choice is one of
the live candidates.  A damaged file is a miss with one log line; a folder that cannot
be written is a warning once, then the choice is kept for this process only.
`frametrace.config.cache` off (or FRAMETRACE_CACHE_DIR= empty) turns it off.

Choices are made (and so stored) only where candidates are timed: on a GPU, for a
kernel over `config.autotune_min_elements` with more than one candidate; Triton's
interpreter and small kernels take the heuristic default, which needs no cache.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os

import torch

from ... import config as frametrace_config
from ...files import write_atomic

log = logging.getLogger("frametrace.cache")

_FORMAT = 1
_SUBDIR = "triton-autotune"
STATS = {"hits": 0, "misses": 0, "stores": 0, "errors": 0}
_unwritable: set = set()


def _folder() -> str | None:
    base = frametrace_config.cache_folder()
    return None if base is None else os.path.join(base, _SUBDIR)


@functools.lru_cache(maxsize=8)
def _device_of(index) -> tuple:
    p = torch.cuda.get_device_properties(index)
    return (p.name, p.major, p.minor, getattr(p, "multi_processor_count", None))


def device() -> tuple:
    """The GPU the choice is timed on (the current one): name, capability, SMs."""
    return _device_of(torch.cuda.current_device())


@functools.lru_cache(maxsize=1)
def _versions() -> tuple:
    try:
        triton_version = importlib.metadata.version("triton")
    except Exception:
        triton_version = None
    return (_FORMAT, triton_version, torch.__version__)


def describe(c) -> list:
    """A candidate (autotune.Config, tiling.TileConfig) as the launch keywords it gives."""
    return [type(c).__name__, [[k, v] for k, v in sorted(c.kwargs(True).items())]]


def key_of(name, xnumel, rnumel, configs) -> list:
    return [name, int(xnumel), int(rnumel), [describe(c) for c in configs],
            list(device()), list(_versions())]


def _path(folder, key) -> str:
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()
    return os.path.join(folder, digest[:2], digest + ".json")


def load(name, xnumel, rnumel, configs):
    """The stored choice among `configs` for this kernel, extents and GPU, or None."""
    folder = _folder()
    if folder is None:
        return None
    try:
        key = key_of(name, xnumel, rnumel, configs)
        path = _path(folder, key)
    except Exception as e:      # (no GPU facts to key by: nothing stored either)
        log.info("frametrace: cache: no autotune key for %s (%s)", name, e)
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        STATS["misses"] += 1
        return None
    except (OSError, ValueError) as e:
        STATS["errors"] += 1
        log.warning("frametrace: cache: autotune choice %s cannot be read (%s); timed again", path, e)
        return None
    try:
        if data["key"] != key:
            raise ValueError("another key")
        index = data["choice"]
        chosen = configs[index]
        if describe(chosen) != data["config"]:
            raise ValueError("another candidate")
    except Exception as e:
        STATS["errors"] += 1
        log.warning("frametrace: cache: autotune choice %s is damaged or of another version (%s); "
                    "timed again", path, e)
        return None
    STATS["hits"] += 1
    log.debug("frametrace: cache: %s at (%d, %d): %r from the cache", name, xnumel, rnumel, chosen)
    return chosen


def store(name, xnumel, rnumel, configs, chosen):
    """Write the choice just timed (atomically: a temporary file renamed)."""
    folder = _folder()
    if folder is None:
        return
    try:
        key = key_of(name, xnumel, rnumel, configs)
        index = next(i for i, c in enumerate(configs) if c is chosen)
    except Exception:
        return
    data = json.dumps({"key": key, "choice": index,
                       "config": describe(chosen)})
    path = _path(folder, key)
    try:
        write_atomic(path, data.encode("utf-8"))
    except OSError as e:
        STATS["errors"] += 1
        (log.info if folder in _unwritable else log.warning)(
            "frametrace: cache: cannot write an autotune choice to %s (%s); not cached", folder, e)
        _unwritable.add(folder)
        return
    STATS["stores"] += 1
