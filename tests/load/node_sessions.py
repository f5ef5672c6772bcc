#!/usr/bin/env python3
"""Node runtime sessions under load (issue 45): N simulated nodes hold their runtime sessions on
one Capstan host; what each session costs the host in resident memory, and how fast the host
delivers assignments to all of them. Python's standard library only (the WebSocket client is
the few lines RFC 6455 needs below: masked text frames out, pongs to the host's pings); run it
on the host's machine, since it reads the host's /proc/<pid>/status.

Usage: node_sessions.py --url http://127.0.0.1:8080 --pid <capstan pid> --admin-password P
           [--nodes 1000] [--idle 15] [--timeout 180] [--open-concurrency 32]
           [--enroll-concurrency 8] [--registry-host reg.example] [--via-relay] [--no-teardown] [--json]

Against `capstan serve --dev` (its public origin is plain http, which only dev mode accepts for
jump commands), started with `ulimit -n $(ulimit -Hn)`. In order:

1. Logs in as `admin`, creates an organization, a cluster and a service whose image is pinned
   by digest in this host's registry (`<host:port>/workloads/web-<12 hex>@sha256:<64 hex>`; the
   repository need not exist: the host issues a pull credential with each `run` push all the
   same, as for a real image; `--registry-host reg.example` pins it outside the registry
   instead, so a push carries no credential and writes nothing), then enrolls N nodes as their
   agents do:
   `nodes.createJumpCommand {clusterId}` and `POST /agent/v1/enroll {protocol, code, hostname,
   tokenSha256, agentVersion}` (the token: 64 random lowercase hex characters, kept; only its
   SHA-256 is sent).
2. Opens N sockets to `/api/v1/socket`, each offering `{"kind": "agent", "node", "token"}`, and
   registers each node's runtime session (`runtime.registerSession {nodeId, nonce,
   agentVersion}`). The host's VmRSS before the first socket and after all N are registered and
   idle for `--idle` seconds (15 by default; a reading 5 s after is reported too, with the
   host's thread count at both) gives the memory per session. At most `--open-concurrency`
   upgrades are in flight: an upgrade without a bearer the host knows — an agent's, whose node
   token is no JWT — takes a *stranger's* slot until its offer is judged (64 of them,
   docs/socket.md), so a herd of agents opening at once is answered 503 `too-many-sessions`
   past that; such answers are retried with backoff and counted (`--open-concurrency 1000`
   plays the herd).
3. Writes the spec (`runtime.setServiceSpec`: every node, one replica); every session answers
   each `runtime.assign` request with `{"accepted": true}`. From the write to the last of the N
   `run` pushes received and acknowledged: assignments delivered per second. Then every node
   reports its replica running and ready (`runtime.reportObservation`), until the verdict reads
   `converged`.
4. A rollout check: the service's environment changes. The runtime replaces one slot at a time
   (docs/runtime.md): exactly one slot's stop, remove and successor run are pushed within
   `--rollout-window` seconds, and nothing else (the fake agents acknowledge, report their
   receipts, and never report the successor ready, so the rollout holds there).
5. Unless `--no-teardown`: the spec is held (`hold: true`), which stops every slot at once: N
   `stop` pushes (rate again); each node reports its receipt (generation 2), is pushed its
   `remove`, reports generation 3, and the producer releases the slots: the time until the
   service holds no slot.

With `--via-relay` the N sessions ride one relay socket instead of N sockets (docs/relays.md,
"Carrying node sessions"): the driver enables the cluster's relay (setting `clusterRelayZone` if
unset, `clusters.enableRelay`, the credential minted and exported), opens one socket as the
relay, and carries every node on it — `node-open` with the node's id and token, then each node's
frames wrapped as `{"type": "node", "node", "frame"}` — so the memory figure is per carried
session.

An answer marked retryable — HTTP 503 or a socket `error` frame with `"retryable": true`, in
practice `store-busy` when SQLite stays locked past the store's 5 s budget — is retried with
backoff (0.1 s doubling to 2 s, 12 tries) and counted by route or method in the report.

Prints a short report (`--json`: one JSON object instead) and exits 1 on any failure: an
enrollment or a call refused (after those retries), an offer refused, a socket the host closed,
a push missing after `--timeout` seconds, a push received twice.
"""

import argparse
import asyncio
import base64
import collections
import hashlib
import http.client
import json
import os
import resource
import secrets
import struct
import sys
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor

AGENT_VERSION = "0.1.0-load"
# socket calls answered with a retryable error and retried, by (method, code)
RETRIED = collections.Counter()
PROTOCOL = "capstan-socket/1"


