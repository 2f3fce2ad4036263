"""Loaders that turn benchmark files into one record type, :class:`QARecord`.

    from memreader.eval.datasets import load_longbench
    records = load_longbench("../shared/datasets/longbench_multifieldqa_zh.jsonl")

Every loader takes a path; nothing is downloaded. Bad input (missing field, wrong type, truncated
file, non-UTF-8 bytes) raises :class:`DatasetError` naming the file, the line and the field. Fields
that some copies store as Python-literal strings (LongBench ``answers``, HotpotQA ``context`` and
``supporting_facts``) are parsed with :func:`ast.literal_eval`, never ``eval``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError

CRUD_QA_SPLITS = {"1doc": "questanswer_1doc", "2docs": "questanswer_2docs", "3docs": "questanswer_3docs"}


class DatasetError(MemReaderError, ValueError):
    """A data file is unusable; the message names the file, line and field, and what was expected."""

    def __init__(self, path: str | Path, message: str, line: int | None = None, field: str | None = None):
        self.path, self.line, self.field = str(path), line, field
        where = self.path + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: " + (f"field {field!r}: " if field else "") + message)


def read_text(path: str | Path) -> str:
    """The file as text, strictly UTF-8 (a leading BOM is dropped); bad bytes are reported by line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DatasetError(path, f"cannot read the file ({exc.strerror}); loaders take a local copy's path") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DatasetError(
            path, f"byte 0x{data[exc.start]:02x} at column {column} is not UTF-8; re-encode the file as UTF-8", line
        ) from None


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class LocatedJson:
    """A JSON document parsed while remembering where each container starts, down to ``depth``
    levels, so that errors about an item can name its line."""

    def __init__(self, path: str | Path, depth: int = 3) -> None:
        self.path, self.text = path, read_text(path)
        self.offsets: dict[tuple, int] = {}
        self.value, end = self._value(0, depth, ())
        end = _WS.match(self.text, end).end()
        if end != len(self.text):
            raise self._error(end, "unexpected data after the JSON document")

    def line(self, path: tuple) -> int:
        """Line on which the item at ``path`` (or its nearest recorded parent) starts."""
        while path not in self.offsets:
            path = path[:-1]
        return self.text.count("\n", 0, self.offsets[path]) + 1

    def _error(self, pos: int, message: str) -> DatasetError:
        return DatasetError(self.path, message, self.text.count("\n", 0, pos) + 1)

    def _value(self, idx: int, depth: int, path: tuple) -> tuple[Any, int]:
        text = self.text
        idx = _WS.match(text, idx).end()
        self.offsets[path] = idx
        opener = text[idx : idx + 1]
        if depth == 0 or opener not in ("[", "{"):
            try:
                return _DECODER.raw_decode(text, idx)
            except json.JSONDecodeError as exc:
                raise self._error(exc.pos, f"malformed or truncated JSON: {exc.msg}") from None
        closer = "]" if opener == "[" else "}"
        out: Any = [] if opener == "[" else {}
        idx = _WS.match(text, idx + 1).end()
        if text.startswith(closer, idx):
            return out, idx + 1
        while True:
            if opener == "[":
                item, idx = self._value(idx, depth - 1, (*path, len(out)))
                out.append(item)
            else:
                key, idx = self._value(idx, 0, (*path, "<key>"))
                if not isinstance(key, str):
                    raise self._error(idx, "object keys must be strings (malformed JSON)")
                idx = _WS.match(text, idx).end()
                if not text.startswith(":", idx):
                    raise self._error(idx, "expected ':' after an object key (truncated or malformed JSON)")
                out[key], idx = self._value(idx + 1, depth - 1, (*path, key))
            idx = _WS.match(text, idx).end()
            if text.startswith(",", idx):
                idx += 1
            elif text.startswith(closer, idx):
                return out, idx + 1
            else:
                raise self._error(idx, f"expected ',' or '{closer}' (truncated or malformed JSON)")


class JsonItem:
    """One record of a data file, with typed field access whose errors name file, line and field."""

    def __init__(self, record: dict, path: str | Path, line: int, prefix: str = "") -> None:
        self.record, self.path, self.line, self.prefix = record, path, line, prefix

    def error(self, key: str, message: str) -> DatasetError:
        """A :class:`DatasetError` about field ``key`` of this record."""
        return DatasetError(self.path, message, self.line, self.prefix + key)

    def get(self, key: str) -> Any:
        """The field's value; missing fields are an error listing the keys that are there."""
        if key not in self.record:
            raise self.error(key, f"missing (the record has: {', '.join(map(str, self.record)) or 'no fields'})")
        return self.record[key]

    def require_type(self, key: str, kind: type) -> Any:
        """The field's value, which must be of type ``kind``."""
        value = self.get(key)
        if not isinstance(value, kind):
            raise self.error(key, f"expected {kind.__name__}, got {type(value).__name__} {value!r:.60}")
        return value

    def str(self, key: str) -> str:
        """A string field."""
        return self.require_type(key, str)

    def id(self, key: str) -> str | int:
        """An identifier: a string or an integer."""
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.error(key, f"expected a string or integer id, got {type(value).__name__} {value!r:.60}")
        return value

    def child(self, value: Any, name: str) -> JsonItem:
        """A nested object of this record, reported as ``<name>.<field>``."""
        if not isinstance(value, dict):
            raise DatasetError(self.path, f"expected an object, got {type(value).__name__}", self.line, self.prefix + name)
        return JsonItem(value, self.path, self.line, f"{self.prefix}{name}.")


