"""``memreader view``: a memories file as one self-contained HTML page (no network; opens offline, attaches to an issue).

    memreader view artifacts/runs/demo/read/memories.jsonl                    # -> artifacts/runs/demo/read/memories.html
    memreader view runs/demo/gen/memories.jsonl --candidates runs/demo/gen/candidates.jsonl --out gen.html
    memreader view memories.jsonl --gold gold_segments.jsonl                  # gold boundaries against the memory's

Each document shows its chunks as alternating coloured spans over the exact text (a gap no chunk covers is marked,
an overlap is flagged, never silently fixed), the outline, each chunk's core and provenance, and the generation
record; ``--candidates`` adds each document's candidates as a table and as bars on one scale, so their boundaries
line up, ``--gold`` the gold segmentation. One document is drawn at a time. From Python: :func:`write_view`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from memreader.core.config import field
from memreader.core.html_page import esc, page, write_page
from memreader.core.stage import Flag, Stage
from memreader.viewer.documents import (
    Attachments,
    ViewerInputError,
    read_candidates,
    read_gold,
    read_memories_leniently,
    view_document,
)

CSS = """
.layout{display:grid;grid-template-columns:250px 1fr;gap:14px}#sidebar{position:sticky;top:0;max-height:100vh;
overflow:auto;border-right:1px solid var(--line);padding-right:8px}#search{width:100%;padding:4px 6px}
#doclist{list-style:none;margin:6px 0;padding:0}.docitem{cursor:pointer;padding:2px 4px;border-radius:4px;
overflow:hidden;text-overflow:ellipsis;white-space:nowrap}.docitem:hover{background:var(--panel)}
.docitem.current{background:var(--c0);font-weight:600}.docitem.bad{color:var(--bad)}
.cols{display:grid;grid-template-columns:minmax(150px,220px) minmax(300px,1fr) minmax(220px,300px);gap:14px;
margin-top:8px}#outline{padding-left:24px;margin:0}#outline li{cursor:pointer;padding:1px 0}
#outline li:hover{text-decoration:underline}#outline li.sel,.chunk.sel{outline:2px solid var(--accent)}
.chunk.c0{background:var(--c0)}.chunk.c1{background:var(--c1)}.chunk{cursor:default}
mark.gap{background:repeating-linear-gradient(45deg,#ffd6d6,#ffd6d6 4px,#fff 4px,#fff 8px);
outline:1px dashed var(--bad)}.chunk.overlap{border-left:3px solid var(--bad)}
.chunk.overlap::before{content:"⟵ " attr(data-note);color:var(--bad);font-size:11px}
.goldcut{border-left:3px solid #7b1fa2;margin:0 1px}.cutstrip{position:relative;height:42px;border-bottom:1px solid #999;margin:2px 0 8px}.cuttick{position:absolute;bottom:0;width:3px;background:#90a4ae}.cuttick.cutbreak{background:#d84315}.infocol{position:sticky;top:0;align-self:start}
#chunkinfo{background:var(--panel);border:1px solid var(--line);border-radius:6px;padding:8px;margin-bottom:8px}
#chunkinfo h3{margin-top:0}.label{color:var(--muted);font-size:11px;text-transform:uppercase;margin-top:6px}
.problems{border:1px solid var(--bad);border-radius:6px;padding:6px 10px;margin:8px 0}
.bars{margin:8px 0}.barrow{display:flex;align-items:center;gap:8px;margin:3px 0}.barlabel{width:120px;
font-size:12px;text-align:right;overflow:hidden;white-space:nowrap}.track{position:relative;flex:1;height:16px;
background:#fafafa;border:1px solid var(--line)}.bar{position:absolute;top:0;bottom:0;border-right:2px solid #333}
.bar.c0{background:var(--c0b)}.bar.c1{background:var(--c1b)}.barrow.gold .bar{background:#e1bee7}
.barrow.selected .barlabel{font-weight:700;color:var(--ok)}tr.selected{background:#e8f5e9;font-weight:600}
table.record{font-size:12px}.notes{border:1px solid var(--warn);padding:4px 10px;border-radius:6px}
"""

BODY = """
<div class="notes warn" id="notes" {notes_hidden}>{notes}</div>
<div class="layout">
  <div id="sidebar"><input id="search" type="search" placeholder="search document ids and outlines">
    <div id="listcount" class="muted"></div><ul id="doclist"></ul></div>
  <div id="docview"></div>
</div>
"""


@dataclass
class ViewConfig:
    """Settings of ``memreader view``."""

    memories: str = field("", help="memories JSONL to show (runs/<run>/read/memories.jsonl or gen/memories.jsonl)")
    candidates: str = field("", help="candidates.jsonl of `memreader gen`: each document's candidates side by side")
    gold: str = field("", help="gold-boundary JSONL (memreader.eval.gold_segments' format): gold drawn against the "
                      "memory's boundaries")
    out: str = field("", help="HTML file to write (default: the memories file with .html)")

    def problems(self) -> list[str]:
        """Problems beyond types."""
        return [] if self.memories else ["memories: name the memories file (memreader view FILE)"]


@dataclass
class ViewSummary:
    """What one :func:`write_view` wrote."""

    path: Path
    documents: int
    not_tiling: int
    with_candidates: int
    with_gold: int
    notes: list[str]
    bytes: int
    seconds: float

    def line(self) -> str:
        """The one-line summary the command prints."""
        extra = "".join(f", {n} {what}" for n, what in ((self.not_tiling, "not tiling (marked)"),
                                                        (self.with_candidates, "with candidates"),
                                                        (self.with_gold, "with gold")) if n)
        return (f"view: {self.documents} documents{extra} -> {self.path} ({self.bytes / 1e6:.2f} MB, "
                f"{self.seconds:.1f} s)")


def write_view(memories: str | Path, out: str | Path | None = None, candidates: str | Path | None = None,
               gold: str | Path | None = None) -> ViewSummary:
    """Write the viewer page of a memories file (with its candidates and a gold segmentation when given)."""
    start = time.perf_counter()
    memories = Path(memories)
    attach = Attachments(candidates=read_candidates(candidates) if candidates else {},
                         gold=read_gold(gold) if gold else {})
    docs = [view_document(m, attach) for m in read_memories_leniently(memories)]
    ids = {d["id"] for d in docs}
    stray = sorted(set(attach.candidates) - ids)
    if stray:
        attach.notes.append(f"{len(stray)} document(s) in {candidates} are not in {memories} (first: {stray[0]}): "
                            "their candidates are not shown — view the memories file that run wrote")
    if attach.gold and not ids & set(attach.gold):
        attach.notes.append(f"no document id of {gold} is in {memories}: no gold boundaries drawn")
    notes = "<br>".join(esc(n) for n in attach.notes)
    body = BODY.format(notes=notes, notes_hidden="" if notes else "hidden")
    subtitle = " · ".join(str(p) for p in (memories, candidates, gold) if p)
    script = files("memreader.viewer").joinpath("viewer.js").read_text(encoding="utf-8")
    html = page(f"Memories: {memories.name}", body, css=CSS, script=script, data={"docs": docs}, subtitle=subtitle)
    path = write_page(Path(out) if out else memories.with_suffix(".html"), html)
    return ViewSummary(path, len(docs), sum("problems" in d for d in docs), sum("cand" in d for d in docs),
                       sum("gold" in d for d in docs), attach.notes, len(html.encode("utf-8")),
                       time.perf_counter() - start)


def _run_stage(cfg: ViewConfig) -> int:
    summary = write_view(cfg.memories, cfg.out or None, cfg.candidates or None, cfg.gold or None)
    for note in summary.notes:
        print(f"view: warning: {note}", file=sys.stderr)
    print(summary.line())
    return 0


STAGE = Stage("view", "a memories file as one self-contained HTML page (chunks over the text, outline, core, "
              "candidates, gold)", run=_run_stage, config=ViewConfig, example_dir="configs/",
              flags=(Flag("memories", positional=True, help="the memories JSONL to show"), Flag("candidates"),
                     Flag("gold"), Flag("out")))

__all__ = ["STAGE", "ViewConfig", "ViewSummary", "ViewerInputError", "write_view"]

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("view"))
