"""The one engine rule (core/engines.py): every stage x backend x dtype through the real resolution, with and
without a recorded measurement, on a CPU and on a GPU; the measurements file; the one factory and its model
cache; the stages wired to both; and the hardware facts beneath (probe, cores, threads)."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest
import torch

from memreader.core import engines, hardware
from memreader.core.engines import EngineError, make_engine, record_choices, resolve_engine
from memreader.core.runtime import runtime
from tests.engine_fakes import fake_engines

# The rule, written out: stage -> (backends it runs on, what backend: auto is without a measurement).
STAGES = {
    "read": (("transformers", "vllm", "openai"), "vllm"),
    "teacher": (("transformers", "vllm", "openai"), "vllm"),
    "answer": (("transformers", "vllm", "openai"), "vllm"),
    "chat": (("transformers", "vllm", "openai"), "vllm"),
    "scorer": (("transformers", "vllm"), "transformers"),
    "support": (("transformers", "vllm"), "vllm"),
    "verifier": (("transformers", "vllm"), "vllm"),
    "train": (("transformers",), "transformers"),
    "merge": (("transformers",), "transformers"),
}
# A recorded measurement that differs from every default (and from the probe's bfloat16) in backend and dtype.
MEASURED = {"read": "transformers", "teacher": "transformers", "answer": "transformers", "chat": "transformers",
            "scorer": "vllm", "support": "transformers", "verifier": "transformers"}
BACKEND_SETTINGS = ("auto", "transformers", "local", "hf", "vllm", "openai")
DTYPE_SETTINGS = ("auto", "float32", "bfloat16", "float16")
PROBE = "bfloat16"  # what the CPU matmul probe says here (MEMREADER_CPU_DTYPE, the probe's own override)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A CPU machine with vLLM importable and a probe that says bfloat16; the test changes what it needs."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path))
    monkeypatch.setenv("MEMREADER_CPU_DTYPE", PROBE)
    facts = {"device": "cpu", "vllm": None, "bf16_gpu": True}
    monkeypatch.setattr(engines, "machine_device", lambda: facts["device"])
    monkeypatch.setattr(engines, "vllm_import_error", lambda: facts["vllm"])
    monkeypatch.setattr(engines, "_bf16_gpu", lambda: facts["bf16_gpu"])
    engines._warned.clear()
    yield facts
    engines._warned.clear()


def record_all() -> None:
    record_choices({stage: {"backend": backend, "dtype": "float32"} for stage, backend in MEASURED.items()})


def expected(stage: str, backend: str, dtype: str, measured: bool, vllm_imports: bool = True) -> tuple | str:
    """The rule of docs/ENGINES.md for a CPU machine: (backend, dtype, device), or "error"."""
    allowed, default = STAGES[stage]
    name = {"local": "transformers", "hf": "transformers"}.get(backend, backend)
    if name != "auto" and name not in allowed:
        return "error"
    if name == "openai":
        return ("openai", "remote", "remote")
    row = {"backend": MEASURED[stage], "dtype": "float32"} if measured and stage in MEASURED else None
    if name == "auto":
        name = row["backend"] if row else default
        if name == "vllm" and not vllm_imports:
            name = "transformers"
    if dtype == "auto":
        if row and row["backend"] == name:
            dtype = row["dtype"]
        else:
            dtype = "float32" if stage == "train" else PROBE
    return (name, dtype, "cpu")


def resolved(stage: str, backend: str, dtype: str) -> tuple | str:
    try:
        choice = resolve_engine(stage, backend, dtype)
    except EngineError:
        return "error"
    return (choice.backend, choice.dtype, choice.device)


@pytest.mark.parametrize("measured", [False, True], ids=["no-measurement", "measured"])
@pytest.mark.parametrize("stage", list(STAGES))
def test_every_stage_backend_and_dtype_resolves_by_the_one_rule(machine, stage, measured) -> None:
    if measured:
        record_all()
    wrong = {}
    for backend in BACKEND_SETTINGS:
        for dtype in DTYPE_SETTINGS:
            want, got = expected(stage, backend, dtype, measured), resolved(stage, backend, dtype)
            if got != want:
                wrong[(backend, dtype)] = f"got {got}, want {want}"
    assert not wrong, f"{stage}: " + "; ".join(f"{k}: {v}" for k, v in wrong.items())


@pytest.mark.parametrize("measured", [False, True], ids=["no-measurement", "measured"])
def test_without_vllm_auto_takes_transformers_and_says_so(machine, measured, caplog) -> None:
    if measured:
        record_choices({"scorer": {"backend": "vllm", "dtype": "float32"}})
    machine["vllm"] = "ImportError: No module named 'vllm'"
    with caplog.at_level("WARNING"):
        for stage in STAGES:
            for dtype in DTYPE_SETTINGS:
                want = expected(stage, "auto", dtype, measured and stage == "scorer", vllm_imports=False)
                assert resolved(stage, "auto", dtype) == want, (stage, dtype)
    assert "vLLM does not import here (ImportError: No module named 'vllm')" in caplog.text
    assert "make setup" in caplog.text
    assert resolve_engine("read").why.startswith("backend: vLLM does not import here")


def test_on_a_gpu_auto_is_bf16_where_the_gpu_has_it_and_a_cpu_device_keeps_the_cpu_rules(machine) -> None:
    machine["device"] = "cuda"
    record_all()  # measured on this GPU machine
    assert resolved("read", "auto", "auto") == ("transformers", "float32", "cuda")  # the measured row
    assert resolved("scorer", "auto", "auto") == ("vllm", "float32", "cuda")
    assert resolved("support", "vllm", "auto") == ("vllm", "bfloat16", "cuda")  # measured row is transformers
    assert resolved("train", "auto", "auto") == ("transformers", "bfloat16", "cuda")
    assert resolved("merge", "transformers", "auto") == ("transformers", "bfloat16", "cuda")
    assert resolved("answer", "transformers", "auto", ) == ("transformers", "float32", "cuda")
    assert resolve_engine("answer", "transformers", "auto", "cuda:1").device == "cuda:1"
    machine["bf16_gpu"] = False
    assert resolved("support", "vllm", "auto") == ("vllm", "float16", "cuda")
    assert resolved("train", "auto", "auto") == ("transformers", "float32", "cuda")
    # device=cpu on a GPU machine: the measurements (taken on the GPU) do not apply, vLLM does not run there
    cpu = resolve_engine("read", "auto", "auto", "cpu")
    assert (cpu.backend, cpu.dtype, cpu.device) == ("transformers", PROBE, "cpu") and "vLLM runs on cuda" in cpu.why
    assert resolve_engine("scorer", "auto", "auto", "cpu").backend == "transformers"  # its measured vllm row ignored
    with pytest.raises(EngineError, match="backend=vllm with device=cpu: vLLM runs on cuda here"):
        resolve_engine("read", "vllm", "auto", "cpu")


def test_bad_settings_name_the_value_and_the_fix(machine) -> None:
    with pytest.raises(EngineError, match=r"backend: 'tgi' is not one of transformers, vllm, openai, auto.*fix: read "
                                          r"runs on transformers, vllm, openai or auto"):
        resolve_engine("read", "tgi")
    with pytest.raises(EngineError, match="backend: 'openai' is not one of transformers, vllm, auto"):
        resolve_engine("scorer", "openai")
    with pytest.raises(EngineError, match="dtype: 'fp8' is not one of auto, float32, bfloat16, float16"):
        resolve_engine("answer", "auto", "fp8")
    with pytest.raises(EngineError, match="device: 'gpu' is not one of auto, cpu, cuda, cuda:N"):
        resolve_engine("chat", "auto", "auto", "gpu")
    with pytest.raises(ValueError, match="stage 'reading' is not one of read, teacher"):
        resolve_engine("reading")
    assert engines.EngineKeys("teacher", "teacher", extra=("structure",)).check("structure", "auto", "auto") == []
    keys = engines.EngineKeys("scorer", "evaluator_backend", "evaluator_dtype", "evaluator_device")
    assert keys.check("hf", "fp16", "tpu") == [
        "evaluator_dtype: 'fp16' is not one of auto, float32, bfloat16, float16",
        "evaluator_device: 'tpu' is not one of auto, cpu, cuda, cuda:N"]
    cfg = SimpleNamespace(answer_backend="tgi", dtype="auto", device="auto")  # a config's keys, by their names
    assert engines.EngineKeys("answer", "answer_backend").problems(cfg) == [
        "answer_backend: 'tgi' is not one of transformers, vllm, openai, auto, local, hf"]
    assert engines.backend_problem("openai", "read", "chunk_backend", local=True) == (
        "chunk_backend: 'openai' is not one of transformers, vllm, auto, local, hf")


def test_measurements_are_this_machines_and_a_bad_row_is_refused(machine, tmp_path) -> None:
    record_all()
    data = json.loads((tmp_path / engines.CHOICE_FILE).read_text())
    assert list(data) == [engines.machine_key()] and f"cores={hardware.cpu_cores()}" in engines.machine_key()
    (tmp_path / engines.CHOICE_FILE).write_text(json.dumps({"cpu:other|torch=0|cores=64": data[engines.machine_key()]}))
    assert resolved("read", "auto", "auto") == ("vllm", PROBE, "cpu")  # another machine's rows are not this one's
    record_choices({"read": {"backend": "transformers", "dtype": "bfloat16"}})  # the other machine's rows are kept
    assert set(json.loads((tmp_path / engines.CHOICE_FILE).read_text())) == {"cpu:other|torch=0|cores=64",
                                                                            engines.machine_key()}
    with pytest.raises(ValueError, match="unknown stages"):
        record_choices({"train": {"backend": "transformers", "dtype": "float32"}})
    with pytest.raises(ValueError, match="read: a recorded row needs backend"):
        record_choices({"read": {"backend": "openai", "dtype": "float32"}})


def test_a_corrupt_measurements_file_is_named_and_moved_aside_never_silently_rewritten(machine, tmp_path,
                                                                                        caplog) -> None:
    path = tmp_path / engines.CHOICE_FILE
    path.write_text('{"cpu:x": {"read": ', encoding="utf-8")
    with caplog.at_level("WARNING"):
        assert resolved("read", "auto", "auto") == ("vllm", PROBE, "cpu")  # the defaults, said loudly
    assert str(path) in caplog.text and "JSONDecodeError" in caplog.text and "delete it" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        record_choices({"read": {"backend": "transformers", "dtype": "float32"}})
    backups = list(tmp_path.glob(f"{engines.CHOICE_FILE}.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_text() == '{"cpu:x": {"read": '  # kept as it was
    assert str(backups[0]) in caplog.text
    assert resolved("read", "auto", "auto") == ("transformers", "float32", "cpu")
    path.write_text('["not", "a", "mapping"]', encoding="utf-8")
    with caplog.at_level("WARNING"):
        assert engines.measured_choices() == {}
    assert "not a mapping" in caplog.text


# ---------------------------------------------------------------------------------------------------------------
# The factory.


def test_the_factory_settings_are_the_engines_own() -> None:
    import inspect

    for backend, names in engines.ENGINE_SETTINGS.items():
        params = inspect.signature(engines.engine_class(backend)).parameters
        assert "model" in params, backend
        assert set(names) <= set(params), (backend, set(names) - set(params))
    assert {"dtype", "device"} <= set(inspect.signature(engines.engine_class("transformers")).parameters)
    assert "dtype" in inspect.signature(engines.engine_class("vllm")).parameters


@pytest.mark.parametrize("backend", ["transformers", "vllm", "openai"])
def test_make_engine_routes_each_backend(machine, monkeypatch, backend) -> None:
    built = fake_engines(monkeypatch, engine="the engine")
    settings = dict(adapter="", batch_size=3, max_model_len=2048, kv_cache_gib=0.5, base_url="", max_concurrency=5,
                    guided="off", env_prefix="MEMREADER_QA")
    assert make_engine(resolve_engine("answer", backend, "float32"), "m", **settings) == "the engine"
    (b,) = built
    assert (b.backend, b.model) == (backend, "m")
    want = {"transformers": {"adapter": None, "batch_size": 3, "dtype": "float32", "device": "cpu"},
            "vllm": {"adapter": None, "max_model_len": 2048, "kv_cache_gib": 0.5, "dtype": "float32"},
            "openai": {"base_url": None, "max_concurrency": 5, "guided": "off", "env_prefix": "MEMREADER_QA"}}[backend]
    assert b.kwargs == {"model": "m", **want}
    with pytest.raises(TypeError, match=r"unknown settings \['model_name'\]"):
        make_engine(resolve_engine("answer", backend, "float32"), "m", model_name="m")


def test_make_chat_is_the_factory_for_scripts(machine, monkeypatch) -> None:
    from memreader.core.generation import make_chat

    built = fake_engines(monkeypatch, engine="chat")
    make_chat("local", batch_size=2)
    make_chat("vllm", model="x", dtype="float32")
    assert [(b.backend, b.kwargs.get("dtype")) for b in built] == [("transformers", PROBE), ("vllm", "float32")]
    with pytest.raises(EngineError, match="'tgi' is not one of"):
        make_chat("tgi")


# ---------------------------------------------------------------------------------------------------------------
# The stages ask the rule and build through the factory.


def test_reading_teacher_answering_and_chunkers_build_what_the_rule_chooses(machine, monkeypatch, tmp_path) -> None:
    from memreader.data_gen.pipeline import GenConfig, _backend, resolve_teacher
    from memreader.eval.chunkers import ChunkerSettings
    from memreader.eval.qa import QAConfig, _answerer
    from memreader.inference.reader import ReadConfig, make_backend, resolved

    built = fake_engines(monkeypatch, engine="engine")
    record_all()  # read, teacher, answer: transformers float32
    cfg = resolved(ReadConfig(input="x.jsonl"))
    assert (cfg.backend, cfg.dtype) == ("transformers", "float32")
    make_backend(ReadConfig(input="x.jsonl", batch_size=3))
    gen = resolve_teacher(GenConfig(input="x.jsonl"))
    assert gen.teacher == "local"  # transformers, under the name every cached reply's key has
    _backend(gen)
    chat, record = _answerer(QAConfig(qa="q.jsonl"))
    assert record == resolve_engine("answer").record() and record["device"] == "cpu"
    ChunkerSettings().chat("read", adapter="")
    assert [(b.backend, b.kwargs["dtype"], b.kwargs["device"]) for b in built] == [("transformers", "float32", "cpu")] * 4
    assert built[0].kwargs["batch_size"] == 3 and built[1].kwargs["batch_size"] == 4
    assert built[3].kwargs["batch_size"] == 32  # the chunkers' reader: 32 requests in the engine
    # without the measurement: each stage's default, the same settings
    (tmp_path / engines.CHOICE_FILE).unlink()
    built.clear()
    make_backend(ReadConfig(input="x.jsonl"))
    _backend(resolve_teacher(GenConfig(input="x.jsonl")))
    _answerer(QAConfig(qa="q.jsonl"))
    ChunkerSettings().chat("answer")
    assert [(b.backend, b.kwargs["dtype"]) for b in built] == [("vllm", PROBE)] * 4
    built.clear()
    make_backend(ReadConfig(input="x.jsonl", backend="openai", base_url="http://h/v1", batch_size=6))
    assert built[0].backend == "openai" and built[0].kwargs["max_concurrency"] == 6
    assert built[0].kwargs["env_prefix"] == "MEMREADER_READER"
    with pytest.raises(EngineError, match="the chunkers' LM runs in this process"):
        ChunkerSettings(backend="openai").chat("read")


class _FakeModel:
    def __init__(self, dtype: str) -> None:
        self.param = torch.zeros(1, dtype=getattr(torch, dtype))

    def parameters(self):
        yield self.param


class _FakeVLLMEngine:
    def __init__(self, model, dtype="auto", max_model_len=8192, engine=None):
        self.tokenizer, self.dtype, self.max_model_len = "tok", dtype, max_model_len


@pytest.fixture
def fake_scorer_engines(monkeypatch):
    """The scorer's engines scripted below the rule: the transformers cache and vLLM engine record what they load."""
    from memreader.core import runtime as rt_module
    from memreader.core import scoring
    from memreader.core.runtime import SharedModel

    loads = []

    def shared(name, adapter=None, rt=None):
        loads.append(("transformers", name, str(rt.dtype).removeprefix("torch."), rt.device))
        return SharedModel(_FakeModel(str(rt.dtype).removeprefix("torch.")), "tok", None, ())

    def vllm(model, dtype="auto", max_model_len=8192, engine=None):
        loads.append(("vllm", model, dtype, max_model_len))
        return _FakeVLLMEngine(model, dtype, max_model_len)

    monkeypatch.setattr(rt_module, "shared_causal_lm", shared)
    monkeypatch.setattr(scoring, "VLLMEngine", vllm)
    monkeypatch.setattr(scoring, "HFEngine", lambda *a, **k: object())
    return loads


