"""A real S3 endpoint for tests and bench/bench_s3.py: moto's server on 127.0.0.1, with every HTTP
request counted (and optionally held) by a WSGI wrapper around moto's own application.

Nothing of checkpoint-strategy is mocked: the code under test talks HTTP to this server through
s3fs/botocore exactly as it would to S3.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter
from pathlib import Path

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SESSION_TOKEN": "testing",
}


logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CountingMotoServer(ThreadedMotoServer):
    """ThreadedMotoServer whose WSGI app counts requests by (method, kind). ``hold(pred)`` makes a
    request matching pred(method, path, query) wait after moto has handled it (the object is
    stored), until ``release()``; ``held`` is set when one is waiting."""

    def __init__(self, port: int) -> None:
        super().__init__("127.0.0.1", port, verbose=False)
        self.counts: Counter = Counter()
        self.lock = threading.Lock()
        self._hold = None
        self.held = threading.Event()
        self._release = threading.Event()

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)

        def counting(environ, start_response):
            method = environ.get("REQUEST_METHOD", "")
            path = environ.get("PATH_INFO", "")
            query = environ.get("QUERY_STRING", "")
            kind = (
                "list"
                if method == "GET"
                and ("list-type" in query or path.count("/") <= 1 and "prefix" in query)
                else "range"
                if environ.get("HTTP_RANGE")
                else method.lower()
            )
            with self.lock:
                self.counts[kind] += 1
                self.counts["total"] += 1  # requests (bytes_out: response bytes of ranged GETs)
            result = list(app(environ, start_response))
            if kind == "range":
                with self.lock:
                    self.counts["bytes_out"] += sum(len(chunk) for chunk in result)
            hold = self._hold
            if hold is not None and hold(method, path, query):
                self.held.set()
                self._release.wait(60)
            return result

        self._server = make_server(self._ip_address, self._port, counting, True)
        self._server_ready_event.set()
        self._server.serve_forever()

    def reset(self) -> None:
        with self.lock:
            self.counts.clear()

    def hold(self, pred) -> None:
        self.held.clear()
        self._release.clear()
        self._hold = pred

    def release(self) -> None:
        self._hold = None
        self._release.set()

    @property
    def endpoint(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"


def start(env: dict | None = None) -> CountingMotoServer:
    server = CountingMotoServer(free_port())
    server.start()
    target = os.environ if env is None else env
    target.update(CREDENTIALS)
    target["AWS_ENDPOINT_URL"] = server.endpoint
    return server


def s3fs_client(endpoint: str):
    import s3fs

    return s3fs.S3FileSystem(
        endpoint_url=endpoint,
        key="testing",
        secret="testing",
        skip_instance_cache=True,
        use_listings_cache=False,
    )


def upload(fs, local: Path, dest: str) -> None:
    """Copy a local file or folder to dest (bucket/prefix), key by key."""
    local = Path(local)
    if local.is_file():
        fs.pipe_file(dest, local.read_bytes())
        return
    for p in sorted(local.rglob("*")):
        if p.is_file() and not p.is_symlink():
            fs.pipe_file(dest + "/" + p.relative_to(local).as_posix(), p.read_bytes())
