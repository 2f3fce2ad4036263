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

    out = [f"MeVe  {a['signature']}", f"question: {a['question']}", ""]
    out.append(f"1 knn        {ms['knn']:8.1f} ms  {len(a['knn']['candidates'])} candidates (k={a['knn']['k']})")
    v = a["verify"]
    if v["enabled"]:
        out.append(f"2 verify     {ms['verify']:8.1f} ms  kept {len(v['kept'])}, dropped {len(v['dropped'])} "
                   f"(tau={v['tau']}; verifier {a['verifier']}: {v['verifier_ms']:.1f} ms)")
        out += [f"    dropped {line(c)}" for c in v["dropped"]]
    else:
        out.append(f"2 verify     {ms['verify']:8.1f} ms  off: every kNN candidate kept (score = cosine)")
    f = a["fallback"]
    out.append(f"3 fallback   {ms['fallback']:8.1f} ms  {'fired' if f['fired'] else 'not fired'} ({f['reason']})"
               + (f", added {len(f['added'])}" if f["fired"] else ""))
    out += [f"    added   {line(c)}" for c in f["added"]]
    p = a["prioritize"]
    if p["enabled"]:
        out.append(f"4 prioritize {ms['prioritize']:8.1f} ms  {len(p['order'])} ordered, {len(p['dropped'])} redundant "
                   f"(cos > {p['redundancy']})")
        out += [f"    dropped {line(c)}" for c in p["dropped"]]
    else:
        out.append(f"4 prioritize {ms['prioritize']:8.1f} ms  off: phase order kept")
    k = a["pack"]
    budget = f"t_max={k['t_max']}" if k["enabled"] else "off: no budget"
    out.append(f"5 pack       {ms['pack']:8.1f} ms  {len(k['packed'])} packed, {k['tokens']} tokens ({budget})")
    out += [f"    dropped {line(c)}" for c in k["dropped"]]
    out.append(f"total {ms['total']:.1f} ms (verifier {ms['verifier']:.1f} ms, without it "
               f"{ms['total_without_verifier']:.1f} ms), context {a['tokens']} tokens")
    out.append("")
    for i, c in enumerate(result.passages, start=1):
        text = " ".join(c.text.split())
        text = text if len(text) <= max_chars else text[:max_chars] + " ..."
        at = f"  {describe_where(c.where)}" if c.where and describe_where(c.where) else ""
        out.append(f"[{i}] {c.doc_id}{at} ({c.id}, {c.source}, score {c.score:.3f}, {c.tokens} tok)\n    {text}")
    return "\n".join(out) if result.passages else "\n".join(out + ["(empty context: no passage survived)"])
