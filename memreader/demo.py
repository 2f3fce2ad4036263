"""``memreader demo``: every stage, for real, on the embedded models and the demo corpus (one ``memreader`` command
each, with the configs and data the package ships, so it runs from an installed wheel outside any checkout), then
checks the run; ``--check-only`` checks an existing run without running anything. ``make demo`` runs it; it is the
CPU smoke of the GPU recipe ``scripts/speedrun.sh``.

    memreader demo                                   # what make demo runs
    memreader demo --run demo2 --set train_steps=4
    memreader demo --set teacher=openai --set teacher_model=deepseek-chat   # MEMREADER_TEACHER_BASE_URL/_API_KEY
    memreader demo --check-only --run demo           # the checks of artifacts/runs/demo (the demo's last step)

Stages (one ``memreader`` command each, YAMLs in ``memreader/demo_data/configs/``, linked as configs/demo/): teacher generation (the
embedded SmolLM2 as teacher: two guided candidates per document, scored by the same model as evaluator, RRF
keeps one) → LoRA SFT (TRL) → MemReader reading with the adapter → three-layer Milvus Lite index + one question,
over the layers and with MeVe → QA evaluation against chunkers calibrated to the same chunk length → report with
plots → these checks. Everything lands under ``$MEMREADER_HOME/runs/<run>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.errors import MemReaderError, RunFailed
from memreader.core.paths import run_dir, write_json
from memreader.core.registry import SMOLLM2
from memreader.core.stage import Flag, Stage

DEMO_DATA = Path(__file__).with_name("demo_data")
DEMO_CONFIGS = DEMO_DATA / "configs"  # configs/demo in a checkout is a link to this folder


@dataclass
class DemoConfig:
    """Knobs of the demo run; every stage's own settings are in configs/demo/*.yaml."""

    run: str = field("demo", help="run name under $MEMREADER_HOME/runs/")
    teacher: str = field("auto", help="'auto' (the embedded model on the fastest in-process engine measured here), "
                         "'local' (transformers), 'vllm', or 'openai' (any OpenAI-compatible endpoint from "
                         "MEMREADER_TEACHER_BASE_URL / _API_KEY): a real teacher fills every layer")
    teacher_model: str = field(SMOLLM2, help="teacher model (for teacher=openai e.g. deepseek-chat)")
    train_steps: int = field(8, ge=1, help="LoRA optimizer steps")
    question: str = field("How many compost bays stand behind the tool shed?", help="sample question for 'ask'")

    def problems(self) -> list[str]:
        """Problems beyond types."""
        teachers = ("auto", "local", "transformers", "vllm", "openai")
        return [] if self.teacher in teachers else [f"teacher: {self.teacher!r} is not one of {', '.join(teachers)}"]


def adapter_changed(adapter_dir: Path) -> float:
    """Largest |lora_B| entry of a saved adapter. PEFT initialises every lora_B to zero, so a
    positive value proves the weights moved away from their initialisation."""
    from safetensors.torch import load_file

    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    b_mats = [t for k, t in tensors.items() if "lora_B" in k]
    if not b_mats:
        raise RuntimeError(f"{adapter_dir}: no lora_B tensors in adapter_model.safetensors")
    return max(float(t.abs().max()) for t in b_mats)


