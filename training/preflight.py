"""Pre-flight checks for SFT data: read and validate the JSONL, measure token lengths, guard truncation.

Every example is measured exactly as TRL will tokenize it; over-long ones (which TRL would cut from the end, i.e.
the target) refuse the run (``policy="refuse"``) or are dropped loudly (``policy="drop"``).
Details (data format, report): docs/TRAINING.md (Data; Pre-flight: token lengths and truncation).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memreader.core.errors import MemReaderError

log = logging.getLogger(__name__)

POLICIES = ("refuse", "drop")
_PROMPT_ROLES = {"system", "user"}
_WORST_SHOWN = 10


class DataFormatError(MemReaderError, ValueError):
    """An SFT JSONL file is malformed; the message lists every bad line."""


class PreflightError(MemReaderError, ValueError):
    """Examples would be truncated under ``truncation_policy=refuse``; the message names them and the fix."""


@dataclass
class ExampleLength:
    """Token counts of one example as TRL tokenizes it."""

    id: str
    prompt: int
    completion: int
    total: int
    prompt_is_prefix: bool


def _check_messages(value: Any, where: str, roles: set[str], problems: list[str]) -> None:
    if not isinstance(value, list) or not value:
        problems.append(f"{where}: expected a non-empty list of {{role, content}} messages, got {value!r:.80}")
        return
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            problems.append(f"{where}[{i}]: expected {{'role': ..., 'content': str}}, got {message!r:.80}")
        elif message.get("role") not in roles:
            problems.append(f"{where}[{i}]: role {message.get('role')!r} is not one of {sorted(roles)}")
        elif not message["content"].strip():
            problems.append(f"{where}[{i}]: empty content")


def load_sft_records(path: str | Path) -> list[dict[str, Any]]:
    """Read an SFT JSONL file and validate every line; raises :class:`DataFormatError` listing all problems."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"SFT data file {path} does not exist; run data_gen's SFT export or fix the path")
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path.name}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(f"{where}: not valid JSON ({err.msg} at column {err.colno})")
                continue
            if not isinstance(record, dict):
                problems.append(f"{where}: expected a JSON object, got {type(record).__name__}")
                continue
            rid = record.get("id")
            if not isinstance(rid, str) or not rid:
                problems.append(f"{where}: 'id' must be a non-empty string, got {rid!r}")
            elif rid in seen:
                problems.append(f"{where}: duplicate id {rid!r} (first on line {seen[rid]})")
            else:
                seen[rid] = lineno
            _check_messages(record.get("prompt"), f"{where} prompt", _PROMPT_ROLES, problems)
            _check_messages(record.get("completion"), f"{where} completion", {"assistant"}, problems)
            records.append(record)
    if not records and not problems:
        problems.append(f"{path}: no records (the file is empty)")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise DataFormatError(
            f"{path}: {len(problems)} problem(s) in the SFT data (expected TRL prompt-completion JSONL: "
            "id, prompt=[system/user messages], completion=[assistant message]):\n  - " + "\n  - ".join(shown)
        )
    return records


