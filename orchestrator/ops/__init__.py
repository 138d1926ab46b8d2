"""Internal: operations over the sessions of a store: capacity, pool, hibernation, prune, janitor, images, survey.

Builds on runtime, state, wire and backends; the api layer and the CLI call it.
"""
