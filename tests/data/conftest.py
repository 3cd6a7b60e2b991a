"""Fixtures for the dataset tests: a machine without network, and a local HTTP server.

No test touches the real mirrors: `urllib.request.urlopen` is replaced, or the mirrors
are pointed at a server on 127.0.0.1 serving files the test wrote.
"""

import functools
import http.server
import threading
import urllib.error
import urllib.request

import pytest


@pytest.fixture
def offline(monkeypatch):
    """Every download fails as on a machine without network; returns the URLs requested."""
    requested = []

    def urlopen(url, timeout=None):
        requested.append(url)
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return requested


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def http_folder(tmp_path_factory, monkeypatch):
    """(folder, base URL): files written into `folder` are served at base URL + name by an HTTP
    server on 127.0.0.1 (a missing file answers 404), through the real urllib."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path_factory.mktemp("served")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
