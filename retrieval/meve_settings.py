"""MeVe's settings: the keys of its five phases, their defaults and where those came from.

    MeVeSettings()                      # the operating point chosen leave-one-corpus-out (DEFAULT_OPERATING_POINT)
    MeVeSettings(**PAPER_SETTINGS)      # the paper's values (Ottem 2025, appendix A.4)

The pipeline that runs them is :mod:`memreader.retrieval.meve`; ``memreader calibrate-meve`` chose the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from memreader.core.config import field
from memreader.core.engines import backend_field, backend_problem, dtype_field, dtype_problem
from memreader.core.registry import SMOLLM2
from memreader.retrieval.verifier import KINDS, VERIFIER_BATCH
from memreader.retrieval.verifier_calibration import CALIBRATIONS

__all__ = ["DEFAULT_OPERATING_POINT", "DEFAULT_POINT", "PAPER_SETTINGS", "POINT_KEYS", "VERIFIER_KINDS", "MeVeSettings"]

VERIFIER_KINDS = (*KINDS, "embedding")

DEFAULT_OPERATING_POINT = (
    "lm_likelihood/none tau=0.7965 t_max=2048 redundancy=0.95, chosen leave-one-corpus-out by memreader calibrate-meve "
    "on HotpotQA-100, CMRC 2018 (100 questions) and MultiFieldQA-zh (38) (docs/MEVE.md); out of corpus: hotpotqa recall "
    "0.815 vs top-5 0.785, tokens -79.3% vs top-20; cmrc2018 1.000 vs 1.000, -79.7%; multifieldqa_zh 0.579 vs 0.474, "
    "-86.7%")
"""Where :class:`MeVeSettings`' defaults come from (recorded in every audit that runs them)."""
POINT_KEYS = ("k", "n_min", "fallback_k", "verify", "verifier", "verifier_kind", "verifier_calibration",
              "verifier_max_tokens", "tau", "redundancy", "t_max", "budget_share", "budget_tokenizer", "fallback",
              "prioritize", "pack")
"""The keys that make :data:`DEFAULT_OPERATING_POINT` (their values: :class:`MeVeSettings`' defaults, :data:`DEFAULT_POINT`):
an audit that names that point while one of them differs says so."""
PAPER_SETTINGS = {"k": 20, "tau": 0.5, "n_min": 3, "redundancy": 0.85, "t_max": 512, "verifier_kind": "lm",
                  "verifier_calibration": "none", "budget_share": 0.0, "operating_point": ""}
"""The paper's values (Ottem 2025, appendix A.4; its cross-encoder verifier is not shipped offline, so ``lm``):
``MeVeSettings(**PAPER_SETTINGS)``."""


