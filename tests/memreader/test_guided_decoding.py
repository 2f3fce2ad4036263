"""Guided decoding end to end on a tiny random Llama (llguidance masks, batching with a free row),
the truncation policy, and the small guards around them."""

from __future__ import annotations

import pytest

from memreader.core.assemble import memory_from_output
from memreader.core.generation.params import GenerationParams, GenerationRequestError, Reply
from memreader.core.guidance import MemoryGrammars, count_fates, generate_with_policy
from memreader.core.memory_grammar import BoundaryGraph, GrammarSettings

SETTINGS = GrammarSettings(min_chunk_chars=30, max_chunk_chars=90, topic_tokens=6, min_topic_tokens=3,
                           core_tokens=10, min_core_tokens=4)
DOCS = [
    "The cat sat on a mat today. It was warm and the sun was out! Birds sang in the old oak tree? "
    "Then rain came down hard.",
    "Tea came to Europe long ago. Dutch traders shipped it first.\nBrewing needs hot water. "
    "Green tea prefers cooler water.",
]


@pytest.fixture(scope="module")
def tiny(tiny_model: str):
    """(model, tokenizer) of the session's tiny random Llama, on one CPU thread (a 32-wide model is
    fastest single-threaded, and several threads crawl when the cores are shared)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    yield LlamaForCausalLM.from_pretrained(tiny_model).eval(), tokenizer
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def plans(tiny):
    _, tokenizer = tiny
    grammars = MemoryGrammars(SETTINGS, lambda t: len(tokenizer.encode(t, add_special_tokens=False)))
    plans, errors = grammars.plan([*DOCS, "  \n "], 2000)
    assert errors.keys() == {2} and "empty" in errors[2] and plans[2] is None
    return plans[:2]


def _messages(doc: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Read this document:\n{doc}"}]


@pytest.mark.integration
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_guided_rows_are_exact_memories_beside_a_free_row(tiny, plans, temperature: float) -> None:
    from memreader.core.generation.local import generate_chat_batch

    model, tokenizer = tiny
    budget = max(p.worst_case_tokens for p in plans)
    params = GenerationParams(temperature=temperature, top_p=0.9, max_new_tokens=budget, seed=7)
    batch = [_messages(DOCS[0]), _messages("Say hello."), _messages(DOCS[1])]
    gens = generate_chat_batch(model, tokenizer, batch, params, grammars=[plans[0].lark, None, plans[1].lark])
    assert [g.guided for g in gens] == [True, False, True]
    for gen, doc, plan in zip([gens[0], gens[2]], DOCS, plans, strict=True):
        assert gen.finish_reason == "stop", gen.text
        assert gen.completion_tokens <= plan.worst_case_tokens
        assert gen.text.startswith("<outline>\n") and gen.text.endswith("\n</scenario>")
        mem = memory_from_output("d", doc, gen.text)
        assert mem.meta["alignment"]["coverage_exact"] == 1.0
        # the grammar lets the outline have 1..scenarios_max items; nothing else may need repair
        assert all(d.startswith("outline has") for d in mem.meta["parse_diagnostics"]), mem.meta
        assert len(mem.scenarios) >= 2 and "".join(mem.chunks) == doc
        graph = BoundaryGraph.build(doc, SETTINGS)
        for sc in mem.scenarios:
            assert sc.end in graph.edges[sc.start], (sc.start, sc.end)
            assert sc.core and "<" not in sc.core and "\n" not in sc.core


@pytest.mark.integration
def test_guided_row_cut_off_by_its_budget_is_length(tiny, plans) -> None:
    from memreader.core.generation.local import generate_chat_batch

    model, tokenizer = tiny
    params = GenerationParams(temperature=0, max_new_tokens=12)
    gens = generate_chat_batch(model, tokenizer, [_messages(DOCS[0])], params, grammars=[plans[0].lark])
    assert gens[0].finish_reason == "length" and gens[0].guided and gens[0].completion_tokens == 12
    assert gens[0].text.startswith("<outline>\n")


@pytest.mark.integration
def test_accepts_and_compile_guards(tiny, plans) -> None:
    from memreader.core.generation.guided import (
        GuidedDecodingUnavailable,
        accepts,
        compile_matcher,
        ll_tokenizer,
    )

    _, tokenizer = tiny
    ll_tok = ll_tokenizer(tokenizer)
    assert ll_tokenizer(tokenizer) is ll_tok  # built once per tokenizer
    assert not accepts(ll_tok, plans[0].lark, "<outline>\nfree text\n</outline>\n")
    with pytest.raises(ValueError, match="llguidance rejected the grammar"):
        compile_matcher(ll_tok, "start: missing_rule\n")

    class Slow:
        is_fast = False

    with pytest.raises(GuidedDecodingUnavailable, match="fast"):
        ll_tokenizer(Slow())


class FakeCall:
    """``call(indices, params)`` scripted per round: item i's reply in round r is ``script[r][i]``."""

    def __init__(self, *rounds: dict[int, object]) -> None:
        self.rounds, self.calls = list(rounds), []

    def __call__(self, indices: list[int], params: GenerationParams) -> list[object]:
        self.calls.append((list(indices), params.max_new_tokens))
        script = self.rounds[len(self.calls) - 1]
        return [script[i] for i in indices]


