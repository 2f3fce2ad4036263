"""Every stage YAML under configs/ loads into its dataclass and starts with a header comment."""

from __future__ import annotations

from pathlib import Path

import pytest

from memreader.core.config import load_config
from memreader.data_gen.pipeline import GenConfig
from memreader.eval.cross_encoder_training import TrainVerifierConfig
from memreader.eval.qa import QAConfig
from memreader.eval.score_cli import ScoreConfig
from memreader.inference.distributed import DistributedReadConfig
from memreader.inference.reader import ReadConfig
from memreader.inference.server import ServeConfig
from memreader.retrieval.chat import ChatConfig
from memreader.retrieval.search import RetrievalConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STAGES = {"data_gen": GenConfig, "inference": ReadConfig, "eval": QAConfig, "retrieval": RetrievalConfig}
# YAMLs of a second command in a stage folder, by file-name prefix (training recipes: tests/training)
BY_PREFIX = {("inference", "serve_"): ServeConfig, ("inference", "ray_cluster"): DistributedReadConfig,
             ("inference", "smollm2_ray"): DistributedReadConfig, ("eval", "score"): ScoreConfig, ("retrieval", "chat_"): ChatConfig,
             ("retrieval", "train_verifier"): TrainVerifierConfig}


def _config_class(path: Path) -> type:
    for (stage, prefix), cls in BY_PREFIX.items():
        if path.parent.name == stage and path.name.startswith(prefix):
            return cls
    return STAGES[path.parent.name]


@pytest.mark.parametrize(
    "path", sorted(p for stage in STAGES for p in (CONFIGS / stage).glob("*.yaml")), ids=lambda p: p.name
)
def test_stage_yaml_loads(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), f"{path} must start with a header comment (purpose, prerequisites, launch)"
    assert "Launch" in text or "launch" in text
    load_config(_config_class(path), path)


def test_serve_and_score_have_example_configs() -> None:
    assert list((CONFIGS / "inference").glob("serve_*.yaml")) and list((CONFIGS / "eval").glob("score*.yaml"))


def test_every_stage_has_a_config() -> None:
    for stage in STAGES:
        assert list((CONFIGS / stage).glob("*.yaml")), f"configs/{stage}/ has no YAML"


def test_bare_on_off_reach_string_fields_as_words(tmp_path) -> None:
    """YAML 1.1 reads a bare off/on as a boolean; a string field gets the word back."""
    from memreader.core.config import load_config
    from memreader.inference.reader import ReadConfig

    path = tmp_path / "r.yaml"
    path.write_text("input: c.jsonl\nguided: off\n", encoding="utf-8")
    assert load_config(ReadConfig, path).guided == "off"
    assert load_config(ReadConfig, None, ["input=c.jsonl", "guided=on"]).guided == "on"


def test_every_numeric_field_of_every_stage_config_has_a_range() -> None:
    import dataclasses

    from memreader.data_gen.assess import AssessConfig
    from memreader.data_gen.pipeline import GenConfig
    from memreader.demo import DemoConfig
    from memreader.eval.qa import QAConfig
    from memreader.inference.reader import ReadConfig
    from memreader.retrieval.search import RetrievalConfig
    from memreader.training.config import _RANGES, MemReaderArguments
    from memreader.training.merge import MergeConfig

    for cls in (GenConfig, ReadConfig, DemoConfig, QAConfig, RetrievalConfig, MemReaderArguments, MergeConfig,
                ServeConfig, ScoreConfig, AssessConfig, TrainVerifierConfig):
        for f in dataclasses.fields(cls):
            if f.type in ("int", "float", "int | None", "float | None", int, float):
                # MemReaderArguments keeps its ranges beside LoRA's and TRL's (TRL's parser reads field metadata)
                ranged = {"ge", "gt", "le", "lt"} & set(f.metadata) or (cls is MemReaderArguments and f.name in _RANGES)
                assert ranged, f"{cls.__name__}.{f.name} has no range"


def test_gen_assess_and_eval_take_the_same_evaluator_keys() -> None:
    """One declaration (EvaluatorConfig): every stage that scores has each evaluator key with the same default, help
    and checks, and the scorer's settings are built from those keys as they are."""
    import dataclasses

    from memreader.core.scoring_settings import EvaluatorConfig, ScorerSettings
    from memreader.data_gen.assess import AssessConfig

    want = {f.name: (f.default, dict(f.metadata)) for f in dataclasses.fields(EvaluatorConfig)}
    assert {"evaluator", "clarity_variant", "evaluator_backend", "evaluator_batch_tokens"} <= set(want)
    for cls in (GenConfig, AssessConfig, QAConfig, ScorerSettings):
        assert {f.name: (f.default, dict(f.metadata)) for f in dataclasses.fields(cls) if f.name in want} == want
    cfg = QAConfig(qa="q.jsonl", evaluator="m", clarity_variant="prob", evaluator_device="cpu", evaluator_batch_tokens=99)
    settings = ScorerSettings.of(cfg, max_model_len=512)
    assert (settings.evaluator, settings.clarity_variant, settings.evaluator_device, settings.evaluator_batch_tokens,
            settings.max_model_len) == ("m", "prob", "cpu", 99, 512)