def test_the_evaluator_scorer_means_the_same_in_gen_assess_and_eval(machine, fake_scorer_engines, tmp_path) -> None:
    from memreader.core.config import problems_of
    from memreader.core.scoring import evaluator_scorer
    from memreader.data_gen.assess import AssessConfig
    from memreader.data_gen.pipeline import GenConfig
    from memreader.eval.qa import QAConfig

    def three(**settings):
        configs = (GenConfig(input="x.jsonl", **settings), AssessConfig(input="x.jsonl", **settings),
                   QAConfig(qa="q.jsonl", **settings))
        return [(s.choice.backend, s.choice.dtype, s.choice.device, s.dtype_name)
                for s in map(evaluator_scorer, configs)]

    assert three() == [("transformers", PROBE, "cpu", PROBE)] * 3  # no measurement: transformers, the probe
    record_all()  # the scorer's recorded row: vllm float32
    assert three() == [("vllm", "float32", "cpu", "float32")] * 3
    hf16 = three(evaluator_backend="hf", evaluator_dtype="float16")
    assert hf16 == [("transformers", "float16", "cpu", "float16")] * 3
    assert [x[0] for x in fake_scorer_engines] == ["transformers"] * 3 + ["vllm"] * 3 + ["transformers"] * 3
    for cfg in (GenConfig(input="x", evaluator_backend="openai"), QAConfig(qa="q", evaluator_backend="openai"),
                AssessConfig(input=str(tmp_path), evaluator_backend="openai")):
        assert any("evaluator_backend: 'openai' is not one of transformers, vllm, auto" in p for p in problems_of(cfg))


