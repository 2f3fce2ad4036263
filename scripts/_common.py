"""Code that several scripts share and that is no product code: the one module a script may import from another
(``from _common import ...``; a script run as ``python scripts/x.py`` has ``scripts/`` on its path).

- **Evidence in a context** (:func:`evidence_chunks`): where a question's answer lies among the chunks of its
  context, the definition ``bench_embedders.py`` and ``bench_layers.py`` both score against.
- **Support corpora for MeVe** (:data:`DATASETS`): where the public files lie, ``bench_meve.py``'s default
  ``--data-dir`` (the corpora, their stores and the top-k baseline: memreader.eval.support_corpora).
- **Report tables** (:func:`mean_cell`, :func:`delta_cell`, :func:`settings_line`, :func:`emit_table`): a mean's and a
  paired difference's cell with their bootstrap intervals, the settings line and the print-and-save of a table, for ``bench_embedders.py``, ``bench_layers.py`` and ``bench_layer_latency.py``.
- **The CPU** (:func:`cpu_label`): its model and bf16 flags, for ``bench_cut_read.py`` and ``bench_train_speed.py``.
- **Memories per method** (:func:`method_file`): the ``--method NAME=memories.jsonl`` argument of
  ``bench_segmentation.py``, ``bench_structure_retrieval.py`` and ``profile_cuts.py``.
- **Qwen2.5 shapes** (:data:`SHAPES`, :data:`SMOKE`, :func:`versions`): the config values the GPU checks
  ``gpu_sft_mfu.py`` and ``gpu_decode_step.py`` build their random-weight models from.

Only the standard library is imported here at import time: the GPU scripts run where the project is not installed,
and a script that uses one helper does not pay for the others' imports.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# -------- report tables (bench_embedders, bench_layers, bench_layer_latency) --------


def mean_cell(values: Any) -> str:
    """The mean of ``values`` with its bootstrap 95% interval (:func:`memreader.eval.stats.bootstrap_ci`)."""
    from memreader.eval.stats import bootstrap_ci

    ci = bootstrap_ci(values)
    return f"{values.mean():.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def delta_cell(a: Any, b: Any) -> str:
    """``mean(a - b)`` with its paired bootstrap 95% interval (:func:`memreader.eval.stats.paired_bootstrap`)."""
    from memreader.eval.stats import paired_bootstrap

    test = paired_bootstrap(a, b)
    return f"{test.delta:+.3f} [{test.interval.low:+.3f}, {test.interval.high:+.3f}]"


def settings_line(what: str, seconds: float, machine: bool = False) -> str:
    """The table's closing ``settings:`` line: ``what`` was run, the bootstrap of :func:`mean_cell` and
    :func:`delta_cell` (the defaults of memreader.eval.stats), Python (``machine``: and the CPU) and the time."""
    cpu = f", {platform.machine()} CPU x{len(os.sched_getaffinity(0))}" if machine else ""
    return (f"settings: {what}; bootstrap 1000 draws, seed 12345; Python {platform.python_version()}{cpu}; "
            f"{seconds:.0f} s.")


def emit_table(lines: Sequence[str], out: str | None) -> int:
    """Print the table ``lines``, write them to ``out`` too when given; the script's exit status 0."""
    table = "\n".join(lines)
    print(table)
    if out:
        Path(out).write_text(table + "\n", encoding="utf-8")
    return 0


def cpu_label() -> str:
    """The CPU a figure was measured on (bench_cut_read, bench_train_speed): its model and its bf16-relevant flags."""
    from memreader.core.hardware import cpu_flags, cpu_model

    return f"{cpu_model()} ({', '.join(cpu_flags()) or 'no avx2/avx512/bf16 flags'})"


# -------- evidence chunks (bench_embedders, bench_layers) --------

_PUNCT_EDGES = re.compile(r"^[\s\W_]+|[\s\W_]+$", re.UNICODE)


def _strip(text: str) -> str:
    return _PUNCT_EDGES.sub("", text)


def _words(text: str) -> set[str]:
    import jieba

    return {w.lower() for w in jieba.lcut(text)
            if w.strip() and not all(unicodedata.category(c)[0] in "PSZ" for c in w)}


