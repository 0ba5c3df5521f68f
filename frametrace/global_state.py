"""The process-wide torch state a compile may change, saved before and put back after.

Tracing switches grad mode and autocast for real, enters FakeTensorMode and torch
function modes, and runs backends that do the same.  Normal exits undo each of those,
but an interrupt (KeyboardInterrupt, or any BaseException) can arrive between any two
steps: whatever stops a compile, `restore` puts back what `save` saw, so the program
goes on (or handles the interrupt) in the state it was in.
"""
from __future__ import annotations

import torch
from torch.utils import _python_dispatch

_AUTOCAST_DEVICES = ("cpu", "cuda")


class GlobalState:
    __slots__ = ("grad", "autocast", "autocast_cache", "autocast_nesting", "function_modes",
                 "dispatch_modes", "dtype", "device", "deterministic")

    def __init__(self):
        self.grad = torch.is_grad_enabled()
        self.autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                         for d in _AUTOCAST_DEVICES]
        self.autocast_cache = torch.is_autocast_cache_enabled()
        self.autocast_nesting = torch.autocast_increment_nesting() - 1
        torch.autocast_decrement_nesting()
        self.function_modes = _function_modes()
        self.dispatch_modes = _python_dispatch._get_current_dispatch_mode_stack()
        self.dtype = torch.get_default_dtype()
        self.device = torch.get_default_device()
        self.deterministic = (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled())

    def restore(self):
        _restore_stack(self.function_modes, _function_modes,
                       torch._C._pop_torch_function_stack, torch._C._push_on_torch_function_stack)
        _restore_stack(self.dispatch_modes, _python_dispatch._get_current_dispatch_mode_stack,
                       _python_dispatch._pop_mode, _python_dispatch._push_mode)
        torch._C._set_grad_enabled(self.grad)
        for device, enabled, dtype in self.autocast:
            if torch.is_autocast_enabled(device) != enabled:
                torch.set_autocast_enabled(device, enabled)
            if torch.get_autocast_dtype(device) != dtype:
                torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(self.autocast_cache)
        level = torch.autocast_increment_nesting() - 1
        torch.autocast_decrement_nesting()
        while level > self.autocast_nesting:
            level = torch.autocast_decrement_nesting()
        while level < self.autocast_nesting:
            level = torch.autocast_increment_nesting()
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)
        if torch.get_default_device() != self.device:
            torch.set_default_device(self.device)
        mode, warn_only = self.deterministic
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def _function_modes():
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def _restore_stack(saved, current, pop, push):
    """Pop the modes pushed since `saved` (and any it lost), then push back the lost."""
    now = current()
    keep = 0
    while keep < min(len(saved), len(now)) and saved[keep] is now[keep]:
        keep += 1
    for _ in range(len(now) - keep):
        pop()
    for mode in saved[keep:]:
        push(mode)
