"""``memreader.core`` (the ``core/`` folder): the services every stage shares; it imports nothing of the stages or the
top layer (scripts/check_layers.py).

- memory records and their text form: schema, markup, parser, aligner, assemble, structure, corpus;
- guided reading: memory_grammar, guidance, windowing, prompts (+ templates/), language, generation/ (the chat
  backends: transformers, OpenAI-compatible, vLLM);
- models and engines: registry, runtime, hardware, engines, vllm_engine, lora, kv_budget, embedders;
- scores: scoring and scoring_engines (the evaluator), fusion (RRF), boundaries (predicted vs gold cuts), the cut
  head (cut_features, cut_head);
- a run's plumbing: config, stage, paths, runlock, errors, html_page.

docs/ARCHITECTURE.md says where each concept lives.
"""
