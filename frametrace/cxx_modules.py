"""The optional C++ modules built against torch's headers (setup.py): used only under the
torch they were built for, since they read torch's C++ structs."""
from __future__ import annotations

import importlib
import logging

import torch


def load(name: str, log: logging.Logger, without: str):
    """``frametrace.<name>`` when it was built, for this very torch; else None, with one
    debug line on `log` saying why and what runs `without` it."""
    try:
        module = importlib.import_module(f"frametrace.{name}")
    except ImportError as e:
        log.debug("%s: %s", without, e)
        return None
    if module.TORCH_VERSION != torch.__version__:
        log.debug("%s: frametrace.%s was built for torch %s, this is %s (reinstall frametrace)",
                  without, name, module.TORCH_VERSION, torch.__version__)
        return None
    return module
