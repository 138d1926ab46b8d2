"""The public API: ``Orchestrator``, ``Session``, ``Context``, results, live events, ``PythonTool``; their async twins.

Import them from ``orchestrator`` (and ``orchestrator.aio``), which re-export them. Builds on every internal layer
(runtime, ops, state, wire, backends); docs/architecture.md draws them.
"""