def test_training_precision_asks_the_rule(machine) -> None:
    from memreader.training.config import training_engine

    assert (training_engine().dtype, training_engine().device) == ("float32", "cpu")
    machine["device"] = "cuda"
    assert (training_engine().dtype, training_engine().device) == ("bfloat16", "cuda")
    assert (training_engine(use_cpu=True).dtype, training_engine(use_cpu=True).device) == ("float32", "cpu")
    machine["bf16_gpu"] = False
    assert training_engine().dtype == "float32"


def test_merging_keeps_the_checkpoint_dtype_unless_asked(machine, tmp_path) -> None:
    from memreader.core.lora import MERGE_DTYPES, MergeError, merge_adapter

    assert MERGE_DTYPES == (*engines.DTYPES, "checkpoint")
    (tmp_path / "adapter_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(MergeError, match="dtype 'fp8' is not one of auto, float32, bfloat16, float16, checkpoint"):
        merge_adapter(str(tmp_path), dtype="fp8")
    assert resolve_engine("merge", "transformers").dtype == PROBE  # auto: what this machine runs models in


# ---------------------------------------------------------------------------------------------------------------
# The hardware beneath: the probe, the cores, the threads.


def test_the_probe_measures_both_dtypes_once_and_caches_them_per_machine(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path))
    hardware._memo.clear()
    entry = hardware.matmul_rates(threads=1)
    assert entry["float32"] > 0 and entry["bfloat16"] > 0
    assert entry["best"] == max(hardware.CPU_DTYPES, key=lambda d: entry[d])
    cached = json.loads((tmp_path / "hardware.json").read_text())
    key = next(iter(cached))
    assert "threads=1" in key and torch.__version__ in key and cached[key]["best"] == entry["best"]
    hardware._memo.clear()
    cached[key]["best"] = "float32" if entry["best"] == "bfloat16" else "bfloat16"  # what another probe said
    (tmp_path / "hardware.json").write_text(json.dumps(cached))
    assert hardware.matmul_rates(threads=1)["best"] == cached[key]["best"]  # read back, not measured again
    hardware._memo.clear()


