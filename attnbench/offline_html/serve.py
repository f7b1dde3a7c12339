"""Serve a published site over HTTP on 127.0.0.1.

``file://`` would need chromium's ``--allow-file-access-from-files``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(SimpleHTTPRequestHandler):
    """Records ``(method, path, status)`` in ``server.requests`` instead of logging to stderr."""

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        self.server.requests.append((self.command, self.path, getattr(self, "_status", None)))

    def send_response(self, code, message=None):
        self._status = code
        super().send_response(code, message)

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a browser dropping a load is no error
            super().handle_error(request, client_address)


def serve(html_dir: str | os.PathLike, port: int = 0, *, handler=None) -> ThreadingHTTPServer:
    """Start serving ``html_dir`` on 127.0.0.1:``port`` (0: any free port) in a daemon thread.

    Stop with ``server.shutdown(); server.server_close()``.
    """
    handler = handler or QuietHandler
    server = _Server(("127.0.0.1", port), functools.partial(handler, directory=str(html_dir)))
    server.requests = []
    threading.Thread(target=server.serve_forever, name=f"serve {html_dir}", daemon=True).start()
    return server
