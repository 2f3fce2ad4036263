"""BLEU-1, BLEU-Avg, ROUGE-L and METEOR per example, with every number-changing option explicit.

    from memreader.eval.metrics import resolve_config, score_example
    s = score_example("厦门大学举办。", ["厦门大学。"], resolve_config("mom"))
    s.bleu_1, s.bleu_avg, s.rouge_l, s.meteor

Scoring whole sets: :mod:`memreader.eval.score`. Details (which library computes what, why BLEU is written here):
docs/EVALUATION.md (What is computed by which library).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memreader.core.config import ConfigError, field
from memreader.core.config import validate as validate_config
from memreader.core.errors import MemReaderError
from memreader.eval.tokenize import TOKENIZERS, init_jieba, postprocess, tokenize, tokenizer_signature
from memreader.eval.wordnet import find_wordnet

METRICS = ("bleu_1", "bleu_avg", "rouge_l", "meteor")
DISPLAY_NAMES = {"bleu_1": "BLEU-1", "bleu_avg": "BLEU-Avg", "rouge_l": "ROUGE-L", "meteor": "METEOR"}
# Bump when any scoring semantics here change; it is part of every signature.
EVAL_VERSION = "1.0"
_CHOICES = {
    "tokenizer": TOKENIZERS,
    "bleu_smoothing": ("none", "add1"),
    "bleu_level": ("sentence", "corpus"),
    "multi_ref": ("max", "first", "native"),
    "empty": ("zero", "skip"),
}


class MetricSetupError(MemReaderError, RuntimeError):
    """Something the metrics need is not installed; the message names the fix."""


@dataclass(frozen=True)
class MetricConfig:
    """Every setting that can change a score. Defaults are the ``mom`` profile."""

    tokenizer: str = field("jieba", help=f"tokenizer for all metrics: {', '.join(TOKENIZERS)}")
    keep_whitespace: bool = field(True, help="BLEU/ROUGE-L keep whitespace tokens (jieba emits them)")
    lowercase: bool = field(False, help="BLEU/ROUGE-L lower-case tokens after tokenizing")
    bleu_max_order: int = field(4, ge=1, help="largest n-gram order of BLEU-Avg")
    bleu_smoothing: str = field("none", help="'none', or 'add1' = (matches+1)/(total+1) at every order")
    bleu_brevity_penalty: bool = field(True, help="BLEU-Avg includes the brevity penalty (false: CRUD's bleu/bp)")
    bleu_level: str = field("sentence", help="'sentence': mean of per-example BLEU; 'corpus': pooled counts")
    meteor_alpha: float = field(0.9, ge=0, le=1, help="METEOR precision/recall weight")
    meteor_beta: float = field(3.0, ge=0, help="METEOR fragmentation penalty exponent")
    meteor_gamma: float = field(0.5, ge=0, le=1, help="METEOR fragmentation penalty weight")
    meteor_wordnet: bool = field(True, help="METEOR synonym stage with WordNet 3.0 (false: explicit wordnet:off)")
    meteor_keep_whitespace: bool = field(False, help="METEOR keeps whitespace tokens (MoM drops them)")
    meteor_lowercase: bool = field(True, help="METEOR lower-cases words (nltk's default preprocess)")
    multi_ref: str = field("max", help="several references: 'max' per metric, 'first', or 'native' (see docs)")
    empty: str = field("zero", help="blank prediction/reference: 'zero' scores 0, 'skip' leaves it out of means")

    def problems(self) -> list[str]:
        """Every invalid setting, as messages naming the value and the choices."""
        out = []
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), {"str": str, "bool": bool, "int": int, "float": float}[str(f.type)]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                continue
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                out.append(f"{f.name}: expected {kind.__name__}, got {value!r}")
            elif f.name in _CHOICES and value not in _CHOICES[f.name]:
                out.append(f"{f.name}: {value!r} is not one of {', '.join(_CHOICES[f.name])}")
        if isinstance(self.bleu_max_order, int) and not 1 <= self.bleu_max_order <= 9:
            out.append(f"bleu_max_order: {self.bleu_max_order!r} must be between 1 and 9")
        from memreader.core.config import range_problems

        out += [p for p in range_problems(self) if not p.startswith("bleu_max_order")]
        if self.bleu_level == "corpus" and self.multi_ref == "max":
            out.append("bleu_level 'corpus' pools counts, so multi_ref must be 'first' or 'native', not 'max'")
        return out


PROFILES: dict[str, MetricConfig] = {
    # The MoM notebook: jieba, per-example BLEU with penalty, rouge-score F, nltk METEOR.
    "mom": MetricConfig(),
    # CRUD-RAG src/metric/common.py: BLEU-Avg divided by its penalty; its evaluator drops blank answers.
    "crud": MetricConfig(bleu_brevity_penalty=False, empty="skip"),
}


def resolve_config(profile: str = "mom", **overrides: Any) -> MetricConfig:
    """The named profile with ``overrides`` applied, validated (all problems reported together)."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown metric profile {profile!r}; choose one of {', '.join(PROFILES)}")
    names = {f.name for f in dataclasses.fields(MetricConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown metric setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
    config = dataclasses.replace(PROFILES[profile], **overrides)
    validate_config(config)
    floats = {f.name: float(getattr(config, f.name)) for f in dataclasses.fields(config) if f.type == "float"}
    return dataclasses.replace(config, **floats)


def _num(x: float) -> str:
    """3.0 -> '3', 0.9 -> '0.9': short, and never rounded (distinct settings stay distinct)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def signatures(config: MetricConfig) -> dict[str, str]:
    """A sacrebleu-style signature per metric: the settings and library versions behind a number."""
    tok = tokenizer_signature(config.tokenizer)
    base = f"tok:{tok}|ws:{'keep' if config.keep_whitespace else 'drop'}|case:{'lc' if config.lowercase else 'mixed'}"
    tail = f"refs:{config.multi_ref}|empty:{config.empty}|mr-eval:{EVAL_VERSION}"
    bleu = f"smooth:{config.bleu_smoothing}|level:{config.bleu_level}"
    wordnet = find_wordnet() if config.meteor_wordnet else "off"
    meteor = (
        f"tok:{tok}|ws:{'keep' if config.meteor_keep_whitespace else 'drop'}"
        f"|case:{'lc' if config.meteor_lowercase else 'mixed'}|stem:porter|wordnet:{wordnet}"
        f"|alpha:{_num(config.meteor_alpha)}|beta:{_num(config.meteor_beta)}|gamma:{_num(config.meteor_gamma)}"
    )
    return {
        "bleu_1": f"BLEU-1|{base}|{bleu}|{tail}",
        "bleu_avg": f"BLEU-Avg|{base}|order:{config.bleu_max_order}|{bleu}"
        f"|bp:{'yes' if config.bleu_brevity_penalty else 'divided-out'}|{tail}",
        "rouge_l": f"ROUGE-L|score:F|{base}|{tail}|rouge-score:{importlib.metadata.version('rouge-score')}"
        f"|lcs:rapidfuzz-{importlib.metadata.version('rapidfuzz')}",
        "meteor": f"METEOR|{meteor}|{tail}|nltk:{importlib.metadata.version('nltk')}",
    }


@dataclass(frozen=True)
class BleuStats:
    """Sufficient statistics of BLEU for one example (or, summed, a corpus)."""

    matches: tuple[int, ...]
    possible: tuple[int, ...]
    hyp_len: int
    ref_len: int

    def __add__(self, other: BleuStats) -> BleuStats:
        add = lambda a, b: tuple(x + y for x, y in zip(a, b, strict=True))  # noqa: E731
        return BleuStats(add(self.matches, other.matches), add(self.possible, other.possible),
                         self.hyp_len + other.hyp_len, self.ref_len + other.ref_len)


@dataclass(frozen=True)
class ExampleScores:
    """The four scores of one example; ``blank`` marks an empty prediction or reference."""

    bleu_1: float
    bleu_avg: float
    rouge_l: float
    meteor: float
    blank: bool
    bleu_stats: BleuStats


def _ngram_counts(tokens: Sequence[str], max_order: int) -> Counter[tuple[str, ...]]:
    counts: Counter[tuple[str, ...]] = Counter()
    for order in range(1, max_order + 1):
        counts.update(zip(*(tokens[i:] for i in range(order)), strict=False))  # shorter tails end it
    return counts


def bleu_stats(hyp: Sequence[str], refs: Sequence[Sequence[str]], max_order: int = 4) -> BleuStats:
    """Clipped n-gram matches as nmt-BLEU counts them: clip against the union of the references'
    counts, reference length = the shortest reference."""
    if not refs:
        raise ValueError("bleu_stats needs at least one reference")
    merged: Counter[tuple[str, ...]] = Counter()
    for ref in refs:
        merged |= _ngram_counts(ref, max_order)
    overlap = _ngram_counts(hyp, max_order) & merged
    matches = [0] * max_order
    for ngram, count in overlap.items():
        matches[len(ngram) - 1] += count
    possible = tuple(max(len(hyp) - order + 1, 0) for order in range(1, max_order + 1))
    return BleuStats(tuple(matches), possible, len(hyp), min(len(r) for r in refs))


def bleu_from_stats(stats: BleuStats, config: MetricConfig) -> tuple[float, float]:
    """``(BLEU-1, BLEU-Avg)`` from counts, with nmt-BLEU's float operations in its order.

    BLEU-1 is the (optionally smoothed) clipped unigram precision, never length-penalised.
    BLEU-Avg is the geometric mean of the 1..N precisions, times the brevity penalty when
    ``bleu_brevity_penalty``; otherwise CRUD-RAG's ``bleu / bp`` (0 when ``bp`` is 0).
    An empty hypothesis has penalty 0 and an empty reference penalty 1 (nmt-BLEU divides by zero).
    """
    order = config.bleu_max_order
    add1 = config.bleu_smoothing == "add1"
    precisions = [(m + 1.0) / (p + 1.0) if add1 else float(m) / p if p > 0 else 0.0
                  for m, p in zip(stats.matches, stats.possible, strict=True)]
    geo_mean = math.exp(sum((1.0 / order) * math.log(p) for p in precisions)) if min(precisions) > 0 else 0.0
    if stats.hyp_len == 0:
        bp = 0.0
    elif stats.ref_len == 0:
        bp = 1.0
    else:
        ratio = float(stats.hyp_len) / stats.ref_len
        bp = 1.0 if ratio > 1.0 else math.exp(1 - 1.0 / ratio)
    bleu = geo_mean * bp
    if not config.bleu_brevity_penalty:
        bleu = 0.0 if bp == 0 else bleu / bp
    return precisions[0], bleu


def rouge_l(hyp: Sequence[str], ref: Sequence[str]) -> float:
    """ROUGE-L F-measure of two token lists, exactly as rouge-score's ``_score_lcs`` defines it."""
    from rapidfuzz.distance import LCSseq
    from rouge_score import scoring

    if not hyp or not ref:
        return 0.0
    # Integer ids make rapidfuzz compare tokens exactly (no hashing of strings involved).
    vocab: dict[str, int] = {}
    lcs = LCSseq.similarity([vocab.setdefault(t, len(vocab)) for t in ref], [vocab.setdefault(t, len(vocab)) for t in hyp])
    return scoring.fmeasure(lcs / len(hyp), lcs / len(ref))


class _Memo:
    """Memoises a pure one-argument method (a stemmer's ``stem``, WordNet's ``synsets``): METEOR
    asks for the same words over and over. Same answers, so the same scores."""

    def __init__(self, target: Any, method: str, limit: int = 500_000) -> None:
        self._call, self._cache, self._limit = getattr(target, method), {}, limit
        setattr(self, method, self._lookup)

    def _lookup(self, word: str) -> Any:
        hit = self._cache.get(word)
        if hit is None:
            if len(self._cache) >= self._limit:
                self._cache.clear()
            hit = self._cache[word] = self._call(word)
        return hit


class NoWordNet:
    """WordNet stand-in whose ``synsets`` finds nothing: METEOR's synonym stage off (``wordnet:off``)."""

    def synsets(self, lemma: str, pos: str | None = None, lang: str = "eng", check_exceptions: bool = True) -> list:
        return []


class _Scorers:
    """Per-process scorer objects for one config (WordNet and jieba load once)."""

    def __init__(self, config: MetricConfig) -> None:
        from nltk.stem.porter import PorterStemmer

        validate_config(config)
        if config.tokenizer == "jieba":
            init_jieba()
        self.stemmer: Any = _Memo(PorterStemmer(), "stem")
        if config.meteor_wordnet:
            find_wordnet()
            from nltk.corpus import wordnet

            self.wordnet: Any = _Memo(wordnet, "synsets")
        else:
            self.wordnet = NoWordNet()


_scorers = functools.cache(_Scorers)


def prepare(config: MetricConfig) -> None:
    """Check the config and load everything it needs now (jieba, WordNet), failing early."""
    _scorers(config)


def reopen_wordnet_files() -> None:
    """In a forked worker: close the WordNet data files inherited from the parent, so this process opens its own.

    nltk's WordNet reader keeps one open file per part of speech (:func:`find_wordnet`'s ``get_version`` opens
    data.adj, every synset lookup may open more), and a forked child shares each open file's offset with its
    parent and its siblings: two workers that seek and read in the same file read each other's lines, which gives
    a wrong synset, or nltk's "No WordNet synset found" and an ``AttributeError`` (met on the full MultiFieldQA-zh
    run). Closing the child's copies leaves the parent's files as they are.
    """
    import sys

    if "nltk.corpus" not in sys.modules:
        return
    import nltk
    from nltk.corpus import wordnet

    if type(wordnet).__name__ == "LazyCorpusLoader":  # never loaded in the parent: nothing inherited
        return
    files = getattr(wordnet, "_data_file_map", None)
    if not isinstance(files, dict):
        raise MetricSetupError(f"this nltk ({nltk.__version__}) keeps WordNet's open data files in a way memreader.eval.metrics "
                               "does not know, so scoring workers forked from this process could share them and read "
                               "wrong synsets. Score in one process (`memreader score --workers 1`, or `workers=1` "
                               "in Python), or install nltk 3.10, whose reader keeps them in `_data_file_map`")
    for handle in files.values():
        handle.close()
    files.clear()


def _meteor(hyp: list[str], ref: list[str], config: MetricConfig, scorers: _Scorers) -> float:
    from nltk.translate.meteor_score import single_meteor_score

    return single_meteor_score(ref, hyp, preprocess=str.lower if config.meteor_lowercase else str,
                               stemmer=scorers.stemmer, wordnet=scorers.wordnet, alpha=config.meteor_alpha,
                               beta=config.meteor_beta, gamma=config.meteor_gamma)


def score_example(prediction: str, references: str | Sequence[str], config: MetricConfig) -> ExampleScores:
    """The four scores of one prediction against its reference(s): the one-at-a-time path."""
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        raise ValueError("an example needs at least one reference answer")
    for ref in [prediction, *refs]:
        if not isinstance(ref, str):
            raise TypeError(f"predictions and references must be strings, got {type(ref).__name__}: {ref!r:.80}")
    scorers = _scorers(config)
    order = config.bleu_max_order
    refs = [r for r in refs if r.strip()] or [""]
    if config.multi_ref == "first":
        refs = refs[:1]
    if not prediction.strip() or not refs[0].strip():
        zero = BleuStats((0,) * order, (0,) * order, 0, 0)
        return ExampleScores(0.0, 0.0, 0.0, 0.0, True, zero)

    hyp_raw = tokenize(prediction, config.tokenizer)
    refs_raw = [tokenize(r, config.tokenizer) for r in refs]
    hyp = postprocess(hyp_raw, config.keep_whitespace, config.lowercase)
    ref_toks = [postprocess(r, config.keep_whitespace, config.lowercase) for r in refs_raw]
    hyp_m = postprocess(hyp_raw, config.meteor_keep_whitespace, False)
    refs_m = [postprocess(r, config.meteor_keep_whitespace, False) for r in refs_raw]

    rouge = max(rouge_l(hyp, ref) for ref in ref_toks)
    meteor = max(_meteor(hyp_m, ref, config, scorers) for ref in refs_m)
    if config.multi_ref == "max":
        per_ref = [bleu_stats(hyp, [ref], order) for ref in ref_toks]
        scored = [bleu_from_stats(s, config) for s in per_ref]
        bleu_1 = max(b1 for b1, _ in scored)
        best = max(range(len(scored)), key=lambda i: scored[i][1])
        bleu_avg, stats = scored[best][1], per_ref[best]
    else:
        stats = bleu_stats(hyp, ref_toks, order)
        bleu_1, bleu_avg = bleu_from_stats(stats, config)
    return ExampleScores(bleu_1, bleu_avg, rouge, meteor, False, stats)


def corpus_bleu(scores: Sequence[ExampleScores], config: MetricConfig) -> tuple[float, float]:
    """Corpus-level ``(BLEU-1, BLEU-Avg)``: statistics pooled over examples before the ratios."""
    order = config.bleu_max_order
    return bleu_from_stats(sum((s.bleu_stats for s in scores), BleuStats((0,) * order, (0,) * order, 0, 0)), config)
