"""The collector's persistence and reads: the SQLite store, its schema and ingest, the query
layer, the spool import and the sources the CLI reads runs from."""
