"""The cut scorer's features (core/cut_features.py): one row per allowed end from the base model's first layers, long
texts in pieces, the cache, and one prefill for the rows of several layer counts. On the tiny random Llamas of
tests/training/conftest.py (2 layers, hidden size 32 and 48)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memreader.core.cut_features import (
    CutFeatures,
    CutScorerError,
    cache_layer_counts,
    cached_rows,
    model_signature,
)
from memreader.core.memory_grammar import sentence_ends

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Sentences of two topics, for the feature tests.
BAKERY = ["The baker kneads the dough before dawn.", "Fresh bread cools on the wooden rack.",
          "Flour and yeast fill the warm kitchen.", "She slices the crusty loaf for breakfast.",
          "Butter melts on the toasted rye.", "The oven hums beside the sourdough starter.",
          "Sugar dusts the cinnamon buns.", "A croissant flakes onto the plate."]
SKY = ["Distant galaxies drift through the dark void.", "Astronomers measure the redshift of quasars.",
       "A telescope tracks the orbiting comet.", "Nebulae glow with ionized hydrogen gas.",
       "Neutron stars spin hundreds of times per second.", "The planet's moons cross its rings.",
       "Cosmic rays strike the upper atmosphere.", "A supernova outshines its whole galaxy."]


@pytest.mark.integration
def test_model_signature_is_the_configs_shape(tiny_llamas: dict[int, str]) -> None:
    from transformers import AutoConfig

    signature = model_signature(AutoConfig.from_pretrained(tiny_llamas[48]))
    assert signature == {"model_type": "llama", "hidden_size": 48, "num_hidden_layers": 2, "vocab_size": 49152,
                         "intermediate_size": 64, "num_attention_heads": 4}


@pytest.mark.integration
def test_features_give_one_row_per_allowed_end(features: CutFeatures) -> None:
    assert features.layers == 1 and len(features.model.layers) == 1  # only the first layers run
    assert features.signature["num_hidden_layers"] == 2  # the signature is the full model's
    assert features.dim() == 3 * 32 + 2
    text = "The baker kneads the dough. Fresh bread cools.\n\nGalaxies drift through the void. Comets pass by."
    ends, rows = features.of(text)
    assert ends == sentence_ends(text) and len(ends) >= 3
    assert rows.shape == (len(ends), 98) and rows.dtype == np.float32 and np.isfinite(rows).all()
    paragraph = [e for e in ends if "\n" in text[max(0, e - 4):e]]
    assert paragraph and rows[:, -1].tolist() == [1.0 if e in paragraph else 0.0 for e in ends]
    cos = rows[:, -2]
    assert ((-1.001 <= cos) & (cos <= 1.001)).all()
    np.testing.assert_allclose(rows[:, 64:96], np.abs(rows[:, :32] - rows[:, 32:64]), rtol=1e-6)
    assert features.of(text, ends=[ends[0]])[1].shape == (1, 98)
    assert features.of("no sentence end here")[1].shape == (0, 98)


@pytest.mark.integration
def test_a_long_text_is_read_in_overlapping_pieces(features: CutFeatures) -> None:
    import dataclasses

    import torch

    text = " ".join(BAKERY + SKY)
    whole, starts = features.hidden(text)
    small = dataclasses.replace(features, max_tokens=16, overlap=4)  # pieces of 16 tokens, 12 new ones each
    pieced, starts_again = small.hidden(text)
    n = len(starts)
    assert n > 40 and starts == starts_again and whole.shape == pieced.shape == (n, 32)
    assert (np.abs(pieced).sum(1) > 0).all()  # every token got its state
    # the first piece has all of its left context: as in one pass
    np.testing.assert_allclose(pieced[:12], whole[:12], atol=1e-4)
    # the second piece keeps tokens [12, 24), read from token 8 on
    ids = features.tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        direct = features.model(input_ids=torch.tensor([ids[8:24]])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(pieced[12:24], direct[4:], atol=1e-4)
    assert not np.allclose(pieced[12:24], whole[12:24], atol=1e-4)  # less left context than the single pass
    ends, rows = small.of(text)
    assert ends == sentence_ends(text) and rows.shape == (len(ends), 98)


@pytest.mark.integration
def test_layers_out_of_range_are_refused(tiny_llamas: dict[int, str]) -> None:
    for layers in (0, 3):
        with pytest.raises(CutScorerError, match=f"cut features from layer {layers}, but .* has 2 decoder layers "
                                                 ".*set cut_layers between 1 and 2"):
            CutFeatures.load(tiny_llamas[32], layers=layers)


@pytest.mark.integration
def test_cached_rows_are_read_back_instead_of_computed(features: CutFeatures, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    text = "The baker kneads the dough. Fresh bread cools. Galaxies drift through the void. Comets pass."
    ends, rows = cached_rows(features, text, tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def refuse(*args: Any, **kw: Any) -> None:
        raise AssertionError("computed again")

    monkeypatch.setattr(CutFeatures, "hidden", refuse)  # no second prefill
    again_ends, again_rows = cached_rows(features, text, tmp_path)
    assert again_ends == ends and all(isinstance(e, int) for e in again_ends)
    np.testing.assert_array_equal(again_rows, rows)
    monkeypatch.undo()
    other = CutFeatures(features.model, features.tokenizer, features.name, features.signature, features.layers,
                        window=4)
    cached_rows(other, text, tmp_path)  # other settings: another file
    assert len(list(tmp_path.glob("*.npz"))) == 2
    cached_rows(replace(features, dtype="bfloat16"), text, tmp_path)  # bf16 rows never stand in for fp32 ones
    assert len(list(tmp_path.glob("*.npz"))) == 3


@pytest.mark.integration
def test_one_prefill_caches_the_rows_each_layer_count_would_compute(tiny_llamas: dict[int, str], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    text = " ".join(BAKERY[:5] + SKY[:5])
    deep = replace(CutFeatures.load(tiny_llamas[32], layers=2, max_tokens=16), overlap=4)  # in pieces, too
    shallow = replace(CutFeatures.load(tiny_llamas[32], layers=1, max_tokens=16), overlap=4)
    own = {n: f.of(text) for n, f in ((1, shallow), (2, deep))}  # each count's own prefill
    assert not np.allclose(own[1][1], own[2][1])  # the counts give other rows
    assert cache_layer_counts(deep, text, tmp_path, [1, 2]) == [1, 2]
    assert cache_layer_counts(deep, text, tmp_path, [1, 2]) == []  # already there: no prefill
    monkeypatch.setattr(CutFeatures, "hidden", lambda *a, **k: pytest.fail("computed again"))
    for n, f in ((1, shallow), (2, deep)):
        ends, rows = cached_rows(f, text, tmp_path)  # read under the key of a count's own features
        assert ends == own[n][0]
        np.testing.assert_allclose(rows, own[n][1], atol=1e-5)
    monkeypatch.undo()
    assert cache_layer_counts(deep, "no sentence end here", tmp_path, [1]) == [1]
    assert cached_rows(shallow, "no sentence end here", tmp_path)[1].shape == (0, 98)
    with pytest.raises(CutScorerError, match=r"layers \[3\] asked of features with 2 layers.*between 1 and 2"):
        deep.hidden_at(text, [3])
