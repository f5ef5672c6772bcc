#!/usr/bin/env python3
"""The test CoreMail: the control protocol of docs/coremail-protocol.md, for Capstan's own tests.

    python3 coremail.py --port P --bootstrap-file FILE [--state FILE]

Serves the control socket under `/socket` on 127.0.0.1:P. The control client (Capstan's
CoreMail manager) authenticates with its control credential, checked against the verifiers of
COREMAIL_CONTROL_BOOTSTRAP, which the test writes into FILE (read again on every request, as a
restarted workload would read its new environment; a missing file refuses every request).
Prints `coremail ready port=P` once it listens. Python 3.11, stdlib only.

Test-only endpoints (no authentication, loopback only), so a test can play CoreMail's side:
  GET  /test/counters                    {"statusReads", "prepares", "refused"}
  GET  /test/applied                     {"epoch", "digest", "desired"}: what it applied
  POST /test/bindings/<id> {"status"}   what CoreMail reports for a binding it was given
  POST /test/traffic {"bindingId", "day", "delivered", "acknowledged", "rejected", "received"}
  POST /test/fail {"code", "message"}    report the next applies as failed (null: stop)
"""

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROTOCOL = 1
VERIFIER_RE = re.compile(r"coremail-v1\$([0-9a-f]{32})\$([0-9a-f]{64})\Z")
DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
BINDING_STATUSES = ("pending", "active", "failed")