def evidence_chunks(question: str, context: str, spans: list[tuple[int, int]], answers: list[str],
                    min_overlap: float) -> tuple[set[int], str]:
    """Indices of the chunks (``spans`` of ``context``) that hold a question's answer, and how they were found.

    Answers and context are compared after stripping whitespace and punctuation at the answer's ends. If a
    reference answer occurs verbatim in the context, every chunk overlapping an occurrence is evidence
    (``exact``). Otherwise the answer is cut into jieba words (punctuation dropped; words the question also holds
    are dropped too, unless nothing else is left, since answers often restate the question) and each chunk scores
    the share of those distinct words it contains; the chunk(s) with the highest share are evidence
    (``overlap``), provided that share is at least ``min_overlap``; else there is none (``none``)."""
    exact: set[int] = set()
    for answer in answers:
        needle = _strip(answer)
        if not needle:
            continue
        start = context.find(needle)
        while start != -1:
            end = start + len(needle)
            exact |= {i for i, (s, e) in enumerate(spans) if s < end and start < e}
            start = context.find(needle, start + 1)
    if exact:
        return exact, "exact"
    words = set().union(*(_words(a) for a in answers))
    # Answers often restate the question ("2012年，铜仁市的财政总收入增长了25.89%"): only the words
    # the question lacks say where the answer is, unless the answer has no others.
    words = (words - _words(question)) or words
    if not words:
        return set(), "none"
    shares = [len(words & _words(context[s:e])) / len(words) for s, e in spans]
    best = max(shares)
    if best < min_overlap:
        return set(), "none"
    return {i for i, share in enumerate(shares) if share == best}, "overlap"


# -------- support corpora for MeVe (bench_meve) --------

DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
"""The offline copies of the public benchmark files (``../shared/datasets``): the default ``--data-dir``."""


# -------- memories per method (bench_segmentation, bench_structure_retrieval, profile_cuts) --------


def method_file(value: str) -> tuple[str, Path]:
    """A benchmark's ``--method NAME=memories.jsonl`` argument as ``(name, path)`` (argparse ``type=``)."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{value!r}: give NAME=memories.jsonl, e.g. fixed=runs/x/memories.jsonl")
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{path} does not exist (the memories of method {name!r})")
    return name, Path(path)


# -------- Qwen2.5 shapes for the GPU checks (gpu_sft_mfu, gpu_decode_step) --------

# the Qwen2.5-1.5B config.json values (Qwen/Qwen2.5-1.5B), written out so no hub access is needed
QWEN25_1P5B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    bos_token_id=151643,
    eos_token_id=151643,
)
# Qwen2.5-3B and Qwen2.5-7B differ in size only (config.json values of Qwen/Qwen2.5-3B and Qwen/Qwen2.5-7B-Instruct);
# the 7B model does not tie its LM head to the embedding
QWEN25_3B = {**QWEN25_1P5B, **dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                   num_attention_heads=16, num_key_value_heads=2)}
QWEN25_7B = {**QWEN25_1P5B, **dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                   num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                   tie_word_embeddings=False)}
SHAPES = {"1.5b": ("Qwen2.5-1.5B", QWEN25_1P5B), "3b": ("Qwen2.5-3B", QWEN25_3B), "7b": ("Qwen2.5-7B", QWEN25_7B)}
"""``--shape`` → (model name, Qwen2Config keyword arguments)."""
# --smoke: same architecture, toy sizes
SMOKE = {**QWEN25_1P5B, **dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=512, max_position_embeddings=512, bos_token_id=1, eos_token_id=1)}
"""The Qwen2.5 layout at toy size, for the CPU ``--smoke`` runs."""


def versions() -> dict[str, Any]:
    """Python, torch, CUDA and the training libraries' versions (None where a library does not import)."""
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "trl", "peft", "accelerate", "datasets", "pyarrow", "flash_attn"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception:  # noqa: BLE001 - any import failure just means "not available"
            out[name] = None
    out["cuda"] = torch.version.cuda
    return out

