"""A delegated mailbox's refresh token: where it is read, and where a rotated one is stored.

Identity platforms may answer a refresh grant with a new refresh token (Entra
ID does so on every use, RFC 6749 6 allows it for any).  :class:`StoredRefreshToken`
keeps the rule in one place for the MSAL and google-auth providers:

* The token is read from its source at every fetch, so a refresh token the
  operator stores after signing the mailbox in again is used without a restart.
* A rotated token is written back to its file (:func:`write_back`): a new file
  of mode 0600 and the old file's owner in the same directory, flushed to
  disk, then renamed over the old one (the path's symbolic links are
  followed, so the link stays).  The next fetch reads it back from the file.
* When it cannot be stored (an environment variable, a read-only directory),
  the rotated token is kept in memory and used for as long as the source still
  holds what it held then; a different token in the source wins.

Callers hold the token cache's per-account lock, so one fetch at a time
uses a :class:`StoredRefreshToken`.  Nothing here logs a token.
"""

from __future__ import annotations

import logging
import os
import tempfile

from .settings import Secret

log = logging.getLogger("mailq_db.worker.oauth")


class StoredRefreshToken:
    """The refresh token to redeem next (see the module docstring)."""

    def __init__(self, source: Secret):
        self.source = source
        self._kept: str | None = None  # a rotated token that could not be stored
        self._kept_over: str | None = None  # what the source held when it was kept
        self._read: str | None = None  # what the source held at the last current()
        self._told = False

    def current(self) -> str:
        stored = self.source.read()
        self._read = stored
        if self._kept is not None and stored == self._kept_over:
            return self._kept
        self._kept = self._kept_over = None
        return stored

    def rotated(self, used: str, new: str | None) -> None:
        """Record the refresh token the platform returned after ``used`` was redeemed."""
        if not new or new == used:
            return
        if self.source.file is not None and write_back(self.source.file, new):
            self._kept = self._kept_over = None
            return
        if self.source.file is None and not self._told:
            self._told = True
            log.info("the refresh token was rotated; the new one is kept in memory (the environment "
                     "variable %s cannot be updated)", self.source.env)
        self._kept, self._kept_over = new, self._read


def write_back(path: str, token: str) -> bool:
    """Replace the file at ``path`` (its symbolic links followed) by one holding ``token``,
    mode 0600 and the old file's owner, atomically and durably; False (logged) when it cannot
    be done.  A user other than the file's owner (and not root) does not replace it: the new
    file would be its own, mode 0600, and the owner (the worker) could no longer read it;
    this happens when ``check-config --probe`` runs as another user."""
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    try:
        old = os.stat(target)
    except OSError:
        old = None
    if old is not None and euid not in (None, 0, old.st_uid):
        log.warning("the refresh token was rotated but %s belongs to another user (uid %d) and is not rewritten "
                    "by this one (uid %d); the new one is kept in memory until this process stops",
                    path, old.st_uid, euid)
        return False
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".refresh-", dir=directory)  # mode 0600
        if old is not None and euid == 0 and (old.st_uid, old.st_gid) != (0, 0):
            os.fchown(fd, old.st_uid, old.st_gid)  # root (a probe) keeps the worker's file the worker's
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        tmp = None
        _sync_directory(directory)
    except OSError as exc:
        log.warning("the refresh token was rotated but %s could not be rewritten (%s); the new one is kept in "
                    "memory until the worker stops", path, exc.strerror or type(exc).__name__)
        return False
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    log.info("the refresh token was rotated and written back to %s", path)
    return True


def _sync_directory(directory: str) -> None:
    """Make the rename durable (best effort: not every file system lets a directory be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
