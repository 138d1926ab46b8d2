"""Internal: operations over the sessions of a store: capacity, pool, prune, janitor, lifecycle, images, survey.

Builds on runtime, state, wire and backends; the api layer and the CLI call it.
"""
