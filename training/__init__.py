"""``memreader.training`` (the ``training/`` folder): LoRA SFT of MemReader with TRL + PEFT (``memreader train``:
:mod:`~memreader.training.sft`, its settings: :mod:`~memreader.training.config`), data pre-flight checks
(:mod:`~memreader.training.preflight`), adapter merging (``memreader merge``: :mod:`~memreader.training.merge`) and
the cut head's fit (:mod:`~memreader.training.cut_fit`).

Submodules import torch / transformers lazily, so ``import memreader.training`` stays cheap.
"""
