"""Ints and floats read from objects the frame was passed (a config's `max_len`, a
`scale`) are constants at first and symbolic once they change between calls, as
torch.compile's automatic dynamic has them: the first value compiles, the second
recompiles with a symbol, the third reuses that graph.  Sizes 0 and 1 and values a
constant is needed for keep specializing (guarded); ints of nn.Modules do until they
have changed twice (a counter)."""
import pytest
import torch
import torch.nn as nn

from differential import check


class Config:
    def __init__(self, max_len=4, scale=1.0, depth=2):
        self.max_len = max_len
        self.scale = scale
        self.depth = depth


def test_int_attribute_of_a_config_becomes_symbolic_after_it_changes():
    def f(x, cfg):
        return x[:cfg.max_len] + cfg.max_len

    r = check(f, [(torch.randn(10), Config(max_len=n)) for n in (3, 4, 5, 6, 7)],
              breaks=0, fullgraph=True)
    assert r.compiles == 2, r


def test_float_attribute_of_a_config_becomes_symbolic_after_it_changes():
    def f(x, cfg):
        return x * cfg.scale

    r = check(f, [(torch.randn(3), Config(scale=s)) for s in (0.5, 1.5, 2.5, -3.25)],
              breaks=0, fullgraph=True)
    assert r.compiles == 2, r


def test_numbers_read_through_an_object_held_by_self():
    class Block:
        def __init__(self, cfg):
            self.config = cfg

        def run(self, x):
            return x.view(self.config.max_len, -1).sum(0) * self.config.scale

    def f(block, x):
        return block.run(x)

    r = check(f, [(Block(Config(max_len=n, scale=n / 2)), torch.randn(12)) for n in (2, 3, 4, 6)],
              breaks=0, fullgraph=True)
    assert r.compiles == 2, r


def test_sizes_zero_and_one_stay_specialized():
    def f(x, cfg):
        return torch.zeros(cfg.max_len, 2) + x

    r = check(f, [(torch.randn(2), Config(max_len=n)) for n in (3, 4, 5, 1, 0, 6)],
              breaks=0, fullgraph=True)
    assert r.compiles == 4, r


def test_a_symbolic_int_that_decides_a_branch_is_guarded():
    def f(x, cfg):
        if cfg.max_len > 4:
            return x * 2
        return x - 1

    r = check(f, [(torch.randn(3), Config(max_len=n)) for n in (2, 3, 6, 7, 3)], breaks=0)
    assert r.compiles <= 3, r


def test_a_symbolic_int_that_counts_a_loop_is_guarded():
    def f(x, cfg):
        for _ in range(cfg.depth):
            x = x * 2
        return x

    check(f, [(torch.randn(3), Config(depth=n)) for n in (2, 3, 4, 3, 2)], breaks=0)


def test_an_attribute_the_frame_increments():
    def f(x, cfg):
        cfg.max_len += 1
        return x * cfg.max_len

    r = check(f, [(torch.randn(3), Config(max_len=n)) for n in (3, 5, 7, 9)], breaks=0)
    assert r.compiles == 2, r


def test_ints_of_modules_stay_specialized():
    class Crop(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n = n

        def forward(self, x):
            return x[:self.n]

    r = check(lambda m, x: m(x), [(Crop(n), torch.randn(8)) for n in (2, 3, 4)], breaks=0)
    assert r.compiles == 3, r


class _Counting(nn.Module):
    """A step counter in forward, read as a number and as a size."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.step = 0
        self.warmup = 3

    def forward(self, x):
        self.step += 1
        ramp = min(1.0, self.step / self.warmup)
        return self.lin(x) * self.step + ramp, torch.full((2,), self.step), x.new_ones(self.step).sum()


def _count_loop(backend, steps=12):
    import copy
    import frametrace
    torch.manual_seed(0)
    model = _Counting()
    reference = copy.deepcopy(model)
    counter = frametrace.testing.CompileCounter(inner=backend)
    compiled = frametrace.optimize(model, backend=counter)
    for i in range(steps):
        x = torch.randn(2, 4)
        for got, want in zip(compiled(x), reference(x)):
            torch.testing.assert_close(got, want, msg=f"step {i}")
    assert model.step == reference.step == steps
    return counter.frame_count



@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_modules_counter_becomes_symbolic_after_it_changes_twice(backend):
    # The first value compiles, the second recompiles with the constant (a module's
    # ints are sizes until they change again), the third with a symbol that the rest
    # of the loop reuses: three compiles in twelve steps, never the cache limit.
    assert _count_loop(backend) == 3


def test_module_counters_switch_off(monkeypatch):
    import warnings
    import frametrace
    monkeypatch.setattr(frametrace.config, "dynamic_module_counters", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # (the cache-limit warning)
        assert _count_loop("eager", steps=10) == frametrace.config.cache_size_limit
