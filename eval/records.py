"""Typed records of an evaluation run: the ``summary.json`` that ``memreader eval`` writes and
``memreader report`` reads.

    summary = EvalSummary(settings=RunSettings(...), dataset=DatasetRecord(...), methods={"fixed": MethodRecord(...)},
                          ...)
    write_json(folder / "summary.json", summary.to_dict())
    summary = EvalSummary.read(folder / "summary.json")        # or EvalSummary.from_dict(data, source)

``from_dict`` reads every field by its type annotation and raises one :class:`SummaryError` naming the file, every
bad key and the fix; a field with a default is optional (older runs still report). Other keys are ignored.
Details (layout, the keys added later): docs/EVALUATION.md (Report).
"""

from __future__ import annotations

import functools
import json
import math
import types
from collections.abc import Callable, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from memreader.core.errors import MemReaderError
from memreader.eval.chunkers.base import Calibration
from memreader.eval.stats import Interval

R = TypeVar("R", bound="_Record")
NULL = type(None)
_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number", list: "a list",
          tuple: "a list", dict: "an object", NULL: "null"}
# The memreader method's calibration from given memories records the memories file as its value.
_FIELD_TYPES = {Calibration: {"value": float | str | None}}


class SummaryError(MemReaderError, ValueError):
    """A summary that is not what ``memreader eval`` writes; the message names the file, every bad key and the fix."""


def _fix(source: str | Path) -> str:
    path = Path(source)
    config = path.parent / "config.yaml"
    rerun = f"`memreader eval --config {config}`" if path.name == "summary.json" and config.is_file() else \
        "`memreader eval` with the run's config"
    return (f"re-run {rerun} (it reuses the run's finished memories, answers and clarity and writes summary.json "
            "again), or repair the named keys")


def _outer(t: Any) -> Any:
    """The JSON type of values of type ``t``."""
    origin = get_origin(t)
    return dict if is_dataclass(t) or origin is dict else list if origin in (list, tuple) else t


def _is(value: Any, t: Any) -> bool:
    t = _outer(t)
    if t is Any or isinstance(value, bool):
        return t in (Any, bool)
    return isinstance(value, t) or (t is float and isinstance(value, int)) or (t is list and isinstance(value, tuple))


def _kind(value: Any) -> str:
    return next((name for t, name in _NAMES.items() if _is(value, t)), type(value).__name__)


def _expected(t: Any) -> str:
    if get_origin(t) in (Union, types.UnionType):
        return " or ".join(_expected(a) for a in get_args(t))
    return _NAMES.get(_outer(t), "anything")


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return {**get_type_hints(cls), **_FIELD_TYPES.get(cls, {})}


def _load(t: Any, value: Any, where: str, problems: list[str]) -> Any:
    """``value`` read as type ``t`` (a dataclass from an object, ``list``/``tuple``/``dict[str, ...]``, a union
    with None, ``str``/``int``/``float``/``bool``, ``Any``); a mismatch goes to ``problems`` (and gives None)."""
    expected, origin, args = _expected(t), get_origin(t), get_args(t)
    if origin in (Union, types.UnionType):
        if value is None and NULL in args:
            return None
        t = next((a for a in args if a is not NULL and _is(value, a)), NULL)
        origin, args = get_origin(t), get_args(t)
    if not _is(value, t) or (origin is tuple and len(value) != len(args)):
        what = f"'{where}'" if where else "the top level"
        got = f"a list of {len(value)}" if origin is tuple and _is(value, t) else _kind(value)
        problems.append(f"{what} is {got}, expected {expected}{f' of {len(args)}' * (origin is tuple)}")
        return None
    if is_dataclass(t):
        return _load_record(t, value, where, problems)
    if origin in (list, tuple):
        inner = []  # only the first bad item of a long list is named
        items = [_load(args[0] if origin is list else args[i], v, f"{where}[{i}]", inner) for i, v in enumerate(value)]
        problems += [inner[0] + f" (and {len(inner) - 1} more in '{where}')" * (len(inner) > 1)] if inner else []
        return items if origin is list else tuple(items)
    if origin is dict:
        return {k: _load(args[1], v, f"{where}.{k}", problems) for k, v in value.items()}
    return value


