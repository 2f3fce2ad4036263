#!/usr/bin/env bash
# GPU reference check. Run from anywhere on a machine with one CUDA GPU and a python3 that has torch,
# transformers, peft and accelerate; the repository does NOT need to be pip-installed.
#
#   bash scripts/gpu_check.sh                       # the reference configuration
#   bash scripts/gpu_check.sh --no-compile-layers --batch-size 16 --gradient-checkpointing full
#                                                   # extra args go to scripts/gpu_sft_mfu.py
#
# Steps, each of which must succeed (the script stops at the first failure with a non-zero status):
#   1. install carried wheels from .whl/ (trl, datasets, ... for machines without a registry) into /tmp/site
#   2. nvidia-smi
#   3. import check: torch sees the GPU; trl/peft/transformers and the repo's memreader package import
#   4. scripts/gpu_sft_mfu.py: bf16 matmul peak + LoRA SFT of a Qwen2.5-1.5B-shaped model -> tokens/s, MFU
#      (--shape 3b / 7b for the larger recipes)
#   5. scripts/bench_scoring.py --device cuda in float32 and bfloat16 (evaluator scorer throughput vs a naive
#      loop, FLOP share of the measured peak); with .gpu/evaluator the evaluator has random weights:
#        mkdir -p .gpu/evaluator && echo /.gpu/ >> .git/info/exclude
#        cp $MEMREADER_HOME/models/smollm2-135m-instruct/{config.json,tokenizer*.json,chat_template.jinja} .gpu/evaluator/
#        mkdir -p .gpu/datasets && cp ../shared/datasets/{crud_event_summary.jsonl,hotpotqa_100_corpus.json} .gpu/datasets/
#      (then name .gpu in the device call's carry)
#   SCORER_ONLY=1 skips step 4.
# Results: $OUT/gpu_sft_mfu.json, $OUT/scoring_*.json and $OUT/gpu_check.log ($OUT defaults to artifacts/gpu_check).
#
# Wheels for .whl/ (on a machine with pip access, in the repo root; .whl/ is git-ignored locally):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 rapidfuzz==3.14.6
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-artifacts/gpu_check}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

step() { echo; echo "=== $* ===" | tee -a "$LOG"; }

# 1. carried wheels (no registry on the GPU machine)
if compgen -G ".whl/*.whl" > /dev/null; then
  step "1. install carried wheels: $(cd .whl && ls *.whl | tr '\n' ' ')"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  step "1. no .whl/ folder: using the installed packages"
fi
# the repo is not pip-installed: build the installed layout (pyproject.toml's package-dir: memreader/ is `memreader`,
# core/ is `memreader.core`, each stage folder `memreader.<stage>`) from symlinks, and put it on the path
NS=${TMPDIR:-/tmp}/memreader-ns
rm -rf "$NS" && mkdir -p "$NS/memreader"
ln -s "$PWD"/memreader/* "$NS/memreader/"
for layer in core ingest data_gen training inference retrieval eval; do ln -s "$PWD/$layer" "$NS/memreader/$layer"; done
export PYTHONPATH="$NS${PYTHONPATH:+:$PYTHONPATH}"

# 2. the card as we find it
step "2. nvidia-smi"
nvidia-smi 2>&1 | tee -a "$LOG"

# 3. imports
step "3. import check"
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import torch, transformers, trl, peft, accelerate, datasets
import memreader
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"torch {torch.__version__} (cuda {torch.version.cuda}) on {torch.cuda.get_device_name(0)}; "
      f"transformers {transformers.__version__}, trl {trl.__version__}, peft {peft.__version__}, "
      f"accelerate {accelerate.__version__}, datasets {datasets.__version__}, memreader {memreader.__version__}")
EOF

# 4. LoRA SFT throughput and MFU
if [ -z "${SCORER_ONLY:-}" ]; then
  step "4. LoRA SFT MFU (scripts/gpu_sft_mfu.py $*)"
  "$PY" scripts/gpu_sft_mfu.py --out "$OUT/gpu_sft_mfu.json" "$@" 2>&1 | tee -a "$LOG"
fi

# 5. scorer throughput (optional script)
if [ -f scripts/bench_scoring.py ]; then
  step "5. scorer throughput (scripts/bench_scoring.py)"
  # The GPU machine has no model hub and the evaluator's weights (540 MB) exceed what a call carries:
  # with .gpu/evaluator (config + tokenizer of the evaluator, copied here beforehand, see the header)
  # the scorer runs the real architecture with random weights (same speed; the AUCs are skipped).
  EVAL_ARGS=()
  if [ -d .gpu/evaluator ]; then EVAL_ARGS=(--model .gpu/evaluator --random-init); fi
  # ../shared beside the checkout does not travel to a lent machine: a copy in .gpu/datasets does
  if [ -d .gpu/datasets ]; then EVAL_ARGS+=(--datasets .gpu/datasets); fi
  "$PY" scripts/bench_scoring.py --device cuda --dtype float32 "${EVAL_ARGS[@]}" --out "$OUT/scoring_fp32.json" 2>&1 | tee -a "$LOG"
  "$PY" scripts/bench_scoring.py --device cuda --dtype bfloat16 "${EVAL_ARGS[@]}" --out "$OUT/scoring_bf16.json" 2>&1 | tee -a "$LOG"
else
  step "5. scripts/bench_scoring.py not present: skipped"
fi

step "gpu_check: all steps passed"
grep '^SUMMARY' "$LOG" || true
