"""Fakes shared by the data_gen tests: a three-document corpus and scripted teachers (the real teacher is a remote
service). Import as ``from tests.data_gen.fakes import ...``."""

from __future__ import annotations

from memreader.core.generation import GenerationRequestError, Reply
from memreader.core.markup import render_memory

DOCS = [
    ("a", "First part about apples and orchards. Second part about cider presses and bottles."),
    ("b", "苹果的种植历史很长。榨汁机的使用方法也很重要，需要定期清洗。"),
    ("c", "Short note one. Short note two is here."),
]


def stage(prompt: str) -> str:
    """Which teacher step a prompt belongs to."""
    if "Document memory:" in prompt or "文档记忆：" in prompt:
        return "reverse CoM"
    if "outline" in prompt.lower() and "<scenario>" not in prompt:
        return "outline"
    return "extraction"


class ScriptedTeacher:
    """Answers like a well-behaved teacher, computed from the document in the prompt."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[tuple[str, int, bool]] = []  # (stage, max_new_tokens, got a grammar)
        self.seeds: list[int | None] = []

    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None, seeds=None):
        self.calls += len(list_of_messages)
        outs = []
        for i, m in enumerate(list_of_messages):
            self.seen.append((stage(m[-1]["content"]), params.max_new_tokens, bool(grammars and grammars[i])))
            self.seeds.append(seeds[i] if seeds else params.seed)
            out = self._reply(m[-1]["content"])
            if isinstance(out, GenerationRequestError):
                if not return_exceptions:
                    raise out
            else:
                out = self._finish(m[-1]["content"], params, out)
                if on_reply is not None:
                    on_reply(i, out)
            outs.append(out)
        return outs

    def _finish(self, prompt, params, out):
        """A subclass's change to a finished reply (a cut-off one, say): as it is here."""
        return out

    @staticmethod
    def _reply(prompt: str) -> str:
        doc = prompt.split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]
        if "Document memory:" in prompt or "文档记忆：" in prompt:
            return "The text has two parts; the second begins where the topic changes."
        cut = len(doc) // 2
        if "outline" in prompt.lower() and "<scenario>" not in prompt:
            return "<outline>\nPart one\nPart two\n</outline>"
        return render_memory(["Part one", "Part two"], [doc[:cut], doc[cut:]], ["core one", "core two"])


class FixedTeacher(ScriptedTeacher):
    """Gives the one reply ``text`` to every prompt (a refusal, a ramble without structure)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def _reply(self, prompt: str) -> str:
        return self.text


class SeededTeacher(ScriptedTeacher):
    """Cuts each document at a place that depends on the request's seed, like a sampling teacher."""

    def __init__(self) -> None:
        super().__init__()
        self.documents: list[str] = []  # the document of every extraction prompt

    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None, seeds=None):
        self.calls += len(list_of_messages)
        outs = []
        for i, m in enumerate(list_of_messages):
            seed = seeds[i] if seeds else params.seed
            self.seen.append((stage(m[-1]["content"]), params.max_new_tokens, bool(grammars and grammars[i])))
            self.seeds.append(seed)
            prompt = m[-1]["content"]
            if stage(prompt) != "extraction":
                outs.append(Reply(self._reply(prompt), finish_reason="stop"))
                continue
            doc = prompt.split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]
            self.documents.append(doc)
            cut = 5 + (seed or 0) % (len(doc) - 10)
            outs.append(Reply(render_memory(["P1", "P2"], [doc[:cut], doc[cut:]], ["c1", "c2"]), finish_reason="stop"))
        return outs
