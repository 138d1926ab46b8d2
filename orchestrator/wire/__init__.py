"""Internal: how the controller talks to one agent: its endpoint, the framed channel, the handshake, typed replies.

Builds on the agent's wire format (``agent/protocol.py``) alone; everything that reaches an agent goes through here.
"""
