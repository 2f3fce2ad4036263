"""Versioned prompt templates (zh and en) and safe rendering into chat messages; a reader prompt from a file
(:class:`ReaderPrompt`, placeholders :data:`READER_FIELDS`).

Details: docs/ARCHITECTURE.md (Model output: prompt templates), docs/USAGE.md (Released checkpoints).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from memreader.core.config import field as config_field
from memreader.core.errors import MemReaderError
from memreader.core.markup import escape_markup

TEMPLATE_DIR = Path(__file__).with_name("templates")
TEMPLATES = ("teacher_outline", "teacher_extraction", "memreader", "memreader_think", "reverse_com", "chunk_boundary",
             "qa_answer")
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


READER_FIELDS = {"document": "the document (or reading window) to read; required",
                 "language": "the document's language: en or zh"}
"""Placeholders a reader prompt file may use."""


class PromptTemplateError(MemReaderError, ValueError):
    """A prompt template file that cannot be used; the message names the file, the problem and the valid set."""


def load_template_file(path: str | Path, name: str = "memreader") -> Template:
    """A reader prompt from a file (see the module docstring), checked: its placeholders are among
    :data:`READER_FIELDS` and ``{{document}}`` is one of them."""
    path = Path(path)
    valid = ", ".join("{{" + k + "}}" for k in READER_FIELDS)
    if not path.is_file():
        raise PromptTemplateError(f"prompt template {path} does not exist",
                                  f"give a text file with a [user] section using {valid}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError:
        raise PromptTemplateError(f"prompt template {path} is not UTF-8", "re-encode it as UTF-8") from None
    m = re.match(r"\s*(?:version:[ \t]*\S+[ \t]*\n)?\s*(?:\[system\][ \t]*\n(.*?))?^\[user\][ \t]*\n(.*)\Z", text,
                 re.S | re.M)
    if not m:
        raise PromptTemplateError(f"prompt template {path}: no [user] section (a line of its own)",
                                  "write an optional '[system]' section, then '[user]' and the prompt (with "
                                  f"{valid})")
    tpl = Template(name, "file", hashlib.sha256(raw).hexdigest()[:12], (m.group(1) or "").strip(),
                   m.group(2).strip())
    unknown = sorted(tpl.fields - READER_FIELDS.keys())
    problems = ([f"unknown placeholder(s) {', '.join('{{' + u + '}}' for u in unknown)}"] if unknown else []) + (
        ["no {{document}} placeholder: the document would never reach the model"] if "document" not in tpl.fields
        else [])
    if problems:
        raise PromptTemplateError(f"prompt template {path}: " + "; ".join(problems), f"use only {valid}")
    return tpl


@dataclass
class PromptConfig:
    """The reader-prompt keys of ``memreader read`` and ``memreader gen`` (whose SFT data teaches that prompt)."""

    prompt_template: str = config_field("", help="a prompt file for MemReader ([system] / [user] sections, "
                                        "placeholders {{document}} and {{language}}; docs: docs/USAGE.md "
                                        "'Released checkpoints'); empty = the bundled memreader template of each language")
    system_prompt: str = config_field("", help="replaces the prompt's system message (empty = the template's own)")

    def reader_prompt(self, think: bool = False) -> ReaderPrompt:
        """The run's prompt."""
        return ReaderPrompt(self.prompt_template, self.system_prompt, think)

    def prompt_problems(self) -> list[str]:
        """What is wrong with the template file (checked before any model call)."""
        return ReaderPrompt(self.prompt_template).problems()


@dataclass(frozen=True)
class ReaderPrompt:
    """The MemReader prompt of a run: the bundled ``memreader`` / ``memreader_think`` template in the document's
    language, or ``template`` (a file) for every language; ``system`` replaces the system message."""

    template: str = ""
    system: str = ""
    think: bool = False

    def problems(self) -> list[str]:
        """What is wrong with the template file (empty when fine, or when none is given)."""
        if not self.template:
            return []
        try:
            load_template_file(self.template)
        except PromptTemplateError as exc:
            return [f"prompt_template: {exc}"]
        return []

    def key(self) -> dict[str, Any]:
        """What a run's key records about the prompt beyond the bundled default (``{}`` for it)."""
        out: dict[str, Any] = {}
        if self.template:
            out["prompt_template"] = load_template_file(self.template).version
        if self.system:
            out["system_prompt_sha256"] = hashlib.sha256(self.system.encode()).hexdigest()[:12]
        return out

    def render(self, lang: str, document: str) -> tuple[list[dict[str, str]], Template]:
        """Chat messages for ``document`` in ``lang`` (``en`` or ``zh``) and the template used."""
        if self.template:
            tpl = load_template_file(self.template, "memreader_think" if self.think else "memreader")
            messages, tpl = render_template(tpl, {"document": document, "language": lang})
        else:
            messages, tpl = render("memreader_think" if self.think else "memreader", lang, document=document)
        if self.system:
            messages[0] = {"role": "system", "content": self.system}
        return messages, tpl


def render_template(tpl: Template, values: dict[str, object]) -> tuple[list[dict[str, str]], Template]:
    """Chat messages of ``tpl`` (:func:`render` for a template from a file: the values it does not use are left
    out)."""
    used = {k: v for k, v in values.items() if k in tpl.fields}
    safe = {k: (str(v) if k in PRE_ESCAPED else escape_markup(str(v))) for k, v in used.items()}
    return [{"role": "system", "content": _fill(tpl.system, safe)},
            {"role": "user", "content": _fill(tpl.user, safe)}], tpl


def render(name: str, lang: str, **values: object) -> tuple[list[dict[str, str]], Template]:
    """Chat messages for template ``name`` in ``lang``; every placeholder must be given."""
    tpl = load_template(name, lang)
    missing, extra = tpl.fields - values.keys(), values.keys() - tpl.fields
    if missing or extra:
        raise ValueError(f"template {tpl.id}: missing values {sorted(missing)}, unexpected values {sorted(extra)}")
    return render_template(tpl, values)
