"""``memreader demo``: every stage, for real, on the embedded models and the bundled demo corpus.

    memreader demo                    # ~9.5 minutes on a 2-core CPU
    memreader demo --run demo2 --set train_steps=4

Stages: teacher generation (embedded SmolLM2 as teacher: two candidates per document, scored by the
same model as evaluator, RRF keeps one) → LoRA SFT (TRL) → MemReader reading
with the adapter → three-layer Milvus Lite index + one sample question → QA evaluation against a
fixed-length chunking baseline. Teacher and reader decode guided (``guided=auto``): each
document's memory grammar makes a valid, exactly tiling memory with several scenarios the only
thing the 135M model can emit. It is still a weak teacher and student: the point of the demo is
that every stage runs and every artifact is valid, not the scores. Everything lands under
``$MEMREADER_HOME/runs/<run>/``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.config import field, load_config
from memreader.paths import run_dir, write_json, write_resolved_config

DEMO_DATA = Path(__file__).with_name("demo_data")


@dataclass
class DemoConfig:
    """Knobs of the demo run (defaults sized for ~9.5 minutes on 2 CPU cores)."""

    run: str = field("demo", help="run name under $MEMREADER_HOME/runs/")
    corpus: str = field(str(DEMO_DATA / "corpus.jsonl"), help="demo corpus JSONL")
    qa: str = field(str(DEMO_DATA / "qa.jsonl"), help="demo questions JSONL")
    model: str = field("smollm2-135m-instruct", help="student base and answering model (and the local teacher)")
    teacher: str = field("local", help="'local' (in-process, the embedded model) or 'openai' (any OpenAI-compatible "
                         "endpoint from MEMREADER_TEACHER_BASE_URL / _API_KEY): a real teacher fills every layer")
    teacher_model: str = field("", help="teacher model name for teacher=openai (e.g. deepseek-chat); empty = model")
    gen_max_new_tokens: int = field(512, ge=1, help="teacher extraction budget (a guided memory's limits are sized to it)")
    read_max_new_tokens: int = field(512, ge=1, help="MemReader reading budget (a guided memory's limits are sized to it)")
    guided: str = field("auto", help="grammar-guided decoding for teacher and reader: auto (on for local models), "
                        "on, off (free text, then parser + aligner: the 135M model then fails the format)")
    num_candidates: int = field(2, ge=1, help="teacher candidates per document; the evaluator (the same embedded "
                                "model) scores them and RRF keeps the best (MoM selection)")
    clarity_variant: str = field("ppl", help="clarity variant of the evaluator: ppl, prob or margin")
    train_steps: int = field(8, ge=1, help="LoRA optimizer steps")
    batch_size: int = field(8, ge=1, help="sequences per generate call: on CPU, batch 8 decodes ~2.9x the tokens/s "
                            "of batch 1 (memory-bandwidth bound; docs/BENCHMARKS.md)")
    top_k: int = field(3, ge=1, help="chunks retrieved per question")
    question: str = field("How many compost bays stand behind the tool shed?", help="sample question for 'ask'")


CONFIG_CLASS = DemoConfig


def adapter_changed(adapter_dir: Path) -> float:
    """Largest |lora_B| entry of a saved adapter. PEFT initialises every lora_B to zero, so a
    positive value proves the weights moved away from their initialisation."""
    from safetensors.torch import load_file

    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    b_mats = [t for k, t in tensors.items() if "lora_B" in k]
    if not b_mats:
        raise RuntimeError(f"{adapter_dir}: no lora_B tensors in adapter_model.safetensors")
    return max(float(t.abs().max()) for t in b_mats)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run every stage and return the artifact map."""
    from data_gen.pipeline import GenConfig, generate
    from eval.qa import QAConfig, run_qa
    from inference.reader import ReadConfig, read_corpus_memories
    from memreader.registry import load_embedder
    from memreader.schema import read_memories
    from retrieval.fusion import LAYERS
    from retrieval.index import MemoryIndex
    from retrieval.meve import format_audit
    from retrieval.search import RetrievalConfig, format_hits, run_meve_ask
    from training.config import make_train_config
    from training.sft import train

    t0 = time.perf_counter()
    root = run_dir(cfg.run)
    write_resolved_config(root, cfg, "demo_config.yaml")
    timings: dict[str, float] = {}

    def stage(name: str) -> None:
        timings[name] = round(time.perf_counter() - t0 - sum(timings.values()), 1)
        print(f"\n=== {name} done ({timings[name]} s) ===\n", flush=True)

    gen = generate(GenConfig(
        input=cfg.corpus, run=cfg.run, model=cfg.teacher_model or cfg.model, teacher=cfg.teacher, batch_size=cfg.batch_size,
        max_new_tokens=cfg.gen_max_new_tokens, outline_max_new_tokens=96, com_max_new_tokens=96,
        val_fraction=0.25, on_unusable="whole", guided=cfg.guided, num_candidates=cfg.num_candidates,
        evaluator=cfg.model, clarity_variant=cfg.clarity_variant,
    ))
    stage("gen")
    trained = train(make_train_config(dict(
        train_file=gen["files"]["sft_train"], val_file=gen["files"]["sft_val"] if gen["sft"]["val"] else None,
        model=cfg.model, run=cfg.run,
        overwrite=True, max_steps=cfg.train_steps, learning_rate=5e-4, gradient_accumulation_steps=1,
        per_device_train_batch_size=1, per_device_eval_batch_size=1, max_length=2048, truncation_policy="drop",
        bf16=False, gradient_checkpointing=False, logging_steps=1, save_strategy="no", warmup_steps=0,
    ), where="memreader demo"))
    adapter = Path(trained["run_dir"])
    lora_b_max = adapter_changed(adapter)
    stage("train")
    stale = run_dir(cfg.run, "read") / "memories.jsonl"
    if stale.exists():  # the adapter was just retrained: memories of an earlier demo run must not be reused
        print(f"demo: removing {stale} from an earlier run, reading again with the new adapter")
        stale.unlink()
    read = read_corpus_memories(ReadConfig(
        input=cfg.corpus, run=cfg.run, model=cfg.model, adapter=str(adapter), max_new_tokens=cfg.read_max_new_tokens,
        batch_size=cfg.batch_size, guided=cfg.guided,
    ))
    stage("read")
    memories = read_memories(read["memories"])
    db = Path(RetrievalConfig(run=cfg.run, memories=read["memories"]).db())
    db.parent.mkdir(parents=True, exist_ok=True)
    embedder = load_embedder("minilm-l6")
    with MemoryIndex(db, embedder=embedder) as index:
        build = index.build(memories, embedder, embedder_name="minilm-l6", progress=False)
        counts = index.counts()
        hits = index.search(cfg.question, top_k=cfg.top_k)
    print(build.line())
    print(f"ask: {cfg.question}\n{format_hits(hits)}")
    # MeVe over the same index: verified, de-duplicated, packed under t_max tokens, with its audit
    meve = run_meve_ask(RetrievalConfig(run=cfg.run, memories=read["memories"], db_path=str(db),
                                        embedder="minilm-l6", verifier=cfg.model), cfg.question)
    print(f"\nask --pipeline meve: {cfg.question}\n{format_audit(meve)}")
    stage("index+ask")
    report = run_qa(QAConfig(memories=read["memories"], qa=cfg.qa, run=cfg.run, answer_model=cfg.model,
                             top_k=cfg.top_k, max_new_tokens=48, batch_size=3 * cfg.batch_size), embedder)
    stage("eval")

    artifacts = {
        "teacher memories": gen["files"]["memories"],
        "SFT data": gen["files"]["sft_train"],
        "LoRA adapter": str(adapter),
        "MemReader memories": read["memories"],
        "Milvus Lite index": str(db),
        "evaluation report": str(run_dir(cfg.run, "eval") / "report.json"),
    }
    checks = {
        "usable teacher replies": f"{gen['memories'] - len(gen['whole_document_fallbacks'])}/{gen['documents']} "
                                  f"({gen['guided']} guided, {len(gen['whole_document_fallbacks'])} whole-document "
                                  f"fallbacks, {gen['extraction_fates'].get('truncated-skipped', 0)} cut off)",
        "usable MemReader outputs": f"{read['read'] - read['fallback_whole_document']}/{read['documents']} "
                                    f"({read['guided']} guided, {read['fallback_whole_document']} whole-document "
                                    f"fallbacks, {read['truncated_skipped']} cut off)",
        "candidate selection": _selection_line(gen),
        "reasoning paths (CoM)": f"{gen['memories'] - len(gen['without_reasoning'])}/{gen['memories']} "
                                 "(a cut-off reasoning is left out of its SFT target)",
        "scenarios per memory": _scenario_line(memories),
        "single chunk (no boundary)": f"{len(read['single_chunk_no_boundary'])} "
                                      f"{read['single_chunk_no_boundary'][:4] or ''}",
        "memories tile their documents": f"{len(memories)} memories validated on write and re-read",
        "adapter moved from init": f"max |lora_B| = {lora_b_max:.3g} (init 0)",
        "index layers": ", ".join(f"{k}={counts.get(k, 0)}" for k in (*LAYERS, "single")),
        "MeVe (ask --pipeline meve)": f"{len(meve.passages)} passages, {meve.tokens} tokens <= t_max "
                                      f"{meve.audit['settings']['t_max']}; fallback "
                                      f"{'fired' if meve.audit['fallback'].get('fired') else 'not needed'}",
        "training loss": f"{trained['first_loss']:.3f} -> {trained['last_loss']:.3f} over {trained['steps']} steps",
    }
    summary = {"artifacts": artifacts, "checks": checks, "timings_s": timings, "qa": report["settings"]}
    write_json(root / "demo_summary.json", summary)
    print("\nArtifacts:")
    for k, v in artifacts.items():
        print(f"  {k:<20} {v}")
    print("Checks:")
    for k, v in checks.items():
        print(f"  {k:<30} {v}")
    if counts.get("outline", 0) + counts.get("core", 0) == 0:
        print("NOTE: the outline and core layers are empty: every memory is a whole-document fallback because "
              f"{cfg.model} does not follow the memory format unguided (guided={cfg.guided}). Run with guided=auto, "
              "or `--set teacher=openai --set teacher_model=<model>` with MEMREADER_TEACHER_BASE_URL/_API_KEY set.")
    print(f"\nQA ({report['settings']}):\n" + Path(artifacts["evaluation report"]).with_name("report.txt").read_text())
    print(f"demo: all stages finished in {time.perf_counter() - t0:.0f} s → {root}")
    return summary