class ApiError(Exception):
    def __init__(self, status, code, message, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def canonical(value):
    """The bytes a digest is taken over: keys sorted, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def digest_of(value):
    return "sha256:" + hashlib.sha256(canonical(value)).hexdigest()


def verify(verifier, secret):
    m = VERIFIER_RE.match(verifier or "")
    if not m:
        return False
    salt = bytes.fromhex(m.group(1))
    return hmac.compare_digest(hashlib.sha256(salt + secret.encode("utf-8")).hexdigest(), m.group(2))


class State:
    """What this CoreMail applied, kept in a file when one is named (a restart keeps its epoch)."""

    def __init__(self, path, bootstrap_file):
        self.lock = threading.Lock()
        self.path, self.bootstrap_file = path, bootstrap_file
        self.applied = {"epoch": 0, "digest": None, "desired": None}
        self.bindings = {}  # binding id -> status reported
        self.traffic = {}  # (binding id, day) -> counters
        self.failing = None
        self.counters = {"statusReads": 0, "prepares": 0, "refused": 0}
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            self.applied = saved["applied"]
            self.bindings = saved["bindings"]
            self.traffic = {tuple(k.split("|", 1)): v for k, v in saved["traffic"].items()}

    def save(self):
        if not self.path:
            return
        saved = {"applied": self.applied, "bindings": self.bindings, "traffic": {f"{b}|{d}": v for (b, d), v in self.traffic.items()}}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(self.path)))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(saved, f)
        os.replace(tmp, self.path)

    def authenticate(self, header):
        """The control credential in `Bearer <credentialId>:<version>:<secret>`, checked against
        the bootstrap's verifiers: the current one, or a retiring one before its acceptUntil."""
        try:
            with open(self.bootstrap_file, encoding="utf-8") as f:
                bootstrap = json.load(f)
        except (OSError, ValueError):
            raise ApiError(401, "unauthorized", "no control bootstrap: COREMAIL_CONTROL_BOOTSTRAP is not delivered yet")
        if not header.startswith("Bearer "):
            raise ApiError(401, "unauthorized", "a control credential is required")
        parts = header[len("Bearer "):].split(":", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            raise ApiError(401, "unauthorized", "the control credential is not <credentialId>:<version>:<secret>")
        credential_id, version, secret = parts[0], int(parts[1]), parts[2]
        if credential_id != bootstrap.get("credentialId"):
            raise ApiError(401, "unauthorized", "unknown control credential")
        now_ms = int(time.time() * 1000)
        for v in bootstrap.get("verifiers", []):
            if v.get("version") != version:
                continue
            if v.get("acceptUntil") is not None and v["acceptUntil"] < now_ms:
                raise ApiError(401, "credential-retired", f"control credential version {version} is no longer accepted")
            if verify(v.get("verifier"), secret):
                return
        raise ApiError(401, "unauthorized", "the control credential does not match its verifier")

    def status(self):
        with self.lock:
            self.counters["statusReads"] += 1
            desired = self.applied["desired"] or {}
            known = [b["bindingId"] for b in desired.get("bindings", [])]
            return {
                "protocol": PROTOCOL,
                "appliedEpoch": self.applied["epoch"],
                "digest": self.applied["digest"],
                "state": "failed" if self.failing else ("applied" if self.applied["epoch"] else "waiting"),
                "lastError": self.failing,
                "bindings": [{"bindingId": b, "status": self.bindings.get(b, "pending")} for b in known],
            }

    def prepare(self, body):
        epoch, digest, desired = body.get("epoch"), body.get("digest"), body.get("desired")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise ApiError(400, "desired-state-invalid", "epoch must be a positive integer")
        if not isinstance(desired, dict) or not isinstance(desired.get("bindings"), list):
            raise ApiError(400, "desired-state-invalid", "desired must be an object with bindings")
        if digest != digest_of(desired):
            raise ApiError(400, "digest-mismatch", "the digest is not the SHA-256 of the canonical desired state")
        with self.lock:
            self.counters["prepares"] += 1
            if epoch <= self.applied["epoch"]:
                self.counters["refused"] += 1
                raise ApiError(409, "epoch-not-increasing", f"epoch {epoch} does not exceed the applied {self.applied['epoch']}",
                               appliedEpoch=self.applied["epoch"])
            self.applied = {"epoch": epoch, "digest": digest, "desired": desired}
            self.save()
            return {"appliedEpoch": epoch, "digest": digest}

    def statistics(self):
        with self.lock:
            by_binding = {b["bindingId"]: b.get("serviceId") for b in (self.applied["desired"] or {}).get("bindings", [])}
            days = [dict(counters, bindingId=b, serviceId=by_binding.get(b), day=d) for (b, d), counters in sorted(self.traffic.items())]
            return {"days": days}


def dispatch(state, method, path, headers, body):
    if path.startswith("/test/"):
        return test_dispatch(state, method, path, body)
    if not path.startswith("/socket/"):
        raise ApiError(404, "not-found", f"no such path {path}")
    state.authenticate(headers.get("authorization", ""))
    op = path[len("/socket/"):]
    if method == "GET" and op == "status":
        return 200, state.status()
    if method == "POST" and op == "prepare":
        return 200, state.prepare(body)
    if method == "GET" and op == "statistics":
        return 200, state.statistics()
    raise ApiError(404, "not-found", f"no such operation {method} {op}")


def test_dispatch(state, method, path, body):
    with state.lock:
        if method == "GET" and path == "/test/counters":
            return 200, dict(state.counters)
        if method == "GET" and path == "/test/applied":
            return 200, state.applied
        if method == "POST" and path.startswith("/test/bindings/"):
            if body.get("status") not in BINDING_STATUSES:
                raise ApiError(400, "invalid-request", f"status is one of {BINDING_STATUSES}")
            state.bindings[path[len("/test/bindings/"):]] = body["status"]
            state.save()
            return 200, {}
        if method == "POST" and path == "/test/traffic":
            if not isinstance(body.get("bindingId"), str) or not DAY_RE.match(str(body.get("day"))):
                raise ApiError(400, "invalid-request", "bindingId and day (YYYY-MM-DD) are required")
            counters = state.traffic.setdefault((body["bindingId"], body["day"]),
                                                {"delivered": 0, "acknowledged": 0, "rejected": 0, "received": 0})
            for k in counters:
                counters[k] += int(body.get(k, 0))
            state.save()
            return 200, {}
        if method == "POST" and path == "/test/fail":
            state.failing = body if body.get("code") else None
            return 200, {}
    raise ApiError(404, "not-found", f"no such path {path}")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None

    def answer(self):
        try:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                raise ApiError(400, "invalid-request", "the body is not JSON")
            if not isinstance(body, dict):
                raise ApiError(400, "invalid-request", "the body is not a JSON object")
            status, payload = dispatch(self.state, self.command, self.path.split("?", 1)[0],
                                       {k.lower(): v for k, v in self.headers.items()}, body)
        except ApiError as e:
            status, payload = e.status, {"error": dict({"code": e.code, "message": e.message}, **e.extra)}
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = answer

    def log_message(self, fmt, *args):  # the request line only: never a header
        sys.stderr.write("coremail: %s\n" % (fmt % args))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bootstrap-file", required=True, help="COREMAIL_CONTROL_BOOTSTRAP as delivered (JSON)")
    p.add_argument("--state", help="keep what was applied across restarts in this file")
    args = p.parse_args()
    Handler.state = State(args.state, args.bootstrap_file)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"coremail ready port={args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
