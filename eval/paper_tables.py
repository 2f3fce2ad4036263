"""The MoM paper's reported numbers (Zhao et al., 2025, arXiv v1; ``shared/papers/mom_mixtures_of_scenario_
aware_document_memories.txt``), transcribed by hand for side-by-side display in ``memreader report``.

These are the paper's values under the paper's settings: Qwen2.5-7B/14B answerers, bge-base-zh-v1.5
embeddings, Milvus, top_k = 8, float16, their own chunkers and MemReader models. They are not
reproduced by this repository and are never compared statistically with our numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from memreader.eval.markdown import fmt, table

PAPER = "MoM (Zhao et al., 2025), arXiv preprint"
SETTINGS = ("paper's settings: answerer Qwen2.5-7B/14B-Instruct (fp16), embedder bge-base-zh-v1.5, Milvus, top_k=8; "
            "their chunkers and MemReader-1.5B/3B/7B")

# Table 1: "Main experimental results are presented in three domain QA datasets." Columns per dataset:
# B-1, B-Avg, ROUGE-L, METEOR. (In the extracted text the Qwen2.5-14B row has run-together numbers,
# "0.11400.2473" and "0.18830.08900.2497"; split here at the fourth decimal, as every cell has four.)
TABLE1_COLUMNS = ("bleu_1", "bleu_avg", "rouge_l", "meteor")
TABLE1_DATASETS = ("CRUD", "OmniEval", "MultiFieldQA")
_TABLE1_ROWS = {  # method: (B-1, B-Avg, ROUGE-L, METEOR) on each of TABLE1_DATASETS in turn
    "Original": (0.5022, 0.3824, 0.5654, 0.7324, 0.1906, 0.1006, 0.2254, 0.3904, 0.1707, 0.0684, 0.2315, 0.3650),
    "Llama_index": (0.5312, 0.4114, 0.5896, 0.7449, 0.1969, 0.1065, 0.2350, 0.4040, 0.1732, 0.0765, 0.2363, 0.3726),
    "Semantic Chunking": (0.5188, 0.3985, 0.5823, 0.7434, 0.1913, 0.0971, 0.2240, 0.3821, 0.1609, 0.0576, 0.2191, 0.3468),
    "LumberChunker": (0.5061, 0.3910, 0.5701, 0.7399, 0.1997, 0.1092, 0.2375, 0.4085, 0.1841, 0.0838, 0.2426, 0.3809),
    "MoC MetaChunker": (0.5456, 0.4225, 0.6031, 0.7546, 0.2042, 0.1128, 0.2457, 0.4141, 0.1707, 0.0728, 0.2255, 0.3512),
    "Qwen2.5-14B": (0.5329, 0.4127, 0.5920, 0.7502, 0.2048, 0.1140, 0.2473, 0.4160, 0.1883, 0.0890, 0.2497, 0.3827),
    "Qwen3-14B": (0.5382, 0.4167, 0.5953, 0.7531, 0.1907, 0.1040, 0.2329, 0.4080, 0.1800, 0.0873, 0.2412, 0.3759),
    "MemReader-1.5B": (0.5513, 0.4314, 0.6106, 0.7611, 0.1908, 0.1023, 0.2354, 0.4083, 0.1774, 0.0771, 0.2424, 0.3900),
    "MemReader-3B": (0.5539, 0.4325, 0.6098, 0.7600, 0.1936, 0.1071, 0.2394, 0.4171, 0.1897, 0.0840, 0.2559, 0.3941),
    "MemReader-7B": (0.5565, 0.4372, 0.6152, 0.7669, 0.2056, 0.1123, 0.2500, 0.4229, 0.2000, 0.0837, 0.2637, 0.4043),
}
TABLE1: dict[str, dict[str, tuple[float, float, float, float]]] = {
    dataset: {method: row[4 * i : 4 * i + 4] for method, row in _TABLE1_ROWS.items()}
    for i, dataset in enumerate(TABLE1_DATASETS)
}

# Table 2: "Correlation analysis of atomic chunks clarity with ROUGE-L under different LLMs."
# (ROUGE-L, clarity with evaluator Qwen2.5-3B, Qwen2.5-7B, Qwen2.5-14B). The paper does not name the
# data set (its ROUGE-L values, 0.41-0.44, match none of Table 1's columns); last row: Pearson r.
TABLE2_EVALUATORS = ("Qwen2.5-3B", "Qwen2.5-7B", "Qwen2.5-14B")
TABLE2: dict[str, tuple[float, float, float, float]] = {
    "Original": (0.4213, -0.0071, 0.0085, -0.0510),
    "Llama_index": (0.4326, 0.2710, 0.1919, 0.3531),
    "Semantic Chunking": (0.4131, 0.1945, 0.1447, 0.2380),
    "Qwen2.5-14B": (0.4351, 0.3782, 0.3651, 0.4996),
    "Qwen2.5-72B": (0.4405, 0.3484, 0.3355, 0.4908),
}
TABLE2_PEARSON = (0.7044, 0.7585, 0.7248)

# Table 3: "Quantitative evaluation of informational support from retrieved memories for answers."
# S_support (lower is better) on MultiFieldQA (§4.4: "We conduct the test on the MultiFieldQA dataset"),
# scored with Qwen2.5-7B, Qwen2.5-14B and Qwen2-7B.
TABLE3_DATASET = "MultiFieldQA"
TABLE3_MODELS = ("Qwen2.5-7B", "Qwen2.5-14B", "Qwen2-7B")
TABLE3: dict[str, tuple[float, float, float]] = {
    "Original": (3.304, 3.341, 2.988),
    "Llama_index": (3.343, 3.385, 2.935),
    "Semantic Chunking": (3.580, 3.695, 3.024),
    "LumberChunker": (3.337, 3.369, 2.906),
    "MoC MetaChunker": (3.628, 3.671, 3.151),
    "Qwen2.5-14B": (3.429, 3.498, 2.955),
    "Qwen3-14B": (3.264, 3.348, 2.903),
    "MemReader-3B": (3.149, 3.247, 2.795),
}

# Which paper data set a run's data set is: patterns over "<name> <path>" (lower case).
_DATASETS = (
    ("MultiFieldQA", re.compile(r"multifield")),
    ("OmniEval", re.compile(r"omnieval")),
    ("CRUD", re.compile(r"crud")),
)
NOTES = {
    "CRUD": "the paper does not say which CRUD-RAG task or split its CRUD column is; this run's may differ",
    "MultiFieldQA": "LongBench MultiFieldQA-zh",
    "OmniEval": "the financial-domain OmniEval QA",
}


def match_dataset(name: str, path: str = "") -> str | None:
    """The paper's data set (a key of :data:`TABLE1`) that a run's data set ``name``/``path`` is, or None."""
    text = f"{name} {path}".lower()
    return next((paper for paper, pattern in _DATASETS if pattern.search(text)), None)


def side_by_side(name: str, path: str, scores: Mapping[str, Mapping[str, float]],
                 support: Mapping[str, float | None], correlation: tuple[float, float, int] | None) -> list[str]:
    """Markdown lines: the paper's Table 1 (and Table 3 on MultiFieldQA) rows for the run's data set next to
    this run's ``scores[method][metric]`` and mean ``support[method]``; Table 2 next to this run's
    ``(pearson, spearman, n_methods)`` when there is one. Labelled as the paper's values and settings."""
    match = match_dataset(name, path)
    md = ["## The paper's reported numbers", "",
          f"Values reported in {PAPER}, with the {SETTINGS}. Their models, embedder and chunkers differ from this "
          "run's: read them as context, not as a comparison.", ""]
    if match is None:
        md += [f"The run's data set ({name}) is none of the paper's (CRUD, OmniEval, MultiFieldQA): no Table 1 or 3 "
               "rows shown.", ""]
    else:
        md += [f"Table 1, {match} ({NOTES[match]}):", ""]
        rows = [["paper", method, *map(fmt, values)] for method, values in TABLE1[match].items()]
        rows += [["this run", method, *(fmt(s.get(c)) for c in TABLE1_COLUMNS)] for method, s in scores.items()]
        md += table(["source", "method", "B-1", "B-Avg", "ROUGE-L", "METEOR"], rows)
        if match == TABLE3_DATASET:
            md += [f"Table 3, informational support on {match} (the paper's answer models; this run's own):", ""]
            rows = [["paper", method, *(fmt(v, 3) for v in values), ""] for method, values in TABLE3.items()]
            rows += [["this run", method, "", "", "", fmt(v, 3)] for method, v in support.items()]
            md += table(["source", "method", *TABLE3_MODELS, "this run's model"], rows)
    if correlation is not None:
        md += ["Table 2, clarity vs ROUGE-L (the paper does not name its data set):", ""]
        rows = [["paper", method, *map(fmt, values)] for method, values in TABLE2.items()]
        rows.append(["paper", "Pearson r", "", *map(fmt, TABLE2_PEARSON)])
        md += table(["source", "method", "ROUGE-L", *(f"clarity ({e})" for e in TABLE2_EVALUATORS)], rows)
        md += [f"This run: Pearson r {fmt(correlation[0])}, Spearman rho {fmt(correlation[1])} over "
               f"{correlation[2]} methods.", ""]
    return md
