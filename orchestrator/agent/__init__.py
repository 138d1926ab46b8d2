"""The in-container agent (supervisor + worker) and the wire protocol it shares with the controller.

Everything in this package uses the standard library only, except the worker, which also
needs dill. Images get a copy of this directory as the package ``orchestrator_agent``.
"""