def _selection_line(gen: dict[str, Any]) -> str:
    """How many candidates were sampled and scored, and which evaluator chose."""
    sel = gen["selection"]
    scored = sel["scored_now"] + sel["scores_cached"]
    return (f"N={sel['num_candidates']}: {sel['candidates']} usable candidates, {scored} scored by {sel['evaluator']} "
            f"(clarity={sel['clarity_variant']}), RRF k={sel['rrf_k']:g} kept one per document")


def _scenario_line(memories: list[Any]) -> str:
    """Scenarios per memory and mean chunk length, e.g. ``2-4 (mean 2.9), chunks mean 312 chars``."""
    if not memories:
        return "no memories"
    counts = [len(m.scenarios) for m in memories]
    lengths = [s.end - s.start for m in memories for s in m.scenarios]
    return (f"{min(counts)}-{max(counts)} (mean {sum(counts) / len(counts):.1f}), chunks mean "
            f"{sum(lengths) / len(lengths):.0f} chars")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``memreader demo``."""
    parser.add_argument("--config", help="optional YAML with DemoConfig keys")
    parser.add_argument("--run", help="run name (default: demo)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")


def run(args: argparse.Namespace) -> int:
    """Entry point behind the CLI."""
    overrides = list(args.set) + ([f"run={args.run}"] if args.run else [])
    run_demo(load_config(DemoConfig, args.config, overrides))
    return 0
