"""``memreader ingest``: files of every common format into a reading corpus, with pages and headings."""
