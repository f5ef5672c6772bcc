#!/usr/bin/env python3
"""Memory under attack: the resident memory of a running Capstan host while anonymous clients
send it 64 concurrent bundle uploads of 60 MiB, and 64 concurrent wrong logins (for one user,
then for distinct users). Each attack's clients come from this machine: one client address.

Usage: memory_under_attack.py --url http://127.0.0.1:8080 --pid <capstan pid> [--clients 64]

It prints the host's RSS before, the peak seen during each attack (sampled every 20 ms from
/proc/<pid>/status) and the kernel's high-water mark (VmHWM), and the answers the clients got.
Python's standard library only; run it on the host's machine. Recorded in docs/benchmarks.md.
"""

import argparse
import collections
import http.client
import json
import socket
import threading
import time
import urllib.parse

UPLOAD = 60 << 20
CHUNK = 1 << 20


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True

    def run(self):
        while self.running:
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.02)


def upload(host, port, answers):
    """An anonymous upload that declares 60 MiB and sends it as fast as the host takes it."""
    try:
        with socket.create_connection((host, port), timeout=120) as s:
            head = (f"POST /api/v1/uploads/plugin-bundle HTTP/1.1\r\nhost: {host}\r\n"
                    f"content-type: application/octet-stream\r\ncontent-length: {UPLOAD}\r\n\r\n")
            s.sendall(head.encode())
            chunk = b"\0" * CHUNK
            try:
                for _ in range(UPLOAD // CHUNK):
                    s.sendall(chunk)
            except OSError:
                pass  # the host answered and closed: the rest is never read
            answer = s.recv(4096).decode(errors="replace")
            answers[answer.split("\r\n", 1)[0] or "closed"] += 1
    except OSError as e:
        answers[f"error: {e.__class__.__name__}"] += 1


def wrong_login(host, port, username, i, answers):
    try:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        body = json.dumps({"username": username, "password": f"wrong-password-{i}-xxxxxxxx"})
        conn.request("POST", "/api/v1/auth.login", body, {"content-type": "application/json"})
        response = conn.getresponse()
        code = json.loads(response.read() or b"{}").get("error", {}).get("code", "")
        answers[f"{response.status} {code}"] += 1
    except OSError as e:
        answers[f"error: {e.__class__.__name__}"] += 1


def attack(name, pid, clients, target):
    answers = collections.Counter()
    sampler = Sampler(pid)
    before = rss_kib(pid)
    sampler.start()
    started = time.monotonic()
    threads = [threading.Thread(target=target, args=(i, answers)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    time.sleep(0.2)
    sampler.running = False
    sampler.join()
    print(f"{name}: {clients} clients in {elapsed:.1f} s; RSS before {before / 1024:.0f} MiB, "
          f"peak {sampler.peak / 1024:.0f} MiB, VmHWM {rss_kib(pid, 'VmHWM') / 1024:.0f} MiB; answers {dict(answers)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    url = urllib.parse.urlparse(args.url)
    host, port = url.hostname, url.port or 80
    attack("anonymous 60 MiB uploads", args.pid, args.clients, lambda i, a: upload(host, port, a))
    attack("wrong logins for one user", args.pid, args.clients, lambda i, a: wrong_login(host, port, "admin", i, a))
    # distinct usernames: each its own count, so only the hashing gate bounds the scrypts
    attack("wrong logins for distinct users", args.pid, args.clients, lambda i, a: wrong_login(host, port, f"user{i}", i, a))


if __name__ == "__main__":
    main()
