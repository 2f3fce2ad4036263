"""WordNet for METEOR (eval/wordnet.py): ``memreader setup-wordnet`` copies a WordNet 3.0 database folder into an
nltk data folder that nltk then reads, :func:`find_wordnet` does it by itself when nltk finds none, and without any
source the error names the command and the WordNet-free switch (nltk's downloader, a remote service, is faked)."""

from __future__ import annotations

from pathlib import Path

import nltk
import pytest

import memreader.eval.wordnet as wordnet
from memreader.cli import main as memreader_main
from memreader.eval.wordnet import WordNetConfig, WordNetMissing, find_wordnet, install_wordnet


@pytest.fixture(scope="module")
def database() -> Path:
    """A WordNet 3.0 database folder: Debian's, else the folder nltk reads this environment's copy from."""
    if (Path(wordnet.SOURCE) / "index.sense").is_file():
        return Path(wordnet.SOURCE)
    found = Path(str(nltk.data.find("corpora/wordnet")))
    if not (found / "index.sense").is_file():
        pytest.skip(f"no WordNet 3.0 database folder here ({wordnet.SOURCE}, {found}): run `memreader setup-wordnet`")
    return found


def no_download(*args, **kwargs):
    raise ValueError("Error loading wordnet: <urlopen error [Errno -3] Temporary failure in name resolution>")


def test_the_command_copies_a_database_nltk_reads(database: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "nltk_data"
    assert memreader_main(["setup-wordnet", "--source", str(database), "--dest", str(dest)]) == 0
    assert "copied" in capsys.readouterr().out
    folder = dest / "corpora" / "wordnet"
    lexnames = (folder / "lexnames").read_text(encoding="utf-8").splitlines()
    assert len(lexnames) == 45 and lexnames[3] == "03\tnoun.Tops\t1" and lexnames[44] == "44\tadj.ppl\t3"
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    reader = WordNetCorpusReader(str(folder), None)
    assert reader.get_version() == "3.0" and reader.synsets("dog")
    assert memreader_main(["setup-wordnet", "--source", str(database), "--dest", str(dest)]) == 0
    assert "already in" in capsys.readouterr().out  # a second run copies nothing


def test_find_wordnet_installs_it_when_nltk_finds_none(database: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    monkeypatch.setattr(wordnet, "NLTK_DATA", tmp_path / "env")
    monkeypatch.setattr(wordnet, "SOURCE", str(database))
    monkeypatch.setattr(nltk, "download", no_download)  # the local folder is enough: never asked
    assert find_wordnet() == "3.0"
    assert (tmp_path / "env" / "corpora" / "wordnet" / "index.sense").is_file()
    assert str(tmp_path / "env") in nltk.data.path


def test_without_any_source_the_error_names_the_command(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    monkeypatch.setattr(wordnet, "SOURCE", str(tmp_path / "nowhere"))
    monkeypatch.setattr(wordnet, "NLTK_DATA", tmp_path / "env")
    monkeypatch.setattr(nltk, "download", no_download)
    with pytest.raises(WordNetMissing, match=r"name resolution.*memreader setup-wordnet.*meteor_wordnet=false"):
        find_wordnet()
    with pytest.raises(WordNetMissing, match="nltk finds no WordNet data"):
        find_wordnet(install=False)
    with pytest.raises(WordNetMissing, match="download=false"):
        install_wordnet(WordNetConfig(download=False))
    assert memreader_main(["setup-wordnet", "--dest", str(tmp_path / "d"), "--set", "download=false"]) == 2
    err = capsys.readouterr().err
    assert "memreader setup-wordnet: error:" in err and "has no WordNet 3.0 database" in err
    assert not (tmp_path / "d" / "corpora" / "wordnet").exists()


def test_help(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        memreader_main(["setup-wordnet", "--help"])
    assert done.value.code == 0 and "--source" in capsys.readouterr().out
