"""Whole models end to end: torch.nn.Transformer (and its staticmethod reached through the
class or an instance) and a small Hugging Face BART, with and without its cache."""
import pytest
import torch

import frametrace
from differential import check

# -- graph targets FX can name --
def test_staticmethod_of_module_class_is_traced_through():
    def through_class(x):
        return x + torch.nn.Transformer.generate_square_subsequent_mask(x.shape[0])

    def through_instance(m, x):
        return x + m.generate_square_subsequent_mask(x.shape[0])
    check(through_class, [torch.ones(3, 3)], graphs=1, breaks=0)
    t = torch.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                             dim_feedforward=8)
    check(through_instance, [(t, torch.ones(4, 4))], graphs=1, breaks=0)
    explained = frametrace.explain(through_class)(torch.ones(3, 3))
    assert explained.graph_count == 1 and not explained.break_reasons


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_small_transformer_end_to_end(mode):
    torch.manual_seed(0)
    model = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=32)
    getattr(model, mode)()

    def run(m, src, tgt):
        mask = m.generate_square_subsequent_mask(tgt.shape[0])
        return m(src, tgt, tgt_mask=mask, tgt_is_causal=True)

    def detect_causal(m, src, tgt):
        # Without tgt_is_causal, nn.Transformer compares the mask's values: a graph break.
        return m(src, tgt, tgt_mask=m.generate_square_subsequent_mask(tgt.shape[0]))
    inputs = [(model, torch.randn(5, 2, 16), torch.randn(4, 2, 16))]
    check(run, inputs, graphs=1, breaks=0, rtol=1e-4, atol=1e-5)
    check(detect_causal, inputs, breaks=1, rtol=1e-4, atol=1e-5)


# -- Hugging Face BART (small config, eval mode) --
def _small_bart(cls_name):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BartConfig(
        vocab_size=100, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(cfg).eval()


@pytest.mark.parametrize("cls_name", ["BartModel", "BartForConditionalGeneration"])
def test_bart_without_cache_matches_eager(cls_name):
    model = _small_bart(cls_name)

    def run(ids):
        out = model(input_ids=ids, use_cache=False)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    check(run, [ids], graphs=1, breaks=0, rtol=1e-4, atol=1e-5)


def test_bart_with_cache_matches_eager():
    # A graph break inside BartAttention (the EncoderDecoderCache is opaque) used to end
    # the decoder's `for idx, layer in enumerate(self.layers)` loop after the first layer.
    model = _small_bart("BartForConditionalGeneration")

    def run(ids):
        return model(input_ids=ids).logits
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    check(run, [ids], rtol=1e-4, atol=1e-5)
