"""Guided decoding's bad inputs: each gets an error that names the problem and the fix."""

from __future__ import annotations

import asyncio
import builtins
import sys

import pytest

from memreader.core.generation import guided


def test_slow_tokenizer_is_refused_with_the_fix() -> None:
    class SlowTokenizer:
        is_fast = False

    with pytest.raises(guided.GuidedDecodingUnavailable, match=r"fast \(Rust\) tokenizer.*guided=off"):
        guided.ll_tokenizer(SlowTokenizer())


def test_missing_llguidance_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_llguidance(name: str, *args, **kwargs):
        if name == "llguidance" or name.startswith("llguidance."):
            raise ImportError("No module named 'llguidance'")
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m == "llguidance" or m.startswith("llguidance.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_llguidance)
    with pytest.raises(guided.GuidedDecodingUnavailable, match=r"pip install llguidance.*guided=off"):
        guided.llguidance_module()


def test_cli_reports_guidance_errors_without_traceback(tmp_path, monkeypatch, capsys) -> None:
    """A run whose every document cannot be guided names each one; bad grammar settings exit 2."""
    from memreader.cli import main

    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "Some text."}\n')
    code = main(["read", "--set", f"input={corpus}", "--set", "min_chunk_chars=0"])
    err = capsys.readouterr().err
    assert code == 2 and "min_chunk_chars=0 must be >= 1" in err and "Traceback" not in err


@pytest.mark.integration
def test_document_longer_than_the_window_is_a_named_request_error(tiny_model) -> None:
    """The tiny model's window is 1,024 tokens: a longer prompt fails alone, naming the fix; the
    other prompt of the batch is still answered."""
    from memreader.core.generation import GenerationParams, GenerationRequestError, LocalChat

    chat = LocalChat(tiny_model, device="cpu", batch_size=2)
    long_doc = "word " * 2000
    outs = chat.generate_many([[{"role": "user", "content": long_doc}], [{"role": "user", "content": "hi"}]],
                              GenerationParams(temperature=0, max_new_tokens=4), return_exceptions=True)
    assert isinstance(outs[0], GenerationRequestError)
    assert "window of 1024 tokens" in str(outs[0]) and "split the document" in str(outs[0])
    assert not isinstance(outs[1], Exception) and outs[1].completion_tokens <= 4
    with pytest.raises(GenerationRequestError, match="max_new_tokens"):
        chat.generate_many([[{"role": "user", "content": long_doc}]], GenerationParams(max_new_tokens=4))
    # one reply at a time (the teacher's flow) goes through the same checks
    with pytest.raises(GenerationRequestError, match="window of 1024 tokens"):
        asyncio.run(chat.agenerate([{"role": "user", "content": long_doc}], GenerationParams(max_new_tokens=4)))
