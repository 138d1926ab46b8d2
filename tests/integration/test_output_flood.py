"""A cell that floods its call link with tiny output frames is stopped after ``OUTPUT_FRAMES_PER_CELL`` of them, not
read for its whole timeout (issue 34, hole 5; wire/host_link.py ``OutputBudget``).

The attacker writes forged ``output`` frames of one byte straight on its worker's call link, as fast as it can, and
catches nothing. What is observed: the controller delivered at most the budget and the marker, and the cell was
stopped by it (the marker says so), never time; the session goes on.
"""

from __future__ import annotations

import pytest

from orchestrator import ExecutionTimeout, Session
from orchestrator.api.events import OutputEvent
from orchestrator.wire.host_link import OUTPUT_FRAMES_PER_CELL

pytestmark = pytest.mark.docker

FLOOD = """\
import gc, json
from orchestrator_agent import framing
worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')
head = json.dumps({'type': 'output', 'stream': 'stdout'}).encode()
frame = framing.PREFIX.pack(framing.MAGIC, len(head), 1) + head + b'.'
batch = frame * 4096
while True:
    worker.calls._sock.sendall(batch)
"""


def test_a_cell_flooding_tiny_output_frames_is_stopped_at_its_frame_budget(session: Session) -> None:
    delivered = {"stdout": 0, "stderr": ""}

    def streamed(event: object) -> None:
        if isinstance(event, OutputEvent) and event.stream == "stdout":
            delivered["stdout"] += len(event.text)
        elif isinstance(event, OutputEvent):
            delivered["stderr"] += event.text

    with pytest.raises(ExecutionTimeout):  # stopped as its timeout stops it, long before it
        session.execute(FLOOD, timeout=600, on_output=streamed)
    assert "output stopped" in delivered["stderr"], delivered
    assert delivered["stdout"] <= OUTPUT_FRAMES_PER_CELL
    assert session.execute("1 + 1").return_value == "2"
