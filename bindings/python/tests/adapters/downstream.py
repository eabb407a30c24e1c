"""A loopback downstream service that counts effects, for the adapter tests.

It runs in the test process (an HTTP server on 127.0.0.1, port chosen by the
OS) while the agent under test runs in a child process that is SIGKILLed, so
the count survives the kill. Three classes of downstream, one per path:

| path                 | what it offers                                   |
|----------------------|--------------------------------------------------|
| ``POST /key/send``     | deduplicates by ``Idempotency-Key``: a repeated key returns the first effect, makes none |
| ``POST /lookup/send``  | no deduplication, but stores the caller's reference (``X-Reference``), and ``GET /lookup/find?ref=`` finds an effect by it |
| ``POST /neither/send`` | neither: every request is a new effect             |

``GET /count`` returns ``{"effects": n, "by_class": {...}}``. Nothing here
listens on anything but the loopback address.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

CLASSES = ("key", "lookup", "neither")


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.effects: list[dict] = []  # {"id", "class", "key", "ref", "body"}
        self.requests = 0

    def send(self, cls: str, key: str | None, ref: str | None, body: str) -> tuple[dict, bool]:
        with self.lock:
            self.requests += 1
            if cls == "key" and key:
                for effect in self.effects:
                    if effect["class"] == "key" and effect["key"] == key:
                        return effect, False
            effect = {
                "id": f"eff_{len(self.effects) + 1}",
                "class": cls,
                "key": key,
                "ref": ref,
                "body": body,
            }
            self.effects.append(effect)
            return effect, True

    def find(self, ref: str) -> dict | None:
        with self.lock:
            for effect in self.effects:
                if effect["class"] == "lookup" and effect["ref"] == ref:
                    return effect
        return None

    def counts(self) -> dict:
        with self.lock:
            by_class = {c: sum(1 for e in self.effects if e["class"] == c) for c in CLASSES}
            return {"effects": len(self.effects), "by_class": by_class, "requests": self.requests}


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if len(parts) == 2 and parts[0] in CLASSES and parts[1] == "send":
            cls = parts[0]
            key = self.headers.get("Idempotency-Key") if cls == "key" else None
            ref = self.headers.get("X-Reference") if cls == "lookup" else None
            effect, created = self.server.state.send(cls, key, ref, body)
            self._reply(200, {"id": effect["id"], "created": created})
        else:
            self._reply(404, {"error": "no such path"})

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/count":
            self._reply(200, self.server.state.counts())
        elif url.path == "/lookup/find":
            ref = parse_qs(url.query).get("ref", [""])[0]
            effect = self.server.state.find(ref)
            self._reply(200, {"found": effect is not None, "id": effect and effect["id"]})
        else:
            self._reply(404, {"error": "no such path"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = _State()


class LoopbackDownstream:
    """The service, started on a thread; use as a context manager."""

    def __init__(self):
        self._server = _Server()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "LoopbackDownstream":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def count(self, cls: str | None = None) -> int:
        counts = self._server.state.counts()
        return counts["effects"] if cls is None else counts["by_class"][cls]

    @property
    def requests(self) -> int:
        return self._server.state.counts()["requests"]


# Never through a proxy from the environment: loopback only.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Client:
    """What a tool uses to reach the service (standard library only; every
    request has a timeout)."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def send(self, cls: str, body: dict, *, key: str | None = None, ref: str | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        if ref is not None:
            headers["X-Reference"] = ref
        req = urllib.request.Request(
            f"{self.url}/{cls}/send", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with _OPENER.open(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())

    def find(self, ref: str) -> dict | None:
        with _OPENER.open(f"{self.url}/lookup/find?ref={ref}", timeout=self.timeout) as resp:
            answer = json.loads(resp.read())
        return answer if answer["found"] else None
