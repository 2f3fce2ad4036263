"""``memreader score`` (``python -m memreader.eval.score``): score prediction/reference JSONL files with the library of
:mod:`memreader.eval.score` (keys: :class:`ScoreConfig`; a ``--set`` of a metric setting such as ``meteor_wordnet=false`` is
shorthand for that key of ``metrics``)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from memreader.core.config import field as config_field
from memreader.core.config import load_config, parse_override, read_config_data
from memreader.core.errors import MemReaderError
from memreader.core.paths import run_dir, sha256_file, write_json, write_resolved_config
from memreader.core.stage import Flag, Stage
from memreader.eval.datasets import load_predictions, load_references
from memreader.eval.metrics import DISPLAY_NAMES, PROFILES, MetricConfig, resolve_config
from memreader.eval.score import compare, format_table, join_by_id, score_pairs
from memreader.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED


@dataclass
class ScoreConfig:
    """What to score and how (``memreader score --config ... --set ...``)."""

    pred: str = config_field(help='predictions JSONL: {"id": ..., "prediction": "..."} per line')
    ref: str = config_field(help='references JSONL: {"id": ..., "answer": "..."} or {"id": ..., "answers": [...]}')
    profile: str = config_field("mom", help=f"metric settings: {', '.join(sorted(PROFILES))}")
    metrics: dict = config_field({}, help="metric settings that differ from the profile, e.g. {meteor_wordnet: "
                                 "false} (see docs/EVALUATION.md); --set meteor_wordnet=false is shorthand")
    baseline: str | None = config_field(None, help="a second predictions JSONL for the same ids: adds paired "
                                        "tests pred - baseline")
    out: str | None = config_field(None, help="JSON report path (default: $MEMREADER_HOME/runs/<run>/score/"
                                   "scores.json)")
    run: str | None = config_field(None, help="run name under $MEMREADER_HOME/runs (default: a timestamp)")
    workers: int | None = config_field(None, ge=1, help="scoring processes (default: all CPUs)")
    bootstrap: int = config_field(DEFAULT_RESAMPLES, ge=1, help="bootstrap resamples for the 95% intervals")
    seed: int = config_field(DEFAULT_SEED, ge=0, help="bootstrap seed")
    per_example: bool = config_field(True, help="keep per-example scores in the JSON report")

    def problems(self) -> list[str]:
        """Every problem with the values, for :func:`memreader.core.config.load_config`."""
        if self.profile not in PROFILES:
            return [f"profile={self.profile!r}: use one of {', '.join(sorted(PROFILES))}"]
        try:
            resolve_config(self.profile, **self.metrics)
        except MemReaderError as exc:
            return [str(exc)]
        return []


def load_score_config(path: str | None, items: list[str]) -> ScoreConfig:
    """The :class:`ScoreConfig` of a YAML file and overrides (shortcut flags, then ``--set``); an override of a
    metric setting goes into ``metrics``."""
    metric_names = {f.name for f in dataclasses.fields(MetricConfig)}
    overrides, metric_overrides = [], {}
    for item in items:
        key, value = parse_override(item)
        if key in metric_names:
            metric_overrides[key] = value
        else:
            overrides.append(item)
    if metric_overrides:
        given = read_config_data(path, overrides)[0].get("metrics")
        merged = {**given, **metric_overrides} if isinstance(given, dict) else metric_overrides
        overrides.append(f"metrics={json.dumps(merged)}")
    return load_config(ScoreConfig, path, overrides)


def _run_stage(cfg: ScoreConfig) -> int:
    """Score the files of ``cfg``, print the table and write the JSON report and the resolved config."""
    start = time.perf_counter()
    ids, preds, refs = join_by_id(load_predictions(cfg.pred), load_references(cfg.ref), cfg.pred, cfg.ref)
    options = {"workers": cfg.workers, "n_resamples": cfg.bootstrap, "seed": cfg.seed}
    report = score_pairs(preds, refs, cfg.profile, ids=ids, progress=sys.stderr.isatty(), **options,
                         **cfg.metrics)
    reports = {Path(cfg.pred).stem: report}
    data = {"inputs": {"pred": str(cfg.pred), "pred_sha256": sha256_file(cfg.pred),
                       "ref": str(cfg.ref), "ref_sha256": sha256_file(cfg.ref)},
            "report": report.to_dict(per_example=cfg.per_example)}
    if cfg.baseline:
        _, base_preds, _ = join_by_id(load_predictions(cfg.baseline), dict(zip(ids, refs, strict=True)),
                                      cfg.baseline, cfg.ref)
        base = score_pairs(base_preds, refs, cfg.profile, ids=ids, **options, **cfg.metrics)
        reports[Path(cfg.baseline).stem] = base
        tests = compare(report, base, cfg.bootstrap, seed=cfg.seed)
        data["baseline"] = {"pred": str(cfg.baseline), "pred_sha256": sha256_file(cfg.baseline),
                            "report": base.to_dict(per_example=cfg.per_example),
                            "paired_tests": {m: t.to_dict() for m, t in tests.items()}}
    out = Path(cfg.out) if cfg.out else run_dir(cfg.run, "score") / "scores.json"
    config_path = write_resolved_config(out.parent, cfg, f"{out.stem}.config.yaml" if cfg.out else "config.yaml")
    write_json(out, data)
    print(format_table(reports))
    if cfg.baseline:
        for name, test in tests.items():
            print(f"paired {DISPLAY_NAMES[name]:<9} delta {test.delta:+.4f} [{test.interval.low:+.4f}, "
                  f"{test.interval.high:+.4f}]  p_boot {test.p_bootstrap:.4f}  p_perm {test.p_permutation:.4f}")
    seconds = time.perf_counter() - start
    print(f"score: {len(ids)} examples in {seconds:.1f} s ({len(ids) / seconds:.1f} examples/s) -> {out} "
          f"(config: {config_path})")
    return 0


STAGE = Stage("score", "score prediction/reference JSONL files with BLEU/ROUGE-L/METEOR", run=_run_stage,
              config=ScoreConfig, load=load_score_config, example_dir="configs/eval/ (score.yaml)",
              flags=(Flag("pred"), Flag("ref"), Flag("profile"), Flag("baseline"), Flag("out"), Flag("run"),
                     Flag("workers", int), Flag("bootstrap", int), Flag("seed", int),
                     Flag("per_example", const=False, name="--no-per-example")))
