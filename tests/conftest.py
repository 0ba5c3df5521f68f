import pytest
import torch

import frametrace


@pytest.fixture(autouse=True)
def _fresh_frametrace():
    frametrace.reset()
    limit = frametrace.config.cache_size_limit
    torch.manual_seed(0)
    yield
    frametrace.config.cache_size_limit = limit
    frametrace.reset()


@pytest.fixture
def cnt():
    return frametrace.testing.CompileCounter()


def compile_with(cnt, fn, **kwargs):
    return frametrace.optimize(backend=cnt, **kwargs)(fn)
