"""The structure teacher: the memory that known sections imply, planned as the guided reader plans it."""

from __future__ import annotations

import json

import pytest

import memreader.data_gen.pipeline as pipeline
import memreader.data_gen.structure_teacher as st
from memreader.core.corpus import Document
from memreader.core.errors import RunFailed
from memreader.core.guidance import approx_tokens
from memreader.core.markup import render_memory
from memreader.core.memory_grammar import BoundaryGraph, GrammarSettings, memory_grammar
from memreader.core.schema import read_memories
from tests.engine_fakes import fake_engines

PASSAGES = [
    ("Harbour town", "Kelvport is a small harbour town on a rocky northern coast. Its fishing fleet lands cod and "
     "herring every morning. The old lighthouse was rebuilt after a storm in 1911 and now houses a museum."),
    ("Bread oven", "A bread oven needs a steady heat for a long time. Bakers fire the dome with dry beech wood, "
     "then rake out the ashes. The stored heat bakes several batches of loaves one after another."),
    ("Comet tails", "A comet grows a tail when it nears the sun. Sunlight and the solar wind push gas and dust "
     "away from the nucleus. The tail therefore always points away from the sun, not behind the comet."),
]


class _FakeTokens:
    """A reader tokenizer without a model download: about three characters a token."""

    class _Tok:
        @staticmethod
        def encode(text: str, add_special_tokens: bool = False) -> list[int]:
            return list(range(approx_tokens(text)))

    def __init__(self, model: str) -> None:
        self.model = model

    def tokenizer(self):
        return self._Tok()

    def model_window(self) -> int:
        return 8192


def _record(doc_id: str, passages=PASSAGES, sep: str = " ") -> dict:
    texts = [p + (sep if i < len(passages) - 1 else "") for i, (_, p) in enumerate(passages)]
    return {"id": doc_id, "text": "".join(texts), "sections": [{"title": t, "text": x}
                                                            for (t, _), x in zip(passages, texts, strict=True)]}


def _starts(rec: dict) -> list[int]:
    out, pos = [], 0
    for s in rec["sections"][:-1]:
        pos += len(s["text"])
        out.append(pos)
    return out


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _cfg(corpus: str, **kw) -> pipeline.GenConfig:
    return pipeline.GenConfig(**{"input": corpus, "run": "st", "teacher": "structure", "max_new_tokens": 1024,
                                 "max_parts": 8, "min_chunk_chars": 100, "val_fraction": 0.0, **kw})


def test_sections_boundaries_and_headings_give_the_same_starts() -> None:
    rec = _record("a")
    by_sections = st.sections_of(Document("a", rec["text"], {"sections": rec["sections"]}))
    starts = [0, *_starts(rec)]
    assert by_sections == [(s, t) for s, (t, _) in zip(starts, PASSAGES, strict=True)]
    by_bounds = st.sections_of(Document("a", rec["text"], {"boundaries": starts[1:],
                                                           "titles": [t for t, _ in PASSAGES]}))
    assert by_bounds == by_sections
    untitled = st.sections_of(Document("a", rec["text"], {"boundaries": starts[1:]}))
    assert untitled[1][1].startswith("A bread oven needs")  # no titles: the section's first words
    headings = [[s + 1, ["Guide", t]] for s, (t, _) in zip(starts, PASSAGES, strict=True)]
    by_headings = st.sections_of(Document("a", rec["text"], {"headings": headings, "source": "guide.md"}))
    assert by_headings[0] == (0, "guide.md") and by_headings[1] == (1, "Guide > Harbour town")


@pytest.mark.parametrize(("meta", "match"), [
    ({}, "has no structure"),
    ({"sections": [{"title": "x", "text": "Kelvport is"}, {"title": "y", "text": "nothing like it"}]},
     "sections do not tile the document: section 1"),
    ({"sections": [{"title": "x", "text": "Kelvport"}]}, "cover 8 of its"),
    ({"boundaries": [5, 3]}, "not strictly increasing"),
    ({"boundaries": [0, 40]}, r"out of range"),
    ({"boundaries": [40, 10_000]}, r"out of range"),
    ({"boundaries": [40], "titles": ["only one"]}, "one title per section"),
    ({"boundaries": ["40"]}, "list of character offsets"),
])
def test_bad_structure_is_refused_with_the_fix(meta: dict, match: str) -> None:
    rec = _record("a")
    with pytest.raises(st.StructureError, match=match) as info:
        st.sections_of(Document("a", rec["text"], meta))
    assert "fix:" in str(info.value) or info.value.fix


def test_best_path_hits_every_reachable_section_start_and_cuts_long_sections_inside_the_range() -> None:
    long_first = [("Long", " ".join(f"Sentence number {i} says one more thing." for i in range(12))), *PASSAGES[1:]]
    rec = _record("a", long_first)
    settings = GrammarSettings(min_chunk_chars=100, max_chunk_chars=300)
    graph = BoundaryGraph.build(rec["text"], settings)
    ends = st.best_path(graph, _starts(rec))
    assert set(_starts(rec)) <= set(ends)
    first = [e for e in ends if e < _starts(rec)[0]]
    assert first and all(100 <= b - a <= 300 for a, b in zip([0, *first], first, strict=False))


