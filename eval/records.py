"""Typed records of an evaluation run: the ``summary.json`` that ``memreader eval`` writes and
``memreader report`` reads (layout in docs/EVALUATION.md, "Report").

    summary = EvalSummary(settings=RunSettings(...), dataset=DatasetRecord(...), methods={"fixed": MethodRecord(...)},
                          ...)
    write_json(folder / "summary.json", summary.to_dict())
    summary = EvalSummary.read(folder / "summary.json")        # or EvalSummary.from_dict(data, source)

``to_dict`` writes the JSON every run has written (its keys are the field names). ``from_dict`` checks every
key's presence and type, and that per-item lists align with their ids; it raises one :class:`SummaryError`
that names the file, every bad key (dotted: ``methods.fixed.scores.ids``) and the fix (re-run ``memreader
eval``: it reuses the finished memories, answers and clarity and writes the summary again).

Tolerated, so that summaries of older runs still report (they read as None or the default shown): a null or
absent ``support``, ``clarity`` or ``calibration`` of a method (not measured, not calibrated); ``engine`` at the
top level and a method's ``questions_with_chunks_left_out`` (added to the format later); ``support.n_scored``
and ``clarity.n_single_chunk`` (written by every run since this module); a calibration's ``n_docs`` and
``calibration_docs``. Keys not named here are ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from eval.chunkers.base import Calibration
from eval.stats import Interval
from memreader.errors import MemReaderError

T = TypeVar("T")
R = TypeVar("R", bound="_Record")
NULL = type(None)
_ABSENT: Any = object()
_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
          tuple: "a list", dict: "an object", NULL: "null"}


class SummaryError(MemReaderError, ValueError):
    """A summary that is not what ``memreader eval`` writes; the message names the file, every bad key and the fix."""


def _is(value: Any, types: Sequence[type]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, tuple(types)) or (float in types and isinstance(value, int))


def _kind(value: Any) -> str:
    return next((name for t, name in _NAMES.items() if _is(value, (t,))), type(value).__name__)


def _fix(source: str | Path) -> str:
    path = Path(source)
    config = path.parent / "config.yaml"
    rerun = f"`memreader eval --config {config}`" if path.name == "summary.json" and config.is_file() else \
        "`memreader eval` with the run's config"
    return (f"re-run {rerun} (it reuses the run's finished memories, answers and clarity and writes summary.json "
            "again), or repair the named keys")


class _Obj:
    """One JSON object of a summary being read: type-checked values by key. Every problem is collected with its
    dotted key, so that one error names them all."""

    def __init__(self, data: dict[str, Any], where: str, problems: list[str]) -> None:
        self.data, self.where, self.problems = data, where, problems

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def check(self, ok: bool, key: str, text: str) -> None:
        if not ok:
            self.problems.append(f"'{self.path(key)}' {text}")

    def get(self, key: str, *types: type, default: Any = _ABSENT) -> Any:
        """``data[key]`` if it is one of ``types``; an optional key (one with a ``default``) may be absent or null."""
        value = self.data.get(key, _ABSENT)
        expected = " or ".join(_NAMES[t] for t in types)
        if value is _ABSENT or (value is None and default is not _ABSENT):
            self.check(default is not _ABSENT, key, f"missing (expected {expected})")
            return None if default is _ABSENT else default
        self.check(_is(value, types), key, f"is {_kind(value)}, expected {expected}")
        return value if _is(value, types) else None if default is _ABSENT else default

    def items(self, key: str, *types: type, default: Any = _ABSENT) -> list[Any] | None:
        """A list whose every item is one of ``types``."""
        value = self.get(key, list, default=default)
        bad = next((i for i, v in enumerate(value) if not _is(v, types)), None) if isinstance(value, list) else None
        self.check(bad is None, f"{key}[{bad}]", f"is {_kind(value[bad] if bad is not None else None)}, expected "
                   + " or ".join(_NAMES[t] for t in types))
        return value

    def ids(self, key: str) -> list[str] | None:
        """A list of ids (strings; integers are read as strings)."""
        value = self.items(key, str, int)
        return None if value is None else [str(i) for i in value]

    def mapping(self, key: str, *types: type) -> dict[str, Any] | None:
        """An object whose every value is one of ``types`` (any value when none are given)."""
        value = self.get(key, dict)
        for name, v in (value or {}).items():
            self.check(not types or _is(v, types), f"{key}.{name}", f"is {_kind(v)}, expected "
                       + " or ".join(_NAMES[t] for t in types))
        return value

    def obj(self, key: str, read: Callable[[_Obj], T], optional: bool = False) -> T | None:
        """A nested object read by ``read``; ``optional``: it may be null or absent (None)."""
        value = self.get(key, dict, default=None if optional else _ABSENT)
        return read(_Obj(value, self.path(key), self.problems)) if isinstance(value, dict) else None

    def objs(self, key: str, read: Callable[[_Obj], T]) -> dict[str, T]:
        """An object of nested objects, each read by ``read`` (name -> record)."""
        out = {}
        for name, value in (self.get(key, dict) or {}).items():
            self.check(isinstance(value, dict), f"{key}.{name}", f"is {_kind(value)}, expected an object")
            if isinstance(value, dict):
                out[name] = read(_Obj(value, f"{self.path(key)}.{name}", self.problems))
        return out

    def aligned(self, key: str, values: list[Any] | None, ids_key: str, ids: list[str] | None) -> None:
        """``values`` has one entry per id."""
        if isinstance(values, list) and isinstance(ids, list):
            self.check(len(values) == len(ids), key, f"has {len(values)} values for the {len(ids)} ids of "
                       f"'{self.path(ids_key)}'")


def _parse(read: Callable[[_Obj], T], data: Any, source: str | Path) -> T:
    problems: list[str] = []
    record = read(_Obj(data, "", problems)) if isinstance(data, dict) else None
    if not isinstance(data, dict):
        problems.append(f"the top level is {_kind(data)}, expected an object")
    if problems:
        raise SummaryError(f"{source}: malformed summary ({len(problems)} problem(s)): {'; '.join(problems)}",
                           _fix(source))
    return record  # type: ignore[return-value]


class _Record:
    """``to_dict`` / ``from_dict`` of a summary record; its JSON keys are its field names."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: Any, source: str | Path = "summary.json") -> R:
        """The record of ``data`` (JSON from ``source``), checked: :class:`SummaryError` names every bad key."""
        return _parse(cls._read, data, source)  # type: ignore[attr-defined]


