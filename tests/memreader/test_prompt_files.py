"""Reader prompts from a file (prompt_template / system_prompt in read and gen): checked before any call, used
for every language, recorded by hash, and the SFT data of gen teaches the same prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.core.config import ConfigError, load_config
from memreader.core.markup import render_memory
from memreader.core.prompts import PromptTemplateError, ReaderPrompt, load_template_file
from memreader.core.schema import DocumentMemory, Scenario, read_memories
from memreader.data_gen.sft_export import sft_record
from memreader.inference.reader import ReadConfig, read_corpus_memories, read_key

RELEASED_STYLE = """[system]
You extract scenario memories.
[user]
Task: write the reasoning, the outline and the scenarios of this {{language}} document.
<document>
{{document}}
</document>
"""


def _file(tmp_path: Path, text: str, name: str = "prompt.txt") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "error"), [
    ("[user]\nRead {{doc}} please.\n", r"unknown placeholder\(s\) \{\{doc\}\}; no \{\{document\}\} placeholder"),
    ("[user]\nRead {{document}} in {{lang}}.\n", r"unknown placeholder\(s\) \{\{lang\}\}"),
    ("[user]\nRead the document.\n", r"no \{\{document\}\} placeholder"),
    ("just a prompt without sections {{document}}\n", "no \\[user\\] section"),
])
def test_bad_template_files_name_the_valid_placeholders(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(PromptTemplateError, match=error) as err:
        load_template_file(_file(tmp_path, text))
    assert "{{document}}, {{language}}" in str(err.value)
    with pytest.raises(PromptTemplateError, match="does not exist"):
        load_template_file(tmp_path / "missing.txt")


def test_a_template_file_renders_every_language_and_the_system_can_be_replaced(tmp_path: Path) -> None:
    path = _file(tmp_path, RELEASED_STYLE)
    messages, tpl = ReaderPrompt(str(path)).render("zh", "文档</document>")
    assert messages[0] == {"role": "system", "content": "You extract scenario memories."}
    assert "this zh document" in messages[1]["content"] and "</document>\n</document>" not in messages[1]["content"]
    assert tpl.id.startswith("memreader.file@") and len(tpl.version) == 12  # the file's hash
    messages, _ = ReaderPrompt(str(path), system="Be brief.").render("en", "text")
    assert messages[0] == {"role": "system", "content": "Be brief."}
    bundled, default = ReaderPrompt().render("en", "text")
    assert default.id == "memreader.en@1" and ReaderPrompt().key() == {}


def test_read_uses_the_file_records_its_hash_and_refuses_a_bad_one_before_any_call(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "d0", "text": "A short document with words here and there."}) + "\n")
    bad = _file(tmp_path, "[user]\n{{text}}\n", "bad.txt")
    with pytest.raises(ConfigError, match=r"prompt_template: prompt template .*bad.txt: unknown placeholder"):
        load_config(ReadConfig, None, [f"input={corpus}", f"prompt_template={bad}"])
    path = _file(tmp_path, RELEASED_STYLE)
    seen = []

    class Backend:
        def generate_many(self, list_of_messages, params, return_exceptions=False, grammars=None, **_):
            out = []
            for msgs in list_of_messages:
                seen.append(msgs)
                doc = msgs[-1]["content"].split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]
                cut = doc.index(" ", len(doc) // 2)
                out.append(render_memory(["x", "y"], [doc[:cut], doc[cut:]], ["c", "d"]))
            return out

    cfg = ReadConfig(input=str(corpus), run="tpl", guided="off", prompt_template=str(path))
    summary = read_corpus_memories(cfg, backend=Backend())
    assert summary["read"] == 1 and seen[0][0]["content"] == "You extract scenario memories."
    (mem,) = read_memories(summary["memories"])
    assert mem.meta["prompt"] == load_template_file(path).id
    assert read_key(cfg) != read_key(ReadConfig(input=str(corpus), run="tpl", guided="off"))
    path.write_text(RELEASED_STYLE.replace("Task:", "Job:"), encoding="utf-8")  # another prompt, another key
    assert read_key(cfg) != mem.meta["read_key"]


def test_gen_sft_data_teaches_the_template(tmp_path: Path) -> None:
    path = _file(tmp_path, RELEASED_STYLE)
    doc = "First part of the text. Second part of the text."
    mem = DocumentMemory("d", doc, [Scenario("a", "b", 0, 24), Scenario("c", "d", 24, len(doc))])
    record = sft_record(mem, prompt=ReaderPrompt(str(path), system="Sys."))
    assert record["prompt"][0]["content"] == "Sys." and "this en document" in record["prompt"][1]["content"]
    assert record["meta"]["template"] == load_template_file(path).id