def test_a_dtype_the_cpu_emulates_is_timed_on_small_matrices_only(monkeypatch) -> None:
    """bf16 on a CPU without bf16 units runs ~1 GFLOP/s: a 2048 product takes 17 s (measure-engines spent over two
    minutes on them). A product whose side-256 rate says it would take longer than the probe's time is not run."""
    sides: dict[str, list[int]] = {"float32": [], "bfloat16": []}
    real_mm = torch.mm

    def mm(a, b):  # fp32 at its real speed; bf16 as an emulating CPU runs it (~1 GFLOP/s), without the wait
        name = str(a.dtype).removeprefix("torch.")
        sides[name].append(a.shape[0])
        if name == "bfloat16":
            time.sleep(2.0 * a.shape[0] ** 3 / 1e9)
            return a
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", mm)
    assert hardware.matmul_rate("bfloat16", 2048) < 2.0
    assert set(sides["bfloat16"]) == {hardware.PROBE_SMALL}  # never at 2048: 17 s a product
    assert hardware.matmul_rate("float32", 1024) > 2.0 and 1024 in sides["float32"]  # a fast dtype at full size


@pytest.mark.parametrize("best", ["float32", "bfloat16"])
def test_dtype_auto_on_a_cpu_is_the_probes_faster_dtype_and_deciding_sets_no_threads(tmp_path, monkeypatch,
                                                                                      best) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path))
    monkeypatch.delenv("MEMREADER_CPU_DTYPE", raising=False)
    hardware._memo.clear()
    (tmp_path / "hardware.json").write_text(json.dumps({hardware._key(2): {"float32": 1.0, "bfloat16": 1.0,
                                                                          "best": best}}))
    calls: list[int] = []  # a spy, not torch's own count: an in-process vLLM engine makes set_num_threads a no-op
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    try:
        assert runtime("cpu", "auto", threads=2).dtype == getattr(torch, best)
        assert calls == []  # deciding changed nothing: only loading a model sets threads
        assert runtime("cpu", "float32").dtype == torch.float32  # a set dtype is kept
        assert runtime("cpu", "float32").threads == hardware.cpu_threads()
        assert calls == []
    finally:
        hardware._memo.clear()


