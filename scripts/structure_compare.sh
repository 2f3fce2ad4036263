#!/usr/bin/env bash
# Training that teaches, measured: the base SmolLM2 and the structure adapter (both guided), the rule
# chunkers calibrated to the adapter's mean chunk length, and the grammar alone, on the gold-structure dev documents;
# then supporting-passage recall@k on the HotpotQA-100 dev questions over the same reads.
#   bash scripts/structure_compare.sh                  # ADAPTER=results/structure-adapter by default
# Prerequisites: `make setup`; memreader structure-data --set shared=../shared/datasets (artifacts/datasets/structure/).
# Outputs: $MEMREADER_HOME/runs/seg-{base,trained}/read, runs/seg-cmp/segmentation, artifacts/bench/structure_*.json
set -euo pipefail
cd "$(dirname "$0")/.."
MR=${MEMREADER:-.venv/bin/memreader}
PY=${PYTHON:-.venv/bin/python}
HOME_DIR=${MEMREADER_HOME:-artifacts}
ADAPTER=${ADAPTER:-results/structure-adapter}
DEV=${DEV:-artifacts/datasets/structure/dev.jsonl}
METHODS=${METHODS:-fixed,sentence,semantic}   # add lumber,llm-direct for the model chunkers (each a calibrated read)
mkdir -p artifacts/bench

$MR read --config configs/inference/smollm2_cpu.yaml --set run=seg-base --set input="$DEV"
$MR read --config configs/inference/smollm2_cpu.yaml --set run=seg-trained --set input="$DEV" --set adapter="$ADAPTER"
$PY scripts/grammar_prior.py --input "$DEV" --out artifacts/bench/grammar-random.jsonl
# the rule and LLM chunkers calibrated to the trained reader's mean chunk length
TARGET=$($PY -c "
import json, sys
n = c = 0
for line in open(sys.argv[1], encoding='utf-8'):
    m = json.loads(line)
    n += len(m['scenarios']); c += len(m['document'])
print(round(c / n))" "$HOME_DIR/runs/seg-trained/read/memories.jsonl")
echo "structure_compare: calibrating ${METHODS} to ${TARGET} characters (the trained reader's mean chunk length)"
$MR eval --config configs/eval/segmentation_demo.yaml --set qa="$DEV" --set run=seg-cmp \
    --set "methods=[${METHODS}]" --set target_chars="$TARGET"
ARGS=(--method base=$HOME_DIR/runs/seg-base/read/memories.jsonl
      --method trained=$HOME_DIR/runs/seg-trained/read/memories.jsonl
      --method grammar-random=artifacts/bench/grammar-random.jsonl)
for m in ${METHODS//,/ }; do ARGS+=(--method "$m=$HOME_DIR/runs/seg-cmp/segmentation/methods/$m/memories.jsonl"); done
$PY scripts/bench_segmentation.py --gold "$DEV" "${ARGS[@]}" --out artifacts/bench/structure_segmentation.json
for lang in en zh; do
  $PY -c "
import json, sys
src, dst, lang = sys.argv[1:]
with open(dst, 'w', encoding='utf-8') as out:
    for line in open(src, encoding='utf-8'):
        if json.loads(line).get('lang') == lang: out.write(line)" "$DEV" "artifacts/bench/dev.$lang.jsonl" "$lang"
  $PY scripts/bench_segmentation.py --gold "artifacts/bench/dev.$lang.jsonl" "${ARGS[@]}" \
      --out "artifacts/bench/structure_segmentation.$lang.json"
done
$PY scripts/bench_structure_retrieval.py --gold "$DEV" --manifest artifacts/datasets/structure/manifest.json \
    --qa ../shared/datasets/hotpotqa_100_qa.json "${ARGS[@]}" --out artifacts/bench/structure_retrieval.json
