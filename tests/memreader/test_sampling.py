"""The transformers path's seeded top-p sampler: the nucleus it draws from is exactly the full sort's, each row's
draws are its own whatever the batch, and the draws follow the nucleus's probabilities."""

from __future__ import annotations

import pytest
import torch

from memreader.core.generation.sampling import NUCLEUS_K, SeededSampler, nucleus_prefix

V = 49152  # SmolLM2's vocabulary


def _full_sort_nucleus(p: torch.Tensor, top_p: float) -> dict[int, float]:
    sorted_p, order = torch.sort(p, descending=True)
    keep = (torch.cumsum(sorted_p, 0) - sorted_p) < top_p
    return dict(zip(order[keep].tolist(), sorted_p[keep].tolist(), strict=True))


def _scores(kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "peaked":
        return torch.randn(V, generator=g) * 6
    if kind == "flat":  # a nucleus of thousands of tokens: the prefix must grow past the first 64
        return torch.randn(V, generator=g) * 0.3
    allowed = torch.rand(V, generator=g) < 0.002  # a grammar's mask: ~100 tokens allowed
    return torch.where(allowed, torch.randn(V, generator=g), torch.tensor(float("-inf")))


@pytest.mark.parametrize("kind", ["peaked", "flat", "masked"])
@pytest.mark.parametrize("top_p", [0.1, 0.9, 0.999])
def test_the_nucleus_is_the_full_sorts(kind: str, top_p: float) -> None:
    p = torch.softmax(_scores(kind, 3) / 0.7, dim=-1)
    top, order = nucleus_prefix(p, top_p)
    keep = (torch.cumsum(top, 0) - top) < top_p
    got = dict(zip(order[keep].tolist(), top[keep].tolist(), strict=True))
    assert got == _full_sort_nucleus(p, top_p)
    if kind == "flat" and top_p > 0.5:
        assert len(got) > NUCLEUS_K  # the growing branch ran


def test_each_row_draws_the_same_tokens_alone_or_in_a_batch() -> None:
    rows = torch.stack([_scores(k, i) for i, k in enumerate(["peaked", "flat", "masked", "peaked"])])
    batch = SeededSampler([11, 12, 13, 14], temperature=0.8, top_p=0.9)
    alone = SeededSampler([13], temperature=0.8, top_p=0.9)
    for _ in range(5):
        assert batch(None, rows).argmax(-1)[2] == alone(None, rows[2:3]).argmax(-1)[0]


def test_draws_follow_the_nucleus_probabilities() -> None:
    scores = torch.full((V,), -8.0)  # a nucleus of a few tokens with clearly different probabilities
    scores[[7, 70, 700, 7000, 40000]] = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.0])
    p = torch.softmax(scores / 0.7, dim=-1)
    target = _full_sort_nucleus(p, 0.9)
    total = sum(target.values())
    sampler = SeededSampler([0], temperature=0.7, top_p=0.9)
    counts: dict[int, int] = {}
    n = 2000
    for _ in range(n):
        token = int(sampler(None, scores[None]).argmax(-1))
        counts[token] = counts.get(token, 0) + 1
    assert set(counts) <= set(target) and len(target) > 1
    distance = sum(abs(counts.get(t, 0) / n - q / total) for t, q in target.items()) / 2
    assert distance < 0.03