def measure(records: list[dict[str, Any]], tokenizer: Any, batch_size: int = 256) -> list[ExampleLength]:
    """Token lengths of each record, tokenized the way TRL's SFTTrainer does for conversational
    prompt-completion data: the completion starts where ``prompt + generation prompt`` and
    ``prompt + completion`` stop sharing tokens."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; use an instruct/chat "
            "model (e.g. Qwen/Qwen2.5-1.5B-Instruct) whose tokenizer ships one"
        )
    out: list[ExampleLength] = []
    for start in range(0, len(records), batch_size):
        batch = records[start:start + batch_size]
        prompts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in batch]
        fulls = [tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=False) for r in batch]
        # apply_chat_template(tokenize=True) renders then encodes without special tokens; batching is faster.
        prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        full_ids = tokenizer(fulls, add_special_tokens=False)["input_ids"]
        for record, p_ids, f_ids in zip(batch, prompt_ids, full_ids, strict=True):
            prompt_len = next((i for i, (x, y) in enumerate(zip(p_ids, f_ids, strict=False)) if x != y),
                              min(len(p_ids), len(f_ids)))  # the tokens the two share from the start
            out.append(ExampleLength(
                id=record["id"], prompt=prompt_len, completion=len(f_ids) - prompt_len, total=len(f_ids),
                prompt_is_prefix=prompt_len == len(p_ids),
            ))
    return out


def length_stats(values: list[int]) -> dict[str, float]:
    """min / mean / p50 / p95 / max of a list of token counts."""
    if not values:
        return {"min": 0, "mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "min": int(arr.min()), "mean": round(float(arr.mean()), 1), "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)), "max": int(arr.max()),
    }


def _describe(e: ExampleLength) -> str:
    return f"{e.id} ({e.total} = {e.prompt} prompt + {e.completion} completion)"


def check_lengths(
    records: list[dict[str, Any]], tokenizer: Any, max_length: int | None, policy: str, split: str = "train",
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measure ``records`` and apply the truncation policy.

    Returns the records to train on and a JSON-ready report. Raises :class:`PreflightError` when
    ``policy == "refuse"`` and any example's ``prompt + completion`` exceeds ``max_length`` (``None``: TRL
    truncates nothing, so no example is over).
    """
    if policy not in POLICIES:
        raise ValueError(f"truncation_policy {policy!r} is not one of {POLICIES}")
    if not records:
        raise PreflightError(f"{split}: no examples to check; pass a non-empty SFT JSONL file")
    lengths = measure(records, tokenizer)
    limit = max_length if max_length is not None else float("inf")
    over = sorted((e for e in lengths if e.total > limit), key=lambda e: e.total, reverse=True)
    target_lost = sum(1 for e in over if e.prompt >= limit)
    not_prefix = sum(1 for e in lengths if not e.prompt_is_prefix)
    report: dict[str, Any] = {
        "split": split,
        "max_length": max_length,
        "policy": policy,
        "examples": len(records),
        "over_max_length": len(over),
        "target_fully_lost": target_lost,
        "prompt_not_prefix": not_prefix,
        "prompt_tokens": length_stats([e.prompt for e in lengths]),
        "completion_tokens": length_stats([e.completion for e in lengths]),
        "total_tokens": length_stats([e.total for e in lengths]),
        "worst": [asdict(e) for e in over[:_WORST_SHOWN]],
    }
    if not_prefix:
        log.warning("%s: %d example(s) render the prompt differently alone than followed by the completion; "
                    "TRL starts their target where the two diverge", split, not_prefix)
    if over and policy == "refuse":
        worst = "; ".join(_describe(e) for e in over[:_WORST_SHOWN])
        longest = over[0].total
        raise PreflightError(
            f"{split}: {len(over)} of {len(records)} examples are longer than max_length={max_length} tokens "
            f"(prompt + completion with the chat template). TRL truncates from the end, so their targets would be "
            f"cut ({target_lost} lose the whole target) and the model would silently learn truncated memories.\n"
            f"  worst: {worst}\n"
            f"  fix: raise max_length to at least {longest} (p95 of all examples is "
            f"{report['total_tokens']['p95']:.0f}), or shorten the documents / window them into shorter token "
            f"windows in data_gen, or set truncation_policy=drop to train without these examples."
        )
    keep_ids = {e.id for e in lengths if e.total <= limit}
    kept = [r for r in records if r["id"] in keep_ids]
    report["dropped"] = len(records) - len(kept)
    report["kept"] = len(kept)
    if over:
        bar = "!" * 78
        log.warning(
            "\n%s\n!! DROPPING %d of %d %s examples longer than max_length=%d tokens (truncation_policy=drop)\n"
            "!! worst: %s\n!! raise max_length or window the documents to keep them\n%s",
            bar, len(over), len(records), split, max_length, "; ".join(_describe(e) for e in over[:3]), bar,
        )
    if not kept:
        raise PreflightError(
            f"{split}: every one of the {len(records)} examples exceeds max_length={max_length}; nothing is left "
            f"to train on. Raise max_length (longest is {over[0].total} tokens) or window the documents."
        )
    return kept, report


def format_report(report: dict[str, Any]) -> str:
    """One human-readable block of the length statistics of one split."""
    rows = [f"{report['split']}: {report['examples']} examples, {report['over_max_length']} over "
            f"max_length={report['max_length']}, {report.get('dropped', 0)} dropped"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        s = report[key]
        rows.append(f"  {key:<18} min {s['min']:>6}  mean {s['mean']:>8.1f}  p50 {s['p50']:>7.0f}  "
                    f"p95 {s['p95']:>7.0f}  max {s['max']:>6}")
    return "\n".join(rows)
