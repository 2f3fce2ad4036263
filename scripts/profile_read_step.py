"""Where a guided reading step spends its time, on both engines, at several batch sizes, grammar on and off.

    .venv/bin/python scripts/profile_read_step.py                       # vLLM and transformers, batch 1 8 24 64
    .venv/bin/python scripts/profile_read_step.py --engines vllm --batch-sizes 8 24 --steps 32

Each configuration reads ``batch`` English documents of at least 1,400 characters (composed from the HotpotQA-100
passages in ../shared/datasets, or ``--corpus`` JSONL) in one call of the product's engine (the reader's prompt,
each document's own memory grammar from :mod:`memreader.core.memory_grammar`, greedy), cut at ``--steps`` generated
tokens: a profile of decoding steps, not a finished read. Timers wrap the engine's own parts:

- vLLM (in-process V1 engine): ``schedule`` (Scheduler.schedule), ``forward`` (executor.execute_model, the model
  with its attention), ``attention`` (the CPU attention backend's forward, inside ``forward``), ``grammar mask``
  (Scheduler.get_grammar_bitmask: llguidance fills one mask row per guided request), ``sample`` (executor.sample_tokens:
  logits, applying the masks, sampling), ``update`` (Scheduler.update_from_output: the grammars advance by the chosen
  tokens, requests finish), ``rest`` (the rest of LLMEngine.step: output processing, detokenising, Python);
- transformers (``generate`` with :class:`memreader.core.generation.guided.GuidedLogitsProcessor`): ``forward`` (the
  model), ``attention`` (its attention modules, inside ``forward``), ``grammar`` (the logits processor: mask
  computation and application), ``rest`` (generate's loop: sampling, stopping, cache bookkeeping).

Printed per configuration: ms per decoding step, each part's share of it, generated tokens/s (rows / step time); the
prefill step is left out and printed apart, and so are vLLM's steps that ran no model (requests waiting for their
grammars to compile in the background). The step's model FLOPs are about 2 x parameters x rows:
the last column compares tokens/s with the bf16/fp32 matmul rate measured here (``--matmul-gflops`` to give it).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import HOTPOT, compose_documents

from memreader.core.engines import make_engine, resolve_engine
from memreader.core.generation import GenerationParams
from memreader.core.memory_grammar import BoundaryGraph, memory_grammar
from memreader.core.prompts import render
from memreader.inference.reader import ReadConfig


class Timers:
    """Per-step seconds of each part. ``wrap`` times a method of a class in place (undone by ``restore``); a call of
    the ``boundary`` part (the engine step, or the model's forward for transformers) opens a new step record."""

    def __init__(self, boundary: str) -> None:
        self.boundary = boundary
        self.steps: list[dict[str, float]] = []
        self._undo: list[tuple[Any, str, Any]] = []
        self._last_start: float | None = None

    def wrap(self, owner: Any, name: str, part: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            if part == self.boundary:
                if self._last_start is not None and self.steps:  # transformers: the step runs to the next forward
                    self.steps[-1]["wall"] = start - self._last_start
                self._last_start = start
                self.steps.append(defaultdict(float))
            record = self.steps[-1] if self.steps else defaultdict(float)
            try:
                result = original(*args, **kwargs)
                if part == "schedule":  # vLLM: how many tokens this step computes (0 while grammars compile)
                    record["scheduled"] += result.total_num_scheduled_tokens
                    record["rows"] += len(result.num_scheduled_tokens)
                return result
            finally:
                record[part] += time.perf_counter() - start

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def grammars_for(texts: list[str], cfg: ReadConfig, count: Callable[[str], int]) -> list[str]:
    settings = cfg.grammar_settings(**cfg.marker())
    return [memory_grammar(BoundaryGraph.build(t, settings), settings, cfg.max_new_tokens, count).lark for t in texts]


def instrument_vllm(timers: Timers) -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    timers.wrap(LLMEngine, "step", "step")  # one engine step with its output processing (what LLM.generate loops on)
    timers.wrap(Scheduler, "schedule", "schedule")
    timers.wrap(Scheduler, "get_grammar_bitmask", "grammar mask")
    timers.wrap(Scheduler, "update_from_output", "update")
    timers.wrap(UniProcExecutor, "execute_model", "forward")
    timers.wrap(UniProcExecutor, "sample_tokens", "sample")
    timers.wrap(CPUAttentionBackendImpl, "forward", "attention")


def instrument_transformers(timers: Timers, model: Any) -> None:
    from memreader.core.generation.guided import GuidedLogitsProcessor

    timers.wrap(type(model), "forward", "forward")
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            timers.wrap(type(module), "forward", "attention")
            break
    timers.wrap(GuidedLogitsProcessor, "__call__", "grammar")


@contextmanager
def instrumented(engine: str, chat: Any) -> Iterator[Timers]:
    timers = Timers("step" if engine == "vllm" else "forward")
    if engine == "vllm":
        instrument_vllm(timers)
    else:
        instrument_transformers(timers, chat.model())
    try:
        yield timers
    finally:
        timers.restore()


@contextmanager
def _operators(top_ops: int) -> Iterator[Any]:
    """torch.profiler over the run when ``top_ops`` > 0 (its own overhead inflates every operator: read shares, not
    absolute times), else nothing."""
    if not top_ops:
        yield None
        return
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        yield prof


def decode_profile(steps: list[dict[str, float]], boundary: str) -> tuple[float, dict[str, float], float]:
    """Mean ms per decoding step and each part's share of it. Only steps that ran the model count (vLLM compiles
    grammars in the background: its first steps may schedule nothing while requests wait for theirs); on vLLM only
    the steps that computed one token per row (no prompt tokens), on transformers all but the first (the prefill)
    and the last (no next forward ends it). Also the mean rows of those steps (vLLM; 0 = every row)."""
    ran = [s for s in steps if s.get("forward", 0.0) > 0 and s.get("scheduled", 1) > 0]
    if boundary == "step":  # vLLM: a decoding step computes one token per row; a step with any prompt tokens in it
        # (a prompt split over steps, a request whose grammar was compiled late) is prefill, left out
        decode = [s for s in ran if s.get("scheduled") == s.get("rows")]
    else:
        decode = [s for s in ran[1:] if "wall" in s][:-1]
    if not decode:
        return 0.0, {}, 0.0
    walls = [s["step"] if boundary == "step" else s["wall"] for s in decode]
    wall = sum(walls)
    parts: dict[str, float] = defaultdict(float)
    for s in decode:
        for k, v in s.items():
            if k not in ("step", "wall", "scheduled", "rows"):
                parts[k] += v
    share = {k: v / wall for k, v in parts.items()}
    share["rest"] = max(0.0, 1 - sum(v for k, v in share.items() if k != "attention"))
    return 1000 * wall / len(decode), share, sum(s.get("rows", 0) for s in decode) / len(decode)


def profile(engine: str, chat: Any, texts: list[str], grammars: list[str] | None, steps: int,
            top_ops: int = 0) -> dict[str, Any]:
    messages = [render("memreader", "en", document=t)[0] for t in texts]
    with instrumented(engine, chat) as timers, _operators(top_ops) as ops:
        t0 = time.perf_counter()
        replies = chat.generate_many(messages, GenerationParams(temperature=0.0, max_new_tokens=steps),
                                     grammars=grammars, return_exceptions=True)
        total = time.perf_counter() - t0
    if ops is not None:
        print(f"\n{engine} batch {len(texts)} grammar {'on' if grammars else 'off'}: the {top_ops} operators with "
              f"the most own CPU time over {total:.1f} s")
        print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=top_ops, max_name_column_width=60))
    ms, share, rows = decode_profile(timers.steps, timers.boundary)
    rows = rows or len(texts)
    first = next((s for s in timers.steps if s.get("forward", 0.0) > 0 and s.get("scheduled", 1) > 0), {})
    return {"engine": engine, "batch": len(texts), "grammar": grammars is not None, "seconds": round(total, 2),
            "prefill_step_s": round(first.get("step", first.get("wall", 0.0)), 3), "ms_per_step": round(ms, 1),
            "rows": round(rows, 1), "tokens_per_s": round(rows * 1000 / ms, 1) if ms else None,
            "share": {k: round(v, 3) for k, v in sorted(share.items())},
            "errors": sum(isinstance(r, Exception) for r in replies)}


