"""``memreader.inference`` (the ``inference/`` folder): reading documents into memories with a MemReader model.

- ``memreader read`` (reader; the documents in flight: reading);
- ``memreader read-dist`` (distributed): a corpus in shards (shards) read by workers (workers) on Ray (ray_engine) or
  data-parallel vLLM processes (dp_engine, dp_worker);
- ``memreader serve`` (server): an OpenAI-compatible chat server around one local model.
"""
