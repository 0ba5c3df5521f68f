"""Which ops' FakeTensor strides are not the kernel's: a script, not a test.

For every OpInfo of torch's op_db (first samples, float32 or int64), the sample's input
is given contiguous, transposed, sliced, expanded and channels-last (1-d and 2-d), and
the op runs on it for real (CPU) and under FakeTensorMode; an op whose result's sizes
and strides differ is printed with one example, and whether a meta-tensor replay would
have got the kernel's strides.  frametrace/variables/tensor_layout.py's UNTRUSTED lists
what this finds (torch 2.13: no differences on contiguous, non-empty inputs).

    OMP_NUM_THREADS=1 python tests/layout_sweep.py [op names...]
"""
import sys
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map


def variants(t):
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.layout != torch.strided:
        return {}
    out = {"contiguous": t.contiguous(),
           "transposed": t.transpose(0, 1).contiguous().transpose(0, 1),
           "transposed_last": t.transpose(-1, -2).contiguous().transpose(-1, -2),
           "sliced": torch.cat([t, t], -1)[..., ::2]}
    if t.shape[0] > 0:
        out["expanded"] = t[:1].expand(t.shape)
    if t.dim() == 4:
        out["channels_last"] = t.contiguous(memory_format=torch.channels_last)
    if t.dim() == 3:
        out["channels_last_1d"] = t.permute(0, 2, 1).contiguous().permute(0, 2, 1)
    return out


def geometry(x):
    return [(tuple(t.shape), tuple(t.stride())) for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def sweep(names=(), samples_per_op=12):
    from torch.testing._internal.common_methods_invocations import op_db
    found = {}
    for op in op_db:
        if names and op.name not in names:
            continue
        dtype = torch.float32 if torch.float32 in op.dtypes else torch.int64 if torch.int64 in op.dtypes else None
        if dtype is None:
            continue
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:samples_per_op]
        except Exception:
            continue
        for s in samples:
            for kind, inp in variants(s.input).items():
                try:
                    real = op(inp, *s.args, **s.kwargs)
                except Exception:
                    continue
                mode = FakeTensorMode()
                conv = lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                try:
                    with mode:
                        fake = op(conv(inp), *tree_map(conv, s.args), **tree_map(conv, s.kwargs))
                except Exception:
                    continue
                meta_of = lambda x: torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta") \
                    if isinstance(x, torch.Tensor) else x
                try:
                    meta = geometry(op(meta_of(inp), *tree_map(meta_of, s.args), **tree_map(meta_of, s.kwargs)))
                except Exception:
                    meta = None
                want, got = geometry(real), geometry(fake)
                if want != got:
                    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
                    found.setdefault(name, []).append((kind, want[:2], got[:2], meta == want))
    return found


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    for name, cases in sweep(sys.argv[1:]).items():
        kind, want, got, meta_right = cases[0]
        print(f"{name}: {len(cases)} cases; {kind}: kernel {want}, fake {got}; "
              f"meta replay {'right' if meta_right else 'as wrong'}")