def test_lead_sentences_fit_the_budget_and_the_grammar_alphabet() -> None:
    text = "The first sentence is short. The second <one> has [brackets] in it. A third."
    assert st.lead_sentences(text, 12, approx_tokens) == "The first sentence is short."  # 11 tokens
    both = st.lead_sentences(text, 40, approx_tokens)
    assert both.startswith("The first sentence is short. The second") and not set("<[]") & set(both)
    cut = st.lead_sentences("Averyveryverylongwordwithoutanyend " * 10, 5, approx_tokens)
    assert 0 < approx_tokens(cut) <= 5


def test_gen_with_the_structure_teacher_writes_gold_memories_and_sft(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(st, "_Tokens", _FakeTokens)
    built = fake_engines(monkeypatch, lambda b: pytest.fail(f"the structure teacher builds no engine ({b})"))
    good = [_record("a"), _record("b", PASSAGES[::-1])]
    corpus = _write(tmp_path / "c.jsonl", [*good, {"id": "plain", "text": "No structure at all here. " * 10}])
    manifest = pipeline.generate(_cfg(corpus))
    mems = {m.doc_id: m for m in read_memories(manifest["files"]["memories"])}
    assert sorted(mems) == ["a", "b"]
    for rec in good:
        mem = mems[rec["id"]]
        assert [s.start for s in mem.scenarios[1:]] == _starts(rec)
        assert mem.outline == [s["title"] for s in rec["sections"]]
        assert all(sec["text"].startswith(sc.core) for sc, sec in zip(mem.scenarios, rec["sections"], strict=True))
        assert mem.reasoning is None and mem.meta["generation"]["teacher"] == "structure"
    assert manifest["failures"] == [{"doc_id": "plain", "stage": "structure", "error": manifest["failures"][0]["error"]}]
    assert "has no structure" in manifest["failures"][0]["error"]
    assert manifest["structure"] == {"section_starts": 4, "chunk_ends_at_section_starts": 4}
    assert manifest["teacher"]["calls"] == 0 and manifest["selection"]["num_candidates"] == 1 and built == []
    train = [json.loads(x) for x in open(manifest["files"]["sft_train"], encoding="utf-8")]
    assert len(train) == 2 and good[0]["text"] in train[0]["prompt"][1]["content"]
    assert train[0]["completion"][0]["content"].startswith("<outline>\nHarbour town\n")


def test_a_corpus_without_structure_fails_naming_the_fix(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(st, "_Tokens", _FakeTokens)
    corpus = _write(tmp_path / "c.jsonl", [{"id": "plain", "text": "Just text. " * 30}])
    with pytest.raises(st.StructureError, match="no document of the corpus has a usable structure") as info:
        pipeline.generate(_cfg(corpus))
    assert "sections" in info.value.fix and "memreader ingest" in info.value.fix
    assert not isinstance(info.value, RunFailed)


@pytest.mark.integration
def test_every_structure_target_is_a_reply_the_guided_reader_can_write(smollm2_path) -> None:
    from transformers import AutoTokenizer

    from memreader.core.generation.guided import ll_tokenizer
    from tests.memreader.test_memory_grammar import accepts

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    count = lambda text: len(tok.encode(text, add_special_tokens=False))  # noqa: E731
    settings = GrammarSettings(min_chunk_chars=100, max_chunk_chars=400)
    zh = [("港口", "凯尔港是北方海岸的一个小港口。渔船每天早上运回鳕鱼和鲱鱼。旧灯塔在一九一一年的风暴后重建，现在是一座博物馆。"),
          ("面包炉", "面包炉需要长时间稳定的热量。面包师用干山毛榉木烧热炉膛，然后扒出灰烬。储存的热量可以连续烤好几批面包。"),
          ("彗星", "彗星靠近太阳时会长出尾巴。阳光和太阳风把气体和尘埃推离彗核。所以彗尾总是背向太阳，而不是拖在彗星后面。")]
    for rec in (_record("en"), _record("zh", zh, sep="")):
        plan = memory_grammar(BoundaryGraph.build(rec["text"], settings), settings, 1024, count)
        sections = st.sections_of(Document(rec["id"], rec["text"], {"sections": rec["sections"]}))
        mem = st.structure_memory(rec["id"], rec["text"], sections, plan, count)
        assert [s.start for s in mem.scenarios[1:]] == _starts(rec)
        target = render_memory(mem.outline, mem.chunks, mem.cores)
        assert accepts(ll_tokenizer(tok), plan.lark, target), target


def test_ingested_files_train_on_their_headings(tmp_path, memreader_home, monkeypatch) -> None:
    """A folder of structured files (HTML, Word, Markdown) through `memreader ingest`, then the structure teacher:
    every section heading that the chunk range allows ends a chunk, and the outline is its heading path."""
    from memreader.cli import main
    from tests.ingest.test_heading_breaks import SECTIONS, _files

    assert main(["ingest", str(_files(tmp_path / "docs")), "--set", "run=st-heads", "--set", "workers=1"]) == 0
    monkeypatch.setattr(st, "_Tokens", _FakeTokens)
    corpus = memreader_home / "runs" / "st-heads" / "ingest" / "corpus.jsonl"
    manifest = pipeline.generate(_cfg(str(corpus), run="st-heads", min_chunk_chars=150))
    mems = read_memories(manifest["files"]["memories"])
    assert len(mems) == 3 and not manifest["failures"]
    for mem in mems:
        for heading in list(SECTIONS)[1:]:  # "History" sits right under the title: too close to end a chunk
            at = mem.document.index(heading, 20)  # a Markdown chunk starts at "## " before the heading text
            assert any(0 <= at - s.start <= 3 for s in mem.scenarios), (mem.doc_id, heading)
        assert any(o.endswith("> Somalia") for o in mem.outline), mem.outline
