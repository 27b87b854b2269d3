"""A stand-in HTTP server on loopback for unit tests: one request handler class served from a
thread on a free port, shut down and joined on the way out, whatever the test did."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on ``127.0.0.1`` at a free port; yields ``http://127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # A handler still answering (a slow stand-in) must not hold the test's teardown.
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="test-loopback", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