def _interval(o: _Obj) -> Interval:
    return Interval(low=o.get("low", float), high=o.get("high", float), confidence=o.get("confidence", float),
                    n_resamples=o.get("n_resamples", int), seed=o.get("seed", int),
                    method=o.get("method", str, default="percentile-bootstrap"))


def _calibration(o: _Obj) -> Calibration:
    """A method's :class:`eval.chunkers.base.Calibration` (``tried``: [value, mean_chars] pairs in JSON)."""
    tolerance = o.get("tolerance", float)
    o.check(tolerance is None or 0 <= tolerance < 1, "tolerance", f"is {tolerance}, expected a fraction in [0, 1)")
    tried = [tuple(t) for t in o.items("tried", list, tuple) or [] if isinstance(t, (list, tuple))]
    o.check(all(len(t) == 2 for t in tried), "tried", "expected [value, mean_chars] pairs")
    return Calibration(method=o.get("method", str), param=o.get("param", str), value=o.get("value", float, str, NULL),
                       target_chars=o.get("target_chars", float), tolerance=tolerance,
                       mean_chars=o.get("mean_chars", float), std_chars=o.get("std_chars", float),
                       n_chunks=o.get("n_chunks", int), within=o.get("within", bool), tried=tried,
                       note=o.get("note", str), n_docs=o.get("n_docs", int, default=0),
                       calibration_docs=o.get("calibration_docs", int, default=0))


