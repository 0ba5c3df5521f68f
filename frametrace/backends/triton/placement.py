"""Kernels run on the graph's device and never take a pointer to another one (a pointer to
host memory faults the GPU and loses the process's CUDA context).  What a kernel reads
from another device: a constant is moved once, at compile time; one element (a CPU scalar
tensor beside CUDA ones, or a broadcast of one) is read once per call, a float as a
number (as eager reads such a scalar) and anything else as a copy; other tensors leave the
op that reads them an aten call in the same wrapper.  Values the graph makes on another
device (`torch.arange(n)` without a device) are made there, by aten."""
from __future__ import annotations

import operator

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .ir import Buffer, Extern, HostScalar, IRNode

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def device_of(val):
    """The device of an op's (first) tensor result, or None."""
    if isinstance(val, torch.Tensor):
        return val.device
    if isinstance(val, (list, tuple)):
        return next((d for d in map(device_of, val) if d is not None), None)
    return None


def is_view(op) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is not None and not schema.is_mutable and any(
        r.alias_info is not None for r in schema.returns)


def reaches_output(node) -> bool:
    """Whether `node`'s value, or a view of it, is one of the graph's outputs."""
    for user in node.users:
        if user.op == "output" or (user.target is operator.getitem or is_view(user.target)) \
                and reaches_output(user):
            return True
    return False


class Placement:
    """GraphLowering's part that places memory: `device` (the kernels'), `devices` (wrapper
    name -> device, of the tensors elsewhere), `off_device` (the wrapper does host work),
    `_host` ((name, offset) -> what kernels read for that element)."""

    @staticmethod
    def device_of_input(name, tensor):
        """The device of a graph input or constant (the tests make some count as another)."""
        return tensor.device

    def _note_device(self, name, tensor_or_device):
        device = tensor_or_device if isinstance(tensor_or_device, torch.device) else \
            self.device_of_input(name, tensor_or_device)
        if device != self.device:
            self.devices[name] = device
        return device

    def _made_for_kernels(self, node, args, kwargs) -> bool:
        """Whether `node` makes a value from numbers alone (`torch.full((), v)` on the CPU),
        or a host scalar from host scalars (torch.optim's bias corrections from CPU step
        counters), that only ops on the kernels' device read, directly or through more of
        the same: made there too, it is computed in their kernels from numbers and host
        scalars read by value (for them a scalar tensor on either device means the same),
        not by one aten call on the host per op."""
        if any(isinstance(a, IRNode) and not _one(a) for a in _flat((args, kwargs))):
            return False
        return _feeds_kernels(node, self.device)

    def _on_device(self, args, kwargs):
        """The op's arguments as kernels on the graph's device can read them, and the host
        reads this added (a list), or the reason it stays an aten call instead (a str)."""
        added, refused = [], []

        def fix(a):
            if isinstance(a, Buffer) and a.device != self.device:
                b = self.on_device(a, added)
                if b is None:
                    refused.append(a)
                return a if b is None else b
            if isinstance(a, (list, tuple)):
                return type(a)(fix(x) for x in a)
            return a
        args, kwargs = fix(args), {k: fix(v) for k, v in kwargs.items()}
        if refused:
            self._forget(added)
            b = refused[0]
            return args, kwargs, f"reads {b.name} on {b.device} (the kernels run on {self.device})"
        return args, kwargs, added

    def on_device(self, b: Buffer, added: list):
        """What a kernel on the graph's device reads for buffer `b` on another device, or
        None; `added` gets the keys of the host reads set up for it."""
        if b.name in self.constants:
            return Buffer(self._moved_constant(b.name), b.shape, b.stride, b.dtype, self.device,
                          b.offset, b.is_view)
        if b.symbolic or any(n != 1 and s != 0 for n, s in zip(b.shape, b.stride)):
            return None
        key = (b.name, b.offset)
        got = self._host.get(key)
        if got is None:
            one = b if not b.shape and not b.is_view else \
                Buffer(b.name, (), (), b.dtype, b.device, b.offset, is_view=True)
            name = self.name("host")
            if b.device.type == "cpu" and b.dtype in _FLOATS:
                # (floats only: Triton specializes int arguments on their value)
                e = Extern(name, aten._local_scalar_dense.default, (one,), {}, None)
                got = HostScalar(name, (), b.dtype)
            else:
                e = Extern(name, aten._to_copy.default, (one,),
                           {"device": self.device, "non_blocking": True},
                           Buffer(name, (), (), b.dtype, self.device))
                got = e.outputs
            self.items.insert(self._host_position(b.name), e)
            self._host[key] = got
            added.append(key)
            self.off_device = True
        if isinstance(got, HostScalar):
            return HostScalar(got.name, b.shape, b.dtype)
        return Buffer(got.name, b.shape, (0,) * len(b.shape), b.dtype, self.device,
                      is_view=bool(b.shape))

    def _host_position(self, name) -> int:
        """Where in program order a host read of buffer `name` goes: as early as its value
        exists, so that it splits no group of kernels that could fuse.  (Inserting shifts
        later items; their `order`s keep their relative order, which is all they serve.)"""
        if name in self.inputs:
            return 0
        for i, item in enumerate(self.items):
            if isinstance(item, Extern) and name.startswith(item.name) and name in _names(item.outputs):
                return i + 1
        return len(self.items)

    def _moved_constant(self, name) -> str:
        moved = f"{name}_{self.device.type}"
        if moved not in self.constants:
            t = self.constants[name]
            # the memory it spans, moved whole: views of it keep their strides and offsets
            span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n) if t.numel() else 0
            with unset_fake_temporarily():  # (lowering runs under AOTAutograd's fake mode)
                flat = t.as_strided((span,), (1,), t.storage_offset()).to(self.device)
                self.constants[moved] = flat.as_strided(t.shape, t.stride(), 0)
        return moved

    def _forget(self, added):
        """Drop the host reads set up for an op that stays aten after all."""
        for key in added or ():
            got = self._host.pop(key)
            self.items[:] = [i for i in self.items if not (isinstance(i, Extern) and i.name == got.name)]


def _one(v) -> bool:
    shape = getattr(v, "shape", None)
    return shape is not None and all(n == 1 for n in shape)


def _feeds_kernels(node, device, depth=0) -> bool:
    """Whether every user of `node` is an op on `device`, or a functional op making one
    element on another device whose users are (a few levels at most)."""
    for u in node.users:
        val = u.meta.get("val")
        if device_of(val) == device:
            continue
        if depth >= 8 or not isinstance(val, torch.Tensor) or val.numel() != 1 or \
                getattr(getattr(u.target, "_schema", None), "is_mutable", True) or \
                not _feeds_kernels(u, device, depth + 1):
            return False
    return True


def _names(outputs):
    if isinstance(outputs, Buffer):
        yield outputs.name
    elif isinstance(outputs, (list, tuple)):
        for o in outputs:
            yield from _names(o)


def _flat(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _flat(v)
    elif isinstance(x, dict):
        yield from _flat(list(x.values()))
    else:
        yield x
