"""Pre-flight: JSONL validation, token-length statistics, refuse / drop of examples longer than max_length."""

from __future__ import annotations

import json
import logging

import pytest

from memreader.training.preflight import (
    DataFormatError,
    PreflightError,
    check_lengths,
    length_stats,
    load_sft_records,
    measure,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _long(record: dict, rid: str, repeat: int = 120) -> dict:
    prompt = [dict(m) for m in record["prompt"]]
    prompt[-1]["content"] = prompt[-1]["content"] + " More text follows here." * repeat
    return {**record, "id": rid, "prompt": prompt}


def test_load_validates_every_line(tmp_path, tiny_records):
    good = json.dumps(tiny_records[0])
    bad_lines = [
        good,
        "{not json",
        json.dumps({**tiny_records[1], "id": tiny_records[0]["id"]}),  # duplicate id
        json.dumps({**tiny_records[2], "completion": [{"role": "user", "content": "x"}]}),
        json.dumps({**tiny_records[3], "prompt": []}),
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(bad_lines) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        load_sft_records(path)
    message = str(err.value)
    assert "4 problem(s)" in message
    assert "bad.jsonl:2: not valid JSON" in message
    assert "duplicate id 't1'" in message
    assert "role 'user' is not one of ['assistant']" in message
    assert "bad.jsonl:5 prompt" in message
    with pytest.raises(DataFormatError, match="does not exist"):
        load_sft_records(tmp_path / "missing.jsonl")


@pytest.mark.integration
def test_lengths_and_stats(tokenizer, tiny_records):
    lengths = measure(tiny_records, tokenizer)
    assert [e.id for e in lengths] == [r["id"] for r in tiny_records]
    for e, record in zip(lengths, tiny_records, strict=True):
        assert e.prompt_is_prefix
        assert e.prompt + e.completion == e.total
        # the completion is the assistant text plus the template's end-of-turn tokens
        expected = len(tokenizer(record["completion"][0]["content"], add_special_tokens=False)["input_ids"])
        assert expected < e.completion <= expected + 3
    stats = length_stats([1, 2, 3, 4, 100])
    assert stats == {"min": 1, "mean": 22.0, "p50": 3.0, "p95": pytest.approx(80.8), "max": 100}


@pytest.mark.integration
def test_refuse_names_examples_and_fix(tokenizer, tiny_records):
    records = tiny_records + [_long(tiny_records[0], "huge-1"), _long(tiny_records[1], "huge-2", 60)]
    with pytest.raises(PreflightError) as err:
        check_lengths(records, tokenizer, max_length=300, policy="refuse")
    message = str(err.value)
    assert "2 of 6 examples are longer than max_length=300" in message
    assert message.index("huge-1") < message.index("huge-2")  # worst first
    assert "raise max_length" in message and "window" in message and "truncation_policy=drop" in message


@pytest.mark.integration
def test_drop_is_loud_and_counted(tokenizer, tiny_records, caplog):
    records = tiny_records + [_long(tiny_records[0], "huge-1")]
    with caplog.at_level(logging.WARNING, logger="memreader.training.preflight"):
        kept, report = check_lengths(records, tokenizer, max_length=300, policy="drop", split="train")
    assert [r["id"] for r in kept] == [r["id"] for r in tiny_records]
    assert report["dropped"] == 1 and report["kept"] == 4 and report["over_max_length"] == 1
    assert report["worst"][0]["id"] == "huge-1"
    assert report["total_tokens"]["max"] > 300
    warning = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "DROPPING 1 of 5 train examples longer than max_length=300" in warning
    assert "huge-1" in warning


@pytest.mark.integration
def test_prompt_alone_over_limit_counts_as_target_lost(tokenizer, tiny_records):
    records = [_long(tiny_records[0], "huge-1", 400)]
    with pytest.raises(PreflightError, match=r"1 lose the whole target"):
        check_lengths(records, tokenizer, max_length=300, policy="refuse")
    with pytest.raises(PreflightError, match="nothing is left to train on"):
        check_lengths(records, tokenizer, max_length=300, policy="drop")


@pytest.mark.integration
def test_within_limit_passes_untouched(tokenizer, tiny_records):
    kept, report = check_lengths(tiny_records, tokenizer, max_length=1024, policy="refuse")
    assert kept == tiny_records
    assert report["over_max_length"] == 0 and report["dropped"] == 0
    with pytest.raises(ValueError, match="truncation_policy 'cut'"):
        check_lengths(tiny_records, tokenizer, max_length=1024, policy="cut")
