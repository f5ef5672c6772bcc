#!/usr/bin/env python3
"""The test mail gateway: the HTTP API of docs/gateway-protocol.md and a real SMTP submission
listener (aiosmtpd) that checks the credentials it issued, for Capstan's own tests.

    python3 gateway.py --http-port P --smtp-port Q --token T [--admin-token A ...]
                       [--domain D ...] [--unverified-domain D ...] [--state FILE]
                       [--forward-port R [--private-source PREFIX ...]]

Every listener binds 127.0.0.1 only. Prints `gateway ready http=P smtp=Q` once both listen
(`… forward=R` with `--forward-port`: the plain-HTTP listener that forwards by the routes).
Python 3.11, stdlib + aiosmtpd + cryptography (the certificates it issues, under a CA of its own
made at start).
"""

import argparse
import datetime
import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import string
import sys
import tempfile
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}\Z")
PREFIX_RE = re.compile(r"[A-Za-z0-9._-]{0,128}\Z")
USERNAME_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,256}\Z")
# Deliberately loose: one @, something on both sides, nothing that would break an SMTP command.
ADDRESS_RE = re.compile(r"[^@\s<>\x00-\x1f\x7f]+@[^@\s<>\x00-\x1f\x7f]+\Z")
HOST_RE = re.compile(r"[^\s/@\x00-\x1f\x7f]{1,253}\Z")
# The most alternates a direct forward target carries.
MAX_ALTERNATES = 16
# A peer's salted verifier: coremail-v1$<hex salt>$<hex SHA-256 of salt bytes then secret>.
VERIFIER_RE = re.compile(r"coremail-v1\$([0-9a-f]{32})\$([0-9a-f]{64})\Z")
PASSWORD_ALPHABET = string.ascii_letters + string.digits
# What a client credential may be granted, and the scope each protocol path needs.
SCOPES = {"domains:read", "routes:write", "certificates:read", "dns-records:write", "smtp:write", "peers:write"}
PATH_SCOPES = {"domains": "domains:read", "smtp-credentials": "smtp:write",
               "smtp-forward-targets": "smtp:write", "peers": "peers:write", "dns-records": "dns-records:write",
               "certificates": "certificates:read", "routes": "routes:write"}
# How long a certificate it issues is valid.
CERTIFICATE_DAYS = 90
# A DNS name: lowercase labels of a-z 0-9 - joined by dots, at least two.
DNS_NAME_RE = re.compile(r"(?=.{1,253}\Z)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
MAX_PREFIXES = 64
# The forwarding listener: how long a route's target may take to connect or answer (each step).
FORWARD_TIMEOUT = 10
# Hop-by-hop headers (RFC 9110 §7.6.1): never forwarded either way, nor any the Connection
# header names. content-length is set anew from the body actually passed on.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
              "te", "trailer", "trailers", "transfer-encoding", "upgrade", "content-length"}
# Request headers the forwarder sets itself, so a client cannot choose them: Host (the route's
# hostname) and the x-forwarded-* of this hop (a client's own are dropped, not trusted).
FORWARD_SET = {"host", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "forwarded", "expect"}


