"""``memreader.core`` (the ``core/`` folder): the services every stage shares; it imports nothing of the stages or the
top layer (scripts/check_layers.py). Its modules by concern (records, guided reading, models and engines, scores, a
run's plumbing): the ``core/`` row of docs/ARCHITECTURE.md.
"""