def demo_steps(cfg: DemoConfig, memreader: str) -> list[tuple[str, list[str]]]:
    """The demo's stages as (title, ``memreader`` command line), with the configs and data
    read from the installed package, so that the demo runs from a wheel outside any checkout."""
    r = run_dir(cfg.run)
    conf = lambda name: str(DEMO_CONFIGS / f"{name}.yaml")  # noqa: E731
    corpus, qa = str(DEMO_DATA / "corpus.jsonl"), str(DEMO_DATA / "qa.jsonl")
    run = ["--set", f"run={cfg.run}"]
    retrieval = [memreader, "ask", "--config", conf("retrieval"), *run]
    return [
        ("1/7 teacher: guided candidate memories, evaluator scores, RRF selection, reasoning paths, SFT data",
         [memreader, "gen", "--config", conf("gen"), *run, "--set", f"teacher={cfg.teacher}",
          "--set", f"model={cfg.teacher_model}", "--set", f"input={corpus}"]),
        (f"2/7 LoRA SFT with TRL on the teacher's data ({cfg.train_steps} steps)",
         [memreader, "train", "--config", conf("train"), *run, "--set", f"max_steps={cfg.train_steps}",
          "--set", f"train_file={r / 'gen' / 'sft_train.jsonl'}", "--set", f"val_file={r / 'gen' / 'sft_val.jsonl'}"]),
        ("3/7 MemReader reads the corpus with the new adapter (and SmolLM2's cut head: its breaks in every grammar)",
         [memreader, "read", "--config", conf("read"), *run, "--set", f"adapter={r / 'train'}",
          "--set", f"input={corpus}", "--set", f"cut_head={DEMO_DATA / 'cut_head'}"]),
        ("4/7 three-layer Milvus Lite index", [memreader, "index", "--config", conf("retrieval"), *run]),
        ("4/7 one question over the layers", [*retrieval, "--html", str(r / "view" / "layers.html"), cfg.question]),
        ("4/7 the same with MeVe (audit saved)", [*retrieval, "--pipeline", "meve", "--save", str(r / "retrieval" /
                                                  "meve_answer.json"), "--html", str(r / "view" / "meve.html"),
                                                  cfg.question]),
        ("5/7 QA evaluation: MemReader memories vs chunkers calibrated to the same chunk length",
         [memreader, "eval", "--config", conf("eval"), *run, "--set", f"memories={r / 'read' / 'memories.jsonl'}",
          "--set", "report=false", "--set", f"qa={qa}"]),
        ("6/7 report (Markdown with plots, report.html)", [memreader, "report", cfg.run]),
        ("6/7 the viewer page of the run's memories", [memreader, "view", str(r / "read" / "memories.jsonl"),
                                                       "--out", str(r / "view" / "memories.html")]),
        ("6/7 the viewer page of the teacher's candidates",
         [memreader, "view", str(r / "gen" / "memories.jsonl"), "--candidates", str(r / "gen" / "candidates.jsonl"),
          "--out", str(r / "view" / "candidates.html")]),
    ]


VIEWER_PAGES = ("view/memories.html", "view/candidates.html", "view/meve.html", "view/layers.html",
                "eval/report/report.html")
"""The demo's offline HTML pages, under its run folder (printed by its checks)."""


def run_steps(cfg: DemoConfig) -> int:
    """Run :func:`demo_steps` one after the other, stopping at the first that fails; returns its exit code."""
    memreader = os.environ.get("MEMREADER", str(Path(sys.executable).with_name("memreader")))
    start = time.monotonic()
    (run_dir(cfg.run) / "read" / "memories.jsonl").unlink(missing_ok=True)  # read with an earlier adapter
    for title, command in demo_steps(cfg, memreader):
        print(f"\n=== [{time.monotonic() - start:.0f} s] {title} ===", flush=True)
        code = subprocess.run(command, check=False).returncode
        if code:
            print(f"demo: step {title!r} stopped with exit code {code}: {' '.join(command)}", file=sys.stderr)
            return code
    print(f"\n=== [{time.monotonic() - start:.0f} s] 7/7 checks of the whole run ===", flush=True)
    return print_checks(cfg.run)


def _load(path: Path, made_by: str) -> dict[str, Any]:
    if not path.is_file():
        raise MemReaderError(f"{path} is missing: {made_by} has not run for this run name (run `memreader demo --run "
                              f"{path.parents[1].name}`)")
    return json.loads(path.read_text(encoding="utf-8"))


