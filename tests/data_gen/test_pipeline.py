"""Teacher-side pipeline with a scripted teacher (the real teacher is a remote service; the fakes are in
tests/data_gen/fakes.py)."""

from __future__ import annotations

import json

import pytest

import memreader.data_gen.pipeline as pipeline
from memreader.core.errors import RunFailed
from memreader.core.generation import GenerationRequestError, Reply
from memreader.core.schema import read_memories
from memreader.data_gen.cache import ReplyCache, cache_key
from memreader.demo import _reasoning_line
from tests.data_gen.fakes import FixedTeacher, ScriptedTeacher, stage
from tests.engine_fakes import fake_engines


def Cfg(**kw):  # noqa: N802 - reads like the config class it builds
    """A GenConfig with one candidate per document unless a test asks for more."""
    return pipeline.GenConfig(**{"num_candidates": 1, "teacher": "transformers", **kw})


def test_generate_writes_memories_sft_and_manifest_and_caches(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    teacher = ScriptedTeacher()
    built = fake_engines(monkeypatch, teacher)
    cfg = Cfg(input=str(corpus), run="t", val_fraction=0.34)
    manifest = pipeline.generate(cfg)
    # the teacher setting went through the engine rule and the factory: transformers, the model, its batch size
    assert [(b.backend, b.model, b.kwargs["batch_size"]) for b in built] == [("transformers", cfg.model, 4)]
    assert teacher.calls == 9  # outline + extraction + reverse CoM for 3 documents
    mems = read_memories(manifest["files"]["memories"])
    assert [m.doc_id for m in mems] == ["a", "b", "c"]
    for mem in mems:
        assert "".join(mem.chunks) == mem.document and len(mem.scenarios) == 2
        assert mem.reasoning and mem.meta["prompt"].startswith("teacher_extraction.")
    train = [json.loads(x) for x in open(manifest["files"]["sft_train"], encoding="utf-8")]
    val = [json.loads(x) for x in open(manifest["files"]["sft_val"], encoding="utf-8")]
    assert len(train) + len(val) == 3 and val
    rec = train[0]
    assert [m["role"] for m in rec["prompt"]] == ["system", "user"]
    assert rec["completion"][0]["content"].startswith("<think>")
    assert manifest["templates"] and manifest["teacher"]["calls"] == 9
    # A rerun asks the teacher nothing: every reply comes from the cache.
    teacher.calls = 0
    again = pipeline.generate(cfg)
    assert teacher.calls == 0 and again["teacher"]["cache_hits"] == 9


def test_unusable_reply_is_reported_not_written(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))

    fake_engines(monkeypatch, FixedTeacher("I cannot do that."))
    with pytest.raises(RunFailed, match="every one of the 3 documents failed"):  # exit code 1, not a silent 0
        pipeline.generate(Cfg(input=str(corpus), run="t2", reverse_com=False))
    manifest = json.loads((tmp_path / "home" / "runs" / "t2" / "gen" / "manifest.json").read_text())
    assert manifest["memories"] == 0 and len(manifest["failures"]) == 3
    assert "no <scenario> or <chunk>" in manifest["failures"][0]["error"]


def test_config_errors_are_collected() -> None:
    from memreader.core.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(pipeline.GenConfig, None, ["teacher=gpt", "val_fraction=2"])
    assert "input:" in str(err.value) and "teacher:" in str(err.value) and "val_fraction" in str(err.value)


def test_whole_document_fallback_is_flagged_and_counted(tmp_path, corpus, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))

    fake_engines(monkeypatch, FixedTeacher("A long ramble without any structure."))
    cfg = Cfg(input=str(corpus), run="t3", reverse_com=False, on_unusable="whole")
    manifest = pipeline.generate(cfg)
    assert manifest["memories"] == 3 and manifest["whole_document_fallbacks"] == ["a", "b", "c"]
    assert "WARNING: 3/3 teacher replies had no usable chunk" in capsys.readouterr().out
    mems = read_memories(manifest["files"]["memories"])
    assert all(len(m.scenarios) == 1 and m.meta["fallback"] for m in mems)


