"""The entry point of the Python API: creates, attaches and lists sessions on one Docker engine."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Mapping

from . import images
from .backend import LABEL_PREFIX, DockerBackend
from .config import Settings
from .errors import ConfigError, ImageMissing, OrchestratorError
from .session import Session, SessionState
from .store import SessionRecord, SessionStore, validate_session_id

logger = logging.getLogger(__name__)


class Orchestrator:
    """Runs one long-lived sandbox container per persistent session.

    Closing the orchestrator (or leaving its ``with`` block) closes every session it still
    holds; ``Session.detach()`` keeps a session's container and checkpoint for a later
    ``attach`` instead.
    """

    def __init__(self, settings: Settings | None = None, *, backend: DockerBackend | None = None) -> None:
        """Connect to the local engine (DOCKER_HOST) with ``settings`` (default: ``Settings.from_env()``).

        Raises:
            EngineUnavailable: no Docker engine answers; the message says how to start one.
        """
        self.settings = settings or Settings.from_env()
        self._owns_backend = backend is None
        self.backend = backend or DockerBackend()
        self.store = SessionStore(self.settings.state_dir, fsync=self.settings.fsync)
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @property
    def default_image(self) -> str:
        """The image sessions use unless told otherwise."""
        return self.settings.image or images.image_tag(self.settings.base_image)

    def build_image(self, *, rebuild: bool = False) -> str:
        """Build (or reuse) the default sandbox image on ``settings.base_image``; return its tag."""
        return images.build_image(self.backend, self.settings.base_image, rebuild=rebuild)

    def create_session(
        self,
        *,
        session_id: str | None = None,
        image: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Session:
        """Start a new session in its own container.

        Args:
            session_id: an id of your choosing (3-63 lowercase letters, digits, dashes).
            image: an image with the agent in it (default: ``default_image``).
            labels: extra container labels; keys must start with ``orchestrator.``.

        Raises:
            ConfigError: the id is invalid or taken, or a label is outside our namespace.
            ImageMissing: the image is not built; the message says how to build it.
            EngineError: the engine refused to start the container.
            AgentStartTimeout: the container started but its agent never connected.
        """
        session_id = validate_session_id(session_id) if session_id else f"s{secrets.token_hex(6)}"
        if self.store.exists(session_id):
            raise ConfigError(f"session {session_id!r} already exists; use Orchestrator.attach to reuse it")
        for key in labels or {}:
            if not key.startswith(LABEL_PREFIX) or key.count(".") < 2:
                raise ConfigError(f"label {key!r} must be namespaced like 'orchestrator.<you>.<name>'")
        image = image or self.default_image
        if not self.backend.image_exists(image):
            raise ImageMissing(
                f"sandbox image {image!r} does not exist; build it with `orchestrator image build`"
                + (f" (base image {self.settings.base_image})" if image == self.default_image else "")
            )
        now = time.time()
        record = SessionRecord(
            session_id=session_id, image=image, created_at=now, last_used_at=now, labels=dict(labels or {})
        )
        self.store.create(record)
        session = self._track(
            Session(record, store=self.store, backend=self.backend, settings=self.settings, on_close=self._forget)
        )
        try:
            session.start()
        except BaseException:
            session.close()
            raise
        logger.info("created session %s on %s", session_id, image)
        return session

    def attach(self, session_id: str) -> Session:
        """Take over an existing session: its running container if there is one, else its checkpoint.

        Raises:
            SessionNotFound: no session with that id was stored.
        """
        record = self.store.load(session_id)
        session = Session(record, store=self.store, backend=self.backend, settings=self.settings, on_close=self._forget)
        running = [c for c in self.backend.find(session_id) if c.running]
        try:
            if running:
                session.reattach(running[0])
            else:
                session.start()
        except OrchestratorError as exc:
            if not running:
                raise
            logger.warning(
                "session %s: reattaching to %s failed (%s); starting a new container", session_id, running[0].name, exc
            )
            self.backend.remove(running[0].id)
            session.start()
        return self._track(session)

    def _track(self, session: Session) -> Session:
        with self._lock:
            self._sessions[session.id] = session
        return session

    def _forget(self, session: Session) -> None:
        with self._lock:
            if self._sessions.get(session.id) is session:
                del self._sessions[session.id]

    def sessions(self) -> list[str]:
        """Ids of every stored session (this controller's or not)."""
        return list(self.store.ids())

    def close(self) -> None:
        """Close the sessions this orchestrator still holds (detached ones are left alone), then the engine client."""
        with self._lock:
            held = list(self._sessions.values())
        try:
            for session in held:
                if session.state is SessionState.READY:
                    session.close()
                else:
                    self._forget(session)
        finally:
            if self._owns_backend:
                self.backend.close()

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
