"""frametrace and torch.compile in one program, both ways round.

    python examples/torch_compile_interop.py

Each compiler leaves the other's frames alone: a torch.compile'd function that a
frametrace function calls runs under torch.compile (a graph break on our side), a
frametrace function that torch.compile'd code calls runs under frametrace (a graph
break on its side), and torch's markers (torch.compiler.disable, mark_dynamic) mean the
same to both.  Nothing is printed but the lines below.
"""
import torch

import frametrace


def block(x):
    return torch.nn.functional.gelu(x) * 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.compile(torch.nn.Linear(16, 16), backend="eager")   # torch.compile'd part
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.inner(x).relu())


@torch.compiler.disable
def log_norm(x):                     # neither compiler traces this, nor what it calls
    return x.norm().item()


def main():
    torch.manual_seed(0)
    x = torch.randn(8, 16)

    # 1. a frametrace function calling a torch.compile'd one
    fast_block = torch.compile(block, backend="eager")
    def around(t):
        return fast_block(t + 1) - 1
    f = frametrace.optimize(around)
    assert torch.allclose(f(x), block(x + 1) - 1)

    # 2. a module holding a torch.compile'd submodule, under frametrace
    net = Net()
    model = frametrace.optimize(net, backend="aot_eager")
    assert torch.allclose(model(x), net(x))

    # 3. torch.compile around a frametrace function, and frametrace around torch.compile
    g = torch.compile(frametrace.optimize(block), backend="eager")
    h = frametrace.optimize(torch.compile(block, backend="eager"))
    assert torch.allclose(g(x), block(x)) and torch.allclose(h(x), block(x))

    # 4. torch.compile'd code calling a frametrace function
    ours = frametrace.optimize(block)
    outer = torch.compile(lambda t: ours(t * 3).sum(), backend="eager")
    assert torch.allclose(outer(x), block(x * 3).sum())

    # 5. torch's markers: disable, mark_dynamic
    k = frametrace.optimize(lambda t: t.cos() * log_norm(t))
    assert torch.allclose(k(x), x.cos() * x.norm().item())
    seq = torch.randn(5, 3)
    torch._dynamo.mark_dynamic(seq, 0)           # torch's marker, read by frametrace
    report = frametrace.explain(lambda t: t.sum(0) * t.shape[0])(seq)
    print(f"mark_dynamic: {report.graph_count} graph, symbolic size: "
          f"{'sym_size' in report.graphs[0].code}")
    report = frametrace.explain(around)(x)
    print(f"around a torch.compile'd call: {report.graph_count} graphs, "
          f"{report.graph_break_count} break ({report.break_reasons[0].reason})")
    print("all values equal under both compilers")


if __name__ == "__main__":
    main()
