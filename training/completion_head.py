"""The LM head on the completion's positions only, where TRL's fused head would score every position (CPU).

TRL's ``SFTTrainer`` patches the model's forward with a fused LM head (``trl.trainer.utils.add_fused_lm_head``) and
calls it with ``fused_lm_head=True``. On devices with its Triton kernel (CUDA, XPU) that head projects only the
positions whose label is not ``-100``; elsewhere it projects *every* position, prompt included, and folds each
``[tokens, 32768]`` tile through a dozen fp32 passes (log-sum-exp, entropy, a top-1 mask). A MemReader record is ~65 %
prompt, so on a CPU that head was about a quarter of a training step (docs/BENCHMARKS.md "Training speed on the CPU").

:func:`score_completion_only` wraps that patched forward: on a device without the kernel it runs the backbone, projects
only the hidden states whose next token is a label and takes their log-softmax in one go; the loss, the per-token
log-probabilities (and so their gradients), the entropy and top-1 metrics are TRL's to rounding (tests). On a
Triton device, for shifted labels (context parallelism), MoE auxiliary losses and models whose logits are scaled or
soft-capped, it hands the call to TRL's forward unchanged. The logits of the completion are materialized
(``completion tokens x vocabulary`` fp32: ~60 MB for a 300-token completion of SmolLM2).
"""

from __future__ import annotations

import functools
import types
from typing import Any

TRITON_DEVICES = ("cuda", "xpu")
_SCALING_KEYS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                 "logits_scaling")


def score_completion_only(model: Any) -> bool:
    """Wrap the fused forward TRL put on ``model`` (a PEFT model or the bare one) so that, off Triton devices, only
    the completion's positions reach the LM head. Returns False (and changes nothing) for models whose logits are
    scaled or soft-capped, or that route experts: TRL's head handles those."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    text_config = base.config.get_text_config()
    if any(getattr(text_config, key, None) is not None for key in _SCALING_KEYS) \
            or getattr(text_config, "output_router_logits", False):
        return False
    trl_forward = base.forward  # TRL's fused forward, bound to ``base``

    @functools.wraps(type(base).forward)
    def forward(self: Any, *args: Any, fused_lm_head: bool = False, labels: Any = None, shift_labels: Any = None,
                num_items_in_batch: Any = None, **kwargs: Any) -> Any:
        head = self.get_output_embeddings()
        if not fused_lm_head or shift_labels is not None or head.weight.device.type in TRITON_DEVICES:
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state[:, :-1]
        return completion_log_probs(hidden, labels[:, 1:].to(hidden.device), head, num_items_in_batch)

    base.forward = types.MethodType(forward, base)
    return True


def completion_log_probs(hidden: Any, labels: Any, head: Any, num_items_in_batch: Any = None) -> Any:
    """TRL's ``FusedCausalLMOutput`` for next-token ``labels`` (``-100`` ignored) of ``hidden`` ``[batch, seq, H]``,
    with ``head`` applied to the labelled positions only."""
    import torch
    from trl.trainer.utils import FusedCausalLMOutput

    mask = labels != -100
    targets = labels[mask]
    logits = head(hidden[mask]).float()  # [labelled positions, vocabulary]
    log_z = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = log_z - (probs * logits).sum(-1)
        is_top1 = logits.argmax(-1) == targets

    def spread(values: Any) -> Any:  # back to [batch, seq], zero where ignored; keeps the graph for an empty mask
        return values.new_zeros(mask.shape).masked_scatter(mask, values)

    log_probs = spread(picked)
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(loss=-log_probs.sum() / count, log_probs=log_probs, entropy=spread(entropy),
                               is_top1=spread(is_top1), label_mask=mask)