def test_cores_are_counted_one_way_and_the_env_override_is_named(monkeypatch) -> None:
    if hasattr(os, "sched_getaffinity"):
        assert hardware.cpu_cores() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert hardware.cpu_threads() == hardware.cpu_cores()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert hardware.cpu_threads() == 1
    monkeypatch.setenv("MEMREADER_CPU_DTYPE", "float32")
    assert hardware.cpu_dtype() == "float32"
    monkeypatch.setenv("MEMREADER_CPU_DTYPE", "fp8")
    with pytest.raises(ValueError, match="MEMREADER_CPU_DTYPE='fp8' is not one of float32, bfloat16"):
        hardware.cpu_dtype()


# ---------------------------------------------------------------------------------------------------------------
# The real factory on a tiny model: the engines it builds, and one copy of the weights per model, dtype, device.


@pytest.mark.integration
def test_the_real_factory_builds_a_transformers_engine_whose_weights_every_stage_shares(tiny_model) -> None:
    from memreader.core import runtime as rt_module
    from memreader.core.generation import GenerationParams, LocalChat
    from memreader.core.scoring import EvaluatorScorer, ScorerSettings

    before = torch.get_num_threads()
    try:
        # torch's thread count faked (1 to begin with), not read: after an in-process vLLM engine earlier in the
        # same process torch's own setter changes nothing, so its count says nothing about what loading did
        count, threads = [1], []
        rt_module._MODELS.clear()  # an earlier test's copy in the process cache would be served without a load
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch, "get_num_threads", lambda: count[0])
            mp.setattr(torch, "set_num_threads", lambda n: (threads.append(n), count.__setitem__(0, n))[1])
            chat = make_engine(resolve_engine("read", "transformers", "float32", "cpu"), tiny_model, batch_size=2,
                               max_model_len=64, kv_cache_gib=1.0, base_url="")  # other engines' settings are theirs
            assert isinstance(chat, LocalChat) and chat.batch_size == 2
            assert chat.describe()["dtype"] == "float32" and chat.describe()["device"] == "cpu"
        # loading a model on the CPU sets its threads (from the faked 1; nothing to set where that is the count)
        assert threads == ([] if hardware.cpu_threads() == 1 else [hardware.cpu_threads()])
        (reply,) = chat.generate_many([[{"role": "user", "content": "hi"}]],
                                      GenerationParams(temperature=0.0, max_new_tokens=3))
        assert reply.completion_tokens <= 3
        scorer = EvaluatorScorer(ScorerSettings(evaluator=tiny_model, evaluator_backend="hf", evaluator_dtype="float32",
                                                evaluator_device="cpu"))
        assert scorer.model is chat.model() and scorer.choice.backend == "transformers"  # one copy of the weights
        answerer = make_engine(resolve_engine("answer", "local", "float32", "cpu"), tiny_model)
        assert answerer.model() is chat.model()
        other = make_engine(resolve_engine("answer", "transformers", "bfloat16", "cpu"), tiny_model)
        assert other.model() is not chat.model() and other.describe()["dtype"] == "bfloat16"
    finally:
        torch.set_num_threads(before)
        rt_module._MODELS.clear()  # the process cache: later tests load their own copies
