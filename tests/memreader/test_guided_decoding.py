"""Guided decoding end to end on a tiny random Llama (llguidance masks, batching with a free row),
the truncation policy, and the small guards around them."""

from __future__ import annotations

import pytest

from memreader.core.assemble import memory_from_output
from memreader.core.generation.params import GenerationParams, GenerationRequestError, Reply
from memreader.core.guidance import MemoryGrammars, ask_with_policy, count_fates, longer_budget, settle_reply
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
        compile_matcher,
        ll_tokenizer,
    )

    _, tokenizer = tiny
    ll_tok = ll_tokenizer(tokenizer)
    assert ll_tokenizer(tokenizer) is ll_tok  # built once per tokenizer
    matcher = compile_matcher(ll_tok, plans[0].lark)  # free text is no sentence of a memory grammar
    assert not (matcher.consume_tokens(ll_tok.tokenize_str("<outline>\nfree text\n</outline>\n"))
                and matcher.is_accepting())
    with pytest.raises(ValueError, match="llguidance rejected the grammar"):
        compile_matcher(ll_tok, "start: missing_rule\n")

    class Slow:
        is_fast = False

    with pytest.raises(GuidedDecodingUnavailable, match="fast"):
        ll_tokenizer(Slow())


def _stop(text: str) -> Reply:
    return Reply(text, finish_reason="stop")


def _cut(text: str) -> Reply:
    return Reply(text, finish_reason="length")


def test_retry_longer_asks_again_once_then_settles() -> None:
    error = GenerationRequestError("boom", status=500)
    assert settle_reply(_stop("a"), "retry_longer")[1] == "ok"
    assert settle_reply(_cut("b"), "retry_longer")[1] == "again"  # the first cut: once more, twice the budget
    assert settle_reply(_stop("b-long"), "retry_longer", retried=True)[1] == "retried"
    assert settle_reply(_cut("d-long"), "retry_longer", retried=True)[1] == "truncated-skipped"
    assert settle_reply(error, "retry_longer") == (error, "error")
    assert longer_budget(GenerationParams(max_new_tokens=100)).max_new_tokens == 200
    reply, fate = settle_reply("plain", "retry_longer")  # a backend that reports nothing: a Reply, finish unknown
    assert isinstance(reply, Reply) and reply == "plain" and fate == "ok"
    assert count_fates(["ok", "retried", "error", "truncated-skipped", "ok"]) == {
        "error": 1, "ok": 2, "retried": 1, "truncated-skipped": 1}


@pytest.mark.parametrize(("policy", "fate"), [("skip", "truncated-skipped"), ("keep_flagged", "truncated-kept")])
def test_skip_and_keep_flagged_never_ask_again(policy: str, fate: str) -> None:
    reply, got = settle_reply(_cut("a"), policy)
    assert got == fate and reply == "a" and reply.truncated
    assert settle_reply(_stop("b"), policy)[1] == "ok"


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="on_truncated"):
        settle_reply(_stop("a"), "retry")


def test_ask_with_policy_asks_again_with_twice_the_budget() -> None:
    import asyncio

    asked: list[int] = []

    async def ask(params: GenerationParams) -> Reply:
        asked.append(params.max_new_tokens)
        return _cut("x") if len(asked) == 1 else _stop("x-long")

    reply, fate = asyncio.run(ask_with_policy(ask, GenerationParams(max_new_tokens=50)))
    assert asked == [50, 100] and fate == "retried" and reply == "x-long"


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