def token_counter(tokenizer: Any) -> Callable[[str], int]:
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def open_engine(engine: str, model: str, dtype: str, batch: int, window: int) -> Any:
    choice = resolve_engine("read", engine, dtype, "cpu")
    # no prefix caching: a configuration after the first would find the same prompts cached and skip their prefill
    # (the guided-vs-unguided gap first recorded here was mostly that: whichever ran second was faster)
    return make_engine(choice, model, batch_size=batch, max_model_len=window, prefix_caching=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=["vllm", "transformers"], choices=["vllm", "transformers"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 24, 64])
    parser.add_argument("--grammar", nargs="+", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--steps", type=int, default=48, help="generated tokens per request (decoding steps)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto", help="auto (the engine rule's choice), bfloat16 or float32")
    parser.add_argument("--corpus", default="", help="JSONL with a text field (default: HotpotQA-100 passages)")
    parser.add_argument("--window", type=int, default=4096, help="max_model_len of the vLLM engine")
    parser.add_argument("--params", type=float, default=135e6, help="model parameters (for FLOPs per token)")
    parser.add_argument("--matmul-gflops", type=float, default=400.0, help="the machine's matmul rate (GFLOP/s)")
    parser.add_argument("--top-ops", type=int, default=0, help="also run torch.profiler and print this many "
                        "operators with the most own CPU time per configuration")
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    parser.add_argument("--write-corpus", default="", help="write the largest batch's documents as a JSONL corpus "
                        "here (for a full `memreader read` of the same set) and exit")
    args = parser.parse_args()
    texts = compose_documents(max(args.batch_sizes), args.corpus)
    if args.write_corpus:
        Path(args.write_corpus).write_text("".join(json.dumps({"id": f"en-{i:02d}", "text": t}) + "\n"
                                                   for i, t in enumerate(texts)), encoding="utf-8")
        print(f"{len(texts)} documents -> {args.write_corpus}")
        return
    cfg = ReadConfig(input=args.corpus or str(HOTPOT), model=args.model)
    rows = []
    for engine in args.engines:
        chat = open_engine(engine, args.model, args.dtype, max(args.batch_sizes), args.window)
        count = token_counter(chat.tokenizer())
        for batch in args.batch_sizes:
            for grammar in args.grammar:
                lark = grammars_for(texts[:batch], cfg, count) if grammar == "on" else None
                row = profile(engine, chat, texts[:batch], lark, args.steps, args.top_ops)
                rate = row["tokens_per_s"] or 0.0
                row["of_matmul_rate"] = round(rate * 2 * args.params / (args.matmul_gflops * 1e9), 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'engine':<12} {'batch':>5} {'grammar':>7} {'ms/step':>8} {'tok/s':>7} {'x rate':>6}  shares of a step")
    for r in rows:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in r["share"].items())
        print(f"{r['engine']:<12} {r['batch']:>5} {'on' if r['grammar'] else 'off':>7} {r['ms_per_step']:>8} "
              f"{r['tokens_per_s']:>7} {r['of_matmul_rate']:>6}  {shares}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
