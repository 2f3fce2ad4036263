"""WordNet 3.0 for METEOR's synonym stage: found where nltk looks, else installed into this environment.

    memreader setup-wordnet                                 # -> <python environment>/nltk_data/corpora/wordnet/
    memreader setup-wordnet --set source=/opt/wordnet-3.0   # another WordNet 3.0 database folder

Two sources, tried in turn: a WordNet 3.0 database folder (``source``, default Debian's ``wordnet-base`` +
``wordnet-sense-index`` in /usr/share/wordnet: ``data.*``, ``index.*`` with ``index.sense``, ``*.exc``; copied, with
the ``lexnames`` table nltk needs and Debian lacks), then nltk's own downloader (``download``; its WordNet is 3.0
too). The target is ``<sys.prefix>/nltk_data``, a folder nltk searches by default. :func:`find_wordnet` (which
METEOR's scorers call) installs it the same way when nltk finds none, so ``memreader demo`` and ``memreader eval``
need no step by hand; when neither source works it stops with an error naming both fixes and never drops synonyms
silently.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from memreader.core.config import field
from memreader.core.errors import MemReaderError
from memreader.core.stage import Flag, Stage

log = logging.getLogger(__name__)

SOURCE = "/usr/share/wordnet"
"""Debian's WordNet 3.0 database (``apt-get install wordnet-base wordnet-sense-index``)."""
NLTK_DATA = Path(sys.prefix) / "nltk_data"
"""Where WordNet is installed: a folder nltk searches by default (the virtual environment's, in a checkout .venv)."""
NEEDED = ("data.noun", "index.noun", "index.sense", "verb.exc")
# WordNet 3.0's 45 lexicographer files, numbered as in its lexnames(5WN) page; the last column is the part of speech
LEXNAMES = ("adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
            "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location noun.motive "
            "noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process noun.quantity "
            "noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change verb.cognition "
            "verb.communication verb.competition verb.consumption verb.contact verb.creation verb.emotion verb.motion "
            "verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl").split()
POS_NUMBER = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


class WordNetMissing(MemReaderError, RuntimeError):
    """METEOR asks for WordNet and none is found or can be installed; the message names the fixes."""


@dataclass
class WordNetConfig:
    """Where ``memreader setup-wordnet`` takes WordNet 3.0 from and puts it."""

    source: str = field("", help=f"a WordNet 3.0 database folder (data.*, index.* with index.sense, *.exc; default "
                        f"{SOURCE}, Debian's: apt-get install wordnet-base wordnet-sense-index)")
    dest: str = field("", help="the nltk data folder to install into (default: <sys.prefix>/nltk_data, which nltk "
                      "searches)")
    download: bool = field(True, help="when the source folder has no WordNet, fetch it with nltk's downloader")


_FIX = ("install Debian's WordNet 3.0 (apt-get install wordnet-base wordnet-sense-index) and run `memreader "
        "setup-wordnet`, or give it a WordNet 3.0 folder (`memreader setup-wordnet --set source=DIR`); or score "
        "without synonyms with meteor_wordnet=false (the signature then says wordnet:off)")


def _copy(source: Path, corpora: Path) -> int:
    """Copy the database files of ``source`` into ``corpora/wordnet`` (staged, then renamed: a concurrent reader
    sees all of it or nothing) with the ``lexnames`` table; the number of files copied."""
    files = sorted(p for pattern in ("data.*", "index.*", "*.exc") for p in source.glob(pattern) if p.is_file())
    corpora.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=corpora))
    for path in files:
        shutil.copyfile(path, staged / path.name)
    (staged / "lexnames").write_text("".join(f"{i:02d}\t{name}\t{POS_NUMBER[name.split('.')[0]]}\n"
                                             for i, name in enumerate(LEXNAMES)), encoding="utf-8")
    target = corpora / "wordnet"
    shutil.rmtree(target, ignore_errors=True)  # an older or half-filled copy
    try:
        staged.rename(target)
    except OSError:  # another process put the same database there meanwhile
        shutil.rmtree(staged)
    return len(files)


def install_wordnet(cfg: WordNetConfig | None = None) -> str:
    """Install WordNet 3.0 into ``cfg.dest`` from ``cfg.source``, else (``cfg.download``) with nltk's downloader;
    a line saying what was done. Raises :class:`WordNetMissing` naming the fixes when neither works."""
    import nltk

    cfg = cfg or WordNetConfig()
    dest, source = Path(cfg.dest or NLTK_DATA), Path(cfg.source or SOURCE)
    if all((source / name).is_file() for name in NEEDED):
        count = _copy(source, dest / "corpora")
        line = f"copied {count} WordNet 3.0 files of {source} and wrote lexnames into {dest / 'corpora' / 'wordnet'}"
    else:
        missing = f"{source} has no WordNet 3.0 database ({', '.join(NEEDED)})"
        if not cfg.download:
            raise WordNetMissing(f"{missing} and download=false", _FIX)
        try:
            fetched = nltk.download("wordnet", download_dir=str(dest), quiet=True, raise_on_error=True)
        except (OSError, ValueError) as exc:  # no network, a refused or broken download: named with the fixes
            raise WordNetMissing(f"{missing}, and nltk's downloader failed: {exc}", _FIX) from exc
        if not fetched:
            raise WordNetMissing(f"{missing}, and nltk's downloader did not fetch 'wordnet' into {dest}", _FIX)
        line = f"fetched WordNet with nltk's downloader into {dest / 'corpora'} ({missing})"
    if str(dest) not in nltk.data.path:
        nltk.data.path.append(str(dest))
    return line


def find_wordnet(install: bool = True) -> str:
    """WordNet's version for nltk (e.g. ``'3.0'``), installed first (:func:`install_wordnet`) when nltk finds none
    and ``install``. Raises :class:`WordNetMissing` naming the fixes when it cannot be had."""
    import nltk

    try:
        nltk.data.find("corpora/wordnet")
    except LookupError:
        missing = f"METEOR asks for WordNet synonyms but nltk finds no WordNet data (searched {', '.join(nltk.data.path)})"
        if not install:
            raise WordNetMissing(missing, _FIX) from None
        log.warning("%s: installing it (memreader setup-wordnet)", missing)
        try:
            log.warning("%s", install_wordnet())
        except WordNetMissing as exc:
            raise WordNetMissing(f"{missing}, and it could not be installed: {exc.problem}", _FIX) from exc
    from nltk.corpus import wordnet

    wordnet.ensure_loaded()
    return wordnet.get_version()


def _run_stage(cfg: WordNetConfig) -> int:
    dest = Path(cfg.dest or NLTK_DATA)
    if all((dest / "corpora" / "wordnet" / name).is_file() for name in (*NEEDED, "lexnames")):
        print(f"setup-wordnet: WordNet is already in {dest / 'corpora' / 'wordnet'}")
    elif (dest / "corpora" / "wordnet.zip").is_file():
        print(f"setup-wordnet: WordNet is already in {dest / 'corpora' / 'wordnet.zip'}")
    else:
        print(f"setup-wordnet: {install_wordnet(cfg)}")
    return 0


STAGE = Stage("setup-wordnet", "install WordNet 3.0 for METEOR's synonym stage into this environment (offline "
              "from a database folder, else nltk's downloader)", run=_run_stage, config=WordNetConfig,
              flags=(Flag("source"), Flag("dest")))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("setup-wordnet"))
