"""rlms on orchestrator sessions: a drop-in DockerREPL, RLM(environment="docker", persistent=True) and RLMSession.

Only this subpackage imports rlms (import name ``rlm``); ``import orchestrator`` does not.
Without rlms installed, importing it raises an ImportError that says what to install.
See docs/rlm.md.
"""

from __future__ import annotations

from .chat import RLMSession
from .environment import DockerREPL
from .outcome import DockerREPLResult
from .rlm import RLM
from .routing import register, registered, unregister

__all__ = ["RLM", "DockerREPL", "DockerREPLResult", "RLMSession", "register", "registered", "unregister"]
