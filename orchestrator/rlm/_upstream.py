"""The one module that imports rlms (import name ``rlm``); typed stand-ins of its parts for mypy.

rlms ships no type information, so for the type checker this module declares the few
classes and functions we use, as rlms 0.1.3 defines them; at run time they are rlms' own.
Without rlms installed, importing it raises an ImportError that says how to install it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..extras import install_line

INSTALL_HINT = f"install it with `pip install -e '.[rlm]'` in a checkout, or `{install_line('rlm')}`"


def load(name: str) -> ModuleType:
    """Import an rlms module, or explain what to install.

    Raises:
        ImportError: rlms (or one of its own dependencies) is missing.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == "rlm" or (exc.name or "").startswith("rlm."):
            raise ImportError(f"orchestrator.rlm needs the rlms package (import name `rlm`); {INSTALL_HINT}") from exc
        raise ImportError(f"rlms is installed but could not be imported ({exc}); {INSTALL_HINT}") from exc


if TYPE_CHECKING:

    class UsageSummary:
        model_usage_summaries: dict[str, Any]

        def __init__(self, model_usage_summaries: dict[str, Any]) -> None: ...

    class RLMChatCompletion:
        root_model: str
        prompt: str | dict[str, Any]
        response: str
        usage_summary: UsageSummary
        execution_time: float
        metadata: dict[str, Any] | None
        error: str | None

        def __init__(
            self,
            root_model: str,
            prompt: Any,
            response: str,
            usage_summary: UsageSummary,
            execution_time: float,
            metadata: dict[str, Any] | None = None,
            error: str | None = None,
        ) -> None: ...

    class REPLResult:
        stdout: str
        stderr: str
        locals: dict[str, Any]
        execution_time: float | None
        rlm_calls: list[RLMChatCompletion]
        final_answer: str | None

        def __init__(
            self,
            stdout: str,
            stderr: str,
            locals: dict[str, Any],
            execution_time: float | None = None,
            rlm_calls: list[RLMChatCompletion] | None = None,
            final_answer: str | None = None,
        ) -> None: ...

    class LMRequest:
        def __init__(
            self,
            prompt: Any = None,
            prompts: list[Any] | None = None,
            model: str | None = None,
            depth: int = 0,
        ) -> None: ...

    class LMResponse:
        error: str | None
        chat_completion: RLMChatCompletion | None

        @property
        def success(self) -> bool: ...

    def send_lm_request(
        address: tuple[str, int], request: LMRequest, timeout: int = 300, depth: int | None = None
    ) -> LMResponse: ...

    def send_lm_request_batched(
        address: tuple[str, int], prompts: list[Any], model: str | None = None, timeout: int = 300, depth: int = 0
    ) -> list[LMResponse]: ...

    class NonIsolatedEnv:
        persistent: bool
        depth: int
        max_concurrent_subcalls: int
        kwargs: dict[str, Any]

        def __init__(self, persistent: bool = False, **kwargs: Any) -> None: ...

    def validate_custom_tools(custom_tools: Mapping[str, Any] | None) -> None: ...

    def extract_tool_value(entry: Any) -> Any: ...

    class RLM:
        environment_type: str
        environment_kwargs: dict[str, Any]
        persistent: bool
        depth: int
        _persistent_env: Any

        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
        def completion(self, prompt: str | dict[str, Any], root_prompt: str | None = None) -> RLMChatCompletion: ...
        def close(self) -> None: ...
        def __enter__(self) -> RLM: ...
        def __exit__(self, *exc_info: object) -> bool: ...
        def _spawn_completion_context(
            self, prompt: str | dict[str, Any]
        ) -> AbstractContextManager[tuple[Any, Any]]: ...
        def _setup_prompt(
            self, prompt: str | dict[str, Any], root_prompt: str | None = None
        ) -> list[dict[str, Any]]: ...

else:
    _types = load("rlm.core.types")
    UsageSummary = _types.UsageSummary
    RLMChatCompletion = _types.RLMChatCompletion
    REPLResult = _types.REPLResult

    _comms = load("rlm.core.comms_utils")
    LMRequest = _comms.LMRequest
    LMResponse = _comms.LMResponse
    send_lm_request = _comms.send_lm_request
    send_lm_request_batched = _comms.send_lm_request_batched

    _base_env = load("rlm.environments.base_env")
    NonIsolatedEnv = _base_env.NonIsolatedEnv
    validate_custom_tools = _base_env.validate_custom_tools
    extract_tool_value = _base_env.extract_tool_value

    RLM = load("rlm.core.rlm").RLM


def rlm_core_module() -> ModuleType:
    """``rlm.core.rlm``, where ``RLM`` looks up ``get_environment``."""
    return load("rlm.core.rlm")


def docker_repl_module() -> ModuleType:
    """``rlm.environments.docker_repl``, home of the peer's ``DockerREPL``."""
    return load("rlm.environments.docker_repl")
