"""Whether vLLM's prefix cache can serve a scoring request (``prompt_logprobs``): the answer to why support and
the verifiers prefill their whole prompt again (docs/ENGINES.md).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/probe_prompt_logprobs_cache.py

Scores one ~2,150-token Chinese prompt-plus-answer twice with the embedded SmolLM2 on vLLM bf16: once as vLLM does
by default (the request skips reading the prefix cache) and once with ``skip_reading_prefix_cache=False`` after the
answer prompt was run, so its blocks are cached. Prints both times, the cached tokens, the entries vLLM returned for
the cached positions and the largest difference of the answer's per-token NLLs between the two. A probe, not a
benchmark: the engine and dtype are fixed, one request each.
"""

from __future__ import annotations

import time

import numpy as np
from memreader.core.vllm_engine import EngineSpec, get_engine, import_vllm


def main() -> None:
    vllm = import_vllm()
    engine = get_engine(EngineSpec(model="smollm2-135m-instruct", dtype="bfloat16"))
    tok = engine.tokenizer()
    prompt = tok("根据上下文回答问题。" + "长江是中国最长的河流，流经多个省份。" * 60 + "问题：长江流经哪里？回答：",
                 add_special_tokens=False)["input_ids"]
    answer = tok("长江流经青海、西藏、四川、云南、重庆、湖北、湖南、江西、安徽、江苏和上海。",
                 add_special_tokens=False)["input_ids"]
    ids, start = prompt + answer, len(prompt)

    def score(skip: bool) -> tuple[object, float]:
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, skip_reading_prefix_cache=skip)
        t = time.perf_counter()
        out = engine.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        return out, time.perf_counter() - t

    full, t_full = score(True)
    engine.llm.generate([{"prompt_token_ids": prompt}], vllm.SamplingParams(max_tokens=4), use_tqdm=False)
    try:
        cached, t_cached = score(False)
    except Exception as exc:  # noqa: BLE001  # the finding itself: reported, then the probe ends
        print(f"default (no cache read) {t_full:.2f} s; the cache read made vLLM fail: {type(exc).__name__}: {exc}")
        return
    a = np.array([-full.prompt_logprobs[p][ids[p]].logprob for p in range(start, len(ids))])
    b = np.array([-cached.prompt_logprobs[p][ids[p]].logprob for p in range(start, len(ids))])
    shown = [None if x is None else list(x)[:1] for x in cached.prompt_logprobs[:3]]
    print(f"prompt {len(prompt)} + answer {len(answer)} tokens; default (no cache read) {t_full:.2f} s; "
          f"cache read {t_cached:.2f} s with {cached.num_cached_tokens} cached tokens")
    print(f"token ids vLLM returned for the first positions with the cache read: {shown}")
    print(f"answer NLL, largest difference between the two: {float(np.max(np.abs(a - b))):.4f} nats")


if __name__ == "__main__":
    main()