def test_failed_request_loses_nothing_already_paid_for(tmp_path, corpus, monkeypatch) -> None:
    """One document's extraction fails for good (e.g. HTTP 413): the other replies are cached as they
    arrive, the failure is recorded, and a rerun asks only for what is missing."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))

    class OneBad(ScriptedTeacher):
        fail = True

        def _reply(self, prompt: str):
            if self.fail and "<scenario>" in prompt and "cider" in prompt:
                return GenerationRequestError("HTTP 413: prompt too large", 413)
            return ScriptedTeacher._reply(prompt)

    teacher = OneBad()
    fake_engines(monkeypatch, teacher)
    cfg = Cfg(input=str(corpus), run="t4", reverse_com=False, val_fraction=0)
    manifest = pipeline.generate(cfg)
    assert [f["doc_id"] for f in manifest["failures"]] == ["a"]
    assert manifest["failures"][0]["stage"] == "extraction request" and "413" in manifest["failures"][0]["error"]
    assert manifest["memories"] == 2 and teacher.calls == 6
    teacher.fail, teacher.calls = False, 0
    again = pipeline.generate(cfg)
    assert teacher.calls == 1 and again["memories"] == 3 and not again["failures"]


def test_validation_split_never_empty_when_asked(tmp_path) -> None:
    from memreader.data_gen.sft_export import write_sft_splits

    recs = [{"id": i, "meta": {"lang": lang}} for i, lang in (("a", "en"), ("b", "zh"))]
    split = write_sft_splits(tmp_path, recs, 0.5, seed=1)
    assert (split["train"], split["val"]) == (1, 1)
    assert write_sft_splits(tmp_path, recs, 0.0, seed=1)["val"] == 0


def test_extraction_is_guided_for_the_local_teacher_only_where_asked(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    teacher = ScriptedTeacher()
    fake_engines(monkeypatch, teacher)
    pipeline.generate(Cfg(input=str(corpus), run="g1", reverse_com=False))
    assert {(d, g) for d, _, g in teacher.seen} == {("outline", False), ("extraction", True)}
    teacher.seen.clear()
    pipeline.generate(Cfg(input=str(corpus), run="g2", reverse_com=False, guided="off"))
    assert not any(g for *_, g in teacher.seen)


class CutOff(ScriptedTeacher):
    """Extraction replies are cut off (finish_reason length) until the budget reaches ``enough``."""

    enough = 10**9

    def _finish(self, prompt, params, out):
        if stage(prompt) == "extraction" and params.max_new_tokens < self.enough:
            return Reply(out[: len(out) // 2], finish_reason="length")
        return out


def test_cut_off_replies_retry_longer_then_skip(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    teacher = CutOff()
    fake_engines(monkeypatch, teacher)
    cfg = Cfg(input=str(corpus), run="c1", reverse_com=False, max_new_tokens=500, guided="off")
    with pytest.raises(RunFailed):
        pipeline.generate(cfg)
    manifest = json.loads((tmp_path / "home" / "runs" / "c1" / "gen" / "manifest.json").read_text())
    budgets = [b for d, b, _ in teacher.seen if d == "extraction"]
    assert budgets == [500] * 3 + [1000] * 3  # one retry each, twice the budget
    assert manifest["memories"] == 0 and manifest["extraction_fates"] == {"truncated-skipped": 3}
    assert all("cut off" in f["error"] for f in manifest["failures"])
    # enough budget on the retry: every document becomes a normal memory
    teacher.enough, teacher.seen = 1000, []
    manifest = pipeline.generate(Cfg(input=str(corpus), run="c2", reverse_com=False, max_new_tokens=500,
                                                    guided="off"))
    assert manifest["memories"] == 3 and manifest["extraction_fates"] == {"retried": 3}


def test_cut_off_replies_kept_flagged_are_never_sft_targets(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    fake_engines(monkeypatch, CutOff())
    cfg = Cfg(input=str(corpus), run="c3", reverse_com=False, guided="off", on_truncated="keep_flagged",
                             on_unusable="whole", val_fraction=0)
    manifest = pipeline.generate(cfg)
    mems = read_memories(manifest["files"]["memories"])
    assert len(mems) == 3 and all(m.meta["truncated"] for m in mems)
    assert manifest["truncated_kept"] == ["a", "b", "c"] and manifest["sft"]["train"] == 0


class RamblingReasoner(ScriptedTeacher):
    """Reverse-CoM replies are cut off at every budget (SmolLM2-135M loops past 192 tokens on the demo corpus)."""

    def _finish(self, prompt, params, out):
        if stage(prompt) == "reverse CoM":
            return Reply("The document is about the document is about", finish_reason="length",
                         completion_tokens=params.max_new_tokens)
        return out


def test_cut_off_reasoning_is_counted_and_the_demo_says_why(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    teacher = RamblingReasoner()
    fake_engines(monkeypatch, teacher)
    manifest = pipeline.generate(Cfg(input=str(corpus), run="com1", com_max_new_tokens=96, guided="off",
                                     com_probe=0))
    assert [b for d, b, _ in teacher.seen if d == "reverse CoM"] == [96] * 3 + [192] * 3
    assert manifest["without_reasoning"] == ["a", "b", "c"]
    assert manifest["reasoning"] == {"requests": 3, "fates": {"truncated-skipped": 3}, "probe": 0,
                                     "max_new_tokens": 96, "retry_max_new_tokens": 192}
    mem = read_memories(manifest["files"]["memories"])[0]
    assert mem.reasoning is None and mem.meta["reverse_com"] == {"fate": "truncated-skipped", "max_new_tokens": 192,
                                                                 "completion_tokens": 192}
    line = _reasoning_line(manifest)
    assert line.startswith("0/3 (3 cut off at 192 tokens; left out of the SFT targets)")
    assert "did not end one reasoning within 192 tokens" in line and "never run" not in line
    # the default probe: the first two go alone, both are cut off, the third is never asked, and the line says so
    teacher = RamblingReasoner()
    fake_engines(monkeypatch, teacher)
    manifest = pipeline.generate(Cfg(input=str(corpus), run="com1p", com_max_new_tokens=96, guided="off"))
    assert sorted(b for d, b, _ in teacher.seen if d == "reverse CoM") == [96, 96, 192, 192]
    assert manifest["without_reasoning"] == ["a", "b", "c"]
    assert manifest["reasoning"]["requests"] == 2 and manifest["reasoning"]["probe"] == 2
    assert manifest["reasoning"]["fates"] == {"truncated-skipped": 2, "not-asked": 1}
    line = _reasoning_line(manifest)
    assert line.startswith("0/3 (2 cut off at 192 tokens, 1 not asked: every probe was cut off; left out")
    assert "did not end one reasoning within 192 tokens" in line and "the other 1 never run" in line
    # a teacher that ends its reasoning: every path kept, nothing to explain
    fake_engines(monkeypatch, ScriptedTeacher())
    manifest = pipeline.generate(Cfg(input=str(corpus), run="com2", com_max_new_tokens=96, guided="off"))
    assert manifest["reasoning"]["fates"] == {"ok": 3} and _reasoning_line(manifest) == "3/3"


class RamblesOnce(ScriptedTeacher):
    """Cuts off every reasoning of the first document whose reasoning it is asked for; ends the others'."""

    first: str | None = None

    def _finish(self, prompt, params, out):
        if stage(prompt) == "reverse CoM":
            self.first = self.first or prompt
            if prompt == self.first:
                return Reply("on and on and on", finish_reason="length", completion_tokens=params.max_new_tokens)
        return out


