"""How a value the caller gives (``set_value``, ``add_context``, ``add_history``) travels: its kind and raw bytes.

The host never pickles: a str or bytes goes as its bytes (the controller makes its checkpoint
blob itself, ``blob_format.host_blob_parts``), a dict or list as JSON that the agent loads.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ConfigError


def encode_payload(payload: Any) -> tuple[str, bytes]:
    """(kind, raw bytes) of a payload: ``"str"``, ``"bytes"`` or ``"json"``.

    Raises:
        ConfigError: not a str, bytes, dict or list, or a dict or list that is not JSON-serializable.
    """
    if isinstance(payload, str):
        return "str", payload.encode("utf-8", errors="surrogatepass")
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return "bytes", bytes(payload)
    if isinstance(payload, (dict, list)):
        try:
            return "json", json.dumps(payload).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"a dict or list payload must be JSON-serializable: {exc}") from exc
    raise ConfigError(f"payload must be str, bytes, dict or list, not {type(payload).__name__}")
