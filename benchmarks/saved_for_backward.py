"""What a training graph's forward saves for the backward: frametrace's partition
(backends/triton/partition.py) against AOTAutograd's min-cut partition on the same joint
graph (what Inductor partitions with), and optionally against Inductor's own partition
(its joint graph, after its decompositions and joint-graph passes), tensor by tensor.

    python benchmarks/saved_for_backward.py [--model resnet50] [--batch 64] [--image-size 224]
                                            [--precision autocast|fp32] [--channels-last]
                                            [--inductor] [--list]
    python benchmarks/saved_for_backward.py --smoke     # the small ResNet, on the CPU

The model is benchmarks/training.py's CNN with its loss (timm's resnet50, else
torchvision's; the small bottleneck ResNet with --smoke).  The forward runs once under
bf16 autocast (`--precision autocast`), on CUDA when there is one; the joint graph
AOTAutograd traces is given to both partitioners (copies of it), and the saved values
(the backward's inputs other than tangents) are summed by dtype and by the op that
computed them.  `--list` prints every saved value of each side."""
from __future__ import annotations

import argparse
import collections
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frametrace  # noqa: E402
from training import make_cnn  # noqa: E402


def saved_of(bw):
    return [n for n in bw.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]


def nbytes(val) -> int:
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def summary(name, vals: dict):
    """vals: node name -> (op, fake value).  Prints totals by dtype and by op."""
    by_dtype, by_op = collections.Counter(), collections.Counter()
    for op, v in vals.values():
        by_dtype[str(v.dtype).replace("torch.", "")] += nbytes(v)
        by_op[op] += nbytes(v)
    total = sum(by_dtype.values())
    print(f"== {name}: {len(vals)} saved values, {total / 2 ** 20:.2f} MiB")
    print("   by dtype: " + ", ".join(f"{k} {b / 2 ** 20:.2f}" for k, b in by_dtype.most_common()))
    print("   by op:    " + ", ".join(f"{k} {b / 2 ** 20:.2f}" for k, b in by_op.most_common(8)))
    return total


def op_of(node):
    return str(getattr(node.target, "__name__", node.target)).replace("aten.", "") if node.op != "placeholder" \
        else "input"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--precision", choices=("autocast", "fp32"), default="autocast")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--inductor", action="store_true", help="also Inductor's own partition (compiles the model)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch, args.image_size = 2, 32
    from torch._functorch import partitioners as P
    from torch._functorch.aot_autograd import aot_module_simplified
    from frametrace.backends.triton import partition as FP
    from frametrace.backends.triton.decompositions import decompositions
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model, classes = make_cnn(args.model, args.smoke)
    model = model.to(device)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
    y = torch.randint(0, classes, (args.batch,), device=device)
    if args.channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    sides = {}

    def capture(joint, joint_inputs, *, num_fwd_outputs, **kw):
        ours = copy.deepcopy(joint)
        fw, bw = FP.partition(ours, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        sides["frametrace"] = described(fw, bw)
        theirs = copy.deepcopy(joint)
        mfw, mbw = P.min_cut_rematerialization_partition(theirs, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        sides["min-cut"] = described(mfw, mbw)
        return fw, bw

    def described(fw, bw):
        """saved value's name -> (the op the forward computed it with, its value)."""
        made = {n.name: n for n in fw.graph.nodes}
        out = {}
        for n in saved_of(bw):
            src = made.get(n.name, n)
            val = n.meta.get("val") if isinstance(n.meta.get("val"), torch.Tensor) else src.meta.get("val")
            if isinstance(val, torch.Tensor):
                out[n.name] = (op_of(src), val)
        return out

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, e: g, bw_compiler=lambda g, e: g,
                                     partition_fn=capture, decompositions=decompositions())

    def run(fn):
        with torch.autocast(device.type, torch.bfloat16, enabled=args.precision == "autocast"):
            loss = fn(x, y)
        loss.backward()

    run(frametrace.optimize(backend=backend)(copy.deepcopy(model)))
    if args.inductor:
        import torch._inductor.compile_fx as cf   # (a benchmark's comparison, not frametrace's)
        original = cf.partition_fn

        def recorded(gm, joint_inputs, **kw):
            fw, bw = original(gm, joint_inputs, **kw)
            sides["inductor"] = described(fw, bw)
            return fw, bw
        cf.partition_fn = recorded
        try:
            run(torch.compile(copy.deepcopy(model)))
        finally:
            cf.partition_fn = original
    print(f"{args.model} batch {args.batch} x {args.image_size}, {args.precision}, {device}"
          f"{', channels-last' if args.channels_last else ''}")
    totals = {k: summary(k, v) for k, v in sides.items()}
    if "min-cut" in totals:
        print(f"frametrace / min-cut saved bytes: {totals['frametrace'] / totals['min-cut']:.3f}")
    if "inductor" in totals:
        print(f"frametrace / inductor saved bytes: {totals['frametrace'] / totals['inductor']:.3f}")
    ours, theirs = sides["frametrace"], sides["min-cut"]
    only = lambda a, b: sorted(set(a) - set(b), key=lambda n: -nbytes(a[n][1]))  # noqa: E731
    for title, a, b in (("saved by frametrace only", ours, theirs), ("saved by min-cut only", theirs, ours)):
        names = only(a, b)
        print(f"-- {title}: {len(names)}, {sum(nbytes(a[n][1]) for n in names) / 2 ** 20:.1f} MiB; largest: " +
              ", ".join(f"{n} ({a[n][0]}, {str(a[n][1].dtype)[6:]}{list(a[n][1].shape)})" for n in names[:6]))
    if args.list:
        for side, vals in sides.items():
            print(f"-- {side}")
            for n, (op, v) in vals.items():
                print(f"   {n:28s} {op:32s} {str(v.dtype)[6:]:9s} {list(v.shape)}  {nbytes(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
