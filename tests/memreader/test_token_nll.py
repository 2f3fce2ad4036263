"""The one transformers token NLL (``memreader.core.scoring_engines.TokenNLL``) equals the plain computation: one
unpadded full forward per sequence, log-softmax of the model's own fp32 logits, read at each position.

The models are tiny random ones built from configs: Llama (plain head), Gemma2 (``final_logit_softcapping``)
and Cohere (``logit_scale``), so the soft-cap and the logit scale are checked against the model's own forward.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from memreader.core.scoring_engines import TokenNLL, sigmoid

VOCAB = 97
SEQUENCES = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 50], [7, 7, 19], [90, 1, 45, 23, 8, 66, 12], [4, 30]]


def _model(kind: str):
    import transformers as tf

    config_class, model_class, extra = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, {"final_logit_softcapping": 1.5, "head_dim": 8}),
        "cohere": (tf.CohereConfig, tf.CohereForCausalLM, {"logit_scale": 2.5}),
    }[kind]
    config = config_class(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          initializer_range=0.4, pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(0)
    return model_class(config).eval()


def _reference(model, seq: list[int], positions: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([seq])).logits[0].float().log_softmax(-1)
    return [-logp[p - 1, t].item() for p, t in zip(positions, tokens, strict=True)]


@pytest.mark.parametrize("kind", ["llama", "gemma2", "cohere"])
def test_token_nll_equals_one_plain_forward_per_sequence(kind: str) -> None:
    model = _model(kind)
    tokenizer = SimpleNamespace(pad_token_id=None, eos_token_id=2)
    # each sequence's own tokens at scattered positions, one sequence with nothing to score, and given tokens up to
    # the position just past a sequence (the NLL of a token that would follow it)
    positions = [[1, 4, 5, 11], [], [2, 3, 4, 5, 6, 7], [1, 2]]
    tokens = [[seq[p] if p < len(seq) else 13 for p in pos] for seq, pos in zip(SEQUENCES, positions, strict=True)]
    scorer = TokenNLL(model, tokenizer, batch_size=2, slice_tokens=3)
    got = scorer.nlls(SEQUENCES, positions, tokens)
    for seq, pos, tok, values in zip(SEQUENCES, positions, tokens, got, strict=True):
        assert values.dtype == np.float64 and len(values) == len(pos)
        assert values.tolist() == pytest.approx(_reference(model, seq, pos, tok), abs=1e-4)
    assert scorer.batches == 2 and scorer.tokens_processed == 12 + 7 + 2  # the empty one never ran
    assert scorer.padded_tokens == 2 * 12 + 2 and scorer.max_width == 12
    own = TokenNLL(model, tokenizer, max_batch_tokens=10_000).nlls(SEQUENCES, [range(1, len(s)) for s in SEQUENCES])
    for seq, values in zip(SEQUENCES, own, strict=True):
        assert values.tolist() == pytest.approx(_reference(model, seq, list(range(1, len(seq))), seq[1:]), abs=1e-4)
    if kind != "llama":  # the scale / soft-cap changes these numbers: the check above saw them applied
        scorer.softcap = scorer.logit_scale = None
        assert not np.allclose(scorer.nlls(SEQUENCES, positions, tokens)[0], got[0], atol=1e-2)
    with pytest.raises(ValueError, match=r"sequence 1: scored positions 1\.\.3 are outside 1\.\.2"):
        scorer.nlls(SEQUENCES, [[1], [1, 3], [1], [1]])
    with pytest.raises(ValueError, match="batch_size=0"):
        TokenNLL(model, tokenizer, batch_size=0)


def test_sigmoid_is_the_logistic_function_without_overflow() -> None:
    assert sigmoid(0.0) == 0.5
    assert sigmoid(2.0) == pytest.approx(1 / (1 + math.exp(-2.0))) and sigmoid(-2.0) == pytest.approx(1 - sigmoid(2.0))
    assert sigmoid(1000.0) == 1.0 and sigmoid(-1000.0) == 0.0
