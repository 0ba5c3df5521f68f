"""Graph breaks, seen from the user's side: a small model that prints and branches on a
tensor's value.  Shows the break report (explain) and the bytecode diff viewer (show).

    python examples/graph_breaks.py
    python -m frametrace diff examples/graph_breaks.py --fn forward
"""
import torch

import frametrace


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.proj(x))
        print("activation mean:", round(h.mean().item(), 3))   # graph break: .item()
        if h.sum() > 0:                                        # graph break: a tensor's value
            h = h * 2
        return h.softmax(dim=-1)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Gate().eval()
    x = torch.randn(4, 8)
    report = frametrace.explain(model)(x)
    print(report)
    compiled = frametrace.optimize(model)
    torch.testing.assert_close(compiled(x), model(x))
    frametrace.show(compiled)