def check_run(run: str) -> tuple[dict[str, str], list[str]]:
    """The checks of a finished demo run, read from its artifacts, and the ones that failed."""
    from memreader.core.fusion import LAYERS
    from memreader.core.schema import read_memories
    from memreader.retrieval.index import MemoryIndex

    gen = _load(run_dir(run, "gen") / "manifest.json", "step 1 (memreader gen)")
    trained = _load(run_dir(run, "train") / "summary.json", "step 2 (memreader train)")
    read = _load(run_dir(run, "read") / "summary.json", "step 3 (memreader read)")
    meve = _load(run_dir(run, "retrieval") / "meve_answer.json", "step 4 (memreader ask --pipeline meve --save)")
    qa = _load(run_dir(run, "eval") / "summary.json", "step 5 (memreader eval)")
    memories = read_memories(run_dir(run, "read") / "memories.jsonl")  # validated (tiling) on read
    with MemoryIndex.open(run_dir(run, "retrieval") / "memories.db") as index:
        counts = index.counts()
    lora_b_max = adapter_changed(run_dir(run, "train"))
    usable_read = read["read"] - read["fallback_whole_document"]
    t_max = meve["audit"]["settings"]["t_max"]
    tokens = int(meve["audit"]["tokens"])
    report_md = run_dir(run, "eval") / "report" / "report.md"
    pages = [run_dir(run) / p for p in VIEWER_PAGES]
    checks = {
        "usable teacher replies": f"{gen['memories'] - len(gen['whole_document_fallbacks'])}/{gen['documents']} "
                                  f"({gen['guided']} guided, {len(gen['whole_document_fallbacks'])} whole-document "
                                  f"fallbacks, {gen['extraction_fates'].get('truncated-skipped', 0)} cut off)",
        "usable MemReader outputs": f"{usable_read}/{read['documents']} ({read['guided']} guided, "
                                    f"{read['fallback_whole_document']} whole-document fallbacks, "
                                    f"{read['truncated_skipped']} cut off)",
        "candidate selection": _selection_line(gen),
        "reasoning paths (CoM)": _reasoning_line(gen),
        "scenarios per memory": _scenario_line(memories),
        "memories tile their documents": f"{len(memories)} memories validated on write and re-read",
        "cut head (breaks in the grammars)": _cut_line(read, memories),
        "adapter moved from init": f"max |lora_B| = {lora_b_max:.3g} (init 0)",
        "index layers": ", ".join(f"{k}={counts.get(k, 0)}" for k in (*LAYERS, "single")),
        "MeVe (ask --pipeline meve)": f"{len(meve['passages'])} passages, {tokens} tokens <= t_max {t_max}; fallback "
                                      f"{'fired' if meve['audit']['fallback'].get('fired') else 'not needed'}",
        "training loss": f"{trained['first_loss']:.3f} -> {trained['last_loss']:.3f} over {trained['steps']} steps",
        "QA methods": ", ".join(f"{m} ({v['calibration']['mean_chars']} chars)" for m, v in qa["methods"].items()),
        "report": str(report_md) if report_md.is_file() else "missing",
        "viewer pages": f"{sum(p.is_file() for p in pages)}/{len(pages)} written (paths below)",
    }
    failed = [name for name, bad in (
        ("memories", not memories or len(memories) != read["documents"]),
        ("adapter moved from init", lora_b_max <= 0.0),
        ("usable MemReader outputs", usable_read == 0),
        ("cut head (breaks in the grammars)", not read.get("cut_head")),
        ("MeVe budget", tokens > t_max),
        ("index layers", counts.get("chunk", 0) == 0),
        ("report", not report_md.is_file()),
        ("viewer pages", not all(p.is_file() for p in pages)),
    ) if bad]
    return checks, failed


def _cut_line(read: dict[str, Any], memories: list[Any]) -> str:
    """Which cut head the reader used, on how many documents, how many breaks it put in and what it cost."""
    head = read.get("cut_head")
    if not head:
        return "not used (the reader ran without a head)"
    cuts = [m.meta.get("cuts") or {} for m in memories]
    breaks = sum(len(c.get("breaks", [])) for c in cuts)
    return (f"{sum(bool(c) for c in cuts)}/{len(memories)} memories scored at {sum(len(c.get('ends', [])) for c in cuts)}"
            f" allowed ends, {breaks} breaks at threshold {head['threshold']} ({head['seconds']} s)")


