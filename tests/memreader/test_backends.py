"""``dtype: auto`` follows the machine's matmul probe, ``backend: auto`` follows the recorded measurements."""

from __future__ import annotations

import json

import pytest
import torch
from memreader.core import backends, hardware
from memreader.core.runtime import runtime


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path))
    monkeypatch.delenv("MEMREADER_CPU_DTYPE", raising=False)
    hardware._memo.clear()
    yield tmp_path
    hardware._memo.clear()


def test_the_probe_measures_both_dtypes_once_and_caches_them_per_machine(home) -> None:
    entry = hardware.matmul_rates(threads=1)
    assert entry["float32"] > 0 and entry["bfloat16"] > 0
    assert entry["best"] == max(hardware.CPU_DTYPES, key=lambda d: entry[d])
    cached = json.loads((home / "hardware.json").read_text())
    key = next(iter(cached))
    assert "threads=1" in key and torch.__version__ in key and cached[key]["best"] == entry["best"]
    hardware._memo.clear()
    cached[key]["best"] = "float32" if entry["best"] == "bfloat16" else "bfloat16"  # what another probe said
    (home / "hardware.json").write_text(json.dumps(cached))
    assert hardware.matmul_rates(threads=1)["best"] == cached[key]["best"]  # read back, not measured again


@pytest.mark.parametrize("best", ["float32", "bfloat16"])
def test_dtype_auto_on_a_cpu_is_the_probes_faster_dtype(home, best) -> None:
    threads = torch.get_num_threads()
    key = hardware._key(2)
    (home / "hardware.json").write_text(json.dumps({key: {"float32": 1.0, "bfloat16": 1.0, "best": best}}))
    try:
        assert runtime("cpu", "auto", threads=2).dtype == getattr(torch, best)
    finally:
        torch.set_num_threads(threads)
    assert runtime("cpu", "float32", threads=threads).dtype == torch.float32  # a set dtype is kept


def test_the_env_override_wins_and_a_bad_one_is_named(home, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_CPU_DTYPE", "float32")
    assert hardware.cpu_dtype() == "float32"
    monkeypatch.setenv("MEMREADER_CPU_DTYPE", "fp8")
    with pytest.raises(ValueError, match="MEMREADER_CPU_DTYPE='fp8' is not one of float32, bfloat16"):
        hardware.cpu_dtype()


def test_backend_auto_without_a_measurement_is_the_measured_default_per_stage(home, monkeypatch) -> None:
    import sys

    assert backends.resolve_backend("auto", "read")[0] == "vllm"  # vLLM's CPU build is installed by make setup
    assert backends.resolve_backend("auto", "answer")[0] == "vllm"
    assert backends.resolve_backend("auto", "scorer")[0] == "transformers"
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert backends.resolve_backend("auto", "read") == ("transformers", "vLLM does not import here (make setup "
                                                                         "installs it)")
    assert backends.resolve_backend("local", "answer") == ("transformers", "set")
    assert backends.resolve_backend("hf", "scorer") == ("transformers", "set")
    assert backends.resolve_backend("vllm", "read") == ("vllm", "set")


def test_backend_auto_takes_the_recorded_fastest_row_of_this_machine(home) -> None:
    backends.record_choices({"answer": {"backend": "vllm", "dtype": "bfloat16"},
                             "read": {"backend": "transformers", "dtype": "float32"}})
    backend, why = backends.resolve_backend("auto", "answer")
    assert backend == "vllm" and "measured" in why
    assert backends.resolve_backend("auto", "read")[0] == "transformers"  # the measurement beats the default
    assert backends.resolve_dtype_for("answer", "auto", "vllm") == "bfloat16"
    assert backends.resolve_dtype_for("read", "auto", "transformers") == "float32"
    assert backends.resolve_dtype_for("read", "bfloat16", "transformers") == "bfloat16"  # a set dtype is kept
    # another machine's rows are not this one's
    data = json.loads((home / backends.CHOICE_FILE).read_text())
    (home / backends.CHOICE_FILE).write_text(json.dumps({"cpu:other|torch=0|threads=64": data[backends.machine_key()]}))
    assert backends.resolve_backend("auto", "read")[0] == "vllm"  # the default again, not the other machine's row
    with pytest.raises(ValueError, match="unknown stages"):
        backends.record_choices({"training": {"backend": "vllm"}})


def test_a_recorded_vllm_row_falls_back_loudly_when_vllm_does_not_import(home, monkeypatch, caplog) -> None:
    import sys

    backends.record_choices({"read": {"backend": "vllm", "dtype": "bfloat16"}})
    monkeypatch.setitem(sys.modules, "vllm", None)
    with caplog.at_level("WARNING"):
        assert backends.resolve_backend("auto", "read") == ("transformers", "measured vllm, not importable")
    assert "vLLM does not import here" in caplog.text


def test_stage_configs_name_a_bad_backend(tmp_path) -> None:
    from memreader.core.config import ConfigError, load_config
    from memreader.inference.reader import ReadConfig

    with pytest.raises(ConfigError) as info:
        load_config(ReadConfig, None, ["input=x.jsonl", "backend=tgi", "dtype=fp8", "lora_mode=maybe",
                                       "compile_mode=fast"])
    for part in ("backend: 'tgi' is not one of transformers, vllm, openai, auto", "dtype: 'fp8'",
                 "lora_mode: 'maybe'", "compile_mode: 'fast'"):
        assert part in str(info.value)
    assert load_config(ReadConfig, None, ["input=x.jsonl", "backend=local"]).backend == "local"
