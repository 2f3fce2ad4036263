"""A LoRA adapter that visibly changes SmolLM2, for the tests of serving and applying adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def random_lora_adapter(base: str, folder: Path) -> tuple[str, Any]:
    """A LoRA adapter of the CPU smoke recipe's shape (r=8, alpha 16, every linear layer) on the model folder
    ``base``, with random A and B, saved in ``folder``: ``(the folder, the PEFT model it was saved from, in eval
    mode)``. Random B, because a few smoke training steps barely move B away from zero, and a test that the adapter
    is applied could not fail on it; the PEFT model gives reference logits without a second load of the base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    peft.save_pretrained(folder)
    return str(folder), peft.eval()
