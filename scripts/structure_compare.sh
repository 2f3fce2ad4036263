#!/usr/bin/env bash
# The reader finds the parts, measured: the structure adapter with its cut head, the same adapter without it, the
# base SmolLM2 (BASE=1) and the rule chunkers calibrated to the head reader's mean chunk length, on the gold documents
# of one split (SPLIT=dev by default; SPLIT=test is the split nothing was tuned on); scored in all, per language and
# per kind (joined / sections); then supporting-passage recall@k on the split's HotpotQA questions over the same reads.
#   bash scripts/structure_compare.sh                  # ADAPTER=results/structure-adapter, SPLIT=dev
#   SPLIT=test bash scripts/structure_compare.sh
# Prerequisites: `make setup`; memreader structure-data (artifacts/datasets/structure/, with the manuals: docs/USAGE.md).
# Outputs: $MEMREADER_HOME/runs/seg-$SPLIT-{head,nohead,base}/read, runs/seg-$SPLIT-cmp/segmentation,
#   artifacts/bench/structure_$SPLIT*.json
set -euo pipefail
cd "$(dirname "$0")/.."
MR=${MEMREADER:-.venv/bin/memreader}
PY=${PYTHON:-.venv/bin/python}
HOME_DIR=${MEMREADER_HOME:-artifacts}
ADAPTER=${ADAPTER:-results/structure-adapter}
SPLIT=${SPLIT:-dev}
DATA=${DATA:-artifacts/datasets/structure}
GOLD="$DATA/$SPLIT.jsonl"
METHODS=${METHODS:-fixed,sentence,semantic}   # add lumber,llm-direct for the model chunkers (each a calibrated read)
mkdir -p artifacts/bench

$MR read --config configs/inference/smollm2_cpu.yaml --set run="seg-$SPLIT-head" --set input="$GOLD" \
    --set adapter="$ADAPTER"
$MR read --config configs/inference/smollm2_cpu.yaml --set run="seg-$SPLIT-nohead" --set input="$GOLD" \
    --set adapter="$ADAPTER" --set cut_head=none
ARGS=(--method "trained+head=$HOME_DIR/runs/seg-$SPLIT-head/read/memories.jsonl"
      --method "trained=$HOME_DIR/runs/seg-$SPLIT-nohead/read/memories.jsonl")
if [ "${BASE:-0}" = 1 ]; then
  $MR read --config configs/inference/smollm2_cpu.yaml --set run="seg-$SPLIT-base" --set input="$GOLD"
  ARGS+=(--method "base=$HOME_DIR/runs/seg-$SPLIT-base/read/memories.jsonl")
fi
# the rule chunkers calibrated to the head reader's mean chunk length (target_chars=0: the given memories' length)
$MR eval --config configs/eval/segmentation_demo.yaml --set qa="$GOLD" --set run="seg-$SPLIT-cmp" \
    --set "methods=[memreader,${METHODS}]" --set target_chars=0 \
    --set memories="$HOME_DIR/runs/seg-$SPLIT-head/read/memories.jsonl"
for m in ${METHODS//,/ }; do ARGS+=(--method "$m=$HOME_DIR/runs/seg-$SPLIT-cmp/segmentation/methods/$m/memories.jsonl"); done
$PY scripts/bench_segmentation.py --gold "$GOLD" "${ARGS[@]}" --out "artifacts/bench/structure_$SPLIT.json"
for part in en zh joined sections; do
  $PY -c "
import json, sys
src, dst, part = sys.argv[1:]
with open(dst, 'w', encoding='utf-8') as out:
    for line in open(src, encoding='utf-8'):
        rec = json.loads(line)
        if part in (rec.get('lang'), rec.get('kind')): out.write(line)" "$GOLD" "artifacts/bench/$SPLIT.$part.jsonl" "$part"
  $PY scripts/bench_segmentation.py --gold "artifacts/bench/$SPLIT.$part.jsonl" "${ARGS[@]}" \
      --out "artifacts/bench/structure_$SPLIT.$part.json"
done
$PY scripts/bench_structure_retrieval.py --gold "$GOLD" --manifest "$DATA/manifest.json" --questions "${SPLIT}_questions" \
    --qa ../shared/datasets/hotpotqa_100_qa.json "${ARGS[@]}" --out "artifacts/bench/structure_retrieval_$SPLIT.json"