@dataclass(frozen=True)
class Passage:
    """One evidence document or paragraph."""

    text: str
    title: str = ""
    id: str = ""


@dataclass
class QARecord:
    """One question with its reference answers and, where the dataset has them, its documents."""

    id: str
    question: str
    answers: list[str]
    documents: list[Passage] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _literal_list(item: JsonItem, key: str) -> list:
    """A list field, given either as JSON or as a Python-literal string such as ``"['a', 'b']"``."""
    value = item.get(key)
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError) as exc:
            raise item.error(key, f"is a string but not a Python literal list ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(value, list):
        raise item.error(key, f"expected a list (or its Python-literal string), got {type(value).__name__}")
    return value


def _str_list(item: JsonItem, key: str, values: list) -> list[str]:
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise item.error(key, f"expected a list of strings, found {type(bad[0]).__name__} {bad[0]!r:.60}")
    if not values:
        raise item.error(key, "is an empty list; every question needs at least one answer")
    return values


def _answers(item: JsonItem, key: str) -> list[str]:
    """A single answer string or a list of them."""
    value = item.get(key)
    return [value] if isinstance(value, str) else _str_list(item, key, item.require_type(key, list))


def iter_jsonl(path: str | Path) -> Iterator[JsonItem]:
    """The records of a JSONL file, one :class:`JsonItem` per non-blank line (errors name file and line)."""
    text = read_text(path)
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                path, f"not valid JSON ({exc.msg} at column {exc.colno}); the file may be truncated", number
            ) from None
        if not isinstance(record, dict):
            raise DatasetError(path, f"expected a JSON object per line, got {type(record).__name__}", number)
        yield JsonItem(record, path, number)


def _json_array(path: str | Path, key: str | None = None) -> Iterator[JsonItem]:
    """Items of a top-level JSON array (or of the array under top-level ``key``), with their lines."""
    doc = LocatedJson(path)
    root, prefix = doc.value, ()
    if key is not None:
        if not isinstance(root, dict) or key not in root:
            found = ", ".join(sorted(root)) if isinstance(root, dict) else type(root).__name__
            raise DatasetError(path, f"expected a top-level object with key {key!r}; found {found}", 1, key)
        root, prefix = root[key], (key,)
    if not isinstance(root, list):
        raise DatasetError(path, f"expected a JSON array, got {type(root).__name__}", doc.line(prefix), key)
    for index, record in enumerate(root):
        line = doc.line((*prefix, index))
        if not isinstance(record, dict):
            raise DatasetError(path, f"item {index}: expected an object, got {type(record).__name__}", line)
        yield JsonItem(record, path, line)


def load_longbench(path: str | Path) -> list[QARecord]:
    """LongBench JSONL (e.g. MultiFieldQA-zh): ``_id, input, context, answers`` (+ length, language...)."""
    out = []
    for item in iter_jsonl(path):
        answers = _str_list(item, "answers", _literal_list(item, "answers"))
        meta = {k: item.record[k] for k in ("length", "dataset", "language", "all_classes") if k in item.record}
        doc_id = item.str("_id")
        out.append(QARecord(doc_id, item.str("input"), answers, [Passage(item.str("context"), id=doc_id)], meta))
    return out


def load_crud_qa(path: str | Path, split: str = "1doc") -> list[QARecord]:
    """CRUD-RAG ``split_merged.json`` question answering: ``split`` is ``1doc``, ``2docs`` or ``3docs``;
    evidence is the items' ``news1..newsN``."""
    if split not in CRUD_QA_SPLITS:
        raise ValueError(f"unknown CRUD QA split {split!r}; choose one of {', '.join(CRUD_QA_SPLITS)}")
    out = []
    for item in _json_array(path, CRUD_QA_SPLITS[split]):
        docs = [Passage(item.str(f"news{k}"), id=f"news{k}") for k in range(1, int(split[0]) + 1)]
        meta = {"split": split, "event": item.record.get("event")}
        out.append(QARecord(str(item.id("ID")), item.str("questions"), _answers(item, "answers"), docs, meta))
    return out


