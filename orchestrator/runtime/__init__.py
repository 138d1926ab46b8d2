"""Internal: the life of one session's sandbox: start, restore, recovery, takeover, host calls, output.

Builds on state, wire, backends and the agent's shared modules; the api layer drives it.
"""