def status_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    """The host's user + system CPU time so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pressure(kind):
    """The share of the last 10 s some task waited for `kind` (cpu, io), from /proc/pressure."""
    try:
        with open(f"/proc/pressure/{kind}") as f:
            return float(f.readline().split()[1].split("=")[1])
    except OSError:
        return None


def machine():
    """The machine's load when a phase ends: other work on it slows the host's store."""
    return {"load1": round(os.getloadavg()[0], 2), "cpuSome10": pressure("cpu"), "ioSome10": pressure("io")}


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sampler(threading.Thread):
    """The host's peak RSS, sampled every 50 ms."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True

    def run(self):
        while self.running:
            self.peak = max(self.peak, status_kib(self.pid))
            time.sleep(0.05)


class Refused(Exception):
    retryable = False


class Api:
    """JSON calls over HTTP, one keep-alive connection per thread."""

    def __init__(self, host, port):
        self.host, self.port, self.local, self.token = host, port, threading.local(), None
        # 503s marked retryable (store-busy), retried as a client should, counted by path
        self.retried = collections.Counter()
        self.lock = threading.Lock()

    def post(self, path, body, token=None):
        pause = 0.1
        for _ in range(12):
            try:
                return self.post_once(path, body, token)
            except Refused as e:
                if not e.retryable:
                    raise
                with self.lock:
                    self.retried[path] += 1
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
        return self.post_once(path, body, token)

    def post_once(self, path, body, token=None):
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            headers = {"content-type": "application/json"}
            if token:
                headers["authorization"] = f"Bearer {token}"
            try:
                conn.request("POST", path, json.dumps(body), headers)
                response = conn.getresponse()
                raw = response.read()
            except (http.client.HTTPException, ConnectionError):
                # the host closed an idle keep-alive connection: once more on a new one
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
                continue
            answer = json.loads(raw or b"{}")
            if response.status != 200:
                refused = Refused(f"{path}: {response.status} {json.dumps(answer)[:400]}")
                refused.retryable = response.status == 503 and bool((answer.get("error") or {}).get("retryable"))
                raise refused
            return answer

    def call(self, method, body):
        return self.post(f"/api/v1/{method}", body, self.token)


# ---- a WebSocket client: just what a node's session needs -------------------------------------

def masked(payload, key):
    n = len(payload)
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(keys, "big")).to_bytes(n, "big")


