"""frametrace in one minute: compile a function and a module, see what was compiled.

    python examples/quickstart.py
"""
import torch

import frametrace

# A backend that counts graphs and ops, then runs them eagerly.
counter = frametrace.testing.CompileCounter()


@frametrace.optimize(backend=counter)
def f(x, y):
    return (x.sin() + y).relu() * 2


x, y = torch.randn(8), torch.randn(8)
out = f(x, y)                      # traced, compiled, cached
f(x, y)                            # guards hold: the cached code runs, no tracing
assert torch.allclose(out, (x.sin() + y).relu() * 2)
print(f"f: {counter.frame_count} graph, {counter.op_count} ops, after 2 calls")
print(counter.graphs[0].code.strip())

f(x.double(), y.double())          # a new dtype fails a guard: one recompile
print(f"after a float64 call: {counter.frame_count} graphs")

guard_fn = frametrace._C.entries(f.__wrapped__.__code__)[0].check
print("guards of the newest entry:")
for text in guard_fn.guard_set.texts():
    print("   ", text)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(16, 32) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(32, 4) * 0.1)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return torch.nn.functional.gelu(x @ self.w1) @ self.w2 * self.scale


model = MLP()
compiled = frametrace.optimize("aot_eager", fullgraph=True)(model)
inp = torch.randn(4, 16)
loss = compiled(inp).pow(2).sum()
loss.backward()                    # gradients flow through the AOTAutograd graphs
ref = MLP()
ref.load_state_dict(compiled.state_dict())   # state_dict passes through, no prefix
ref(inp).pow(2).sum().backward()
assert torch.allclose(model.w1.grad, ref.w1.grad, atol=1e-6)
print("module: aot_eager forward + backward match eager")
