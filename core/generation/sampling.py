"""Seeded sampling per row: the same prompt and seed give the same reply whatever the batch.

    seed = row_seed(params.seed, messages)          # a 63-bit seed from (seed, exact messages)
    sampler = SeededSampler([seed_a, seed_b], temperature=0.7, top_p=0.8)
    model.generate(**enc, do_sample=False, logits_processor=LogitsProcessorList([..., sampler]))

Details: docs/ARCHITECTURE.md (The teacher flow: ``SeededSampler``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any


def row_seed(seed: int, messages: Any, sample: int = 0) -> int:
    """A 63-bit generator seed from the user's ``seed``, the exact messages and a sample index."""
    blob = json.dumps([seed, sample, messages], ensure_ascii=False, sort_keys=True)
    return int.from_bytes(hashlib.sha256(blob.encode("utf-8")).digest()[:8], "big") >> 1


class SeededSampler:
    """A transformers logits processor that samples each row from its own generator (see module doc).

    Put it last in the processor list and call ``generate`` with ``do_sample=False``.
    """

    def __init__(self, seeds: Sequence[int | None], temperature: float, top_p: float) -> None:
        if temperature <= 0:
            raise ValueError(f"SeededSampler needs temperature > 0, got {temperature} (use greedy decoding for 0)")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p={top_p} must be in (0, 1]")
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.seeds = list(seeds)
        self.generators: list[Any] = []  # made on the first call, on the scores' device

    def _make_generators(self, device: Any) -> None:
        import torch

        for s in self.seeds:
            g = torch.Generator(device=device)
            if s is None:
                g.seed()  # unseeded row: fresh entropy, as transformers' own sampling would be
            else:
                g.manual_seed(int(s))
            self.generators.append(g)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if not self.generators:
            self._make_generators(scores.device)
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        out = torch.full_like(scores, float("-inf"))
        for r, g in enumerate(self.generators):
            p = probs[r]
            if self.top_p < 1.0:
                top, order = nucleus_prefix(p, self.top_p)
                keep = (torch.cumsum(top, 0) - top) < self.top_p  # always keeps the top token
                token = order[torch.multinomial(torch.where(keep, top, torch.zeros_like(top)), 1, generator=g)]
            else:
                token = torch.multinomial(p, 1, generator=g)
            out[r, token] = 0.0
        return out


NUCLEUS_K = 64
"""Tokens looked at first for a nucleus: a grammar's mask or a peaked distribution puts it in far fewer."""


def nucleus_prefix(p: Any, top_p: float) -> tuple[Any, Any]:
    """The largest probabilities of ``p`` in descending order (values, indices), enough of them to hold its top-p
    nucleus: the top 64 when they reach ``top_p`` (the token after them then starts at or past ``top_p`` and is
    never kept), else eight times more, up to the whole vocabulary. The same values and order a full sort gives
    for the kept tokens, at a fraction of its cost (sorting 49k probabilities every step was the transformers
    path's largest cost after the model)."""
    import torch

    k = min(NUCLEUS_K, p.numel())
    while True:
        top, order = torch.topk(p, k)
        if k == p.numel() or float(top.sum()) >= top_p:
            return top, order
        k = min(8 * k, p.numel())
