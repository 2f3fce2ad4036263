"""Training stage: LoRA SFT of MemReader with TRL + PEFT (:mod:`training.sft`), data pre-flight checks
(:mod:`training.preflight`) and adapter merging (:mod:`training.merge`).

Submodules import torch / transformers lazily, so ``import training`` stays cheap.
"""