def _selection_line(gen: dict[str, Any]) -> str:
    """How many candidates were sampled and scored, and which evaluator chose."""
    sel = gen["selection"]
    scored = sel["scored_now"] + sel["scores_cached"]
    return (f"N={sel['num_candidates']}: {sel['candidates']} usable candidates, {scored} scored by {sel['evaluator']} "
            f"(clarity={sel['clarity_variant']}), RRF k={sel['rrf_k']:g} kept one per document")


def _reasoning_line(gen: dict[str, Any]) -> str:
    """Reasoning paths kept, why the others are missing, and a plain sentence when the teacher wrote none."""
    n = gen["memories"]
    line = f"{n - len(gen['without_reasoning'])}/{n}"
    info = gen.get("reasoning")  # manifests of runs before it was recorded have only the count
    if not info:
        return f"{line} (a cut-off reasoning is left out of its SFT target)"
    fates = info["fates"]
    cut, budget = fates.get("truncated-skipped", 0), info["retry_max_new_tokens"] or info["max_new_tokens"]
    skipped = fates.get("not-asked", 0)
    why = [f"{count} {what}" for count, what in ((cut, f"cut off at {budget} tokens"),
                                                  (fates.get("error", 0), "failed requests"),
                                                  (fates.get("empty", 0), "empty replies"),
                                                  (skipped, "not asked: every probe was cut off")) if count]
    line += f" ({', '.join(why)}; left out of the SFT targets)" if why else ""
    if cut and cut == info["requests"] and n == len(gen["without_reasoning"]):
        line += (f": {gen['teacher']['model']} did not end one reasoning within {budget} tokens, so every SFT "
                 "target is the memory alone; a stronger teacher (TEACHER=openai) writes them")
        if skipped:
            line += f" (the first {cut} asked, com_probe={info.get('probe')}; the other {skipped} never run)"
    return line


def _scenario_line(memories: list[Any]) -> str:
    """Scenarios per memory and mean chunk length, e.g. ``2-4 (mean 2.9), chunks mean 312 chars``."""
    if not memories:
        return "no memories"
    counts = [len(m.scenarios) for m in memories]
    lengths = [s.end - s.start for m in memories for s in m.scenarios]
    return (f"{min(counts)}-{max(counts)} (mean {sum(counts) / len(counts):.1f}), chunks mean "
            f"{sum(lengths) / len(lengths):.0f} chars")


def print_checks(run: str) -> int:
    """Print the run's checks and QA table; 1 when a check failed (named)."""
    checks, failed = check_run(run)
    write_json(run_dir(run) / "demo_summary.json", {"checks": checks, "failed": failed})
    print("Checks:")
    for k, v in checks.items():
        print(f"  {k:<30} {v}")
    report = run_dir(run, "eval") / "report.txt"
    if report.is_file():
        print("\nQA:\n" + report.read_text(encoding="utf-8"))
    print("Viewer pages (open offline in a browser):")
    for page in VIEWER_PAGES:
        path = run_dir(run) / page
        print(f"  {path.resolve().as_uri() if path.is_file() else f'{path} (missing)'}")
    if failed:
        raise RunFailed(f"demo run {run!r}: check(s) failed: {', '.join(failed)} (see the lines above)")
    print(f"demo: every check holds for {run_dir(run)}")
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check-only", action="store_true", help="only check an existing run (the demo's last step)")


def _run_stage(cfg: DemoConfig, args: argparse.Namespace) -> int:
    if args.check_only:
        return print_checks(cfg.run)
    code = run_steps(cfg)
    if code:
        raise RunFailed(f"the demo stopped with exit code {code}; the failing step's message is above "
                        "(finished stages are kept under the run folder)")
    return 0


STAGE = Stage("demo", "every stage on the embedded models and the demo corpus (what make demo runs), checked", run=_run_stage,
              config=DemoConfig, arguments=_arguments, needs_args=True, flags=(Flag("run", help="run name (default: demo)"),))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("demo"))
