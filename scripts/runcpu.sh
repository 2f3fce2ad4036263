#!/usr/bin/env bash
# runcpu.sh: the CPU smoke of the reference pipeline (scripts/speedrun.sh), every stage for real on the embedded
# models (SmolLM2-135M-Instruct, MiniLM) and the bundled demo corpus. `make demo` runs it (timings: docs/BENCHMARKS.md).
#
#   bash scripts/runcpu.sh                        # run "demo" under artifacts/runs/demo/
#   RUN=demo2 TRAIN_STEPS=4 bash scripts/runcpu.sh
#   TEACHER=openai TEACHER_MODEL=deepseek-chat bash scripts/runcpu.sh   # a real teacher (MEMREADER_TEACHER_BASE_URL/_API_KEY)
#
# Each step is one `memreader` stage with its YAML in configs/demo/ (or configs/eval/); every artifact lands under
# $MEMREADER_HOME/runs/$RUN/ with the stage's resolved config. The last step prints the checks of the whole run
# and fails if one does not hold. The embedded 135M model is a weak teacher and student: the point is that every
# stage runs and every artifact is valid, not the scores.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${RUN:-demo}
TEACHER=${TEACHER:-auto}   # auto: the embedded model on the fastest engine measured here (docs/ENGINES.md)
TEACHER_MODEL=${TEACHER_MODEL:-smollm2-135m-instruct}
TRAIN_STEPS=${TRAIN_STEPS:-8}
QUESTION=${QUESTION:-"How many compost bays stand behind the tool shed?"}
MEMREADER=${MEMREADER:-.venv/bin/memreader}
export MEMREADER_HOME=${MEMREADER_HOME:-$PWD/artifacts}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$MEMREADER_HOME/runs/$RUN
start=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - start )) s] $* ==="; }

step "1/7 teacher: guided candidate memories, evaluator scores, RRF selection, reasoning paths, SFT data"
$MEMREADER gen --config configs/demo/gen.yaml --set run="$RUN" --set teacher="$TEACHER" --set model="$TEACHER_MODEL"

step "2/7 LoRA SFT with TRL on the teacher's data ($TRAIN_STEPS steps)"
$MEMREADER train --config configs/demo/train.yaml --set run="$RUN" --set max_steps="$TRAIN_STEPS" \
  --set train_file="$R/gen/sft_train.jsonl" --set val_file="$R/gen/sft_val.jsonl"

step "3/7 MemReader reads the corpus with the new adapter (and SmolLM2's cut head: its breaks in every grammar)"
rm -f "$R/read/memories.jsonl"  # memories of an earlier run were read with an earlier adapter
$MEMREADER read --config configs/demo/read.yaml --set run="$RUN" --set adapter="$R/train" \
    --set cut_head=memreader/demo_data/cut_head

step "4/7 three-layer Milvus Lite index, one question over the layers, the same with MeVe"
$MEMREADER index --config configs/demo/retrieval.yaml --set run="$RUN"
$MEMREADER ask --config configs/demo/retrieval.yaml --set run="$RUN" --html "$R/view/layers.html" "$QUESTION"
$MEMREADER ask --config configs/demo/retrieval.yaml --set run="$RUN" --pipeline meve --json \
  --html "$R/view/meve.html" "$QUESTION" > "$R/retrieval/meve_answer.json"
$MEMREADER ask --config configs/demo/retrieval.yaml --set run="$RUN" --pipeline meve "$QUESTION"

step "5/7 QA evaluation: MemReader memories vs chunkers calibrated to the same chunk length"
$MEMREADER eval --config configs/demo/eval.yaml --set run="$RUN" --set memories="$R/read/memories.jsonl" \
  --set report=false

step "6/7 report (Markdown with plots, report.html) and the viewer pages of the run's memories and candidates"
$MEMREADER report "$RUN"
$MEMREADER view "$R/read/memories.jsonl" --out "$R/view/memories.html"
$MEMREADER view "$R/gen/memories.jsonl" --candidates "$R/gen/candidates.jsonl" --out "$R/view/candidates.html"

step "7/7 checks of the whole run"
$MEMREADER demo --check-only --run "$RUN"
echo "runcpu: all stages finished in $(( $(date +%s) - start )) s → $R"
