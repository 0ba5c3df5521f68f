"""Hugging Face models built from small configs (random weights, no download) compile
into exactly one graph with fullgraph=True, match eager, and do not recompile."""
import pytest
import torch

import frametrace

transformers = pytest.importorskip("transformers")


def gpt2():
    return transformers.GPT2Model(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
        bos_token_id=0, eos_token_id=0))


def bert():
    return transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=100, max_position_embeddings=64))


def llama():
    return transformers.LlamaModel(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=100, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0))


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama}


def _compare(got, expected):
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state,
                               atol=1e-4, rtol=1e-4)
    if getattr(expected, "past_key_values", None) is not None:
        assert type(got.past_key_values) is type(expected.past_key_values)
        for g_layer, e_layer in zip(got.past_key_values.layers, expected.past_key_values.layers):
            torch.testing.assert_close(g_layer.keys, e_layer.keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(g_layer.values, e_layer.values, atol=1e-4, rtol=1e-4)
    if getattr(expected, "pooler_output", None) is not None:
        torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_model_compiles_to_one_graph(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    cnt = frametrace.testing.CompileCounter()
    compiled = frametrace.optimize(backend=cnt, fullgraph=True)(model)
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        got = compiled(ids)
        expected = model(ids)
        again = compiled(ids)
    assert type(got) is type(expected)
    _compare(got, expected)
    _compare(again, expected)
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs"
    assert cnt.op_count > 50


def compiled_model(name):
    """(model, its fullgraph-compiled wrapper, the CompileCounter), seeded."""
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    cnt = frametrace.testing.CompileCounter()
    return model, frametrace.optimize(backend=cnt, fullgraph=True)(model), cnt


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_model_without_cache_and_with_mask(name):
    model, compiled, cnt = compiled_model(name)
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        got = compiled(ids, attention_mask=mask, use_cache=False)
        expected = model(ids, attention_mask=mask, use_cache=False)
        compiled(ids, attention_mask=mask, use_cache=False)
    _compare(got, expected)
    assert got.past_key_values is None
    assert cnt.frame_count == 1


def test_config_is_left_as_cpython_leaves_it():
    model = gpt2().eval()
    before = dict(vars(model.config))
    compiled = frametrace.optimize(fullgraph=True)(model)
    with torch.no_grad():
        compiled(torch.randint(0, 100, (1, 8)))
    assert dict(vars(model.config)) == before


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_five_sequence_lengths_compile_at_most_twice(name):
    model, compiled, cnt = compiled_model(name)
    for seq in (8, 13, 16, 27, 40):
        ids = torch.randint(0, 100, (2, seq))
        with torch.no_grad():
            got = compiled(ids)
            expected = model(ids)
        _compare(got, expected)
    # static for the first length, then one graph with a symbolic sequence length
    assert cnt.frame_count == 2, f"{cnt.frame_count} graphs"
    placeholder = next(n for n in cnt.graphs[1].graph.nodes if n.op == "placeholder")
    assert isinstance(placeholder.meta["example_value"].shape[1], torch.SymInt)
