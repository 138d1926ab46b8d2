"""The state dir's base (``Settings.state_dir``): private to the controller's user, or refused.

The store's own directories and files are 0700 and 0600, but whoever owns or can write the base
can replace them (a ``sessions/`` of their own, a symlink), and a base open to others shows them
every session's id. So the base is made 0700 with its missing parents, and one that exists must be
a real directory of this process's effective uid without group or other bits: the same rule as
the runtime dir's (``rendezvous.ensure_private_dir``). A base that earlier versions made 0755 (ours,
holding a store id) is closed to 0700 instead of refused; any other is left as it is and refused,
with what to do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..agent import rendezvous
from ..errors import ConfigError

SETTING = "Settings.state_dir (ORCH_STATE_DIR)"
STORE_ID_FILE = "store-id"


def ensure_state_dir(base: Path) -> Path:
    """Create ``base`` 0700 (and its missing parents), or check the existing one; return it.

    Raises:
        ConfigError: it is a symbolic link, not a directory, another user's, open to group or others (and not a
            state dir of ours), or cannot be created; the message names it and what to do.
    """
    try:
        _close_our_old_base(base)
        return rendezvous.ensure_private_dir(base, SETTING)
    except rendezvous.RendezvousError as exc:
        raise ConfigError(f"the state directory is not private: {exc}") from None


def _close_our_old_base(base: Path) -> None:
    """Take the group and other bits off a state dir of ours that earlier versions made 0755."""
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # missing (made next), a link or not a directory: ensure_private_dir says why
    try:
        info = os.fstat(fd)
        ours = info.st_uid == os.geteuid() and os.path.isfile(base / STORE_ID_FILE)
        if ours and stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
    except OSError:
        pass  # left as it is: ensure_private_dir says why it cannot be used
    finally:
        os.close(fd)