def _stop(text: str) -> Reply:
    return Reply(text, finish_reason="stop")


def _cut(text: str) -> Reply:
    return Reply(text, finish_reason="length")


def test_retry_longer_asks_again_once_for_the_cut_off_items() -> None:
    error = GenerationRequestError("boom", status=500)
    call = FakeCall({0: _stop("a"), 1: _cut("b"), 2: error, 3: _cut("d")},
                    {1: _stop("b-long"), 3: _cut("d-long")})
    params = GenerationParams(max_new_tokens=100)
    replies, fates = generate_with_policy(call, 4, params, on_truncated="retry_longer")
    assert call.calls == [([0, 1, 2, 3], 100), ([1, 3], 200)]
    assert fates == ["ok", "retried", "error", "truncated-skipped"]
    assert replies[1] == "b-long" and replies[3] == "d-long" and replies[2] is error
    assert count_fates(fates) == {"error": 1, "ok": 1, "retried": 1, "truncated-skipped": 1}


@pytest.mark.parametrize(("policy", "fate"), [("skip", "truncated-skipped"), ("keep_flagged", "truncated-kept")])
def test_skip_and_keep_flagged_never_ask_again(policy: str, fate: str) -> None:
    call = FakeCall({0: _cut("a"), 1: _stop("b")})
    replies, fates = generate_with_policy(call, 2, GenerationParams(max_new_tokens=50), on_truncated=policy)
    assert call.calls == [([0, 1], 50)]
    assert fates == [fate, "ok"] and replies == ["a", "b"] and replies[0].truncated


def test_nothing_cut_off_means_one_call_and_bad_policy_is_refused() -> None:
    call = FakeCall({0: _stop("a")})
    assert generate_with_policy(call, 1, GenerationParams())[1] == ["ok"] and len(call.calls) == 1
    with pytest.raises(ValueError, match="on_truncated"):
        generate_with_policy(FakeCall(), 1, GenerationParams(), on_truncated="retry")


@pytest.mark.integration
def test_sampled_rows_do_not_depend_on_their_batch(tiny, plans) -> None:
    """Each row samples from its own seeded generator: the same prompt and seed give the same reply
    alone, in a batch with other rows, in another order, guided or not; another seed another reply."""
    from memreader.core.generation.local import generate_chat_batch

    model, tokenizer = tiny
    params = GenerationParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=3)
    prompts = [_messages(DOCS[0]), _messages("Say hello."), _messages(DOCS[1])]
    alone = [generate_chat_batch(model, tokenizer, [p], params)[0].text for p in prompts]
    together = [g.text for g in generate_chat_batch(model, tokenizer, prompts[::-1], params)][::-1]
    assert together == alone
    seeds = [3, 4, 3]
    mixed = generate_chat_batch(model, tokenizer, prompts, params, seeds=seeds)
    assert mixed[0].text == alone[0] and mixed[2].text == alone[2] and mixed[1].text != alone[1]
    guided_alone = generate_chat_batch(model, tokenizer, [prompts[0]], params, grammars=[plans[0].lark])[0]
    guided_batch = generate_chat_batch(model, tokenizer, prompts, params, grammars=[plans[0].lark, None, None])[0]
    assert guided_alone.text == guided_batch.text and guided_alone.guided
