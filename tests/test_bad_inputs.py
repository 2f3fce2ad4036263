"""The bad-input matrix: every subcommand x every class of bad input gets exit code 2 (1 for a run
that did nothing), a message naming the problem, no traceback, and files of an earlier good run
left exactly as they were. No model is loaded: each error comes before any model work."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memreader.cli import main


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    for var in ("MEMREADER_READER_BASE_URL", "MEMREADER_TEACHER_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _files(tmp: Path) -> dict[str, Path]:
    corpus = tmp / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "Some words here. More words there."}\n', encoding="utf-8")
    bad_yaml = tmp / "bad.yaml"
    bad_yaml.write_text("run: demo\nlimit: [1, 2\n", encoding="utf-8")
    not_utf8 = tmp / "latin1.jsonl"
    not_utf8.write_bytes('{"id": "a", "text": "caf\xe9"}\n'.encode("latin-1"))
    empty = tmp / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    blank = tmp / "blank.jsonl"
    blank.write_text('{"id": "a", "text": "   "}\n{"id": "b", "text": ""}\n', encoding="utf-8")
    (tmp / "report.pdf").write_bytes(b"%PDF-1.4\n")  # a document where a corpus belongs
    return {"corpus": corpus, "bad_yaml": bad_yaml, "not_utf8": not_utf8, "empty": empty, "blank": blank}


# (case name, argv with {placeholders}, exit code, text the message must contain)
CONFIG_STAGES = [("gen", "input"), ("read", "input"), ("read-dist", "input"), ("train", "train_file"), ("index", "memories"),
                 ("eval", "memories"), ("demo", None), ("serve", None), ("score", "pred"),
                 ("chat", None)]
CASES: list[tuple[str, list[str], int, str]] = []
for stage, _ in CONFIG_STAGES:
    CASES += [
        (f"{stage}-missing-config", [stage, "--config", "{tmp}/nope.yaml"], 2, "does not exist"),
        (f"{stage}-yaml-syntax", [stage, "--config", "{bad_yaml}"], 2, "is not valid YAML"),
        (f"{stage}-set-yaml-syntax", [stage, "--set", "run=[x"], 2, "not valid YAML"),
        (f"{stage}-run-escapes", [stage, "--set", "run=../../x"], 2, "not a valid run name"),
        (f"{stage}-run-dotdot", [stage, "--set", "run=.."], 2, "not a valid run name"),
        (f"{stage}-unknown-key", [stage, "--set", "no_such_key=1"], 2, "unknown key 'no_such_key'"),
    ]
CASES += [
    ("ask-run-escapes", ["ask", "--set", "run=../x", "q"], 2, "not a valid run name"),
    ("gen-negative-max-new-tokens", ["gen", "--set", "input={corpus}", "--set", "max_new_tokens=-5"], 2,
     "max_new_tokens=-5 is out of range"),
    ("gen-negative-temperature", ["gen", "--set", "input={corpus}", "--set", "temperature=-1"], 2,
     "temperature=-1.0 is out of range"),
    ("gen-zero-concurrency", ["gen", "--set", "input={corpus}", "--set", "max_concurrency=0"], 2,
     "max_concurrency=0 is out of range"),
    ("gen-negative-head-chars", ["gen", "--set", "input={corpus}", "--set", "head_chars=-3"], 2,
     "head_chars=-3 is out of range"),
    ("gen-negative-limit", ["gen", "--set", "input={corpus}", "--set", "limit=-1"], 2, "limit=-1 is out of range"),
    ("read-negative-limit", ["read", "--set", "input={corpus}", "--set", "limit=-1"], 2, "limit=-1 is out of range"),
    ("read-top-p-zero", ["read", "--set", "input={corpus}", "--set", "top_p=0"], 2, "top_p=0.0 is out of range"),
    ("read-openai-without-url", ["read", "--set", "input={corpus}", "--set", "backend=openai"], 2,
     "never falls back to the teacher"),
    ("gen-missing-input", ["gen", "--set", "input={tmp}/missing.jsonl"], 2, "does not exist"),
    ("read-missing-input", ["read", "--set", "input={tmp}/missing.jsonl"], 2, "does not exist"),
    ("read-not-utf8", ["read", "--set", "input={not_utf8}"], 2, "not UTF-8"),
    ("gen-empty-corpus", ["gen", "--set", "input={empty}"], 2, "holds no documents"),
    ("read-empty-corpus", ["read", "--set", "input={empty}"], 2, "holds no documents"),
    ("gen-blank-texts", ["gen", "--set", "input={blank}"], 2, "has empty text"),
    ("read-blank-texts", ["read", "--set", "input={blank}"], 2, "has empty text"),
    ("train-missing-file", ["train", "--set", "train_file={tmp}/missing.jsonl"], 2, "missing.jsonl"),
    ("index-not-utf8", ["index", "--set", "memories={not_utf8}"], 2, "not UTF-8"),
    ("index-missing", ["index", "--set", "memories={tmp}/missing.jsonl"], 2, "does not exist"),
    ("eval-missing-memories", ["eval", "--set", "memories={tmp}/missing.jsonl", "--set", "qa={corpus}"], 2,
     "does not exist"),
    ("eval-unknown-method", ["eval", "--set", "qa={corpus}", "--set", "methods=[fixed, chonk]"], 2,
     "methods: unknown 'chonk'; valid: fixed, sentence, semantic"),
    ("eval-wrong-layout", ["eval", "--set", "dataset=multifieldqa_zh", "--set", "qa={corpus}", "--set",
                           "methods=[fixed]"], 2, "corpus.jsonl:1: field 'answers': missing (the record has: id, text)"),
    ("eval-unknown-dataset", ["eval", "--set", "dataset=squad", "--set", "qa={corpus}"], 2, "dataset: 'squad'"),
    ("read-dist-unreachable-ray", ["read-dist", "--set", "input={corpus}", "--set", "engine=ray", "--set",
                                   "ray_address=127.0.0.1:1", "--set", "connect_timeout_s=2"], 2, "ray start --head"),
    ("read-unreachable-server", ["read", "--set", "input={corpus}", "--set", "backend=openai", "--set",
                                 "base_url=http://127.0.0.1:1/v1"], 2, "nothing answers at http://127.0.0.1:1/v1/models"),
    ("read-vllm-bad-lora-mode", ["read", "--set", "input={corpus}", "--set", "backend=vllm", "--set",
                                 "lora_mode=sometimes"], 2, "lora_mode: 'sometimes' is not one of auto, merge, request"),
    ("gen-unreachable-teacher", ["gen", "--set", "input={corpus}", "--set", "teacher=openai", "--set",
                                 "base_url=http://127.0.0.1:1/v1"], 2, "nothing answers at http://127.0.0.1:1/v1/models"),
    ("report-missing-run", ["report", "no-such-run"], 2, "no-such-run"),
    ("read-cut-threshold-out-of-range", ["read", "--set", "input={corpus}", "--set", "cut_threshold=1.5"], 2,
     "cut_threshold=1.5 is out of range"),
    ("read-cut-dtype-unknown", ["read", "--set", "input={corpus}", "--set", "cut_dtype=half"], 2,
     "cut_dtype: 'half' is not one of auto, float32, bfloat16"),
    ("read-cut-head-not-a-head", ["read", "--set", "input={corpus}", "--set", "cut_head={tmp}"], 2,
     "no cut head there"),
    ("train-cut-only-without-data", ["train", "--set", "cut_only=true"], 2, "cut_head / cut_only need cut_data"),
    ("structure-data-missing-config", ["structure-data", "--config", "{tmp}/nope.yaml"], 2, "does not exist"),
    ("structure-data-unknown-key", ["structure-data", "--set", "no_such_key=1"], 2, "unknown key 'no_such_key'"),
    ("structure-data-parts", ["structure-data", "--set", "min_parts=5", "--set", "max_parts=3"], 2,
     "min_parts=5 must be <= max_parts=3"),
    ("structure-data-missing-shared", ["structure-data", "--set", "shared={tmp}/none"], 2,
     "hotpotqa_100_corpus.json does not exist"),
    ("view-no-file", ["view"], 2, "memories: name the memories file"),
    ("view-missing-file", ["view", "{tmp}/nope.jsonl"], 2, "nope.jsonl: no such file"),
    ("view-corpus-not-memories", ["view", "{corpus}"], 2, "looks like a corpus: turn it into memories first"),
    ("view-not-utf8", ["view", "{not_utf8}"], 2, "is not UTF-8 text"),
    ("view-empty", ["view", "{empty}"], 2, "holds no memories"),
    ("score-both-empty", ["score", "--pred", "{empty}", "--ref", "{empty}"], 2, "both inputs are empty"),
    ("score-negative-bootstrap", ["score", "--pred", "{empty}", "--ref", "{empty}", "--bootstrap", "-5"], 2,
     "bootstrap=-5 is out of range: it must be >= 1"),
    ("score-zero-workers", ["score", "--pred", "{empty}", "--ref", "{empty}", "--workers", "0"], 2,
     "workers=0 is out of range: it must be >= 1"),
    ("score-meteor-alpha", ["score", "--pred", "{empty}", "--ref", "{empty}", "--set", "meteor_alpha=-3"], 2,
     "meteor_alpha=-3 is out of range"),
    ("gen-zero-candidates", ["gen", "--set", "input={corpus}", "--set", "num_candidates=0"], 2,
     "num_candidates=0 is out of range"),
    ("gen-rrf-k-negative", ["gen", "--set", "input={corpus}", "--set", "rrf_k=-1"], 2, "rrf_k=-1.0 is out of range"),
    ("gen-overlap-half-window", ["gen", "--set", "input={corpus}", "--set", "window_tokens=100", "--set",
                                 "overlap_tokens=60"], 2, "must be under half"),
    ("read-overlap-half-window", ["read", "--set", "input={corpus}", "--set", "window_tokens=100", "--set",
                                  "overlap_tokens=60"], 2, "must be under half"),
    ("assess-missing-input", ["assess", "--input", "{tmp}/missing.jsonl"], 2, "does not exist"),
    ("assess-not-utf8", ["assess", "--input", "{not_utf8}"], 2, "not UTF-8"),
    ("assess-empty", ["assess", "--input", "{empty}"], 2, "holds no memories"),
    ("assess-not-memories", ["assess", "--input", "{corpus}"], 2, "schema_version"),
    ("merge-missing-adapter", ["merge", "--adapter", "{tmp}/nope"], 2, "nope"),
    ("merge-missing-adapter-set", ["merge", "--set", "adapter={tmp}/nope"], 2, "no adapter_config.json"),
    ("merge-missing-config", ["merge", "--config", "{tmp}/nope.yaml"], 2, "does not exist"),
    ("merge-yaml-syntax", ["merge", "--config", "{bad_yaml}"], 2, "is not valid YAML"),
    ("merge-unknown-key", ["merge", "--set", "adapter={tmp}", "--set", "adaptor=x"], 2,
     "unknown key 'adaptor'; the nearest valid key is 'adapter'"),
    ("merge-bad-dtype", ["merge", "--adapter", "{tmp}", "--dtype", "fp8"], 2, "dtype='fp8': use one of"),
    ("serve-missing-adapter", ["serve", "--adapter", "{tmp}/nope"], 2, "adapter_config.json"),
    ("serve-bad-token-cap", ["serve", "--default-max-tokens", "9", "--max-tokens-cap", "4"], 2,
     "default_max_tokens=9 is above max_tokens_cap=4"),
    ("serve-port-range", ["serve", "--set", "port=70000"], 2, "port=70000 is out of range"),
    ("train-trl-key-typo", ["train", "--set", "train_file={corpus}", "--set", "gradient_acumulation_steps=2"], 2,
     "the nearest valid key is 'gradient_accumulation_steps'"),
    ("train-removed-warmup-ratio", ["train", "--set", "train_file={corpus}", "--set", "warmup_ratio=0.1"], 2,
     "it is now warmup_steps"),
    ("train-yaml-boolean-word", ["train", "--set", "train_file={corpus}", "--set", "save_strategy=no"], 2,
     "save_strategy: got the YAML boolean False"),
    ("train-comma-target-modules", ["train", "--set", "train_file={corpus}", "--set", "target_modules=q_proj,v_proj"],
     2, "give a list"),
    ("train-output-dir", ["train", "--set", "train_file={corpus}", "--set", "output_dir=/tmp/x"], 2,
     "output_dir is derived from run"),
    ("train-eval-without-val", ["train", "--set", "train_file={corpus}", "--set", "eval_strategy=steps"], 2,
     "evaluates on val_file, which is not set"),
    ("score-unknown-metric", ["score", "--pred", "{empty}", "--ref", "{empty}", "--set", "metrics={{meteor_alfa: 1}}"],
     2, "unknown metric setting(s) meteor_alfa"),
    ("ask-meve-k-zero", ["ask", "--pipeline", "meve", "--set", "k=0", "q"], 2, "k=0 is out of range"),
    ("ask-meve-tau-above-one", ["ask", "--pipeline", "meve", "--set", "tau=1.5", "q"], 2,
     "tau=1.5 is out of range: it must be >= 0 and <= 1"),
    ("ask-meve-tau-below-zero", ["ask", "--pipeline", "meve", "--set", "tau=-0.1", "q"], 2,
     "tau=-0.1 is out of range: it must be >= 0 and <= 1"),
    ("ask-meve-unknown-calibration", ["ask", "--pipeline", "meve", "--set", "verifier_calibration=platt", "q"], 2,
     "verifier_calibration: 'platt' is not one of none, content_free, query"),
    ("ask-meve-embedding-content-free", ["ask", "--pipeline", "meve", "--set", "verifier_kind=embedding", "--set",
                                        "verifier_calibration=content_free", "q"], 2,
     "content_free needs a verifier that reads the passage"),
    ("ask-missing-index", ["ask", "--set", "db_path={tmp}/none.db", "q"], 2, "run `memreader index` first"),
    ("ask-unreachable-server", ["ask", "--set", "db_path=http://127.0.0.1:1", "q"], 2,
     "cannot reach the Milvus server at http://127.0.0.1:1"),
    ("chat-zero-top-k", ["chat", "--set", "top_k=0"], 2, "top_k=0 is out of range"),
    ("ingest-missing-input", ["ingest", "{tmp}/nope"], 2, "does not exist"),
    ("ingest-no-input", ["ingest"], 2, "name at least one file, folder or glob"),
    ("read-a-pdf-as-corpus", ["read", "--set", "input={tmp}/report.pdf"], 2, "memreader ingest"),
    ("chat-bad-fusion", ["chat", "--set", "fusion=mean"], 2, "fusion"),
    ("chat-unknown-backend", ["chat", "--set", "backend=tgi"], 2,
     "backend: 'tgi' is not one of transformers, vllm, openai, auto"),
    ("chat-bad-dtype", ["chat", "--set", "dtype=fp8"], 2, "dtype: 'fp8' is not one of auto, float32, bfloat16"),
    ("chat-unreachable-endpoint", ["chat", "--set", "backend=openai", "--set", "base_url=http://127.0.0.1:1/v1",
                                   "--set", "tokenizer=smollm2-135m-instruct"], 2, "nothing answers at"),
    ("ask-meve-verifier-over-http", ["ask", "--pipeline", "meve", "--set", "verifier_backend=openai", "q"], 2,
     "verifier_backend: 'openai' is not one of transformers, vllm, auto"),
    ("ask-meve-verifier-dtype", ["ask", "--pipeline", "meve", "--set", "verifier_dtype=fp16", "q"], 2,
     "verifier_dtype: 'fp16' is not one of"),
    ("chat-candidates-below-top-k", ["chat", "--set", "top_k=9", "--set", "candidates=4"], 2, "candidates"),
    ("score-bad-profile", ["score", "--pred", "{empty}", "--ref", "{empty}", "--profile", "sacre"], 2,
     "profile='sacre': use one of"),
    # a model that is not here is named, with where it was looked for and the fix, before anything loads
    ("train-model-not-here", ["train", "--set", "train_file={corpus}", "--set", "model={tmp}/no-model"], 2,
     "no-model': no such folder"),
    ("read-model-not-here", ["read", "--set", "input={corpus}", "--set", "model={tmp}/no-model"], 2,
     "no-model': no such folder"),
    ("gen-model-not-here", ["gen", "--set", "input={corpus}", "--set", "model={tmp}/no-model"], 2,
     "no-model': no such folder"),
    ("serve-model-not-here", ["serve", "--model", "{tmp}/no-model"], 2, "no-model': no such folder"),
    ("eval-model-not-here", ["eval", "--set", "qa={corpus}", "--set", "methods=[fixed]", "--set",
                             "answer_model={tmp}/no-model"], 2, "fix: point answer_model at the folder"),
]

# the evaluator's keys (memreader.core.scoring_settings.EvaluatorConfig): the same keys and checks in every stage
for stage, given in (("gen", ["--set", "input={corpus}"]), ("assess", ["--input", "{corpus}"]),
                     ("eval", ["--set", "qa={corpus}"])):
    CASES += [
        (f"{stage}-bad-clarity-variant", [stage, *given, "--set", "clarity_variant=vibes"], 2,
         "clarity_variant: 'vibes' is not one of prob, margin, ppl"),
        (f"{stage}-evaluator-batch-zero", [stage, *given, "--set", "evaluator_batch_tokens=0"], 2,
         "evaluator_batch_tokens=0 is out of range: it must be >= 1"),
        (f"{stage}-evaluator-over-http", [stage, *given, "--set", "evaluator_backend=openai"], 2,
         "evaluator_backend: 'openai' is not one of transformers, vllm, auto"),
        (f"{stage}-evaluator-dtype", [stage, *given, "--set", "evaluator_dtype=fp16"], 2,
         "evaluator_dtype: 'fp16' is not one of auto, float32, bfloat16, float16"),
    ]
CASES += [
    ("assess-renamed-backend", ["assess", "--input", "{corpus}", "--set", "backend=vllm"], 2,
     "unknown key 'backend': it is now 'evaluator_backend'"),
    ("gen-renamed-score-batch-tokens", ["gen", "--set", "input={corpus}", "--set", "score_batch_tokens=4096"], 2,
     "unknown key 'score_batch_tokens': it is now 'evaluator_batch_tokens'"),
]

# the commands that were scripts (issue 48): each refuses before any model loads or any file is written
CASES += [
    ("checkpoint-not-a-checkpoint", ["checkpoint", "restore", "{tmp}", "--set", "qa={corpus}", "--set",
                                     "memories={corpus}"], 2,
     "not a checkpoint written by `memreader checkpoint save`"),
    ("checkpoint-run-escapes", ["checkpoint", "save", "{tmp}/c", "--set", "run=../x"], 2, "not a valid run name"),
    ("calibrate-meve-one-corpus", ["calibrate-meve", "--set", "corpora=[hotpotqa,hotpotqa]"], 2,
     "at least two different corpora"),
    ("calibrate-meve-no-files", ["calibrate-meve", "--data-dir", "{tmp}"], 2, "hotpotqa_100_qa.json"),
    ("calibrate-meve-no-cross-encoder", ["calibrate-meve", "--set", "kinds=[cross_encoder]", "--set",
                                         "cross_encoders={tmp}"], 2,
     "cross-encoder-without-cmrc2018 not found; train it: memreader train-verifier --set run=calibrate-meve --exclude"),
    ("measure-engines-unknown-stage", ["measure-engines", "--set", "stages=[chat,nope]"], 2,
     "stages: unknown ['nope']"),
    ("measure-engines-bad-row", ["measure-engines", "--set", "rows=[vllm:fp8]"], 2, "'vllm:fp8' is not backend:dtype"),
    ("setup-wordnet-no-source", ["setup-wordnet", "--set", "source={tmp}/none", "--set", "dest={tmp}/d", "--set",
                                 "download=false"], 2, "has no WordNet 3.0 database"),
    ("train-verifier-unknown-exclude", ["train-verifier", "--exclude", "nope"], 2, "exclude: unknown corpus 'nope'"),
    ("train-verifier-no-files", ["train-verifier", "--data-dir", "{tmp}"], 2, "hotpotqa_100_qa.json"),
    ("train-verifier-out-exists", ["train-verifier", "--out", "{tmp}"], 2, "exists; pass --overwrite"),
]


@pytest.mark.parametrize(("name", "argv", "code", "needle"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_matrix(home: Path, capsys: pytest.CaptureFixture[str], name: str, argv: list[str], code: int,
                          needle: str) -> None:
    files = {k: str(v) for k, v in _files(home).items()}
    args = [a.format(tmp=home, **files) for a in argv]
    assert main(args) == code, capsys.readouterr()
    err = capsys.readouterr().err
    assert f"memreader {args[0]}: error:" in err and needle in err, err
    assert "Traceback" not in err
    assert not (home / "x").exists() and not (home.parent / "x").exists()  # nothing written outside runs/


def test_matrix_size_is_reported() -> None:
    """The matrix covers every subcommand (help aside)."""
    from memreader.cli import COMMANDS

    covered = {argv[0] for _, argv, _, _ in CASES}
    assert covered == set(COMMANDS), set(COMMANDS) - covered
    print(f"bad-input matrix: {len(CASES)} cases over {len(covered)} subcommands")


def test_serve_port_in_use_is_reported_before_the_model_loads(home: Path, capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", str(home)]) == 2  # a folder, but no model to load
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err and "Traceback" not in err


def test_a_hub_model_offline_and_not_cached_is_named_before_anything_loads(home: Path, capsys,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe's base model neither on disk nor reachable: one message with the fix, not transformers' tracebacks."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hf-cache"))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    corpus = _files(home)["corpus"]
    config = Path(__file__).resolve().parents[1] / "configs" / "training" / "qwen2_5_1.5b_lora.yaml"
    assert main(["train", "--config", str(config), "--set", f"train_file={corpus}", "--set", f"val_file={corpus}"]) == 2
    err = capsys.readouterr().err
    assert "model='Qwen/Qwen2.5-1.5B-Instruct'" in err and str(home / "hf-cache") in err, err
    assert "hf download Qwen/Qwen2.5-1.5B-Instruct" in err and "Traceback" not in err and "OSError" not in err
    assert not (home / "home" / "runs").exists()  # refused before the run folder was made


class _Backend:
    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None):
        from memreader.core.markup import render_memory

        outs = []
        for msgs in list_of_messages:
            doc = msgs[-1]["content"].split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]
            outs.append(render_memory(["x"], [doc], ["c"]))
        return outs


def test_refused_resume_leaves_the_earlier_record_unchanged(home: Path, capsys) -> None:
    from memreader.inference.reader import ReadConfig, read_corpus_memories

    corpus = _files(home)["corpus"]
    read_corpus_memories(ReadConfig(input=str(corpus), run="good", guided="off"), backend=_Backend())
    folder = home / "home" / "runs" / "good" / "read"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert main(["read", "--set", f"input={corpus}", "--set", "run=good", "--set", "guided=off",
                 "--set", "temperature=0.5"]) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


@pytest.mark.heavy
def test_second_writer_is_refused_naming_the_holder(home: Path, capsys) -> None:
    corpus = _files(home)["corpus"]
    folder = home / "home" / "runs" / "busy" / "read"
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (folder / ".memreader.lock").write_text(f"{holder.pid} {socket.gethostname()}\n")
        assert main(["read", "--set", f"input={corpus}", "--set", "run=busy"]) == 2
        err = capsys.readouterr().err
        assert f"being written by process {holder.pid}" in err and "Traceback" not in err
        assert not (folder / "memories.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.heavy
def test_stale_lock_is_taken_over(home: Path) -> None:
    from memreader.core.runlock import RunLock

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(done.stdout)  # that process has exited
    folder = home / "run"
    folder.mkdir()
    (folder / ".memreader.lock").write_text(f"{dead_pid} {socket.gethostname()}\n")
    with RunLock(folder) as lock:
        assert lock.held and (folder / ".memreader.lock").read_text().split()[0] == str(os.getpid())
    assert not (folder / ".memreader.lock").exists()


def test_all_failed_run_exits_1(home: Path, capsys, monkeypatch) -> None:
    from tests.engine_fakes import fake_engines

    class Refuser(_Backend):
        def generate_many(self, list_of_messages, *a, **kw):
            return ["I cannot do that."] * len(list_of_messages)

    fake_engines(monkeypatch, Refuser())
    corpus = _files(home)["corpus"]
    assert main(["gen", "--set", f"input={corpus}", "--set", "guided=off", "--set", "reverse_com=false",
                 "--set", "teacher=transformers"]) == 1
    err = capsys.readouterr().err
    assert "every one of the 1 documents failed" in err and "Traceback" not in err


def test_empty_text_documents_are_skipped_before_any_call(home: Path, capsys) -> None:
    from memreader.inference.reader import ReadConfig, read_corpus_memories

    corpus = home / "mixed.jsonl"
    corpus.write_text(json.dumps({"id": "e", "text": " \n"}) + "\n" +
                      json.dumps({"id": "t", "text": "Real text here."}) + "\n", encoding="utf-8")
    backend = _Backend()
    calls: list[int] = []
    real = backend.generate_many
    backend.generate_many = lambda msgs, *a, **kw: (calls.append(len(msgs)), real(msgs, *a, **kw))[1]
    summary = read_corpus_memories(ReadConfig(input=str(corpus), run="mixed", guided="off"), backend=backend)
    assert calls == [1] and summary["skipped_empty"] == ["e"] and summary["read"] == 1
    assert "1 document(s) with empty text were skipped" in capsys.readouterr().out
