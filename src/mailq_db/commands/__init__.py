"""One module per ``mailq-db`` command; each exposes ``register(subparsers)``."""

from __future__ import annotations

import signal
import threading
from socketserver import BaseServer


def serve_until_stopped(server: BaseServer) -> None:
    """Block while ``server`` serves on its own thread, until SIGTERM or Ctrl-C;
    then stop it and close its socket (the long-running HTTP commands)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
