"""Internal: what is durable on the host: session records and blobs, the checkpoint ledger, activity files.

Builds on wire (the replies it stores) and backends (the labels of a controller's containers).
"""