@dataclass
class MeVeSettings:
    """The MeVe keys (a base of :class:`memreader.retrieval.search.RetrievalConfig`). Defaults: the operating point
    chosen leave-one-corpus-out (:data:`DEFAULT_OPERATING_POINT`), the paper's values for the rest (k, n_min,
    fallback_k); :data:`PAPER_SETTINGS` gives the paper's throughout."""

    k: int = field(20, ge=1, help="MeVe phase 1: passages from the kNN search (paper: 20)")
    tau: float = field(0.796452, ge=0, le=1, help="MeVe phase 2: keep passages whose verifier score is >= tau (chosen "
                       "leave-one-corpus-out for lm_likelihood; paper: 0.5)")
    n_min: int = field(3, ge=0, help="MeVe phase 3: BM25 fallback when fewer than n_min passages pass verification "
                       "(paper: 3)")
    fallback_k: int = field(5, ge=1, help="MeVe phase 3: most passages the BM25 fallback adds (not already kept)")
    fallback_beside_verifier: bool = field(True, help="MeVe phase 3: start the fallback's BM25 search beside a slow "
                                           "verifier (a model; the last verification > 50 ms) and use it only if the "
                                           "fallback fires: its time leaves the critical path, at the cost of a search "
                                           "that is often unused; false: search only when the fallback fires")
    redundancy: float = field(0.95, ge=-1, le=1, help="MeVe phase 4: drop a passage whose embedding has cosine > this "
                              "with a higher-ranked kept one (chosen; paper: 0.85, which suits MiniLM, while e5's "
                              "cosines between any two passages crowd 0.86-0.95)")
    t_max: int = field(2048, ge=1, help="MeVe phase 5: token budget of the packed context, separators included "
                       "(chosen; paper: 512); with budget_share > 0 the cap over the share")
    budget_share: float = field(0.0, ge=0, le=1, help="MeVe phase 5: when > 0, the budget is also at most this share "
                                "of what plain top-k would hand over (the k kNN candidates' tokens and separators), "
                                "so it follows the corpus's passage lengths; 0: t_max alone (the paper)")
    verifier: str = field(SMOLLM2, help="MeVe phase 2 model: an instruct LM (registry name, folder, "
                          "hub id) for verifier_kind=lm or lm_likelihood, or a CrossEncoder folder for "
                          "verifier_kind=cross_encoder")
    verifier_kind: str = field("lm_likelihood", help="lm (normalised P(yes) of an instruct LM), lm_likelihood (how much the "
                               "passage raises the LM's likelihood of the question, UPR), cross_encoder (sigmoid "
                               "of a sentence-transformers CrossEncoder's logit) or embedding (phase 1's cosine: no "
                               "model call)")
    verifier_calibration: str = field("none", help="MeVe phase 2: none, content_free (minus the verifier's reading of "
                                      "a content-free passage) or query (normalised over the question's candidates); "
                                      "retrieval/verifier_calibration.py")
    operating_point: str = field(DEFAULT_OPERATING_POINT, help="where tau (and the other phase-2 keys) came from, "
                                 "e.g. the calibration that chose them (memreader calibrate-meve); recorded in every "
                                 "audit, which says when the settings leave the default point")
    verifier_backend: str = backend_field("verifier", "MeVe phase 2, verifier_kind=lm or lm_likelihood (its device is the config's device)")
    verifier_dtype: str = dtype_field("MeVe phase 2: the LM verifier's weights")
    verifier_batch_size: int = field(VERIFIER_BATCH, ge=1, help="MeVe phase 2: passages per verifier forward pass (transformers)")
    verifier_max_tokens: int = field(128, ge=1, help="MeVe phase 2, verifier_kind=lm or lm_likelihood: passage "
                                     "tokens shown to the verifier (longer passages are cut for the judgement only; "
                                     "bounds the LM's cost per passage, which dominates MeVe's time on a CPU)")
    budget_tokenizer: str = field(SMOLLM2, help="MeVe phase 5: tokenizer that counts t_max, the "
                                  "answering model's (registry name, folder or hub id)")
    verify: bool = field(True, help="MeVe ablation switch: false keeps every kNN passage (score = its cosine)")
    fallback: bool = field(True, help="MeVe ablation switch: false never runs the BM25 fallback")
    prioritize: bool = field(True, help="MeVe ablation switch: false keeps phase order, no redundancy filter")
    pack: bool = field(True, help="MeVe ablation switch: false joins every passage, ignoring t_max")

    def meve_problems(self) -> list[str]:
        """Problems beyond the numeric ranges (which :func:`memreader.core.config.range_problems` reports)."""
        out = []
        if self.verifier_kind not in VERIFIER_KINDS:
            out.append(f"verifier_kind: {self.verifier_kind!r} is not one of {', '.join(VERIFIER_KINDS)}")
        if self.verifier_calibration not in CALIBRATIONS:
            out.append(f"verifier_calibration: {self.verifier_calibration!r} is not one of {', '.join(CALIBRATIONS)}")
        elif self.verifier_kind == "embedding" and self.verifier_calibration == "content_free":
            out.append("verifier_calibration: content_free needs a verifier that reads the passage; use query or "
                       "none with verifier_kind=embedding")
        out += [p for p in (backend_problem(self.verifier_backend, "verifier", key="verifier_backend"),
                            dtype_problem(self.verifier_dtype, key="verifier_dtype")) if p]
        if self.verify and self.verifier_kind != "embedding" and not str(self.verifier).strip():
            out.append("verifier: empty; name an instruct LM or a CrossEncoder folder (or set verify=false)")
        if not str(self.budget_tokenizer).strip():
            out.append("budget_tokenizer: empty; name the answering model's tokenizer (e.g. smollm2-135m-instruct)")
        return out

    def point_note(self) -> str:
        """What the audit records as the operating point: ``operating_point``, or that none was given, or (when it
        names the default point) which of that point's keys these settings changed."""
        if not self.operating_point:
            return "not calibrated: the settings as given"
        if self.operating_point != DEFAULT_OPERATING_POINT:
            return self.operating_point
        changed = [f"{k}={getattr(self, k)}" for k, v in DEFAULT_POINT.items() if getattr(self, k) != v]
        return (f"NOT the chosen point: {', '.join(changed)} differ from it ({self.operating_point})" if changed
                else self.operating_point)

    def meve_settings(self) -> dict[str, Any]:
        """Just the MeVe keys, as a plain dict (recorded in every audit)."""
        return {f.name: getattr(self, f.name) for f in fields(MeVeSettings)}

    def signature(self, verifier: str | None = None, engine: dict[str, Any] | None = None) -> str:
        """Every setting that changes a MeVe number, as one ``key:value|...`` line (``verifier``: the
        name of the verifier actually used, when it is not the one the settings name; ``engine``: the backend
        and dtype it scored on, its ``choice``)."""
        s = self.meve_settings()
        off = [p for p in ("verify", "fallback", "prioritize", "pack") if not s[p]]
        if engine and s["verify"]:
            verifier = f"{verifier or s['verifier']}@{engine.get('backend')}/{engine.get('dtype')}"
        return "|".join([f"k:{s['k']}", f"tau:{s['tau']}", f"n_min:{s['n_min']}", f"fallback_k:{s['fallback_k']}",
                         f"redundancy:{s['redundancy']}", f"t_max:{s['t_max']}"
                         + (f"|budget_share:{s['budget_share']}" if s["budget_share"] else ""),
                         (f"verifier:{s['verifier_kind']}:{verifier or s['verifier']}"
                          + (f":{s['verifier_calibration']}" if s["verifier_calibration"] != "none" else ""))
                         if s["verify"] else "verifier:none",
                         f"budget:{s['budget_tokenizer']}",
                         "off:" + (",".join(off) or "none")])


DEFAULT_POINT = {f.name: f.default for f in fields(MeVeSettings) if f.name in POINT_KEYS}
"""The chosen point's keys and values, read from :class:`MeVeSettings`' defaults (written once, there)."""
