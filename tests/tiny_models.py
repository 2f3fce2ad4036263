"""Tiny models built offline for tests: a word-level BERT tokenizer over a test's own texts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def word_tokenizer(texts: Iterable[str], model_max_length: int) -> Any:
    """A BERT-style fast tokenizer (``[CLS] a [SEP] b [SEP]`` pairs) whose vocabulary is the five special tokens and
    the words of ``texts``, lower-cased, ``.,;?`` stripped; ``len(tokenizer)`` is the vocabulary's size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({w.strip(".,;?").lower() for text in texts for w in text.split()})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=model_max_length)
