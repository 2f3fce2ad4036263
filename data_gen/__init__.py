"""``memreader.data_gen`` (the ``data_gen/`` folder): the teacher side, training data for MemReader.

- ``memreader gen`` (pipeline): outline, candidate memories, evaluator scores, RRF selection (selection), reverse
  CoM, SFT records (sft_export); one document's way through it (teacher_flow), the requests kept in flight (flow),
  documents or windows as units (units), every reply and score cached (cache, cached_teacher);
- ``memreader assess`` (assess): the evaluator's scores of any memories file;
- ``memreader structure-data`` (structure_data): documents with gold structure (structure_sources) and the
  memories that structure implies (structure_teacher).
"""
