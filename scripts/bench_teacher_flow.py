"""How busy `memreader gen` keeps an OpenAI-compatible teacher: efficiency against a fake endpoint.

    python scripts/bench_teacher_flow.py                          # 200 docs, concurrency 64 and 16
    python scripts/bench_teacher_flow.py --docs 50 --concurrency 8 --candidates 4

Starts a fake OpenAI-compatible server on 127.0.0.1 (plain asyncio HTTP/1.1, keep-alive) whose
every chat completion takes an exponential time (mean 0.5 s, capped at 3 s) and answers like a
well-behaved teacher (an outline, a valid memory, a reasoning path), then runs the real
`memreader.data_gen.pipeline.generate` against it. Efficiency = (requests × mean latency / max_concurrency) /
wall time: 1.0 means ``max_concurrency`` requests were in flight the whole time. With
``--candidates`` > 1 the evaluator is replaced by a span-length score (no LM, said in the output),
so the figure measures the teacher flow and not the scorer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import threading
import time
from pathlib import Path

from memreader.core.markup import render_memory


def fake_reply(prompt: str) -> str:
    """A teacher-like answer computed from the prompt."""
    doc = prompt.split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0] if "<document>\n" in prompt else prompt
    if "Document memory:" in prompt or "文档记忆：" in prompt:
        return "The document has two parts; the second starts where the topic changes."
    if "outline" in prompt.lower() and "<scenario>" not in prompt:
        return "<outline>\nPart one\nPart two\n</outline>"
    cut = len(doc) // 2
    return render_memory(["Part one", "Part two"], [doc[:cut], doc[cut:]], ["core one", "core two"])


class FakeEndpoint:
    """An OpenAI-compatible chat endpoint with exponential latency, in its own thread and event loop."""

    def __init__(self, mean_s: float = 0.5, cap_s: float = 3.0, seed: int = 0) -> None:
        self.mean_s, self.cap_s, self.rng = mean_s, cap_s, random.Random(seed)
        self.port = 0
        self.requests = 0
        self.service_s: list[float] = []  # the latency the endpoint itself imposed, per completion
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> str:
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
                if method == "GET" and path.endswith("/models"):
                    payload = {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]}
                else:
                    req = json.loads(body)
                    self.requests += 1
                    delay = min(self.rng.expovariate(1 / self.mean_s), self.cap_s)
                    self.service_s.append(delay)
                    await asyncio.sleep(delay)
                    content = fake_reply(req["messages"][-1]["content"])
                    payload = {"id": "x", "object": "chat.completion", "created": 0, "model": req["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": content}}],
                               "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}
                data = json.dumps(payload).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(data)).encode() + b"\r\n\r\n" + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection: nothing more to serve
        finally:
            writer.close()


class SpanScore:
    def __init__(self, clarity: float, completeness: float) -> None:
        self.clarity, self.completeness = clarity, completeness

    def to_dict(self) -> dict[str, float]:
        return {"clarity": self.clarity, "completeness": self.completeness, "variant": "span-length (no LM)"}


class SpanScorer:
    """Stands in for the evaluator so the benchmark times the teacher flow alone (said in the output)."""

    def signature(self) -> dict[str, str]:
        return {"scorer": "span-length"}

    def score(self, memories):  # noqa: ANN001, ANN201
        return [SpanScore(1 / len(m.scenarios), m.scenarios[0].end / len(m.document)) for m in memories]


def corpus(path: Path, n: int) -> None:
    rng = random.Random(1)
    words = "river stone market harvest lantern bridge winter garden copper signal".split()
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            sents = [" ".join(rng.choice(words) for _ in range(12)).capitalize() + "." for _ in range(8)]
            fh.write(json.dumps({"id": f"d{i}", "text": " ".join(sents)}) + "\n")


def run_once(endpoint: FakeEndpoint, base_url: str, corpus_path: Path, concurrency: int, candidates: int,
             run: str) -> dict:
    import memreader.data_gen.pipeline as pipeline

    endpoint.service_s.clear()
    cfg = pipeline.GenConfig(input=str(corpus_path), run=run, teacher="openai", model="fake", base_url=base_url,
                             max_concurrency=concurrency, num_candidates=candidates, guided="off", val_fraction=0)
    t0 = time.perf_counter()
    manifest = pipeline.generate(cfg, scorer=SpanScorer() if candidates > 1 else None)  # the flow alone (module doc)
    wall = time.perf_counter() - t0
    flow = manifest["teacher"]["flow"]
    service = sum(endpoint.service_s) / max(len(endpoint.service_s), 1)
    return {"server_mean_latency_s": round(service, 4),
            # the honest share: the endpoint's own service time, not the client's view of it
            "server_efficiency": round(len(endpoint.service_s) * service / concurrency / flow["wall_s"], 4),
            "concurrency": concurrency, "candidates": candidates, "documents": manifest["documents"],
            "memories": manifest["memories"], "requests": flow["requests"], "mean_latency_s": flow["mean_latency_s"],
            "flow_wall_s": flow["wall_s"], "stage_wall_s": round(wall, 2), "requests_per_s": flow["requests_per_s"],
            "efficiency": flow.get("efficiency"),
            "ideal_s": round(flow["requests"] * flow["mean_latency_s"] / concurrency, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=200)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 16])
    ap.add_argument("--candidates", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--mean-latency", type=float, default=0.5)
    ap.add_argument("--cap", type=float, default=3.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="bench_flow_")
    os.environ["MEMREADER_HOME"] = home
    os.environ.setdefault("MEMREADER_TEACHER_API_KEY", "unused")
    corpus_path = Path(home) / "corpus.jsonl"
    corpus(corpus_path, args.docs)
    endpoint = FakeEndpoint(args.mean_latency, args.cap)
    base_url = endpoint.start()
    rows = []
    for n in args.candidates:
        for c in args.concurrency:
            rows.append(run_once(endpoint, base_url, corpus_path, c, n, f"c{c}-n{n}"))
    print(f"\nfake endpoint: exponential latency mean {args.mean_latency}s capped at {args.cap}s; {args.docs} docs; "
          "steps outline → N candidates → (span-length scorer when N > 1, no LM) → CoM")
    print("efficiency = requests × mean latency / concurrency / wall; 'server' uses the endpoint's own latency "
          "(the honest share), 'client' the latency the client saw")
    print(f"{'N':>2} {'conc':>5} {'requests':>9} {'server lat':>10} {'client lat':>10} {'wall':>7} {'req/s':>7} "
          f"{'eff server':>10} {'eff client':>10}")
    for r in rows:
        print(f"{r['candidates']:>2} {r['concurrency']:>5} {r['requests']:>9} {r['server_mean_latency_s']:>10.3f} "
              f"{r['mean_latency_s']:>10.3f} {r['flow_wall_s']:>7.2f} {r['requests_per_s']:>7.1f} "
              f"{r['server_efficiency']:>10.2f} {r['efficiency']:>10.2f}")
    print(json.dumps({"bench": "teacher_flow", "rows": rows}))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
