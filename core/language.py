"""One language detector for every stage: a text is Chinese (``zh``) when CJK ideographs make up at least
:data:`CJK_SHARE` of its word characters (``\\w``), else English (``en``).

    detect_language("厦门大学是一所大学")          # 'zh'
    detect_language(chunk for chunk in chunks)    # over several texts at once
    is_chinese(document)                          # the same rule as a bool

Who asks it: docs/ARCHITECTURE.md (Where each concept lives).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["CJK_SHARE", "LANGUAGES", "cjk_share", "detect_language", "is_chinese"]

LANGUAGES = ("en", "zh")
CJK_SHARE = 0.2
"""A text is ``zh`` when at least this share of its word characters are CJK ideographs."""
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_WORD = re.compile(r"\w")


def cjk_share(texts: str | Iterable[str]) -> float:
    """Share of CJK ideographs among the word characters of ``texts`` (0.0 for text without any)."""
    cjk = words = 0
    for text in [texts] if isinstance(texts, str) else texts:
        cjk += len(_CJK.findall(text))
        words += len(_WORD.findall(text))
    return cjk / words if words else 0.0


def is_chinese(texts: str | Iterable[str]) -> bool:
    """True when ``texts`` pass :data:`CJK_SHARE`."""
    return cjk_share(texts) >= CJK_SHARE


def detect_language(texts: str | Iterable[str]) -> str:
    """``zh`` or ``en`` (see the module docstring)."""
    return "zh" if is_chinese(texts) else "en"
