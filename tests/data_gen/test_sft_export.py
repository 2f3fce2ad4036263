"""SFT export: strata, balancing, the stratified split and the manifest's checksums."""

from __future__ import annotations

import hashlib
import json

import pytest

import memreader.data_gen.pipeline as pipeline
from memreader.core.corpus import CorpusError
from memreader.data_gen.sft_export import balance, stratum, write_sft_splits
from tests.data_gen.fakes import SeededTeacher
from tests.engine_fakes import fake_engines


def _rec(i: int, lang: str, domain: str, chars: int) -> dict:
    return {"id": f"r{i:03d}", "meta": {"lang": lang, "domain": domain, "chars": chars}}


def test_strata_and_balancing_cap_every_stratum() -> None:
    edges = [1000, 3000]
    assert stratum(_rec(0, "en", "law", 999), edges) == ("en", "law", "<1000")
    assert stratum(_rec(0, "en", "law", 1000), edges) == ("en", "law", "1000-3000")
    assert stratum(_rec(0, "zh", "med", 5000), edges) == ("zh", "med", ">=3000")
    recs = [_rec(i, "en", "law", 500) for i in range(10)] + [_rec(10 + i, "en", "med", 500) for i in range(2)]
    kept, dropped = balance(recs, edges, 3, seed=1)
    assert len(kept) == 5 and dropped == {"en/law/<1000": 7}
    assert balance(recs, edges, 3, seed=1)[0] == kept  # deterministic for a seed
    assert balance(recs, edges, 0, seed=1) == (recs, {})


def test_split_is_stratified_and_checksummed(tmp_path) -> None:
    recs = [_rec(i, "en", d, c) for i, (d, c) in enumerate([("law", 100)] * 6 + [("med", 5000)] * 4)]
    split = write_sft_splits(tmp_path, recs, 0.25, seed=3, length_edges=[1000])
    assert split["strata"]["val"] == {"en/law/<1000": 2, "en/med/>=1000": 1}
    assert split["train"] + split["val"] == 10
    for name, path in split["files"].items():
        assert hashlib.sha256(open(path, "rb").read()).hexdigest() == split["sha256"][name]


def test_manifest_checksums_match_the_files_and_domains_balance(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    fake_engines(monkeypatch, SeededTeacher())
    text = "First part about apples and orchards. Second part about cider presses and bottles."
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": text + f" Number {i}.", "domain": d}) + "\n"
                              for i, d in enumerate(["farm"] * 5 + ["law"] * 2)))
    cfg = pipeline.GenConfig(input=str(corpus), run="m", num_candidates=1, guided="off", domain_field="domain",
                             max_per_stratum=2, val_fraction=0.5)
    manifest = pipeline.generate(cfg)
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256(open(manifest["files"][name], "rb").read()).hexdigest() == digest
    assert manifest["sft"]["balanced_away"] == {"en/farm/<1000": 3}
    assert manifest["sft"]["train"] + manifest["sft"]["val"] == 4 and manifest["templates"]
    bad = pipeline.GenConfig(**{**cfg.__dict__, "domain_field": "topic", "run": "m2"})
    with pytest.raises(CorpusError, match="no 'topic' field"):
        pipeline.generate(bad)
