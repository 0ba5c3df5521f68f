"""The optimized module wrapper follows the original's training flag; nn.Module's
parameter, buffer, module and children iterators follow their arguments (prefix,
recurse, remove_duplicate), and what recurse=False does not walk is not guarded."""
import torch

import frametrace
from differential import check

# -- the optimized module wrapper --
def test_optimized_module_follows_the_original_training_flag():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    cnt = frametrace.testing.CompileCounter()
    om = frametrace.optimize(backend=cnt)(m)
    x = torch.randn(8, 4)
    torch.manual_seed(1)
    want = m(x)
    torch.manual_seed(1)
    assert torch.equal(om(x), want) and om.training
    m.eval()
    assert om.training is False and not om.state_dict().keys() - m.state_dict().keys()
    assert torch.equal(om(x), m(x)) and cnt.frame_count == 2     # recompiled: dropout off
    om.train()
    assert m.training and m[1].training and om.training
    om.eval()
    assert not m.training and not m[1].training and not om.training
    torch.manual_seed(2)
    assert torch.equal(om(x), m(x)) and cnt.frame_count == 2


class _Tree(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 2)
        self.b = torch.nn.Sequential(torch.nn.Linear(2, 2))
        self.register_buffer("buf", torch.ones(2))
        self.c = self.a             # shared: removed as a duplicate unless asked not to

    def forward(self, x):
        names = [n for n, _ in self.named_parameters(prefix="foo")]
        names += [n for n, _ in self.named_parameters(recurse=False)]
        names += [n for n, _ in self.named_parameters(remove_duplicate=False)]
        names += [n for n, _ in self.named_buffers(prefix="bb", recurse=True)]
        names += [n for n, _ in self.named_modules(prefix="mm")]
        names += [n for n, _ in self.named_modules(remove_duplicate=False)]
        names += [n for n, _ in self.named_children()]
        names.append(len(list(self.parameters(recurse=False))))
        names.append(len(list(self.children())))
        first = next(self.parameters())
        total = sum(p.sum() for _, p in self.named_parameters(prefix="p", remove_duplicate=False))
        return x + first.sum() + total, names


def test_module_iterators_follow_their_arguments():
    m = _Tree()
    check(m.forward, [torch.ones(2)], graphs=1, breaks=0,
          compiled=lambda cnt: frametrace.optimize(backend=cnt)(m))


def test_parameters_without_recursion_guard_only_the_module_own_parameters():
    def f(m, x):
        total = x
        for p in m.parameters(recurse=False):
            total = total + p.sum()
        return total, [n for n, _ in m.named_buffers(recurse=False)]

    def g(m, x):
        return sum(p.sum() for p in m.parameters()) + x

    m = torch.nn.Linear(2, 2)
    m.inner = torch.nn.Linear(2, 2)
    x = torch.ones(2)
    counter = frametrace.testing.CompileCounter()
    cf, cg = frametrace.optimize(backend=counter)(f), frametrace.optimize(backend=counter)(g)
    cf(m, x), cg(m, x)
    m.inner.more = torch.nn.Linear(2, 2)      # what recurse=False does not walk changed
    m.other = torch.nn.ReLU()
    for compiled, fn in ((cf, f), (cg, g)):
        got, want = compiled(m, x), fn(m, x)
        assert str(got) == str(want)
    assert counter.frame_count == 3           # f once; g again (its walk changed)