def calibration_from_dict(data: Any, source: str | Path = "calibration.json") -> Calibration:
    """A method's calibration record (``calibration.json``, a summary's ``methods.<m>.calibration``), checked."""
    return _parse(_calibration, data, source)


@dataclass(kw_only=True)
class MetricRecord(_Record):
    """One QA metric of a method (:meth:`eval.score.MetricResult.to_dict`)."""

    metric: str  # display name: BLEU-1, ROUGE-L, ...
    value: float
    aggregation: str  # "mean" of per_example, or "corpus" (corpus-level BLEU: no paired test from per_example)
    ci_low: float
    ci_high: float
    interval: Interval
    signature: str  # equal signatures: comparable numbers
    per_example: list[float]  # aligned with ScoresRecord.ids

    @classmethod
    def _read(cls, o: _Obj) -> MetricRecord:
        return cls(metric=o.get("metric", str), value=o.get("value", float), aggregation=o.get("aggregation", str),
                   ci_low=o.get("ci_low", float), ci_high=o.get("ci_high", float),
                   interval=o.obj("interval", _interval),
                   signature=o.get("signature", str), per_example=o.items("per_example", float))


@dataclass(kw_only=True)
class ScoresRecord(_Record):
    """A method's QA scores: :meth:`eval.score.ScoreReport.to_dict` with per-question values."""

    profile: str
    config: dict[str, Any]  # the resolved metric settings
    n: int  # questions that count towards the means (n_total minus excluded_ids)
    n_total: int
    excluded_ids: list[str]
    metrics: dict[str, MetricRecord]
    ids: list[str]  # the scored question ids, in order
    versions: dict[str, str]
    seconds: float

    @classmethod
    def _read(cls, o: _Obj) -> ScoresRecord:
        ids, metrics = o.ids("ids"), o.objs("metrics", MetricRecord._read)
        o.check(bool(metrics) or not isinstance(o.data.get("metrics"), dict), "metrics", "is empty")
        for name, m in metrics.items():
            o.aligned(f"metrics.{name}.per_example", m.per_example, "ids", ids)
        return cls(profile=o.get("profile", str), config=o.mapping("config"), n=o.get("n", int),
                   n_total=o.get("n_total", int), excluded_ids=o.ids("excluded_ids"), metrics=metrics, ids=ids,
                   versions=o.mapping("versions", str), seconds=o.get("seconds", float))


@dataclass(kw_only=True)
class SupportRecord(_Record):
    """Informational support of the reference answers (eval/support.py): S per question, lower is better."""

    per_example: list[float | None]  # None: not scored (blank reference, support off)
    ids: list[str]
    mean: float | None  # over the scored questions
    signature: str
    n_truncated: int  # questions whose context was cut to fit the model
    n_scored: int | None = None

    @classmethod
    def of(cls, per_example: Sequence[float | None], ids: Sequence[Any], signature: str,
           n_truncated: int) -> SupportRecord:
        """The record of per-question values (the mean over the scored ones)."""
        scored = [v for v in per_example if v is not None]
        return cls(per_example=list(per_example), ids=[str(i) for i in ids], signature=signature,
                   mean=math.fsum(scored) / len(scored) if scored else None, n_truncated=n_truncated,
                   n_scored=len(scored))

    @classmethod
    def _read(cls, o: _Obj) -> SupportRecord:
        per_example, ids = o.items("per_example", float, NULL), o.ids("ids")
        o.aligned("per_example", per_example, "ids", ids)
        return cls(per_example=per_example, ids=ids, mean=o.get("mean", float, NULL), signature=o.get("signature", str),
                   n_truncated=o.get("n_truncated", int), n_scored=o.get("n_scored", int, default=None))


