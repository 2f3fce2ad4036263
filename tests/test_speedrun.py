"""scripts/speedrun.sh end to end on a CPU (SCALE=cpu): a real `vllm serve` teacher and answerer, evaluator scores,
TRL LoRA steps under `accelerate launch --cpu`, vLLM reading with the adapter, index, every chunking method on two
MultiFieldQA-zh questions, the report. About 35-50 minutes on two cores, so opt-in: ``pytest -m slow tests/test_speedrun.py``
(the run is recorded in docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]
EVAL_SET = ROOT / ".." / "shared" / "datasets" / "longbench_multifieldqa_zh.jsonl"  # the script's default EVAL_SET


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_speedrun_runs_end_to_end_on_cpu_with_vllm(tmp_path: Path) -> None:
    if "EVAL_SET" not in os.environ and not EVAL_SET.is_file():
        pytest.skip(f"{EVAL_SET.resolve()} is not here: the speedrun evaluates on it (or set EVAL_SET to a file in "
                    "the LongBench layout, e.g. tests/assets/longbench_multifieldqa_zh_small.jsonl)")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "SCALE": "cpu", "RUN": "sr-cpu", "MEMREADER_HOME": str(tmp_path / "home"),
           "PY": sys.executable, "MEMREADER": str(bin_dir / "memreader"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    log = tmp_path / "speedrun.log"
    with log.open("w") as fh:
        rc = subprocess.run(["bash", "scripts/speedrun.sh"], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                            timeout=3500).returncode
    text = log.read_text()
    assert rc == 0, text[-5000:]
    run = tmp_path / "home" / "runs" / "sr-cpu"
    gen = json.loads((run / "gen" / "manifest.json").read_text())
    assert gen["teacher"]["backend"] == "openai" and gen["teacher"]["calls"] > 0
    assert (run / "train" / "adapter_model.safetensors").is_file()
    read = json.loads((run / "read" / "summary.json").read_text())
    assert read["engine"]["backend"] == "vllm" and read["engine"]["lora_mode"] == "merge" and read["read"] >= 1
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert set(summary["methods"]) == {"memreader", "fixed", "sentence", "semantic", "lumber", "llm-direct"}
    assert summary["engine"]["backend"] == "openai"
    assert (run / "eval" / "report" / "report.md").is_file()
    assert "speedrun: finished" in text