def _load_record(cls: type, data: dict[str, Any], where: str, problems: list[str]) -> Any:
    """The dataclass ``cls`` from ``data``: a field with a default may be absent or null (it keeps the default);
    a record's ``_problems()`` checks what types cannot say."""
    kwargs = {}
    for f in fields(cls):
        key = f"{where}.{f.name}" if where else f.name
        optional = f.default is not MISSING or f.default_factory is not MISSING
        if data.get(f.name) is None and (optional or f.name not in data):
            if not optional:
                problems.append(f"'{key}' missing (expected {_expected(_field_types(cls)[f.name])})")
                kwargs[f.name] = None
            continue
        kwargs[f.name] = _load(_field_types(cls)[f.name], data[f.name], key, problems)
    record = cls(**kwargs)
    if hasattr(record, "_problems"):
        problems += record._problems(lambda key: f"'{where}.{key}'" if where else f"'{key}'")
    return record


def _parse(cls: type[R], data: Any, source: str | Path) -> R:
    problems: list[str] = []
    record = _load(cls, data, "", problems)
    if problems:
        raise SummaryError(f"{source}: malformed summary ({len(problems)} problem(s)): {'; '.join(problems)}",
                           _fix(source))
    return record


def _misaligned(key: str, values: list[Any] | None, ids_key: str, ids: list[str] | None) -> list[str]:
    if isinstance(values, list) and isinstance(ids, list) and len(values) != len(ids):
        return [f"{key} has {len(values)} values for the {len(ids)} ids of {ids_key}"]
    return []


class _Record:
    """``to_dict`` / ``from_dict`` of a summary record: its JSON keys are its field names, its field types say
    what ``from_dict`` accepts."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: Any, source: str | Path = "summary.json") -> R:
        """The record of ``data`` (JSON from ``source``), checked: :class:`SummaryError` names every bad key."""
        return _parse(cls, data, source)


def calibration_from_dict(data: Any, source: str | Path = "calibration.json") -> Calibration:
    """A method's calibration record (``calibration.json``, a summary's ``methods.<m>.calibration``), checked."""
    return _parse(Calibration, data, source)


@dataclass(kw_only=True)
class MetricRecord(_Record):
    """One QA metric of a method (:meth:`memreader.eval.score.MetricResult.to_dict`)."""

    metric: str  # display name: BLEU-1, ROUGE-L, ...
    value: float
    aggregation: str  # "mean" of per_example, or "corpus" (corpus-level BLEU: no paired test from per_example)
    ci_low: float
    ci_high: float
    interval: Interval
    signature: str  # equal signatures: comparable numbers
    per_example: list[float]  # aligned with ScoresRecord.ids


@dataclass(kw_only=True)
class ScoresRecord(_Record):
    """A method's QA scores: :meth:`memreader.eval.score.ScoreReport.to_dict` with per-question values."""

    profile: str
    config: dict[str, Any]  # the resolved metric settings
    n: int  # questions that count towards the means (n_total minus excluded_ids)
    n_total: int
    excluded_ids: list[str]
    metrics: dict[str, MetricRecord]
    ids: list[str]  # the scored question ids, in order
    versions: dict[str, str]
    seconds: float

    def _problems(self, at: Callable[[str], str]) -> list[str]:
        return [f"{at('metrics')} is empty"] * (self.metrics == {}) + [
            p for k, m in (self.metrics or {}).items() if m
            for p in _misaligned(at(f"metrics.{k}.per_example"), m.per_example, at("ids"), self.ids)]


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

    def _problems(self, at: Callable[[str], str]) -> list[str]:
        return _misaligned(at("per_example"), self.per_example, at("ids"), self.ids)


@dataclass(kw_only=True)
class ClarityRecord(_Record):
    """The evaluator's atomic-chunk clarity of a method's memories (eval/intrinsic/)."""

    per_memory: list[float | None]  # None: a single chunk, no boundary
    doc_ids: list[str]
    mean: float | None  # over the memories with a boundary
    signature: str
    n_single_chunk: int | None = None
    # MoC's boundary clarity ppl(q|d)/ppl(q) per memory (eval/intrinsic/); None: not measured (not the ppl variant)
    boundary_clarity: list[float | None] | None = None
    boundary_clarity_mean: float | None = None
    seconds: float | None = None  # what scoring these memories cost (None: a run from before it was recorded)

    @classmethod
    def of(cls, per_memory: Sequence[float | None], doc_ids: Sequence[str], signature: str) -> ClarityRecord:
        """The record of per-memory values (the mean over the memories with a boundary)."""
        scored = [v for v in per_memory if v is not None]
        return cls(per_memory=list(per_memory), doc_ids=list(doc_ids), signature=signature,
                   mean=math.fsum(scored) / len(scored) if scored else None,
                   n_single_chunk=len(per_memory) - len(scored))

    def with_boundary_clarity(self, values: Sequence[float | None]) -> ClarityRecord:
        """This record with boundary clarity per memory (and its mean over the memories with a boundary)."""
        scored = [v for v in values if v is not None]
        self.boundary_clarity = list(values)
        self.boundary_clarity_mean = math.fsum(scored) / len(scored) if scored else None
        return self

    def _problems(self, at: Callable[[str], str]) -> list[str]:
        out = _misaligned(at("per_memory"), self.per_memory, at("doc_ids"), self.doc_ids)
        if self.boundary_clarity is not None:
            out += _misaligned(at("boundary_clarity"), self.boundary_clarity, at("doc_ids"), self.doc_ids)
        return out


