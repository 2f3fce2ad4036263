"""Self-contained HTML pages: one file that opens offline (no network, no CDN), its CSS and script inline.

    from memreader.core.html_page import esc, page, write_page
    write_page(out, page("Title", "<h1>...</h1>", data={"docs": [...]}, script=SCRIPT))

Every viewer page is built here, with one safety rule (:func:`esc`, JSON data blocks, a nonce CSP):
docs/VIEWER.md.
"""

from __future__ import annotations

import html
import json
import secrets
from pathlib import Path
from typing import Any

from memreader.core.paths import write_atomic

DATA_ID = "memreader-data"
"""The id of the JSON block a page's script reads (``JSON.parse(document.getElementById(DATA_ID).textContent)``)."""

BASE_CSS = """
:root{--fg:#1d232b;--muted:#5f6b7a;--line:#d5dae1;--bg:#fff;--panel:#f6f8fa;--accent:#1f6feb;--bad:#c62828;
--ok:#2e7d32;--warn:#b26a00;--c0:#dbeafe;--c1:#fde7c8;--c0b:#93c5fd;--c1b:#f8b86b}
*{box-sizing:border-box}body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);
background:var(--bg)}header{padding:10px 16px;border-bottom:1px solid var(--line);background:var(--panel)}
header h1{font-size:17px;margin:0}header .sub{color:var(--muted);font-size:12px}main{padding:12px 16px}
h2{font-size:15px;margin:18px 0 6px}h3{font-size:14px;margin:12px 0 4px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}th,td{border:1px solid var(--line);padding:3px 7px;
text-align:left;vertical-align:top}th{background:var(--panel)}td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:var(--muted)}.bad{color:var(--bad)}.ok{color:var(--ok)}.warn{color:var(--warn)}
.text{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;
font-size:13px;line-height:1.6}.pill{display:inline-block;border-radius:9px;padding:0 7px;font-size:12px;
background:var(--panel);border:1px solid var(--line)}
code{font-size:12px;background:var(--panel);padding:0 3px;border-radius:3px}
"""


def esc(value: Any) -> str:
    """``value`` as text safe inside HTML markup and attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


def json_for_script(data: Any) -> str:
    """``data`` as JSON that cannot close or comment out the ``<script>`` block holding it."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(title: str, body: str, *, css: str = "", script: str = "", data: Any = None, subtitle: str = "") -> str:
    """One complete HTML document: ``body`` (markup, already escaped by the caller), ``data`` as the JSON block
    :data:`DATA_ID`, ``script`` run once the page is parsed."""
    nonce = secrets.token_urlsafe(16)
    policy = (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'nonce-{nonce}'; "
              "base-uri 'none'; form-action 'none'")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{esc(title)}</title>", f"<style>{BASE_CSS}{css}</style></head><body>",
             f"<header><h1>{esc(title)}</h1>" + (f'<div class="sub">{esc(subtitle)}</div>' if subtitle else "")
             + "</header>", f"<main>{body}</main>"]
    if data is not None:
        parts.append(f'<script type="application/json" id="{DATA_ID}">{json_for_script(data)}</script>')
    if script:
        parts.append(f'<script nonce="{nonce}">"use strict";\n{script}\n</script>')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(path: str | Path, text: str) -> Path:
    """Write a page atomically (a browser never opens a half-written file)."""
    return write_atomic(Path(path), text)
