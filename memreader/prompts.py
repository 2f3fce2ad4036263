"""Versioned prompt templates (zh and en) and safe rendering into chat messages.

Templates live in ``memreader/templates/<name>.<lang>.txt``: a ``version:`` line, then a
``[system]`` and a ``[user]`` section with ``{{field}}`` placeholders. Rendering substitutes in one
pass (an inserted value is never re-scanned for placeholders) and escapes reserved markup in every
value (see :mod:`memreader.markup`), so a document containing ``</document>`` or ``[MASK]`` cannot
break the prompt structure or the parser. Values named in ``PRE_ESCAPED`` are already-rendered
memory markup and pass through as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from memreader.markup import escape_markup

TEMPLATE_DIR = Path(__file__).with_name("templates")
TEMPLATES = (
    "teacher_outline",
    "teacher_extraction",
    "memreader",
    "memreader_think",
    "reverse_com",
    "chunk_boundary",
    "qa_answer",
)
LANGS = ("en", "zh")
PRE_ESCAPED = frozenset({"memory"})
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class Template:
    """One prompt template: its name, language, version and sections."""

    name: str
    lang: str
    version: str
    system: str
    user: str

    @property
    def id(self) -> str:
        """``name.lang@version``: what caches and manifests record."""
        return f"{self.name}.{self.lang}@{self.version}"

    @property
    def fields(self) -> set[str]:
        """Placeholders the template expects."""
        return set(_PLACEHOLDER.findall(self.system + self.user))


@cache
def load_template(name: str, lang: str) -> Template:
    """Read and check one template file."""
    if name not in TEMPLATES:
        raise KeyError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}")
    if lang not in LANGS:
        raise KeyError(f"unknown language {lang!r}; templates exist for {', '.join(LANGS)}")
    path = TEMPLATE_DIR / f"{name}.{lang}.txt"
    text = path.read_text(encoding="utf-8")
    m = re.match(r"version:\s*(\S+)\n\[system\]\n(.*?)\n\[user\]\n(.*)\Z", text, re.S)
    if not m:
        raise ValueError(f"{path}: expected 'version: X', '[system]' and '[user]' sections")
    return Template(name, lang, m.group(1), m.group(2).strip(), m.group(3).strip())


def _fill(text: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def render(name: str, lang: str, **values: object) -> tuple[list[dict[str, str]], Template]:
    """Chat messages for template ``name`` in ``lang``; every placeholder must be given."""
    tpl = load_template(name, lang)
    missing = tpl.fields - values.keys()
    extra = values.keys() - tpl.fields
    if missing or extra:
        raise ValueError(
            f"template {tpl.id}: missing values {sorted(missing)}, unexpected values {sorted(extra)}"
        )
    safe = {k: (str(v) if k in PRE_ESCAPED else escape_markup(str(v))) for k, v in values.items()}
    messages = [
        {"role": "system", "content": _fill(tpl.system, safe)},
        {"role": "user", "content": _fill(tpl.user, safe)},
    ]
    return messages, tpl
