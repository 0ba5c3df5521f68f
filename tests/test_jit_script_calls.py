"""Calling a torch.jit.script function from a compiled frame: its Python original is
traced into the graph (Hugging Face's DeBERTa scales attention with one)."""
import torch

from differential import check


@torch.jit.script
def scaled_size_sqrt(query: torch.Tensor, scale_factor: int) -> torch.Tensor:
    return torch.sqrt(torch.tensor(query.size(-1), dtype=torch.float) * scale_factor)


def attention_scale(q, k):
    scale = scaled_size_sqrt(q, 2)
    return (q @ k.transpose(-1, -2)) / scale.to(q.dtype)


def test_script_function_is_traced_through_its_python_original():
    inputs = [(torch.randn(2, 4, 8), torch.randn(2, 4, 8)), (torch.randn(2, 4, 8), torch.randn(2, 4, 8))]
    check(attention_scale, inputs, fullgraph=True, graphs=1, breaks=0)