def load_cmrc2018(path: str | Path) -> list[QARecord]:
    """CMRC 2018 in SQuAD v1 layout: ``data[].paragraphs[].qas[]``; one record per question."""
    out = []
    for article in _json_array(path, "data"):
        title = article.str("title") if "title" in article.record else ""
        for p_index, para in enumerate(article.require_type("paragraphs", list)):
            where = article.child(para, f"paragraphs[{p_index}]")
            passage = Passage(where.str("context"), title=title, id=str(where.id("id")))
            for q_index, qa in enumerate(where.require_type("qas", list)):
                q = where.child(qa, f"qas[{q_index}]")
                spans = q.require_type("answers", list)
                answers = [q.child(a, f"answers[{i}]").str("text") for i, a in enumerate(spans)]
                starts = [a.get("answer_start") for a in spans]
                meta = {"title": title, "answer_starts": starts}
                out.append(QARecord(str(q.id("id")), q.str("question"), _str_list(q, "answers", answers), [passage], meta))
    return out


def _hotpot_passages(item: JsonItem) -> list[Passage]:
    passages = []
    for entry in _literal_list(item, "context"):
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)
        if not ok or not isinstance(entry[1], list) or not all(isinstance(s, str) for s in entry[1]):
            raise item.error("context", f"expected [title, [sentences]] pairs, found {entry!r:.80}")
        passages.append(Passage("".join(entry[1]), title=entry[0], id=entry[0]))
    return passages


def load_hotpotqa(path: str | Path) -> list[QARecord]:
    """HotpotQA, distractor layout: ``_id, question, answer, type, level, supporting_facts, context``.

    ``context`` becomes one passage per paragraph (sentences joined as stored, which keeps
    HotpotQA's own leading spaces)."""
    out = []
    for item in _json_array(path):
        facts = [list(f) for f in _literal_list(item, "supporting_facts")]
        meta = {"type": item.record.get("type"), "level": item.record.get("level"), "supporting_facts": facts}
        out.append(QARecord(item.str("_id"), item.str("question"), _answers(item, "answer"), _hotpot_passages(item), meta))
    return out


def load_hotpotqa_corpus(path: str | Path) -> list[Passage]:
    """The HotpotQA paragraph file: a JSON object ``title -> [sentences]``."""
    doc = LocatedJson(path)
    if not isinstance(doc.value, dict):
        raise DatasetError(path, f"expected an object title -> [sentences], got {type(doc.value).__name__}", 1)
    out = []
    for title, sentences in doc.value.items():
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise DatasetError(path, "expected a list of sentence strings", doc.line((title,)), title)
        out.append(Passage("".join(sentences), title=title, id=title))
    return out


def load_jsonl(
    path: str | Path,
    id: str | None = "id",  # noqa: A002 - the record field it maps
    question: str = "question",
    answers: str = "answers",
    documents: str | None = None,
) -> list[QARecord]:
    """Any JSONL with a field mapping: each argument names the source key for that record field.

    ``id=None`` numbers records by line; ``answers`` may hold a string or a list of strings;
    ``documents`` (optional) a string, a list of strings, or a list of ``{title, text}`` objects.
    Other keys go to ``meta``.
    """
    out = []
    used = {k for k in (id, question, answers, documents) if k}
    for item in iter_jsonl(path):
        rid = str(item.id(id)) if id else str(item.line)
        docs = None
        if documents:
            raw = item.get(documents)
            raw = [raw] if isinstance(raw, (str, dict)) else item.require_type(documents, list)
            docs = []
            for i, d in enumerate(raw):
                if isinstance(d, str):
                    docs.append(Passage(d, id=str(i)))
                else:
                    sub = item.child(d, f"{documents}[{i}]")
                    title = sub.str("title") if "title" in sub.record else ""
                    docs.append(Passage(sub.str("text"), title=title, id=str(sub.record.get("id", i))))
        meta = {k: v for k, v in item.record.items() if k not in used}
        out.append(QARecord(rid, item.str(question), _answers(item, answers), docs, meta))
    return out


def _by_id(path: str | Path, value: Callable[[JsonItem], Any]) -> dict[str, Any]:
    """``value(item)`` of every record of a JSONL file keyed by its ``id`` (as a string); a repeated id is an error."""
    out: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for item in iter_jsonl(path):
        key = str(item.id("id"))
        if key in out:
            raise item.error("id", f"duplicate id {key!r} (first on line {lines[key]})")
        out[key], lines[key] = value(item), item.line
    return out


def load_predictions(path: str | Path) -> dict[str, str]:
    """Prediction JSONL, one ``{"id": ..., "prediction": "..."}`` per line; ids compared as strings."""
    return _by_id(path, lambda item: item.str("prediction"))


def _reference(item: JsonItem) -> list[str]:
    present = [k for k in ("answer", "answers") if k in item.record]
    if len(present) != 1:
        raise item.error("answer", "each reference needs exactly one of 'answer' (string) or 'answers' (list)")
    return _answers(item, present[0])


def load_references(path: str | Path) -> dict[str, list[str]]:
    """Reference JSONL, one ``{"id": ..., "answer": "..."}`` or ``{"id": ..., "answers": [...]}`` per line."""
    return _by_id(path, _reference)

