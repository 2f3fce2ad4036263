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
                sorted_p, order = torch.sort(p, descending=True)
                keep = (torch.cumsum(sorted_p, 0) - sorted_p) < self.top_p  # always keeps the top token
                sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
                token = order[torch.multinomial(sorted_p, 1, generator=g)]
            else:
                token = torch.multinomial(p, 1, generator=g)
            out[r, token] = 0.0
        return out
