"""MeVe's audit as readable text, phase by phase (``memreader ask --pipeline meve`` prints it).

    print(format_audit(pipeline.run(question)))
"""

from __future__ import annotations

from typing import Any

from memreader.core.structure import describe_where
from memreader.retrieval.meve import MeVeResult

__all__ = ["format_audit"]


def format_audit(result: MeVeResult, max_chars: int = 200) -> str:
    """The audit as readable text, phase by phase (for ``memreader ask --pipeline meve``)."""
    a = result.audit
    ms = a["ms"]

    def line(c: dict[str, Any]) -> str:
        parts = [f"{c['id']}", f"{c['source']} #{c['rank']}", f"sim {c['similarity']:.3f}", f"score {c['score']:.3f}"]
        if "tokens" in c:
            parts.append(f"{c['tokens']} tok")
        return "  ".join(parts) + (f"  -- {c['reason']}" if "reason" in c else "")

    def phase(n: int, name: str, summary: str, label: str = "", listed: list[dict[str, Any]] | None = None) -> None:
        out.append(f"{n} {name:<11}{ms[name]:8.1f} ms  {summary}")
        out.extend(f"    {label} {line(c)}" for c in listed or [])

    out = [f"MeVe  {a['signature']}", f"operating point: {a.get('operating_point') or 'not recorded'}",
           f"question: {a['question']}", ""]
    phase(1, "knn", f"{len(a['knn']['candidates'])} candidates (k={a['knn']['k']})")
    v, f, p, k = a["verify"], a["fallback"], a["prioritize"], a["pack"]  # a phase that is off lists nothing
    phase(2, "verify", f"kept {len(v['kept'])}, dropped {len(v['dropped'])} (tau={v['tau']}; verifier "
          f"{a['verifier']}: {v['verifier_ms']:.1f} ms)" if v["enabled"] else
          "off: every kNN candidate kept (score = cosine)", "dropped", v["dropped"])
    phase(3, "fallback", f"{'fired' if f['fired'] else 'not fired'} ({f['reason']})"
          + (f", added {len(f['added'])}" if f["fired"] else ""), "added  ", f["added"])
    phase(4, "prioritize", f"{len(p['order'])} ordered, {len(p['dropped'])} redundant (cos > {p['redundancy']})"
          if p["enabled"] else "off: phase order kept", "dropped", p["dropped"])
    budget = f"t_max={k['t_max']}" if k["enabled"] else "off: no budget"
    phase(5, "pack", f"{len(k['packed'])} packed, {k['tokens']} tokens ({budget})", "dropped", k["dropped"])
    out.append(f"total {ms['total']:.1f} ms (verifier {ms['verifier']:.1f} ms, without it "
               f"{ms['total_without_verifier']:.1f} ms), context {a['tokens']} tokens")
    out.append("")
    for i, c in enumerate(result.passages, start=1):
        text = " ".join(c.text.split())
        text = text if len(text) <= max_chars else text[:max_chars] + " ..."
        at = f"  {describe_where(c.where)}" if c.where and describe_where(c.where) else ""
        out.append(f"[{i}] {c.doc_id}{at} ({c.id}, {c.source}, score {c.score:.3f}, {c.tokens} tok)\n    {text}")
    return "\n".join(out) if result.passages else "\n".join(out + ["(empty context: no passage survived)"])