@dataclass(kw_only=True)
class StickinessRecord(_Record):
    """Chunk stickiness per memory: structural entropy of its chunk-similarity graph (eval/intrinsic/)."""

    per_memory: list[float | None]  # None: a memory of one chunk (no graph)
    edges: list[int]
    doc_ids: list[str]
    mean: float | None
    threshold: float  # the cosine above which two chunks are joined (a quantile of cross-document pairs)
    signature: str
    seconds: float

    def _problems(self, at: Callable[[str], str]) -> list[str]:
        return (_misaligned(at("per_memory"), self.per_memory, at("doc_ids"), self.doc_ids)
                + _misaligned(at("edges"), self.edges, at("doc_ids"), self.doc_ids))


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
        """Counts over :class:`memreader.core.schema.DocumentMemory` objects (from their ``meta``)."""
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


@dataclass(kw_only=True)
class CostRecord(_Record):
    """What a method cost over all the sessions that worked on it (``cost.json``, eval/costs.py)."""

    phases: dict[str, float]  # seconds per phase (memories, index, answers, clarity), summed over sessions
    seconds: float
    sessions: int
    peak_rss_mib: float  # largest resident memory of the process tree (rss_source says what was measured)
    rss_source: str


@dataclass(kw_only=True)
class MethodRecord(_Record):
    """Everything ``memreader eval`` measured of one method (its files are in ``methods/<name>/``)."""

    scores: ScoresRecord
    support: SupportRecord | None = None  # None: not measured
    clarity: ClarityRecord | None = None  # None: not measured
    stickiness: StickinessRecord | None = None  # None: not measured
    calibration: Calibration | None = None  # None: not calibrated
    provenance: ProvenanceRecord
    question_doc: dict[str, str | None]  # question id -> its (first) document
    mode: str  # retrieval mode used (chunk_only for methods without outlines and cores)
    mean_context_chars: float  # characters of retrieved context per question, mean
    questions_with_chunks_left_out: int | None = None  # chunks that did not fit the answerer's window
    seconds: float
    cost: CostRecord | None = None  # None: a run from before cost.json

    def _problems(self, at: Callable[[str], str]) -> list[str]:
        tolerance = self.calibration.tolerance if self.calibration else 0
        return [] if tolerance is None or 0 <= tolerance < 1 else [
            f"{at('calibration.tolerance')} is {tolerance}, expected a fraction in [0, 1)"]


@dataclass(kw_only=True)
class RunSettings(_Record):
    """The run's settings line (as printed) and the settings the numbers depend on."""

    line: str
    target_chars: int
    tolerance: float
    mode: str
    profile: str
    max_new_tokens: int


@dataclass(kw_only=True)
class DatasetRecord(_Record):
    """The question set (:meth:`memreader.eval.suites.EvalSet.describe`)."""

    name: str
    path: str
    n_questions: int
    n_documents: int
    corpus_chars: int
    mean_document_chars: float


@dataclass(kw_only=True)
class ProfileRecord(_Record):
    """Where the run's time went (:meth:`memreader.eval.answering.GenerationProfile.to_dict`)."""

    forward_share: float | None  # model forward passes' share of generation time (None: not timed)
    answers: int
    forward_calls: int
    seconds: dict[str, float]  # per phase


@dataclass(kw_only=True)
class EngineRecord(_Record):
    """What answered (:meth:`memreader.core.engines.EngineChoice.record`)."""

    stage: str
    backend: str
    dtype: str
    device: str = ""  # "": a run from before the device was recorded
    why: str = ""


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

    def _problems(self, at: Callable[[str], str]) -> list[str]:
        return [f"{at('methods')} is empty"] * (self.methods == {})