@dataclass(kw_only=True)
class ClarityRecord(_Record):
    """The evaluator's atomic-chunk clarity of a method's memories (eval/clarity.py)."""

    per_memory: list[float | None]  # None: a single chunk, no boundary
    doc_ids: list[str]
    mean: float | None  # over the memories with a boundary
    signature: str
    n_single_chunk: int | None = None

    @classmethod
    def of(cls, per_memory: Sequence[float | None], doc_ids: Sequence[str], signature: str) -> ClarityRecord:
        """The record of per-memory values (the mean over the memories with a boundary)."""
        scored = [v for v in per_memory if v is not None]
        return cls(per_memory=list(per_memory), doc_ids=list(doc_ids), signature=signature,
                   mean=math.fsum(scored) / len(scored) if scored else None,
                   n_single_chunk=len(per_memory) - len(scored))

    @classmethod
    def _read(cls, o: _Obj) -> ClarityRecord:
        per_memory, doc_ids = o.items("per_memory", float, NULL), o.ids("doc_ids")
        o.aligned("per_memory", per_memory, "doc_ids", doc_ids)
        return cls(per_memory=per_memory, doc_ids=doc_ids, mean=o.get("mean", float, NULL),
                   signature=o.get("signature", str), n_single_chunk=o.get("n_single_chunk", int, default=None))


@dataclass(kw_only=True)
class ProvenanceRecord(_Record):
    """How a method's memories were made: guided, unguided, whole-document fallbacks, truncated replies (kept
    flagged), or built by a chunking baseline (no model)."""

    memories: int
    guided: int
    unguided: int
    fallback: int
    truncated: int
    baseline: int

    @classmethod
    def of(cls, memories: Sequence[Any]) -> ProvenanceRecord:
        """Counts over :class:`memreader.schema.DocumentMemory` objects (from their ``meta``)."""
        counts = {"memories": len(memories), "guided": 0, "unguided": 0, "fallback": 0, "truncated": 0, "baseline": 0}
        for m in memories:
            gen = m.meta.get("generation")
            if gen is None:
                counts["baseline" if "baseline" in m.meta or "chunker" in m.meta else "unguided"] += 1
            else:
                counts["guided" if gen.get("guided") else "unguided"] += 1
            counts["fallback"] += "fallback" in m.meta
            counts["truncated"] += bool(m.meta.get("truncated"))
        return cls(**counts)

    def line(self) -> str:
        """One line for report.txt."""
        return (f"{self.memories} memories: {self.guided} guided, {self.unguided} unguided, {self.fallback} "
                f"whole-document fallbacks, {self.truncated} truncated (flagged), {self.baseline} from a chunker")

    @classmethod
    def _read(cls, o: _Obj) -> ProvenanceRecord:
        return cls(**{k: o.get(k, int) for k in ("memories", "guided", "unguided", "fallback", "truncated",
                                                 "baseline")})


@dataclass(kw_only=True)
class MethodRecord(_Record):
    """Everything ``memreader eval`` measured of one method (its files are in ``methods/<name>/``)."""

    scores: ScoresRecord
    support: SupportRecord | None = None  # None: not measured
    clarity: ClarityRecord | None = None  # None: not measured
    calibration: Calibration | None = None  # None: not calibrated
    provenance: ProvenanceRecord
    question_doc: dict[str, str | None]  # question id -> its (first) document
    mode: str  # retrieval mode used (chunk_only for methods without outlines and cores)
    mean_context_chars: float  # characters of retrieved context per question, mean
    questions_with_chunks_left_out: int | None = None  # chunks that did not fit the answerer's window
    seconds: float

    @classmethod
    def _read(cls, o: _Obj) -> MethodRecord:
        return cls(scores=o.obj("scores", ScoresRecord._read), support=o.obj("support", SupportRecord._read, True),
                   clarity=o.obj("clarity", ClarityRecord._read, True),
                   calibration=o.obj("calibration", _calibration, True),
                   provenance=o.obj("provenance", ProvenanceRecord._read), question_doc=o.mapping("question_doc", str,
                                                                                                   NULL),
                   mode=o.get("mode", str), mean_context_chars=o.get("mean_context_chars", float),
                   questions_with_chunks_left_out=o.get("questions_with_chunks_left_out", int, default=None),
                   seconds=o.get("seconds", float))


