"""TokenCounter: the private Rust copy counts exactly what the transformers tokenizer counts, remembers passages,
and stays exact while another thread uses the tokenizer itself (which re-configures its backend on every call)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from memreader.retrieval.token_counter import TokenCounter

pytestmark = pytest.mark.integration

TEXTS = [
    "Green tea is brewed at about 80 degrees Celsius; boiling water makes it bitter.",
    "Arthur's Magazine (1844–1846) was an American literary periodical.\n\nFirst for Women is a woman's magazine.",
    "  leading spaces, trailing spaces   ",
    "line one\nline two\r\nline three\n\n\n",
    "数字 12345 和中文：长江是中国最长的河流。",
    "emoji 🍵 and <|im_start|> written as text, 3.14159, e-mail a.b@c.de",
    "",
    "x" * 3000,
]


def _reference(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_counts_equal_the_tokenizers_own(smollm2_tokenizer: Any) -> None:
    counter = TokenCounter(smollm2_tokenizer)
    assert counter.key is not None  # counted through the private Rust backend
    joined = "\n\n".join(TEXTS)
    for text in [*TEXTS, joined]:
        assert counter.count(text) == _reference(smollm2_tokenizer, text), repr(text[:40])
    assert counter.counts(TEXTS) == [_reference(smollm2_tokenizer, t) for t in TEXTS]


def test_counts_are_remembered_per_tokenizer(smollm2_tokenizer: Any) -> None:
    first, second = TokenCounter(smollm2_tokenizer), TokenCounter(smollm2_tokenizer)
    assert first._backend is second._backend  # the private copy is made once per tokenizer (it parses the whole vocabulary)
    text = "a passage counted once, by whichever counter of this tokenizer meets it first"
    assert first.counts([text, text]) == [_reference(smollm2_tokenizer, text)] * 2
    second._lengths = None  # type: ignore[assignment]  # a second tokenisation would now fail
    assert second.counts([text]) == first.counts([text])


def test_counting_beside_the_tokenizers_own_calls_stays_exact(smollm2_tokenizer: Any) -> None:
    counter = TokenCounter(smollm2_tokenizer)
    expected = [_reference(smollm2_tokenizer, t) for t in TEXTS]
    errors: list[BaseException] = []
    stop = threading.Event()

    def truncating() -> None:  # what a verifier does with the same tokenizer: truncate to a few tokens
        try:
            while not stop.is_set():
                out = smollm2_tokenizer(TEXTS, add_special_tokens=False, truncation=True, max_length=4)
                assert all(len(ids) <= 4 for ids in out["input_ids"])
        except BaseException as exc:  # noqa: BLE001  # re-raised in the main thread below
            errors.append(exc)

    worker = threading.Thread(target=truncating)
    worker.start()
    try:
        for _ in range(200):
            assert [counter.count(t) for t in TEXTS] == expected
    finally:
        stop.set()
        worker.join()
    assert not errors, errors


class _SlowTokenizer:
    """A tokenizer without a Rust backend: one token per whitespace-separated word."""

    name_or_path = "slow-words"

    def __call__(self, texts: Any, add_special_tokens: bool = True) -> dict[str, Any]:
        assert add_special_tokens is False
        single = isinstance(texts, str)
        ids = [list(range(len(t.split()))) for t in ([texts] if single else texts)]
        return {"input_ids": ids[0] if single else ids}


def test_a_slow_tokenizer_is_called_as_it_is() -> None:
    counter = TokenCounter(_SlowTokenizer())
    assert counter.key is None and counter.name == "slow-words"
    assert counter.count("three short words") == 3
    assert counter.counts(["a b", "c", "a b"]) == [2, 1, 2]


SHARED = __import__("pathlib").Path(__file__).resolve().parents[3] / "shared" / "datasets"
EDGES = ["Ends with a full stop.", "Ends with a comma,", "ends with 's", "'s starts with a contraction", "12,345",
         "…ellipsis…", "«quoted»", "code: x = y;", "URL http://a.b/c?d=e", "emoji 🍵🍵", "<|im_end|>", "-- dashes --",
         "长江是中国最长的河流。", "Mixed 中文 and English!", "tab\tinside", "a", "?", "Line one\nline two"]


def test_a_join_counts_as_the_sum_of_its_parts_where_proven(smollm2_tokenizer: Any) -> None:
    import random

    counter = TokenCounter(smollm2_tokenizer)
    sep = "\n\n"
    between = counter.count("a" + sep + "b") - 2
    texts = list(EDGES)
    if (SHARED / "hotpotqa_100_corpus.json").is_file():  # real passages of both languages, where present
        from memreader.eval.support_corpora import load_support_corpus

        for name in ("hotpotqa", "cmrc2018"):
            texts += [t for _, _, t in load_support_corpus(name, SHARED).passages[:150]]
    rng = random.Random(7)
    checked = eligible = 0
    for _ in range(400):
        parts = rng.sample(texts, rng.randint(1, 6))
        eligible += all(p.strip() == p and p and "<|" not in p for p in parts)
        got = counter.join_count(parts, counter.counts(parts), sep, between)
        if got is not None:
            checked += 1
            assert got == _reference(smollm2_tokenizer, sep.join(parts)), [p[:30] for p in parts]
    assert checked == eligible >= 40  # summed wherever the parts allow it (the real passages, when present, always)
    for a in EDGES:  # every pair of the awkward ends, both ways round
        for b in EDGES:
            got = counter.join_count([a, b], counter.counts([a, b]), sep, between)
            assert got is None or got == _reference(smollm2_tokenizer, a + sep + b), (a, b)
    # where it is not proven, the caller counts the join
    assert counter.join_count(["ends with a space ", "b"], [5, 1], sep, between) is None
    assert counter.join_count(["a", "\nstarts with a newline"], [1, 5], sep, between) is None
    assert counter.join_count(["a", "b"], [1, 1], " | ", 3) is None  # a separator that is not whitespace
    assert counter.join_count(["", "b"], [0, 1], sep, between) is None


def test_a_pattern_that_glues_punctuation_to_newlines_is_not_summed() -> None:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(set("abc.\n ĊĠ")))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Sequence([  # Qwen2.5's pattern, in short: punctuation takes its newlines
        pre_tokenizers.Split(Regex(r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s+(?!\S)|\s+|\p{L}+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    counter = TokenCounter(PreTrainedTokenizerFast(tokenizer_object=backend))
    assert counter.key is not None and counter.join_count(["a.", "b"], [2, 1], "\n\n", 2) is None
