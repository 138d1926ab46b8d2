"""Internal: where sandboxes run: the ``Backend`` protocol (``base``), the local engine (``docker``) and ``swarm``.

The only layer that imports ``docker``; it builds on wire (the endpoint a backend hands out).
"""
