"""One module per ``mailq-db`` command; each exposes ``register(subparsers)``."""

from __future__ import annotations

import signal
import threading
from socketserver import BaseServer


def serve_until_stopped(server: BaseServer, thread_name: str | None = None) -> None:
    """Block while ``server`` serves on its own thread (started here as
    ``thread_name`` when given), until SIGTERM or Ctrl-C; then stop it and close
    its socket (the long-running HTTP commands)."""
    if thread_name is not None:
        threading.Thread(target=server.serve_forever, name=thread_name, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