def frame(opcode, payload):
    key = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack(">BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack(">BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + key + masked(payload, key)


class Socket:
    """One WebSocket to the host: upgrade, frames out, frames in."""

    async def upgrade(self, host, port, bearer=None):
        """Upgrade; a 503 too-many-sessions is retried (counted): the number of retries."""
        delay, retries = 0.05, 0
        while True:
            self.reader, self.writer = await asyncio.open_connection(host, port, limit=1 << 22)
            key = base64.b64encode(os.urandom(16)).decode()
            auth = f"authorization: Bearer {bearer}\r\n" if bearer else ""
            self.writer.write((f"GET /api/v1/socket HTTP/1.1\r\nhost: {host}:{port}\r\nupgrade: websocket\r\n"
                               f"connection: Upgrade\r\nsec-websocket-key: {key}\r\nsec-websocket-version: 13\r\n{auth}\r\n").encode())
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = head.split(b"\r\n", 1)[0].decode()
            if " 101 " in status:
                return retries
            self.writer.close()
            if " 503 " in status:
                retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            raise Refused(f"the upgrade was answered {status}")

    def send_frame(self, message):
        self.writer.write(frame(1, json.dumps(message, separators=(",", ":")).encode()))

    async def messages(self):
        """The text frames the host sends, as JSON, until it closes (`closed` says how)."""
        try:
            while True:
                opcode, payload = await self.read_frame()
                if opcode == 8:
                    code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                    self.closed = (code, payload[2:].decode(errors="replace"))
                    return
                if opcode == 1:
                    yield json.loads(payload)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self.closed = self.closed or (None, e.__class__.__name__)

    async def read_frame(self):
        payload, first = b"", None
        while True:
            b1, b2 = await self.reader.readexactly(2)
            opcode, n = b1 & 0x0F, b2 & 0x7F
            if n == 126:
                n = struct.unpack(">H", await self.reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", await self.reader.readexactly(8))[0]
            data = await self.reader.readexactly(n)
            if opcode >= 8:  # control frames may come between fragments
                if opcode == 9:
                    self.writer.write(frame(10, data))
                    continue
                if opcode == 10:
                    continue
                return opcode, data
            first = opcode if first is None else first
            payload += data
            if b1 & 0x80:
                return first, payload


class Relay(Socket):
    """The cluster's relay: one socket carrying every node's session."""

    def __init__(self):
        self.nodes = {}  # node id -> Node
        self.opening = {}  # node id -> future of node-opened / node-refused
        self.closed = None

    async def open(self, host, port, bearer):
        await self.upgrade(host, port, bearer)
        self.send_frame({"type": "offer", "kind": "relay", "protocols": [PROTOCOL], "token": bearer})
        opcode, payload = await self.read_frame()
        welcome = json.loads(payload) if opcode == 1 else {}
        if welcome.get("type") != "welcome" or not welcome.get("relay"):
            raise Refused(f"the relay's offer was refused: {json.dumps(welcome)[:300]}")
        self.welcome = welcome
        self.task = asyncio.create_task(self.read_loop())

    async def carry(self, node, handler):
        self.nodes[node.node_id] = node
        node.handler = handler
        opened = asyncio.get_running_loop().create_future()
        self.opening[node.node_id] = opened
        self.send_frame({"type": "node-open", "node": node.node_id, "token": node.token})
        answer = await asyncio.wait_for(opened, 60)
        if answer.get("type") != "node-opened":
            raise Refused(f"{node.hostname}: the relay's node-open was refused: {json.dumps(answer)[:300]}")

    async def read_loop(self):
        try:
            async for message in self.messages():
                kind, node = message.get("type"), self.nodes.get(message.get("node"))
                if kind in ("node-opened", "node-refused") and message.get("node") in self.opening:
                    self.opening.pop(message["node"]).set_result(message)
                elif kind == "node" and node:
                    await node.deliver(message.get("frame") or {}, node.handler)
                elif node:
                    node.errors.append(f"unexpected frame: {json.dumps(message)[:200]}")
        except asyncio.CancelledError:
            return
        for node in self.nodes.values():
            node.closed = node.closed or ("relay", self.closed)
            node.fail_calls()


class Node(Socket):
    """One simulated node: its enrollment, then its socket (or its place on the relay's) and
    runtime session."""

    def __init__(self, index):
        self.index = index
        self.hostname = f"sim-{index:05d}"
        self.token = secrets.token_hex(32)
        self.node_id = None
        self.reader = self.writer = None
        self.calls = {}
        self.next_id = 0
        self.closed = None  # (code, reason) the host closed with, or what broke the connection
        self.welcome = None
        self.pushes = []  # (received at, acknowledged at, body)
        self.receipts = True
        self.errors = []
        self.upgrade_retries = 0
        self.relay = None
        self.handler = None

    async def open(self, host, port, handler, relay=None):
        """Offer (on its own socket, or carried by `relay`), then register."""
        if relay:
            self.relay = relay
            await relay.carry(self, handler)
        else:
            self.upgrade_retries += await self.upgrade(host, port)
            self.send({"type": "offer", "kind": "agent", "protocols": [PROTOCOL], "node": self.node_id, "token": self.token})
            opcode, payload = await self.read_frame()
            message = json.loads(payload) if opcode == 1 else {"type": f"opcode {opcode}"}
            if message.get("type") != "welcome" or (message.get("node") or {}).get("nodeId") != self.node_id:
                raise Refused(f"{self.hostname}: the offer was refused: {json.dumps(message)[:300]}")
            self.welcome = message
            self.task = asyncio.create_task(self.read_loop(handler))
        self.welcome = self.welcome or {"via": "relay"}
        registered = await self.call("runtime.registerSession",
                                     {"nodeId": self.node_id, "nonce": str(uuid.uuid4()), "agentVersion": AGENT_VERSION})
        if registered.get("nodeId") != self.node_id or not registered.get("sessionEpoch"):
            raise Refused(f"{self.hostname}: runtime.registerSession answered {registered}")
        return registered

    def send(self, message):
        if self.relay:
            self.relay.send_frame({"type": "node", "node": self.node_id, "frame": message})
        else:
            self.send_frame(message)

    async def drain(self):
        await (self.relay or self).writer.drain()

    async def deliver(self, message, handler):
        kind = message.get("type")
        if kind in ("result", "error") and message.get("id") in self.calls:
            self.calls.pop(message["id"]).set_result(message)
        elif kind == "request":
            await handler(self, message)
        else:
            self.errors.append(f"unexpected frame: {json.dumps(message)[:200]}")

    def fail_calls(self):
        for waiter in self.calls.values():
            if not waiter.done():
                waiter.set_exception(Refused(f"{self.hostname}: the socket closed: {self.closed}"))

    async def read_loop(self, handler):
        try:
            async for message in self.messages():
                await self.deliver(message, handler)
        except asyncio.CancelledError:
            return
        self.fail_calls()

    async def call(self, method, body, timeout=60):
        """A call; an error marked retryable (store-busy) is retried as an agent should, and
        counted in `retried`."""
        pause = 0.1
        for attempt in range(12):
            self.next_id += 1
            call_id = self.next_id
            answer = asyncio.get_running_loop().create_future()
            self.calls[call_id] = answer
            self.send({"type": "call", "id": call_id, "method": method, "body": body})
            message = await asyncio.wait_for(answer, timeout)
            if message["type"] != "error":
                return message["result"]
            error = message["error"]
            if not error.get("retryable") or attempt == 11:
                raise Refused(f"{self.hostname}: {method}: {json.dumps(error)[:300]}")
            RETRIED[(method, error.get("code"))] += 1
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def close(self):
        if self.relay:
            return
        if self.writer and not self.writer.is_closing():
            try:
                self.writer.write(frame(8, struct.pack(">H", 1000)))
                await self.writer.drain()
            except ConnectionError:
                pass
            self.writer.close()
        if getattr(self, "task", None):
            self.task.cancel()


class Fleet:
    """The simulated nodes and every push they got."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.log = []  # (acknowledged at, node index, intent, assignment id, revision, has pull)
        self.changed = asyncio.Event()
        self.report_tasks = set()
        self.report_errors = []

    async def on_request(self, node, message):
        received = time.monotonic()
        body = message.get("body") or {}
        if message.get("method") != "runtime.assign":
            node.send({"type": "reply", "id": message.get("id"), "error": {"code": "method-unknown", "message": "not here"}})
            node.errors.append(f"a request for {message.get('method')}")
            return
        node.send({"type": "reply", "id": message["id"], "result": {"accepted": True}})
        await node.drain()
        acked = time.monotonic()
        node.pushes.append((received, acked, body))
        self.log.append((acked, node.index, body.get("intent"), body.get("assignmentId"), body.get("revision"), "pull" in body))
        self.changed.set()
        intent = body.get("intent")
        if node.receipts and intent in ("stop", "remove"):
            # as an agent does once the container is stopped, then removed
            generation = 2 if intent == "stop" else 3
            task = asyncio.create_task(self.report(node, "runtime.reportReceipt",
                                                   {"assignmentId": body["assignmentId"], "generation": generation}))
            self.report_tasks.add(task)
            task.add_done_callback(self.report_tasks.discard)

    async def report(self, node, method, body):
        try:
            await node.call(method, body)
        except (Refused, asyncio.TimeoutError) as e:
            self.report_errors.append(str(e) or e.__class__.__name__)

    async def wait_for(self, predicate, timeout):
        """Wait until predicate() holds or timeout seconds pass; whether it held."""
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
            except asyncio.TimeoutError:
                pass
        return True

    def since(self, mark, intent=None):
        return [entry for entry in self.log[mark:] if intent is None or entry[2] == intent]

    def closed(self):
        return [(n.hostname, n.closed) for n in self.nodes if n.closed]


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def round_figures(entries, started, count):
    """Figures of a round of pushes: from `started` (the write) to the last push acknowledged."""
    times = [at - started for at, *_ in entries]
    last = max(times) if times else None
    return {
        "pushes": len(entries),
        "expected": count,
        "firstS": round(min(times), 3) if times else None,
        "lastS": round(last, 3) if last is not None else None,
        "p50S": round(percentile(times, 0.5), 3) if times else None,
        "p99S": round(percentile(times, 0.99), 3) if times else None,
        "perSecond": round(len(entries) / last, 1) if last else None,
        "withPullCredential": sum(1 for e in entries if e[5]),
    }


def duplicates(entries):
    seen = collections.Counter((e[3], e[4]) for e in entries)
    return sum(n - 1 for n in seen.values() if n > 1)


async def run(args, api, problems):
    url = urllib.parse.urlparse(args.url)
    host, port = url.hostname, url.port or 80
    pid = args.pid
    out = {"nodes": args.nodes, "url": args.url, "machine": {"start": machine()}}
    stamp = f"{int(time.time()) % 100000:05d}{secrets.token_hex(2)}"

    # ---- the world: an organization, a cluster, a service pinned by digest ----
    api.token = api.call("auth.login", {"username": "admin", "password": args.admin_password})["token"]
    org = api.call("organizations.create", {"name": f"load-{stamp}"})["id"]
    cluster = api.call("clusters.create", {"name": f"sessions-{stamp}"})["cluster"]["id"]
    registry_host = args.registry_host or url.netloc
    image = f"{registry_host}/workloads/web-{secrets.token_hex(6)}@sha256:{secrets.token_hex(32)}"
    service = api.call("services.create", {"organizationId": org, "name": "web", "image": image,
                                           "ports": [{"port": 8080, "protocol": "tcp"}], "environment": {"ROUND": "1"}})
    service_id = service["id"]
    out.update({"cluster": cluster, "service": service_id, "image": image})

    # ---- enrollment, as agents do ----
    nodes = [Node(i) for i in range(args.nodes)]

    def enroll(node):
        code = api.call("nodes.createJumpCommand", {"clusterId": cluster})["code"]
        body = {"protocol": "capstan-agent/1", "code": code, "hostname": node.hostname,
                "tokenSha256": hashlib.sha256(node.token.encode()).hexdigest(), "agentVersion": AGENT_VERSION}
        enrolled = api.post("/agent/v1/enroll", body)
        if enrolled.get("clusterId") != cluster or not enrolled.get("nodeId"):
            raise Refused(f"{node.hostname}: enrolled as {enrolled}")
        node.node_id = enrolled["nodeId"]
        return time.monotonic()

    began = time.monotonic()
    with ThreadPoolExecutor(args.enroll_concurrency) as pool:
        done = sorted(pool.map(enroll, nodes))
    took = time.monotonic() - began
    tenth = max(1, len(done) // 10)
    first_tenth = done[tenth - 1] - began
    last_tenth = done[-1] - done[-tenth - 1] if len(done) > tenth else None
    out["enrollment"] = {"seconds": round(took, 2), "perSecond": round(len(nodes) / took, 1),
                         "firstTenthPerSecond": round(tenth / first_tenth, 1) if first_tenth else None,
                         "lastTenthPerSecond": round(tenth / last_tenth, 1) if last_tenth else None}
    out["enrollment"]["retried503"] = dict(api.retried)
    out["machine"]["enrollment"] = machine()
    log(args, f"enrolled {len(nodes)} nodes in {took:.1f} s (503 store-busy retried: {dict(api.retried)})")

    # ---- the relay, when the sessions ride one ----
    relay = None
    if args.via_relay:
        settings = api.call("settings.get", {})
        if not (settings.get("values") or settings.get("settings") or {}).get("clusterRelayZone"):
            try:
                api.call("settings.update", {"expectedRevision": settings["revision"], "set": {"clusterRelayZone": "relays.load.test"}})
            except Refused as e:
                log(args, f"the relay zone was not set here ({e}); using the one set")
        got = api.call("clusters.get", {"id": cluster})
        api.call("clusters.enableRelay", {"id": cluster, "expectedRevision": got["revision"]})
        api.call("relays.mutateCredential", {"clusterId": cluster, "action": "ensure", "mutationId": f"load-{stamp}"})
        bearer = api.call("relays.exportAuthorization", {"clusterId": cluster, "expectedGeneration": 1})["authorization"]

    # ---- the sessions ----
    fleet = Fleet(nodes)
    await asyncio.sleep(args.idle)
    rss_before, fds_before, threads_before = status_kib(pid), open_fds(pid), status_kib(pid, "Threads")
    sampler = Sampler(pid)
    sampler.start()
    cpu0 = cpu_seconds(pid)
    gate = asyncio.Semaphore(args.open_concurrency)
    if args.via_relay:
        relay = Relay()
        await relay.open(host, port, bearer)

    async def open_one(node):
        async with gate:
            try:
                await node.open(host, port, fleet.on_request, relay)
            except (Refused, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
                node.errors.append(f"open: {e.__class__.__name__}: {e}")

    began = time.monotonic()
    await asyncio.gather(*(open_one(n) for n in nodes))
    opened = time.monotonic() - began
    failed_open = [n for n in nodes if any(e.startswith("open:") for e in n.errors)]
    for node in failed_open[:5]:
        problems.append(node.errors[0])
    if failed_open:
        problems.append(f"{len(failed_open)} of {len(nodes)} sessions were not opened and registered")
    log(args, f"opened and registered {len(nodes) - len(failed_open)} sessions in {opened:.1f} s; idle {args.idle} s")
    # the blocking threads the registrations' store calls started are kept 10 s after their
    # last use (tokio's default) and count in the RSS: read it at 5 s and again at --idle
    await asyncio.sleep(min(5, args.idle))
    rss_5s, threads_5s = status_kib(pid), status_kib(pid, "Threads")
    await asyncio.sleep(max(0, args.idle - 5))
    rss_after, fds_after = status_kib(pid), open_fds(pid)
    sampler.running = False
    live = len(nodes) - len(failed_open)
    out["sessions"] = {
        "viaRelay": bool(relay),
        "registered": live,
        "openSeconds": round(opened, 2),
        "openPerSecond": round(live / opened, 1) if opened else None,
        "upgradeRetries503": sum(n.upgrade_retries for n in nodes),
        "rssBeforeKiB": rss_before,
        "rssAfterKiB": rss_after,
        "rssPeakWhileOpeningKiB": sampler.peak,
        "rssAfter5sKiB": rss_5s,
        "hostThreadsBefore": threads_before,
        "hostThreadsAfter5s": threads_5s,
        "kibPerSession": round((rss_after - rss_before) / live, 1) if live else None,
        "hostFdsBefore": fds_before,
        "hostFdsAfter": fds_after,
        "hostThreadsAfter": status_kib(pid, "Threads"),
        "hostCpuSecondsOpening": round(cpu_seconds(pid) - cpu0, 2),
    }
    out["machine"]["sessions"] = machine()
    if fleet.closed():
        problems.append(f"{len(fleet.closed())} sockets closed while idle: {fleet.closed()[:5]}")

    # ---- round 1: the spec, N run pushes ----
    mark, cpu0 = len(fleet.log), cpu_seconds(pid)
    started = time.monotonic()
    spec = await asyncio.to_thread(api.call, "runtime.setServiceSpec", {
        "serviceId": service_id, "clusterId": cluster, "expectedRevision": None,
        "placement": {"everyNode": True}, "replicasPerNode": 1})
    wrote = time.monotonic() - started
    ok = await fleet.wait_for(lambda: len({e[3] for e in fleet.since(mark, "run")}) >= live, args.timeout)
    runs = fleet.since(mark, "run")
    out["run"] = round_figures(runs, started, live)
    out["run"]["specWriteSeconds"] = round(wrote, 3)
    out["run"]["hostCpuSeconds"] = round(cpu_seconds(pid) - cpu0, 2)
    out["run"]["duplicates"] = duplicates(runs)
    out["run"]["rssAfterKiB"] = status_kib(pid)
    out["machine"]["run"] = machine()
    missing = [n.hostname for n in nodes if n.welcome and not any(b.get("intent") == "run" for _, _, b in n.pushes)]
    if not ok:
        problems.append(f"run: {len(missing)} of {live} nodes got no run push within {args.timeout} s (e.g. {missing[:5]})")
    if out["run"]["duplicates"]:
        problems.append(f"run: {out['run']['duplicates']} pushes received twice")
    if registry_host == url.netloc and out["run"]["withPullCredential"] != len(runs):
        problems.append(f"run: {len(runs) - out['run']['withPullCredential']} run pushes without a pull credential")
    log(args, f"run: {len(runs)} pushes, last {out['run']['lastS']} s after the spec write")

    # every node reports its replica running and ready: the verdict converges
    assignment = {}
    for _, index, intent, asg, _, _ in runs:
        assignment[index] = asg
    began = time.monotonic()
    await asyncio.gather(*(fleet.report(n, "runtime.reportObservation", {
        "assignmentId": assignment[n.index], "generation": 1, "phase": "running", "ready": True,
        "imageDigest": image.split("@", 1)[1], "restartCount": 0, "observedAt": int(time.time() * 1000)})
        for n in nodes if n.index in assignment))
    reported = time.monotonic() - began
    verdict, converged_at = await verdict_until(api, service_id, lambda t: (t["verdict"] or {}).get("state") == "converged", args.timeout)
    out["observe"] = {"reports": len(assignment), "reportSeconds": round(reported, 2),
                      "reportsPerSecond": round(len(assignment) / reported, 1) if reported else None,
                      "convergedAfterS": round(converged_at - began, 2) if converged_at else None,
                      "verdict": verdict,
                      "storeBusyRetried": RETRIED[("runtime.reportObservation", "store-busy")]}
    out["machine"]["observe"] = machine()
    if fleet.report_errors:
        problems.append(f"observations refused: {len(fleet.report_errors)}, e.g. {fleet.report_errors[:3]}")
    if not converged_at:
        problems.append(f"the verdict did not read converged within {args.timeout} s: {verdict}")
    log(args, f"observed: {len(assignment)} reports in {reported:.1f} s; verdict {verdict}")

    # ---- the rollout holds to one slot at a time ----
    mark = len(fleet.log)
    current = api.call("services.get", {"id": service_id})
    api.call("services.update", {"id": service_id, "expectedRevision": current["revision"], "environment": {"ROUND": "2"}})
    await asyncio.sleep(args.rollout_window)
    rollout = fleet.since(mark)
    by_intent = collections.Counter(e[2] for e in rollout)
    touched = {e[1] for e in rollout if e[2] in ("stop", "remove")}
    out["rollout"] = {"windowS": args.rollout_window, "pushes": dict(by_intent), "nodesStopped": len(touched)}
    if len(touched) != 1 or by_intent.get("stop") != 1:
        problems.append(f"rollout: expected one slot stopped in {args.rollout_window} s, got {dict(by_intent)} on {len(touched)} nodes")
    log(args, f"rollout: {dict(by_intent)} in {args.rollout_window} s")

    # ---- teardown: the spec held, N stops, N removes, the slots released ----
    if not args.no_teardown:
        mark, cpu0 = len(fleet.log), cpu_seconds(pid)
        # what the hold must stop and remove: every assignment pushed to run and not stopped yet
        # (or not removed yet), the rollout's successor included
        ran = {e[3] for e in fleet.log if e[2] == "run"}
        to_stop = ran - {e[3] for e in fleet.log if e[2] == "stop"}
        to_remove = ran - {e[3] for e in fleet.log if e[2] == "remove"}
        started = time.monotonic()
        api.call("runtime.setServiceSpec", {
            "serviceId": service_id, "clusterId": cluster, "expectedRevision": spec["revision"],
            "placement": {"everyNode": True}, "replicasPerNode": 1, "hold": True})
        ok = await fleet.wait_for(lambda: to_stop <= {e[3] for e in fleet.since(mark, "stop")}, args.timeout)
        stops = fleet.since(mark, "stop")
        out["stop"] = round_figures(stops, started, len(to_stop))
        out["stop"]["duplicates"] = duplicates(stops)
        if not ok:
            problems.append(f"stop: {len(to_stop - {e[3] for e in stops})} of {len(to_stop)} stop pushes missing after {args.timeout} s")
        ok = await fleet.wait_for(lambda: to_remove <= {e[3] for e in fleet.since(mark, "remove")}, args.timeout)
        removes = fleet.since(mark, "remove")
        out["remove"] = round_figures(removes, started, len(to_remove))
        out["remove"]["duplicates"] = duplicates(removes)
        if not ok:
            problems.append(f"remove: {len(to_remove - {e[3] for e in removes})} of {len(to_remove)} remove pushes missing after {args.timeout} s")
        verdict, released_at = await verdict_until(api, service_id, lambda t: not t["slots"], args.timeout)
        out["released"] = {"afterS": round(released_at - started, 2) if released_at else None, "verdict": verdict,
                           "receiptsStoreBusyRetried": RETRIED[("runtime.reportReceipt", "store-busy")],
                           "hostCpuSeconds": round(cpu_seconds(pid) - cpu0, 2)}
        out["machine"]["teardown"] = machine()
        if not released_at:
            problems.append(f"the slots were not released within {args.timeout} s: {verdict}")
        if fleet.report_errors:
            problems.append(f"reports refused: {len(fleet.report_errors)}, e.g. {fleet.report_errors[:3]}")
        for round_name in ("stop", "remove"):
            if out[round_name]["duplicates"]:
                problems.append(f"{round_name}: {out[round_name]['duplicates']} pushes received twice")
        log(args, f"teardown: stops last {out['stop']['lastS']} s, removes last {out['remove']['lastS']} s, "
                  f"released after {out['released']['afterS']} s")

    await asyncio.sleep(0.5)
    if fleet.closed():
        problems.append(f"{len(fleet.closed())} sockets closed by the host: {fleet.closed()[:5]}")
    stray = [e for n in nodes for e in n.errors if not e.startswith("open:")]
    if stray:
        problems.append(f"{len(stray)} unexpected frames, e.g. {stray[:3]}")
    out["retried503"] = dict(api.retried)
    out["retriedCalls"] = {f"{method} {code}": n for (method, code), n in RETRIED.items()}
    out["rssEndKiB"] = status_kib(pid)
    out["vmHwmKiB"] = status_kib(pid, "VmHWM")
    await asyncio.gather(*(n.close() for n in nodes))
    if relay:
        if relay.closed:
            problems.append(f"the relay's socket was closed by the host: {relay.closed}")
        relay.writer.close()
    return out


async def verdict_until(api, service_id, predicate, timeout):
    """Poll runtime.getServiceStatus every 0.5 s: (the last verdict, when predicate held or None)."""
    deadline, verdict = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        status = await asyncio.to_thread(api.call, "runtime.getServiceStatus", {"serviceId": service_id})
        # a target without slots may be left out of the answer
        target = (status.get("targets") or [{"verdict": None, "slots": []}])[0]
        verdict = target.get("verdict")
        if predicate(target):
            return verdict, time.monotonic()
        await asyncio.sleep(0.5)
    return verdict, None


def log(args, text):
    if not args.json:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def report(out):
    s = out["sessions"]
    mib = lambda kib: f"{kib / 1024:.1f} MiB"
    print()
    print(f"{out['nodes']} node runtime sessions against {out['url']}" + (" on one relay socket" if s.get("viaRelay") else ""))
    e = out["enrollment"]
    print(f"  enrollment: {e['seconds']} s ({e['perSecond']}/s; first tenth {e['firstTenthPerSecond']}/s, last tenth {e['lastTenthPerSecond']}/s); "
          f"503 store-busy answers retried: {e['retried503'] or 'none'}")
    print(f"  sessions: {s['registered']} registered in {s['openSeconds']} s ({s['openPerSecond']}/s, {s['upgradeRetries503']} upgrades answered 503 and retried)")
    print(f"  host RSS: {mib(s['rssBeforeKiB'])} before, {mib(s['rssAfterKiB'])} with every session idle "
          f"(peak while opening {mib(s['rssPeakWhileOpeningKiB'])}): {s['kibPerSession']} KiB per session")
    print(f"  host: {s['hostFdsBefore']} -> {s['hostFdsAfter']} open files; threads {s['hostThreadsBefore']} before, "
          f"{s['hostThreadsAfter5s']} 5 s after the last registration (RSS {mib(s['rssAfter5sKiB'])}), {s['hostThreadsAfter']} at the reading")
    for name, what in (("run", "run pushes after the spec write"), ("stop", "stop pushes after the hold"),
                       ("remove", "remove pushes after the hold (each after its stop's receipt)")):
        r = out.get(name)
        if r:
            print(f"  {what}: {r['pushes']} of {r['expected']}, first {r['firstS']} s, p50 {r['p50S']} s, p99 {r['p99S']} s, "
                  f"last {r['lastS']} s: {r['perSecond']}/s ({r['duplicates']} twice, {r['withPullCredential']} with a pull credential)")
    print(f"  host CPU: {out['run']['hostCpuSeconds']} s for the run round"
          + (f", {out['released']['hostCpuSeconds']} s for the teardown" if out.get("released") else ""))
    print("  machine at the end of each phase (load average 1 min, PSI cpu/io some avg10 %): "
          + "; ".join(f"{k} {v['load1']} {v['cpuSome10']}/{v['ioSome10']}" for k, v in out["machine"].items()))
    o = out["observe"]
    print(f"  observations: {o['reports']} in {o['reportSeconds']} s ({o['reportsPerSecond']}/s, {o['storeBusyRetried']} answered store-busy "
          f"and retried); converged {o['convergedAfterS']} s after the first")
    r = out["rollout"]
    print(f"  rollout (environment changed, {r['windowS']} s): pushes {r['pushes']}, {r['nodesStopped']} node(s) stopped")
    if out.get("released"):
        print(f"  teardown: every slot released {out['released']['afterS']} s after the hold "
              f"({out['released']['receiptsStoreBusyRetried']} receipts answered store-busy and retried)")
    print(f"  retried: HTTP 503 {out['retried503'] or 'none'}; socket calls {out['retriedCalls'] or 'none'}")
    print(f"  host RSS at the end {mib(out['rssEndKiB'])}, VmHWM {mib(out['vmHwmKiB'])}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the capstan process, for its RSS")
    parser.add_argument("--admin-password", required=True, help="the password `serve --dev` printed")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=15, help="seconds idle before each RSS reading (at least 5)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds a round may take")
    parser.add_argument("--rollout-window", type=float, default=12, help="seconds to watch the rollout after the change")
    parser.add_argument("--open-concurrency", type=int, default=32, help="upgrades in flight at once")
    parser.add_argument("--enroll-concurrency", type=int, default=8)
    parser.add_argument("--registry-host", help="the registry's host:port (default: the URL's)")
    parser.add_argument("--no-teardown", action="store_true", help="skip the hold (stops, removes, release)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the report")
    parser.add_argument("--via-relay", action="store_true", help="carry every session on one relay socket")
    args = parser.parse_args()
    # one descriptor per session, in this process and in the host
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.nodes + 100:
        sys.exit(f"the open files limit {hard} is below {args.nodes + 100}: raise it (ulimit -n)")
    host_limit = next((int(line.split()[3]) for line in open(f"/proc/{args.pid}/limits") if line.startswith("Max open files")), 0)
    if host_limit < args.nodes + 100:
        print(f"warning: the host's open files limit is {host_limit}; start it with ulimit -n $(ulimit -Hn)", file=sys.stderr)
    url = urllib.parse.urlparse(args.url)
    api = Api(url.hostname, url.port or 80)
    problems = []
    try:
        out = asyncio.run(run(args, api, problems))
    except (Refused, OSError) as e:
        problems.append(f"{e.__class__.__name__}: {e}")
        out = {}
    out["problems"] = problems
    if args.json:
        print(json.dumps(out, indent=1))
    elif "run" in out:
        report(out)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
