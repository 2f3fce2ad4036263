"""Informational support: batched, padded, head-sliced scores equal a one-at-a-time direct computation.

The reference computation takes the messages the QA stage itself sends (``memreader.eval.answering.answer_messages``,
which ``memreader.eval.method_run`` calls), applies the chat template, appends the answer's tokens, runs one
unpadded full forward and averages ``-log_softmax`` over the answer tokens.
"""

from __future__ import annotations

import pytest
import torch

from memreader.eval.answering import answer_messages
from memreader.eval.support import (
    SupportError,
    SupportItem,
    informational_support,
    support_for_answers,
    support_signature,
)

pytestmark = pytest.mark.integration

TOL = 1e-4

ITEMS = [
    SupportItem("How many compost bays are there?",
                ["The garden has three compost bays.", "Bay one holds fresh scraps.", "Nothing else."],
                ["Three bays.", "3"]),
    SupportItem("Who built the bridge?", ["The bridge was built in 1890 by the town council after the flood."],
                "The town council built it."),
    SupportItem("厦门大学在哪里？", ["厦门大学位于福建省厦门市思明区。", "它创办于1921年。"], ["福建省厦门市。"]),
    SupportItem("What is missing?", [], ["Nothing is missing here, the text says so clearly and at length."]),
    SupportItem("Blank reference?", ["Some passage."], ["   "]),
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[
        request.param]
    config = config_class(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        initializer_range=0.4, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return model_class(config).eval()


def direct(model, tokenizer, question: str, chunks: list[str], answer: str) -> tuple[float, int]:
    """One unpadded forward, full logits, fp32 log-softmax: mean -log p of the answer tokens."""
    text = tokenizer.apply_chat_template(answer_messages(question, chunks), add_generation_prompt=True,
                                         tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    ans = tokenizer(answer.strip(), add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + ans])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    nll = [-logp[p - 1, ids[0, p]].item() for p in range(len(prompt), ids.shape[1])]
    return sum(nll) / len(nll), len(nll)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_support_equals_direct_computation(model, tokenizer, batch_size):
    scores = informational_support(model, tokenizer, ITEMS, batch_size=batch_size, slice_tokens=7)
    assert len(scores) == len(ITEMS)
    for item, score in zip(ITEMS[:4], scores[:4], strict=True):
        first = item.answers if isinstance(item.answers, str) else item.answers[0]
        expected, n = direct(model, tokenizer, item.question, list(item.contexts), first)
        assert score.nll == pytest.approx(expected, abs=TOL)
        assert score.n_tokens == n and not score.truncated and score.context_chunks == len(item.contexts)
    assert scores[4].nll is None and scores[4].n_tokens == 0  # blank reference: nothing to score


def test_min_over_references_and_context_matters(model, tokenizer):
    item = ITEMS[0]
    scores = informational_support(model, tokenizer, [item], multi_ref="min")
    each = [direct(model, tokenizer, item.question, list(item.contexts), a)[0] for a in item.answers]
    assert scores[0].nll == pytest.approx(min(each), abs=TOL)
    assert scores[0].answer_index == each.index(min(each))
    no_context = informational_support(model, tokenizer, [SupportItem(item.question, [], item.answers)])
    assert no_context[0].nll != pytest.approx(
        informational_support(model, tokenizer, [item])[0].nll, abs=1e-3)  # the context enters the condition


def test_truncation_drops_lowest_ranked_chunks(model, tokenizer):
    item = ITEMS[0]
    full = informational_support(model, tokenizer, [item])[0]
    two = direct(model, tokenizer, item.question, list(item.contexts[:2]), item.answers[0])
    text = tokenizer.apply_chat_template(answer_messages(item.question, list(item.contexts[:2])),
                                         add_generation_prompt=True, tokenize=False)
    limit = len(tokenizer(text, add_special_tokens=False)["input_ids"]) + full.n_tokens
    cut = informational_support(model, tokenizer, [item], max_context_tokens=limit)[0]
    assert cut.truncated and cut.context_chunks == 2
    assert cut.nll == pytest.approx(two[0], abs=TOL)
    with pytest.raises(SupportError, match="max_context_tokens"):
        informational_support(model, tokenizer, [item], max_context_tokens=10)


def test_loader_entry_and_signature(model, tokenizer):
    qs = [it.question for it in ITEMS[:2]]
    ctx = [list(it.contexts) for it in ITEMS[:2]]
    ans = [it.answers for it in ITEMS[:2]]
    scores = support_for_answers((model, tokenizer), qs, ctx, ans, batch_size=2)
    assert [s.nll for s in scores] == pytest.approx([s.nll for s in informational_support(model, tokenizer,
                                                                                            ITEMS[:2])], abs=1e-6)
    assert support_signature("tiny").startswith("Support|model:tiny|tpl:qa_answer.en@")
    with pytest.raises(SupportError, match="align"):
        support_for_answers((model, tokenizer), qs, ctx[:1], ans)


def test_the_answering_prompt_holds_numbered_chunks_and_the_question():
    msgs = answer_messages("Who built it?", ["first passage", "second passage"])
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "[1] first passage\n\n[2] second passage" in msgs[1]["content"]
    assert "Question: Who built it?" in msgs[1]["content"]