def test_one_probe_that_ends_its_reasoning_lets_every_document_ask(tmp_path, corpus, monkeypatch) -> None:
    """com_probe=2: one probe cut off and one ended is a teacher that can reason: the third document is asked too."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    fake_engines(monkeypatch, RamblesOnce())
    manifest = pipeline.generate(Cfg(input=str(corpus), run="com4", com_max_new_tokens=96, guided="off"))
    assert manifest["reasoning"]["requests"] == 3
    assert manifest["reasoning"]["fates"] == {"truncated-skipped": 1, "ok": 2} and len(manifest["without_reasoning"]) == 1


def test_empty_reasoning_is_not_a_reasoning_path(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))

    class ThinksOnly(ScriptedTeacher):
        @staticmethod
        def _reply(prompt: str) -> str:
            if stage(prompt) == "reverse CoM":
                return "<think>hidden</think>  "
            return ScriptedTeacher._reply(prompt)

    fake_engines(monkeypatch, ThinksOnly())
    manifest = pipeline.generate(Cfg(input=str(corpus), run="com3", guided="off"))
    assert manifest["reasoning"]["fates"] == {"empty": 3} and len(manifest["without_reasoning"]) == 3


def test_retry_unusable_asks_the_teacher_again(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))

    teacher = FixedTeacher("A long ramble without any structure.")
    fake_engines(monkeypatch, teacher)
    cfg = Cfg(input=str(corpus), run="r1", reverse_com=False, on_unusable="whole", guided="off")
    pipeline.generate(cfg)
    teacher.calls = 0
    pipeline.generate(cfg)  # default: the unusable replies are replayed, no paid call repeated
    assert teacher.calls == 0
    again = pipeline.generate(Cfg(**{**cfg.__dict__, "retry_unusable": True}))
    assert teacher.calls == 3 and again["teacher"]["reasked_unusable"] == 3  # the extractions, not the outlines


def test_cache_key_covers_backend_url_and_grammar(tmp_path) -> None:
    msgs = [{"role": "user", "content": "x"}]
    base = cache_key("t@1", "m", {"seed": 0}, msgs, "openai", "http://a/v1", None)
    assert base != cache_key("t@1", "m", {"seed": 0}, msgs, "openai", "http://b/v1", None)
    assert base != cache_key("t@1", "m", {"seed": 0}, msgs, "local", "http://a/v1", None)
    assert base != cache_key("t@1", "m", {"seed": 0}, msgs, "openai", "http://a/v1", "start: x")
    cache = ReplyCache(tmp_path / "c.sqlite")
    cache.put(base, "text", {"finish_reason": "length", "guided": True})
    assert cache.get(base) == ("text", {"finish_reason": "length", "guided": True})
    assert cache.get(base, retry_unusable=True) is None and cache.reasked == 1
