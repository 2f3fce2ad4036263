"""``memreader.ingest`` (the ``ingest/`` folder): ``memreader ingest`` (ingest), files of every common format into a
reading corpus with pages and headings; the text and structure of one file: formats."""
