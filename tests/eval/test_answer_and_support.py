"""Answers and their support in one pass (memreader.eval.answering.answer_and_support): where the answerer keeps a prefix
cache, each group that fits it is scored first and answered second; the results keep the prompts' order.
The real vLLM cache hits are tested in tests/inference/test_vllm.py."""

from __future__ import annotations

from memreader.core.generation import GenerationParams
from memreader.eval.answering import CACHE_SHARE, answer_and_support, cache_groups

PARAMS = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=10)


class _Answerer:
    """Replies ``answer:<prompt>`` and logs each call; no prefix cache (transformers, a remote server)."""

    def __init__(self) -> None:
        self.log = []

    def generate_many(self, prompts, params):
        self.log.append(("answer", list(prompts)))
        return [f"answer:{p}" for p in prompts]


class _CachingAnswerer(_Answerer):
    """An engine with a prefix cache of ``cache_tokens`` (0: caching off); a prompt's token count is its length."""

    def __init__(self, cache_tokens: int) -> None:
        super().__init__()
        self.cache_tokens = cache_tokens

    def prefix_cache_tokens(self) -> int:
        return self.cache_tokens

    def prompt_tokens(self, prompt) -> int:
        return len(prompt)


def test_cache_groups_are_consecutive_and_within_the_budget() -> None:
    assert cache_groups([30, 30, 30, 50, 120, 10], 100) == [[0, 1, 2], [3], [4], [5]]
    assert cache_groups([], 100) == []
    assert cache_groups([5] * 4, 1000) == [[0, 1, 2, 3]]


def test_each_group_is_scored_then_answered_in_prompt_order() -> None:
    prompts = ["a" * 40, "b" * 40, "c" * 40, "d" * 10]  # with 10 new tokens each: 50, 50, 50, 20
    answerer = _CachingAnswerer(cache_tokens=int(110 / CACHE_SHARE) + 1)

    def support(idx):
        answerer.log.append(("support", list(idx)))
        return [f"score:{i}" for i in idx]

    def saved(got, idx):  # the caller saves each group as it finishes: both results are there already
        answerer.log.append(("saved", [(got.replies[i], got.support[i]) for i in idx]))

    done = answer_and_support(answerer, prompts, PARAMS, support, on_done=saved)
    assert done.reuse and done.groups == [[0, 1], [2, 3]]
    assert answerer.log == [
        ("support", [0, 1]), ("answer", prompts[:2]), ("saved", [(f"answer:{prompts[0]}", "score:0"),
                                                                 (f"answer:{prompts[1]}", "score:1")]),
        ("support", [2, 3]), ("answer", prompts[2:]), ("saved", [(f"answer:{prompts[2]}", "score:2"),
                                                                 (f"answer:{prompts[3]}", "score:3")])]
    assert done.replies == [f"answer:{p}" for p in prompts] and done.support == [f"score:{i}" for i in range(4)]
    assert done.generate_s >= 0 and done.support_s >= 0


def test_without_a_prefix_cache_or_support_it_answers_first_in_one_pass() -> None:
    prompts = ["x" * 40, "y" * 40]
    for answerer in (_Answerer(), _CachingAnswerer(0)):  # no such method (transformers, a remote server), or caching off

        def support(idx, answerer=answerer):
            answerer.log.append(("support", list(idx)))
            return [None] * len(idx)

        done = answer_and_support(answerer, prompts, PARAMS, support)
        assert not done.reuse and done.groups == [[0, 1]]
        assert answerer.log == [("answer", prompts), ("support", [0, 1])]
    answerer = _CachingAnswerer(10_000)
    done = answer_and_support(answerer, prompts, PARAMS, None)  # support off: nothing to reuse
    assert not done.reuse and done.support == [None, None] and answerer.log == [("answer", prompts)]
    done = answer_and_support(answerer, prompts, PARAMS, lambda idx: [1.0] * len(idx), reuse_prefix=False)
    assert not done.reuse and done.support == [1.0, 1.0]