@dataclass(kw_only=True)
class RunSettings(_Record):
    """The run's settings line (as printed) and the settings the numbers depend on."""

    line: str
    target_chars: int
    tolerance: float
    mode: str
    profile: str
    max_new_tokens: int

    @classmethod
    def _read(cls, o: _Obj) -> RunSettings:
        return cls(line=o.get("line", str), target_chars=o.get("target_chars", int),
                   tolerance=o.get("tolerance", float), mode=o.get("mode", str), profile=o.get("profile", str),
                   max_new_tokens=o.get("max_new_tokens", int))


@dataclass(kw_only=True)
class DatasetRecord(_Record):
    """The question set (:meth:`eval.suites.EvalSet.describe`)."""

    name: str
    path: str
    n_questions: int
    n_documents: int
    corpus_chars: int
    mean_document_chars: float

    @classmethod
    def _read(cls, o: _Obj) -> DatasetRecord:
        return cls(name=o.get("name", str), path=o.get("path", str), n_questions=o.get("n_questions", int),
                   n_documents=o.get("n_documents", int), corpus_chars=o.get("corpus_chars", int),
                   mean_document_chars=o.get("mean_document_chars", float))


@dataclass(kw_only=True)
class ProfileRecord(_Record):
    """Where the run's time went (:meth:`eval.answering.GenerationProfile.to_dict`)."""

    forward_share: float | None  # model forward passes' share of generation time (None: not timed)
    answers: int
    forward_calls: int
    seconds: dict[str, float]  # per phase

    @classmethod
    def _read(cls, o: _Obj) -> ProfileRecord:
        return cls(forward_share=o.get("forward_share", float, NULL), answers=o.get("answers", int),
                   forward_calls=o.get("forward_calls", int), seconds=o.mapping("seconds", float))


@dataclass(kw_only=True)
class EngineRecord(_Record):
    """What answered (:func:`memreader.backends.describe_choice`)."""

    stage: str
    backend: str
    dtype: str
    why: str = ""

    @classmethod
    def _read(cls, o: _Obj) -> EngineRecord:
        return cls(stage=o.get("stage", str), backend=o.get("backend", str), dtype=o.get("dtype", str),
                   why=o.get("why", str, default=""))


@dataclass(kw_only=True)
class EvalSummary(_Record):
    """``<run>/eval/summary.json``: one evaluation run, every method on the same questions."""

    settings: RunSettings
    dataset: DatasetRecord
    answer_model: str
    embedder: str
    top_k: int
    methods: dict[str, MethodRecord]
    profile: ProfileRecord
    engine: EngineRecord | None = None  # None: a run from before backends were recorded
    seconds: float

    @classmethod
    def read(cls, path: str | Path) -> EvalSummary:
        """The checked summary in ``path``; :class:`SummaryError` names the file, every bad key and the fix."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise SummaryError(f"{path} does not exist", "run `memreader eval` first") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SummaryError(f"{path}: not valid JSON ({exc})", _fix(path)) from exc
        return cls.from_dict(data, path)

    @classmethod
    def _read(cls, o: _Obj) -> EvalSummary:
        methods = o.objs("methods", MethodRecord._read)
        o.check(bool(methods) or not isinstance(o.data.get("methods"), dict), "methods", "is empty")
        return cls(settings=o.obj("settings", RunSettings._read), dataset=o.obj("dataset", DatasetRecord._read),
                   answer_model=o.get("answer_model", str), embedder=o.get("embedder", str), top_k=o.get("top_k", int),
                   methods=methods, profile=o.obj("profile", ProfileRecord._read),
                   engine=o.obj("engine", EngineRecord._read, True), seconds=o.get("seconds", float))
