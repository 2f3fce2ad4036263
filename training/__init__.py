"""Training stage: LoRA SFT of MemReader with TRL + PEFT (:mod:`memreader.training.sft`), data pre-flight checks
(:mod:`memreader.training.preflight`) and adapter merging (:mod:`memreader.training.merge`).

Submodules import torch / transformers lazily, so ``import training`` stays cheap.
"""