class ApiError(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def invalid(message):
    return ApiError(400, "invalid-request", message)


def sha256_hex(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def same_address(a, b):
    # The local part is case-sensitive (RFC 5321 §2.4), the domain is not.
    la, _, da = a.rpartition("@")
    lb, _, db = b.rpartition("@")
    return la == lb and da.lower() == db.lower()


def check_id(value):
    if not isinstance(value, str) or not ID_RE.match(value):
        raise invalid(f"an id must be 1-128 of A-Z a-z 0-9 . _ -")
    return value


def check_str(body, field, pattern):
    value = body.get(field)
    if not isinstance(value, str) or not pattern.match(value):
        raise invalid(f"{field} is missing or malformed")
    return value


def check_alternates(value, host, port):
    """A direct target's alternates: 0-16 {host, port}, none the primary's and no two alike."""
    if not isinstance(value, list) or len(value) > MAX_ALTERNATES:
        raise invalid(f"alternates must be a list of at most {MAX_ALTERNATES} {{host, port}}")
    seen = {(host, port)}
    out = []
    for alternate in value:
        if not isinstance(alternate, dict) or set(alternate) != {"host", "port"}:
            raise invalid("an alternate is {host, port}, nothing else")
        a_host, a_port = alternate["host"], alternate["port"]
        if not isinstance(a_host, str) or not HOST_RE.match(a_host):
            raise invalid("an alternate's host is malformed")
        if type(a_port) is not int or not 1 <= a_port <= 65535:  # bool is an int subclass: excluded
            raise invalid("an alternate's port must be an integer 1-65535")
        if (a_host, a_port) in seen:
            raise invalid(f"alternate {a_host}:{a_port} repeats the target or another alternate")
        seen.add((a_host, a_port))
        out.append({"host": a_host, "port": a_port})
    return out


def json_object(body, required=True):
    if not body and not required:
        return {}
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise invalid("the body is not JSON") from None
    if not isinstance(value, dict):
        raise invalid("the body must be a JSON object")
    return value


class State:
    """Everything the gateway knows. Every access holds `lock`: the HTTP server answers on one
    thread per connection and the SMTP listener runs on its own event-loop thread."""

    def __init__(self, path, domains):
        self.lock = threading.Lock()
        self.path, self.domains = path, domains
        self.credentials = {}  # id -> {id, username, allowedFrom, version, sha256}
        self.targets = {}  # id -> {id, address, targetType, host, port, alternates} or {…, peerId}
        self.peers = {}  # id -> {id, kind, verifiers: [{version, verifier, acceptUntil?}]}
        self.passwords = {}  # id -> newest plaintext issued; memory only, never persisted
        # client credentials: id -> {id, clientId, state: candidate|active|revoked, policy, sha256}
        self.client_credentials = {}
        self.client_tokens = {}  # credential id -> token issued; memory only, never persisted
        self.faults = {}  # test-only: {"finalize": status, "provision": status, "certificates": status}
        self.messages = []  # what the SMTP listener accepted
        self.dns_records = {}  # name -> {name, type, values, ttl, clientId?}
        self.routes = {}  # hostname -> {hostname, target: {host, port}, public, clientId}
        # certificates: a CA of this run's own, and what it issued (memory only, never persisted)
        self.ca_key, self.ca = make_ca()
        self.certificates = {}  # name -> {name, certificate, privateKey, notAfter}
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            self.credentials = {c["id"]: c for c in saved.get("credentials", [])}
            self.targets = {t["id"]: t for t in saved.get("targets", [])}
            self.peers = {p["id"]: p for p in saved.get("peers", [])}
            self.client_credentials = {c["id"]: c for c in saved.get("clientCredentials", [])}
            self.dns_records = {r["name"]: r for r in saved.get("dnsRecords", [])}
            self.routes = {r["hostname"]: r for r in saved.get("routes", [])}

    def save(self):
        """Write the state file atomically (temp file + rename), so a gateway killed mid-write
        restarts from the previous state, never a torn one. Called with the lock held."""
        if not self.path:
            return
        data = {"credentials": sorted(self.credentials.values(), key=lambda c: c["id"]),
                "targets": sorted(self.targets.values(), key=lambda t: t["id"]),
                "peers": sorted(self.peers.values(), key=lambda p: p["id"]),
                "clientCredentials": sorted(self.client_credentials.values(), key=lambda c: c["id"]),
                "dnsRecords": sorted(self.dns_records.values(), key=lambda r: r["name"]),
                "routes": sorted(self.routes.values(), key=lambda r: r["hostname"])}
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gateway-state.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise

    # --- SMTP credentials

    @staticmethod
    def view(cred, **extra):
        return {k: cred[k] for k in ("id", "username", "allowedFrom", "version")} | extra

    def issue_password(self, cred):
        password = "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(32))
        cred["sha256"] = sha256_hex(password)
        self.passwords[cred["id"]] = password
        return self.view(cred, password=password)

    def create_credential(self, body):
        cid = check_id(body.get("id"))
        username = check_str(body, "username", USERNAME_RE)
        allowed = body.get("allowedFrom")
        if not isinstance(allowed, list) or not all(
                isinstance(a, str) and len(a) <= 320 and ADDRESS_RE.match(a) for a in allowed):
            raise invalid("allowedFrom must be a list of mail addresses")
        with self.lock:
            if cid in self.credentials:
                raise ApiError(409, "credential-exists", f"credential {cid} exists")
            cred = {"id": cid, "username": username, "allowedFrom": allowed, "version": 1}
            answer = self.issue_password(cred)
            self.credentials[cid] = cred
            self.save()
            return answer

    def credential(self, cid):  # called with the lock held
        if cid not in self.credentials:
            raise ApiError(404, "credential-unknown", f"no credential {cid}")
        return self.credentials[cid]

    def rotate_credential(self, cid):
        with self.lock:
            cred = self.credential(cid)
            cred["version"] += 1
            answer = self.issue_password(cred)  # replaces the hash: the old password is dead now
            self.save()
            return answer

    def get_credential(self, cid):
        with self.lock:
            cred = self.credential(cid)
            return self.view(cred, verifier="sha256:" + cred["sha256"])

    def list_credentials(self, prefix):
        with self.lock:
            return [self.view(c, verifier="sha256:" + c["sha256"])
                    for i, c in sorted(self.credentials.items()) if i.startswith(prefix)]

    def delete_credential(self, cid):
        with self.lock:
            self.credential(cid)
            del self.credentials[cid]
            self.passwords.pop(cid, None)
            self.save()

    def check_password(self, username, password):
        """The credential `username`/`password` authenticates as, or None. Usernames need not be
        unique, so every credential with this username is tried."""
        digest = sha256_hex(password)
        with self.lock:
            for cred in self.credentials.values():
                if cred["username"] == username and hmac.compare_digest(cred["sha256"], digest):
                    return cred["id"], digest
        return None

    def current_allowed_from(self, cid, digest):
        """allowedFrom of the credential a session authenticated as, or None when it has been
        rotated or deleted since: the previous password stops working at once."""
        with self.lock:
            cred = self.credentials.get(cid)
            return list(cred["allowedFrom"]) if cred and cred["sha256"] == digest else None

    # --- forward targets

    def put_target(self, tid, body):
        address = check_str(body, "address", ADDRESS_RE)
        kind = body.get("targetType", "direct")
        if kind == "direct":
            host = check_str(body, "host", HOST_RE)
            port = body.get("port")
            if type(port) is not int or not 1 <= port <= 65535:  # bool is an int subclass: excluded
                raise invalid("port must be an integer 1-65535")
            target = {"id": tid, "address": address, "targetType": "direct", "host": host, "port": port,
                      "alternates": check_alternates(body.get("alternates", []), host, port)}
        elif kind == "coremail":
            if "alternates" in body:
                raise invalid("alternates are for a direct target only")
            peer = check_id(body.get("peerId"))
            target = {"id": tid, "address": address, "targetType": "coremail", "peerId": peer}
        else:
            raise invalid("targetType must be direct or coremail")
        with self.lock:
            if kind == "coremail" and target["peerId"] not in self.peers:
                raise ApiError(404, "peer-unknown", f"no peer {target['peerId']}")
            for other in self.targets.values():
                if other["id"] != tid and same_address(other["address"], address):
                    raise ApiError(409, "address-taken", f"target {other['id']} holds {address}")
            self.targets[tid] = target
            self.save()
            return dict(self.targets[tid])

    def list_targets(self, prefix):
        with self.lock:
            return [dict(t) for i, t in sorted(self.targets.items()) if i.startswith(prefix)]

    def delete_target(self, tid):
        with self.lock:
            if self.targets.pop(tid, None) is None:
                raise ApiError(404, "target-unknown", f"no target {tid}")
            self.save()

    # --- peers

    def put_peer(self, pid, body):
        if body.get("kind") != "coremail":
            raise invalid("kind must be coremail")
        verifiers = body.get("verifiers")
        if not isinstance(verifiers, list) or not 1 <= len(verifiers) <= 8:
            raise invalid("verifiers must be a list of 1-8")
        for v in verifiers:
            if (not isinstance(v, dict) or type(v.get("version")) is not int
                    or not isinstance(v.get("verifier"), str) or not VERIFIER_RE.match(v["verifier"])
                    or ("acceptUntil" in v and type(v["acceptUntil"]) is not int)):
                raise invalid("a verifier is {version, verifier: coremail-v1$<salt>$<sha256>, acceptUntil?}")
        peer = {"id": pid, "kind": "coremail",
                "verifiers": [{k: v[k] for k in ("version", "verifier", "acceptUntil") if k in v}
                              for v in verifiers]}
        with self.lock:
            self.peers[pid] = peer
            self.save()
            return dict(peer)

    def get_peer(self, pid):
        with self.lock:
            if pid not in self.peers:
                raise ApiError(404, "peer-unknown", f"no peer {pid}")
            return dict(self.peers[pid])

    def delete_peer(self, pid):
        with self.lock:
            if pid not in self.peers:
                raise ApiError(404, "peer-unknown", f"no peer {pid}")
            users = [t["id"] for t in self.targets.values() if t.get("peerId") == pid]
            if users:
                raise ApiError(409, "peer-in-use", f"targets still forward to {pid}: {', '.join(users)}")
            del self.peers[pid]
            self.save()


    # --- client enrollment

    def authenticate(self, legacy_token, admin_tokens, given):
        """Who a bearer token is: {"role": "admin"}, {"role": "client", "scopes", ...} or
        {"role": "candidate", ...}; None for a token the gateway does not know."""
        encoded = given.encode("utf-8")
        if hmac.compare_digest(encoded, legacy_token.encode("utf-8")):
            return {"role": "client", "scopes": sorted(SCOPES)}
        if any(hmac.compare_digest(encoded, t.encode("utf-8")) for t in admin_tokens):
            return {"role": "admin"}
        digest = sha256_hex(given)
        with self.lock:
            for cred in self.client_credentials.values():
                if hmac.compare_digest(cred["sha256"], digest):
                    if cred["state"] == "active":
                        return {"role": "client", "clientId": cred["clientId"], "credentialId": cred["id"],
                                "scopes": list(cred["policy"]["scopes"])}
                    if cred["state"] == "candidate":
                        return {"role": "candidate", "clientId": cred["clientId"], "credentialId": cred["id"]}
        return None

    @staticmethod
    def check_policy(body):
        policy = body.get("policy")
        if not isinstance(policy, dict) or set(policy) != {"scopes", "allowedDnsRecordAddresses"}:
            raise invalid("policy must be {scopes, allowedDnsRecordAddresses}")
        scopes, prefixes = policy["scopes"], policy["allowedDnsRecordAddresses"]
        if not isinstance(scopes, list) or not all(isinstance(x, str) and x in SCOPES for x in scopes):
            raise invalid(f"scopes must be a list of {', '.join(sorted(SCOPES))}")
        if not isinstance(prefixes, list) or len(prefixes) > MAX_PREFIXES:
            raise invalid(f"allowedDnsRecordAddresses must be a list of at most {MAX_PREFIXES} prefixes")
        for prefix in prefixes:
            try:
                ipaddress.ip_network(prefix, strict=False)
            except (TypeError, ValueError):
                raise invalid("allowedDnsRecordAddresses holds something that is not an IP network") from None
        return {"scopes": list(scopes), "allowedDnsRecordAddresses": list(prefixes)}

    def provision(self, client_id, body):
        policy = self.check_policy(body)
        with self.lock:
            if self.faults.get("provision"):
                status = self.faults["provision"]
                raise ApiError(status, "provisioning-refused", "provisioning is refused here (test fault)")
            token = "gwc_" + secrets.token_urlsafe(32)
            cred = {"id": "gcc-" + secrets.token_hex(8), "clientId": client_id, "state": "candidate",
                    "policy": policy, "sha256": sha256_hex(token)}
            self.client_credentials[cred["id"]] = cred
            self.client_tokens[cred["id"]] = token
            self.save()
            return {"credentialId": cred["id"], "clientId": client_id, "state": "candidate",
                    "policy": policy, "token": token}

    def finalize(self, who, body):
        if who["role"] not in ("candidate", "client") or "credentialId" not in who:
            raise ApiError(403, "candidate-required", "finalize with the candidate credential's own token")
        if body.get("credentialId") != who["credentialId"]:
            raise invalid("credentialId is not the credential of this token")
        with self.lock:
            if self.faults.get("finalize"):
                status = self.faults["finalize"]
                raise ApiError(status, "finalize-unavailable", "finalizing is unavailable here (test fault)")
            cred = self.client_credentials[who["credentialId"]]
            if cred["state"] == "candidate":
                for other in self.client_credentials.values():
                    if other["clientId"] == cred["clientId"] and other["state"] == "active":
                        other["state"] = "revoked"  # the one before stops working at once
                cred["state"] = "active"
                self.save()
            return {"credentialId": cred["id"], "clientId": cred["clientId"], "state": "active"}

    def put_dns_record(self, who, name, body):
        if not DNS_NAME_RE.match(name):
            raise invalid("the record's name must be a lowercase DNS name")
        kind, values, ttl = body.get("type"), body.get("values"), body.get("ttl")
        if kind not in ("A", "AAAA") or set(body) != {"type", "values", "ttl"}:
            raise invalid("a record is {type: A|AAAA, values, ttl}")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 86400:
            raise invalid("ttl must be 1-86400 seconds")
        if not isinstance(values, list) or not 1 <= len(values) <= 16:
            raise invalid("values must list 1-16 addresses")
        try:
            addresses = [ipaddress.ip_address(v) for v in values]
        except (TypeError, ValueError):
            raise invalid("values must be IP addresses")
        if any(a.version != (4 if kind == "A" else 6) for a in addresses):
            raise invalid(f"an {kind} record holds IPv{4 if kind == 'A' else 6} addresses only")
        with self.lock:
            if "credentialId" in who:
                allowed = [ipaddress.ip_network(p) for p in
                           self.client_credentials[who["credentialId"]]["policy"]["allowedDnsRecordAddresses"]]
                outside = [str(a) for a in addresses if not any(a in net for net in allowed)]
                if outside:
                    raise ApiError(403, "dns-record-address-refused",
                                   f"this credential may not publish {', '.join(outside)}")
            record = {"name": name, "type": kind, "values": [str(a) for a in addresses], "ttl": ttl}
            if "clientId" in who:
                record["clientId"] = who["clientId"]
            self.dns_records[name] = record
            self.save()
            return record

    def delete_dns_record(self, name):
        with self.lock:
            if self.dns_records.pop(name, None) is None:
                raise ApiError(404, "record-unknown", f"no record {name}")
            self.save()

    def certificate(self, who, name):
        """The certificate for exactly `name`: one under a verified domain of this gateway, or a
        name the asking client published a DNS record for. Issued on the first ask, the same
        one after."""
        base = name[2:] if name.startswith("*.") else name
        if not DNS_NAME_RE.match(base):
            raise invalid("the name must be a lowercase DNS name, or *. and one")
        with self.lock:
            if self.faults.get("certificates"):
                status = self.faults["certificates"]
                code = "certificate-pending" if status == 409 else "certificate-unavailable"
                raise ApiError(status, code, f"the certificate for {name} is not ready (test fault)")
            in_domain = self.in_verified_domain(base)
            record = self.dns_records.get(name)
            published = record is not None and "clientId" in who and record.get("clientId") == who["clientId"]
            if not (in_domain or published):
                raise ApiError(404, "name-not-served", f"{name} is in no domain of this gateway and no name this client holds")
            if name not in self.certificates:
                self.certificates[name] = issue(self.ca_key, self.ca, name)
            return dict(self.certificates[name])

    def in_verified_domain(self, name):
        """Whether `name` is one of this gateway's verified domains or a subdomain of one."""
        return any(d["verified"] and (name == d["name"] or name.endswith("." + d["name"])) for d in self.domains)

    # --- routes

    def route_fault(self):  # called with the lock held
        status = self.faults.get("routes")
        if status:
            code = "route-taken" if status == 409 else "unavailable"
            raise ApiError(status, code, "routes cannot be changed here now (test fault)")

    @staticmethod
    def route_owner(who):
        """The client a route written with this token is held by: the credential's client id, or
        None for the legacy `--token` (and for a route an admin token creates)."""
        return who.get("clientId")

    def put_route(self, who, hostname, body):
        if hostname.startswith("*."):
            raise invalid("a route's hostname is one exact name, not a wildcard")
        if not DNS_NAME_RE.match(hostname):
            raise invalid("a route's hostname must be a lowercase DNS name")
        if set(body) != {"target", "public"}:
            raise invalid("a route is {target: {host, port}, public}, nothing else")
        target, public = body["target"], body["public"]
        if not isinstance(target, dict) or set(target) != {"host", "port"}:
            raise invalid("target is {host, port}, nothing else")
        host, port = target["host"], target["port"]
        if not isinstance(host, str):
            raise invalid("target.host must be an IP address or a lowercase DNS name")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not DNS_NAME_RE.match(host):
                raise invalid("target.host must be an IP address or a lowercase DNS name") from None
        if type(port) is not int or not 1 <= port <= 65535:  # bool is an int subclass: excluded
            raise invalid("target.port must be an integer 1-65535")
        if type(public) is not bool:
            raise invalid("public must be true or false")
        with self.lock:
            self.route_fault()
            if not self.in_verified_domain(hostname):
                raise ApiError(404, "name-not-served", f"{hostname} is in no verified domain of this gateway")
            held = self.routes.get(hostname)
            if who["role"] == "admin":
                owner = held["clientId"] if held else None  # an admin replaces, the holder keeps it
            else:
                owner = self.route_owner(who)
                if held and held["clientId"] != owner:
                    raise ApiError(409, "route-taken", f"another client holds the route {hostname}")
            route = {"hostname": hostname, "target": {"host": host, "port": port}, "public": public,
                     "clientId": owner}
            self.routes[hostname] = route
            self.save()
            return json.loads(json.dumps(route))

    def delete_route(self, who, hostname):
        with self.lock:
            self.route_fault()
            held = self.routes.get(hostname)
            if held is None:
                raise ApiError(404, "route-unknown", f"no route {hostname}")
            if who["role"] != "admin" and held["clientId"] != self.route_owner(who):
                raise ApiError(409, "route-taken", f"another client holds the route {hostname}")
            del self.routes[hostname]
            self.save()

    def list_routes(self, who):
        with self.lock:
            return [json.loads(json.dumps(r)) for _, r in sorted(self.routes.items())
                    if who["role"] == "admin" or r["clientId"] == self.route_owner(who)]

    def route(self, hostname):
        """The route for `hostname` (a copy), or None."""
        with self.lock:
            held = self.routes.get(hostname)
            return json.loads(json.dumps(held)) if held else None

    def clients_view(self):
        with self.lock:
            return [{k: c[k] for k in ("id", "clientId", "state", "policy")}
                    for _, c in sorted(self.client_credentials.items())]


def make_ca():
    """A certificate authority for this run: (its key, its certificate)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "capstan test gateway CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(key, hashes.SHA256()))
    return key, ca


def issue(ca_key, ca, name):
    """A certificate for `name` (its only subject alternative name) under `ca`, with a fresh key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    not_after = now + datetime.timedelta(days=CERTIFICATE_DAYS)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode("ascii")
    return {"name": name, "certificate": pem, "privateKey": key_pem,
            "notAfter": int(cert.not_valid_after_utc.timestamp() * 1000)}


def dispatch(state, token, method, target, headers, body, admin_tokens=()):
    """Answer one request: (status, JSON-able payload, or None for no body)."""
    url = urlsplit(target)
    parts = url.path.split("/")[1:]
    query = parse_qs(url.query, keep_blank_values=True)
    who = None
    if parts[:1] == ["v1"]:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        who = state.authenticate(token, admin_tokens, given.strip()) if scheme.lower() == "bearer" else None
        if who is None:
            raise ApiError(401, "unauthorized", "missing or wrong gateway token")
        # a candidate only finalizes; a client reaches what its scopes name; an admin all
        if who["role"] == "candidate" and parts != ["v1", "client", "finalize"] and parts != ["v1", "whoami"]:
            raise ApiError(403, "credential-not-final", "a candidate credential only finalizes itself")
        needed = PATH_SCOPES.get(parts[1] if len(parts) > 1 else "")
        if who["role"] == "client" and needed and needed not in who["scopes"]:
            raise ApiError(403, "scope-missing", f"this credential lacks the scope {needed}")
        if parts[1:2] == ["clients"] and who["role"] != "admin":
            raise ApiError(403, "admin-required", "only an admin token provisions client credentials")

    def prefix():
        p = query.get("prefix", [""])[-1]
        if not PREFIX_RE.match(p):
            raise invalid("prefix must be 0-128 of A-Z a-z 0-9 . _ -")
        return p

    match method, parts:
        case "GET", ["v1", "status"]:
            return 200, {"protocol": 1, "smtpForwardAlternates": True}
        case "GET", ["v1", "whoami"]:
            return 200, who
        case "POST", ["v1", "clients", client_id, "credentials"]:
            return 201, state.provision(check_id(client_id), json_object(body))
        case "POST", ["v1", "client", "finalize"]:
            return 200, state.finalize(who, json_object(body))
        case "GET", ["v1", "domains"]:
            return 200, {"domains": state.domains}
        case "PUT", ["v1", "dns-records", name]:
            return 200, state.put_dns_record(who, name, json_object(body))
        case "DELETE", ["v1", "dns-records", name]:
            state.delete_dns_record(name)
            return 204, None
        case "GET", ["v1", "certificates", name]:
            return 200, state.certificate(who, name)
        case "GET", ["v1", "routes"]:
            return 200, {"routes": state.list_routes(who)}
        case "PUT", ["v1", "routes", hostname]:
            return 200, state.put_route(who, hostname, json_object(body))
        case "DELETE", ["v1", "routes", hostname]:
            state.delete_route(who, hostname)
            return 204, None
        case "GET", ["v1", "dns-records"]:
            with state.lock:
                return 200, {"records": [dict(r) for _, r in sorted(state.dns_records.items())]}
        case "POST", ["v1", "smtp-credentials"]:
            return 201, state.create_credential(json_object(body))
        case "GET", ["v1", "smtp-credentials"]:
            return 200, {"credentials": state.list_credentials(prefix())}
        case "POST", ["v1", "smtp-credentials", cid, "rotate"]:
            check_id(cid)
            json_object(body, required=False)  # `{}`; its content is not used
            return 200, state.rotate_credential(cid)
        case "GET", ["v1", "smtp-credentials", cid]:
            return 200, state.get_credential(check_id(cid))
        case "DELETE", ["v1", "smtp-credentials", cid]:
            state.delete_credential(check_id(cid))
            return 204, None
        case "GET", ["v1", "smtp-forward-targets"]:
            return 200, {"targets": state.list_targets(prefix())}
        case "PUT", ["v1", "smtp-forward-targets", tid]:
            check_id(tid)
            return 200, state.put_target(tid, json_object(body))
        case "DELETE", ["v1", "smtp-forward-targets", tid]:
            state.delete_target(check_id(tid))
            return 204, None
        case "GET", ["v1", "peers", pid]:
            return 200, state.get_peer(check_id(pid))
        case "PUT", ["v1", "peers", pid]:
            check_id(pid)
            return 200, state.put_peer(pid, json_object(body))
        case "DELETE", ["v1", "peers", pid]:
            state.delete_peer(check_id(pid))
            return 204, None
        # Test-only, outside the protocol, without a token.
        case "GET", ["test", "clients"]:
            return 200, {"credentials": state.clients_view()}
        case "GET", ["test", "client-tokens", credential_id]:
            with state.lock:
                if credential_id not in state.client_tokens:
                    raise ApiError(404, "token-unknown", f"no token issued for {credential_id} here")
                return 200, {"token": state.client_tokens[credential_id]}
        case "PUT", ["test", "faults"]:
            faults = json_object(body)
            faults = {k: v for k, v in faults.items() if k in ("finalize", "provision", "certificates", "routes") and v}
            if not all(type(v) is int and 400 <= v <= 599 for v in faults.values()):
                raise invalid("a fault is an HTTP status 400-599")
            with state.lock:
                state.faults = faults
                return 200, dict(state.faults)
        case "GET", ["test", "ca"]:
            return 200, {"certificate": state.ca.public_bytes(serialization.Encoding.PEM).decode("ascii")}
        case "GET", ["test", "messages"]:
            with state.lock:
                return 200, {"messages": list(state.messages)}
        case "GET", ["test", "passwords", cid]:
            check_id(cid)
            with state.lock:
                if cid not in state.passwords:
                    raise ApiError(404, "password-unknown", f"no password issued for {cid} here")
                return 200, {"password": state.passwords[cid]}
    match parts:
        case (["v1", "status" | "whoami" | "domains" | "smtp-credentials" | "smtp-forward-targets" | "dns-records" | "routes"]
              | ["v1", "dns-records" | "certificates" | "routes", _] | ["test", "ca"]
              | ["v1", "clients", _, "credentials"] | ["v1", "client", "finalize"] | ["test", "clients" | "faults"] | ["test", "client-tokens", _]
              | ["v1", "smtp-credentials" | "smtp-forward-targets" | "peers", _]
              | ["v1", "smtp-credentials", _, "rotate"] | ["test", "messages"] | ["test", "passwords", _]):
            raise ApiError(405, "method-not-allowed", f"{method} is not allowed on {url.path}")
    raise ApiError(404, "not-found", f"no such path {url.path}")


class HttpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Capstan's client pools connections
    server_version = "capstan-test-gateway/1"

    def answer(self):
        method = self.command
        try:
            # The body is read before anything is checked, so the connection stays in step.
            if "transfer-encoding" in self.headers:
                self.close_connection = True
                raise ApiError(411, "length-required", "send the body with a content-length")
            try:
                length = int(self.headers.get("content-length", "0"))
            except ValueError:
                length = -1
            if length < 0:
                self.close_connection = True
                raise invalid("bad content-length")
            body = self.rfile.read(length)
            status, payload = dispatch(self.server.state, self.server.token, method, self.path,
                                       self.headers, body, self.server.admin_tokens)
        except ApiError as e:
            status, payload = e.status, {"error": {"code": e.code, "message": e.message}}
        except Exception:
            logging.exception("answering %s %s", method, self.path)
            status, payload = 500, {"error": {"code": "internal", "message": "gateway error"}}
        self.send_response(status)
        if payload is None:  # 204: no body and, per RFC 9110 §8.6, no content-length either
            self.end_headers()
            return
        data = json.dumps(payload).encode("utf-8")
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # PATCH is not in the protocol: it is answered 405 in JSON rather than 501 in HTML.
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer


def request_hostname(host_header):
    """The hostname a Host header names: lower-cased, its port dropped ("" for none)."""
    host = (host_header or "").strip().lower()
    if host.startswith("["):  # an IPv6 literal, [addr]:port
        return host[:host.find("]") + 1] if "]" in host else host
    return host.rpartition(":")[0] if ":" in host else host


def connection_named(headers):
    """The header names a Connection header lists: hop-by-hop too."""
    return {n.strip().lower() for v in headers.get_all("connection", []) for n in v.split(",") if n.strip()}


class ForwardHandler(BaseHTTPRequestHandler):
    """The forwarding listener: picks the route by the Host header and passes the request to its
    target over HTTP/1.1, and the target's answer back. The gateway's own refusals are JSON in
    the protocol's error shape."""
    protocol_version = "HTTP/1.1"
    server_version = "capstan-test-gateway-forward/1"

    def refuse(self, status, code, message):
        data = json.dumps({"error": {"code": code, "message": message}}).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def read_body(self):
        """The request body (content-length or chunked); None when it cannot be read."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    return None
                if size == 0:
                    while self.rfile.readline(8192).strip():  # trailers, dropped
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(8)  # the CRLF after the chunk
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            return None
        return self.rfile.read(length) if length >= 0 else None

    def answer(self):
        body = self.read_body()
        if body is None:
            self.close_connection = True
            return self.refuse(400, "invalid-request", "bad content-length or chunked body")
        original_host = self.headers.get("host", "")
        hostname = request_hostname(original_host)
        route = self.server.state.route(hostname)
        if route is None:
            return self.refuse(404, "route-unknown", f"no route for {hostname or 'a request without Host'}")
        source = ipaddress.ip_address(self.client_address[0])
        if not route["public"] and not any(source in net for net in self.server.private_sources):
            return self.refuse(403, "route-not-public", f"{hostname} is not public and this source is not admitted")
        drop = HOP_BY_HOP | FORWARD_SET | connection_named(self.headers)
        target = route["target"]
        conn = http.client.HTTPConnection(target["host"], target["port"], timeout=FORWARD_TIMEOUT)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("host", hostname)
            for name, value in self.headers.items():
                if name.lower() not in drop:
                    conn.putheader(name, value)
            conn.putheader("x-forwarded-for", self.client_address[0])
            conn.putheader("x-forwarded-host", original_host.strip())
            conn.putheader("x-forwarded-proto", "http")
            if body or self.command in ("POST", "PUT", "PATCH"):
                conn.putheader("content-length", str(len(body)))
            conn.endheaders(body or None)
            response = conn.getresponse()
            data = response.read()
            headers = response.getheaders()
        except (OSError, http.client.HTTPException) as e:
            logging.info("forwarding %s to %s:%s: %s", hostname, target["host"], target["port"], type(e).__name__)
            return self.refuse(502, "route-target-unreachable",
                               f"the target of {hostname} did not answer ({type(e).__name__})")
        finally:
            conn.close()
        dropped = HOP_BY_HOP | {n.strip().lower() for name, v in headers if name.lower() == "connection"
                                for n in v.split(",") if n.strip()}
        # The target's own Server and Date pass through: not send_response, which adds this one's.
        self.log_request(response.status)
        self.send_response_only(response.status, response.reason)
        for name, value in headers:
            if name.lower() not in dropped:
                self.send_header(name, value)
        no_body = self.command == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200
        if self.command == "HEAD" and response.getheader("content-length") is not None:
            self.send_header("content-length", response.getheader("content-length"))
        elif not no_body:
            self.send_header("content-length", str(len(data)))
        self.end_headers()
        if not no_body:
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = answer


class SubmissionHandler:
    """aiosmtpd hooks for the submission listener. aiosmtpd itself refuses MAIL before AUTH
    (auth_required) and answers 535 when `authenticate` fails."""

    def __init__(self, state):
        self.state = state

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        # Only the built-in PLAIN and LOGIN are offered; both hand over a LoginPassword.
        if not isinstance(auth_data, LoginPassword):
            return AuthResult(success=False, handled=False)
        try:
            username = auth_data.login.decode("utf-8")
            password = auth_data.password.decode("utf-8")
        except UnicodeDecodeError:
            return AuthResult(success=False, handled=False)
        found = self.state.check_password(username, password)
        if found is None:
            return AuthResult(success=False, handled=False)
        return AuthResult(success=True, auth_data=(*found, username))

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        cid, digest, _ = session.auth_data
        allowed = self.state.current_allowed_from(cid, digest)
        if allowed is None:
            return "535 5.7.8 credential rotated or deleted since AUTH"
        if not any(same_address(address, a) for a in allowed):
            return "553 5.7.1 sender not allowed for this credential"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        message = {"username": session.auth_data[2], "mailFrom": envelope.mail_from,
                   "rcptTos": list(envelope.rcpt_tos),
                   "data": envelope.content.decode("utf-8", "replace")}
        with self.state.lock:
            self.state.messages.append(message)
        return "250 2.0.0 message accepted"


def port(text):
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port is 1-65535")
    return value


def network(text):
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise argparse.ArgumentTypeError("a private source is an IP network, e.g. 10.0.0.0/8") from None


def main():
    parser = argparse.ArgumentParser(description="Capstan's test mail gateway")
    parser.add_argument("--http-port", type=port, required=True)
    parser.add_argument("--smtp-port", type=port, required=True)
    parser.add_argument("--token", required=True, help="a client token with every scope")
    parser.add_argument("--admin-token", action="append", default=[],
                        help="an admin token (provisions client credentials)")
    parser.add_argument("--domain", action="append", default=[], help="a verified mail domain")
    parser.add_argument("--unverified-domain", action="append", default=[])
    parser.add_argument("--state", help="JSON file keeping credentials and targets across restarts")
    parser.add_argument("--forward-port", type=port,
                        help="a plain-HTTP listener forwarding requests by the routes (Host header)")
    parser.add_argument("--private-source", action="append", default=[], type=network,
                        help="an IP network whose sources a route with public: false is forwarded for")
    args = parser.parse_args()
    if not args.token:
        parser.error("--token must not be empty")

    logging.basicConfig(level=logging.INFO, format="gateway: %(levelname)s %(message)s")
    # AUTH over plain TCP is the point here (loopback, tests): silence aiosmtpd's per-connection
    # warning about it, and its per-command info lines.
    warnings.filterwarnings("ignore", message="Requiring AUTH while not requiring TLS")
    logging.getLogger("mail.log").setLevel(logging.ERROR)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    domains = ([{"name": d, "verified": True} for d in args.domain]
               + [{"name": d, "verified": False} for d in args.unverified_domain])
    state = State(args.state, domains)

    httpd = ThreadingHTTPServer(("127.0.0.1", args.http_port), HttpHandler)
    httpd.state, httpd.token, httpd.admin_tokens = state, args.token, tuple(args.admin_token)
    # A short poll interval: shutdown() waits up to one of them.
    threading.Thread(target=httpd.serve_forever, args=(0.1,), name="http", daemon=True).start()

    forwarder = None
    if args.forward_port:
        forwarder = ThreadingHTTPServer(("127.0.0.1", args.forward_port), ForwardHandler)
        forwarder.state, forwarder.private_sources = state, tuple(args.private_source)
        threading.Thread(target=forwarder.serve_forever, args=(0.1,), name="forward", daemon=True).start()

    handler = SubmissionHandler(state)
    smtpd = Controller(handler, hostname="127.0.0.1", port=args.smtp_port,
                       server_hostname="gateway.test",  # skips a getfqdn() DNS lookup
                       authenticator=handler.authenticate, auth_required=True,
                       auth_require_tls=False)
    smtpd.start()  # returns once the listener answers; raises if it cannot bind

    forward = f" forward={args.forward_port}" if forwarder else ""
    print(f"gateway ready http={args.http_port} smtp={args.smtp_port}{forward}", flush=True)
    stop.wait()
    smtpd.stop()
    if forwarder:
        forwarder.shutdown()
        forwarder.server_close()
    httpd.shutdown()
    httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
