#!/usr/bin/env bash
# Registry push and pull: Capstan's /v2 registry against the CNCF distribution registry
# (Debian's `docker-registry`), the same image through skopeo, interleaved in one run.
# Goal: Capstan's push and pull time within 1.2x of distribution's, and its peak RSS bounded
# independent of layer size. A benchmark run by hand (not a test; CI never runs it), on an idle
# machine: skopeo and the server share the 2 cores, so a build running beside it skews the times.
#
# Usage:
#   apt-get install -y docker-registry skopeo python3          # once
#   CARGO_TARGET_DIR=/var/tmp/capstan-target cargo build --release -p capstan
#   tests/load/registry_vs_distribution.sh
#
# Environment (all optional):
#   ROUNDS=3          interleaved rounds; the ratios are the medians over them
#   LAYERS=5          layers per image
#   TOTAL_MB=200      the image's size in MiB: random (incompressible) data, tar.gz layers of
#                     halving size (5 layers of 200 MiB: 103, 52, 26, 13, 6 MiB); run it again
#                     with TOTAL_MB=1000 to see whether Capstan's peak RSS follows layer size
#   CAPSTAN_BIN=/var/tmp/capstan-target/release/capstan
#   REGISTRY_BIN=docker-registry
#   ONLY=distribution only distribution (before Capstan has a registry); ONLY=capstan the other
#   WORK=<dir>        where the images, both registries' storage and the pulls go (default a
#                     new directory under ${TMPDIR:-/var/tmp}, removed at the end; KEEP=1 keeps
#                     it); about (2 x ROUNDS + 2) x TOTAL_MB of disk at the peak, checked first
#
# What it does: starts docker-registry on 127.0.0.1:<free port> with a filesystem root under
# WORK (no auth), and `capstan serve --dev` on another free port with a data dir under WORK and
# CAPSTAN_ADMIN_ACCOUNT=admin:<random>. Then per round: builds an OCI layout (python3, standard
# library only; untimed) of LAYERS tar.gz layers of random data and a config whose
# rootfs.diff_ids match, pushes it to each registry as bench/image-<round>:bench
# (Capstan: an unmapped repository, which administrators may push), then pull it back from
# each into a fresh oci: directory, `sync` before each and `date +%s.%N` around each skopeo
# copy. Which registry goes first alternates by round. It checks each pull's manifest digest
# against the source's, prints a table, the median ratios Capstan / distribution and both
# servers' peak RSS (VmHWM in /proc/<pid>/status): the peak while starting, then the peak during
# the transfers alone (the high-water mark is reset through /proc/<pid>/clear_refs once both
# answer). Then it stops both servers and cleans up.
#
# Why a fresh image per round, not only a fresh repository: skopeo keeps a blob info cache
# (/var/lib/containers/cache/blob-info-cache-v1.boltdb for root) of where it has seen each
# blob, and a push to a new repository of the same registry mounts known blobs from the old
# one (POST ?mount=&from=) instead of uploading them: round 2 would measure only mounts.
set -euo pipefail

ROUNDS="${ROUNDS:-3}"
LAYERS="${LAYERS:-5}"
TOTAL_MB="${TOTAL_MB:-200}"
CAPSTAN_BIN="${CAPSTAN_BIN:-/var/tmp/capstan-target/release/capstan}"
REGISTRY_BIN="${REGISTRY_BIN:-docker-registry}"
ONLY="${ONLY:-}"

case "$ONLY" in "" | distribution | capstan) ;; *) echo "ONLY is distribution or capstan" >&2; exit 2 ;; esac
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

for tool in skopeo python3 curl; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y $tool)" >&2; exit 2; }
done
if want distribution && ! command -v "$REGISTRY_BIN" >/dev/null; then
    echo "missing $REGISTRY_BIN (apt-get install -y docker-registry)" >&2; exit 2
fi
if want capstan && [ ! -x "$CAPSTAN_BIN" ]; then
    echo "missing $CAPSTAN_BIN (cargo build --release -p capstan, or set CAPSTAN_BIN)" >&2; exit 2
fi

if [ -n "${WORK:-}" ]; then
    mkdir -p "$WORK"
else
    WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/registry-bench.XXXXXX")"
fi
# at the peak: the round's image, every round's copy in each registry, one pull, and slack
need_mb=$((TOTAL_MB * (2 * ROUNDS + 2) + 1024))
free_mb=$(df -Pm "$WORK" | awk 'NR == 2 { print $4 }')
if [ "$free_mb" -lt "$need_mb" ]; then
    echo "$WORK has $free_mb MiB free; this run needs about $need_mb MiB (set WORK elsewhere, or lower ROUNDS or TOTAL_MB)" >&2
    rmdir "$WORK" 2>/dev/null || true
    exit 2
fi
echo "$ROUNDS round(s) of a $TOTAL_MB MiB image ($LAYERS layers of random data), in $WORK"
echo "$(skopeo --version); load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
LOG="$WORK/skopeo.log"
RESULTS="$WORK/results.tsv"
: >"$LOG"
: >"$RESULTS"

DIST_PID=""
CAPSTAN_PID=""
cleanup() {
    local rc=$?
    for pid in $DIST_PID $CAPSTAN_PID; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ "${KEEP:-0}" = 1 ] || [ "$rc" -ne 0 ]; then
        echo "work directory kept: $WORK" >&2
        # the images and stores are most of it; the logs are what explains a failure
        [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"/image-* "$WORK"/pull-* "$WORK"/distribution "$WORK"/capstan/blobs
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

kib() { # field of /proc/<pid>/status in KiB
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}

# -- the images -------------------------------------------------------------------------------

# each round's image is built before the round (untimed) and removed after it
cat >"$WORK/make_image.py" <<'PY'
"""An OCI image layout of random tar.gz layers, tagged `bench`; prints the manifest digest."""
import gzip, hashlib, json, os, sys, tarfile

out, layers, total_mb, round_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
blobs = os.path.join(out, "blobs", "sha256")
os.makedirs(blobs)


class Hashing:
    """A writer that hashes and counts what passes through."""

    def __init__(self, inner):
        self.inner, self.sha, self.size = inner, hashlib.sha256(), 0

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        return self.inner.write(data)

    def flush(self):
        pass


class Random:
    """A reader of `left` random bytes."""

    def __init__(self, left):
        self.left = left

    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return os.urandom(n)


def put(data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


# halving sizes: the first layer is about half the image
weights = [2 ** (layers - 1 - i) for i in range(layers)]
sizes = [(total_mb << 20) * w // sum(weights) for w in weights]
descriptors, diff_ids = [], []
for i, size in enumerate(sizes):
    tmp = os.path.join(blobs, "layer.tmp")
    with open(tmp, "wb") as raw:
        compressed = Hashing(raw)
        with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=1, mtime=0) as gz:
            plain = Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                info = tarfile.TarInfo(f"bench/round-{round_}/layer-{i}.bin")
                info.size, info.mode, info.mtime = size, 0o644, 0
                tar.addfile(info, Random(size))
    digest = compressed.sha.hexdigest()
    os.rename(tmp, os.path.join(blobs, digest))
    diff_ids.append("sha256:" + plain.sha.hexdigest())
    descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": "sha256:" + digest, "size": compressed.size})

config = {
    "created": "2026-01-01T00:00:00Z",
    "architecture": "amd64",
    "os": "linux",
    "config": {"Cmd": ["/bin/true"], "Labels": {"capstan.bench.round": round_}},
    "rootfs": {"type": "layers", "diff_ids": diff_ids},
    "history": [{"created": "2026-01-01T00:00:00Z", "created_by": f"bench layer {i}"} for i in range(layers)],
}
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
               **put(json.dumps(config, separators=(",", ":")).encode())},
    "layers": descriptors,
}
manifest_desc = put(json.dumps(manifest, separators=(",", ":")).encode())
index = {"schemaVersion": 2, "manifests": [{
    "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
    "annotations": {"org.opencontainers.image.ref.name": "bench"}}]}
with open(os.path.join(out, "index.json"), "w") as f:
    json.dump(index, f)
with open(os.path.join(out, "oci-layout"), "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
print(manifest_desc["digest"])
PY

build_image() { # round: $WORK/image-<round>, its manifest digest in $WORK/image-<round>.digest
    python3 "$WORK/make_image.py" "$WORK/image-$1" "$LAYERS" "$TOTAL_MB" "$1" >"$WORK/image-$1.digest"
}

manifest_of() { # the manifest digest an OCI layout's index.json names
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1] + "/index.json"))["manifests"][0]["digest"])' "$1"
}

# -- the servers ------------------------------------------------------------------------------

wait_for() { # name pid url expected-status log
    local status=""
    for _ in $(seq 1 1200); do
        if ! kill -0 "$2" 2>/dev/null; then
            echo "$1 exited while starting; its log ($5):" >&2; tail -n 30 "$5" >&2; exit 1
        fi
        status="$(curl -s -o /dev/null -w '%{http_code}' "$3" || true)"
        [ "$status" = "$4" ] && return 0
        sleep 0.1
    done
    echo "$1 did not answer $4 at $3 within 120 s (last: $status); its log ($5):" >&2
    tail -n 30 "$5" >&2
    exit 1
}

if want distribution; then
    DIST_PORT="$(free_port)"
    mkdir -p "$WORK/distribution"
    cat >"$WORK/distribution.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $WORK/distribution
http:
  addr: 127.0.0.1:$DIST_PORT
  secret: registry-bench-not-a-secret
EOF
    "$REGISTRY_BIN" serve "$WORK/distribution.yml" >"$WORK/distribution.log" 2>&1 &
    DIST_PID=$!
    wait_for distribution "$DIST_PID" "http://127.0.0.1:$DIST_PORT/v2/" 200 "$WORK/distribution.log"
    echo "distribution $("$REGISTRY_BIN" --version 2>/dev/null | awk '{ print $NF }') on 127.0.0.1:$DIST_PORT (pid $DIST_PID)"
fi

if want capstan; then
    CAPSTAN_PORT="$(free_port)"
    ADMIN_PASSWORD="bench-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
    CAPSTAN_ADMIN_ACCOUNT="admin:$ADMIN_PASSWORD" CAPSTAN_LOG="${CAPSTAN_LOG:-warn}" \
        "$CAPSTAN_BIN" serve --dev --data-dir "$WORK/capstan" --listen "127.0.0.1:$CAPSTAN_PORT" \
        >"$WORK/capstan.log" 2>&1 &
    CAPSTAN_PID=$!
    wait_for capstan "$CAPSTAN_PID" "http://127.0.0.1:$CAPSTAN_PORT/healthz" 200 "$WORK/capstan.log"
    status="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$CAPSTAN_PORT/v2/")"
    if [ "$status" != 401 ]; then
        echo "capstan answers GET /v2/ with $status, not 401: this binary has no registry ($CAPSTAN_BIN)" >&2
        exit 1
    fi
    echo "capstan $("$CAPSTAN_BIN" --version 2>/dev/null | awk '{ print $NF }') on 127.0.0.1:$CAPSTAN_PORT (pid $CAPSTAN_PID), RSS after start $(kib "$CAPSTAN_PID" VmRSS) KiB"
fi

# -- the rounds -------------------------------------------------------------------------------

# the peak while starting, then the high-water mark reset to the current RSS (Linux >= 4.0; the
# process is ours), so the peak reported at the end is the transfers' alone
START_HWM=()
for pid in $DIST_PID $CAPSTAN_PID; do
    name="$(awk '$1 == "Name:" { print $2 }' "/proc/$pid/status")"
    case "$name" in
        capstan | docker-registry) ;;
        *) echo "pid $pid is $name, not a server: its RSS would mean nothing" >&2; exit 1 ;;
    esac
    START_HWM+=("$name $(kib "$pid" VmHWM)")
    echo 5 >"/proc/$pid/clear_refs" 2>/dev/null || echo "could not reset $name's VmHWM: its peak includes the start" >&2
done

# skopeo copy with each registry's flags; plain http on loopback for both
copy_args() { # registry push|pull
    case "$1/$2" in
        distribution/push) echo "--dest-tls-verify=false --dest-no-creds" ;;
        distribution/pull) echo "--src-tls-verify=false --src-no-creds" ;;
        capstan/push) echo "--dest-tls-verify=false --dest-creds admin:$ADMIN_PASSWORD" ;;
        capstan/pull) echo "--src-tls-verify=false --src-creds admin:$ADMIN_PASSWORD" ;;
    esac
}

address() {
    case "$1" in distribution) echo "127.0.0.1:$DIST_PORT" ;; capstan) echo "127.0.0.1:$CAPSTAN_PORT" ;; esac
}

timed_copy() { # round registry push|pull src dst
    local t0 t1 seconds
    sync
    t0="$(date +%s.%N)"
    # shellcheck disable=SC2046 # the flags are words
    if ! skopeo copy --quiet $(copy_args "$2" "$3") "$4" "$5" >>"$LOG" 2>&1; then
        echo "round $1: $3 $2 failed: skopeo copy $4 $5; the end of $LOG:" >&2
        tail -n 20 "$LOG" >&2
        exit 1
    fi
    t1="$(date +%s.%N)"
    seconds="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$seconds" >>"$RESULTS"
    printf '  round %s  %-12s %s  %8s s\n' "$1" "$2" "$3" "$seconds"
}

registries=()
want distribution && registries+=(distribution)
want capstan && registries+=(capstan)

for round in $(seq 1 "$ROUNDS"); do
    order=("${registries[@]}")
    if [ "${#order[@]}" = 2 ] && [ $((round % 2)) = 0 ]; then order=("${order[1]}" "${order[0]}"); fi
    build_image "$round"
    echo "round $round (${order[*]})"
    echo "== round $round" >>"$LOG"
    repo="bench/image-$round"
    for registry in "${order[@]}"; do
        timed_copy "$round" "$registry" push "oci:$WORK/image-$round:bench" "docker://$(address "$registry")/$repo:bench"
    done
    for registry in "${order[@]}"; do
        dst="$WORK/pull-$round-$registry"
        timed_copy "$round" "$registry" pull "docker://$(address "$registry")/$repo:bench" "oci:$dst:bench"
        got="$(manifest_of "$dst")"
        expected="$(cat "$WORK/image-$round.digest")"
        if [ "$got" != "$expected" ]; then
            echo "round $round: the image pulled from $registry has manifest $got, pushed $expected" >&2
            exit 1
        fi
        rm -rf "$dst"
    done
    rm -rf "$WORK/image-$round"
done

# -- the report -------------------------------------------------------------------------------

echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg) (the figures mean little on a busy machine)"
HWM=("${START_HWM[@]}")
for pid in $DIST_PID $CAPSTAN_PID; do
    HWM+=("$(awk '$1 == "Name:" { print $2 }' "/proc/$pid/status") $(kib "$pid" VmHWM) $(kib "$pid" VmRSS)")
done

python3 - "$RESULTS" "$TOTAL_MB" "$LAYERS" "${HWM[@]}" <<'PY'
import statistics, sys

results, total_mb, layers = sys.argv[1:4]
starts = [a.split() for a in sys.argv[4:] if len(a.split()) == 2]  # name, VmHWM at start
ends = [a.split() for a in sys.argv[4:] if len(a.split()) == 3]  # name, VmHWM since, VmRSS now
total_mb = int(total_mb)
times = {}  # (round, registry, op) -> seconds
for line in open(results):
    round_, registry, op, seconds = line.split("\t")
    times[(int(round_), registry, op)] = float(seconds)
rounds = sorted({r for r, _, _ in times})
registries = [r for r in ("distribution", "capstan") if any(k[1] == r for k in times)]

print(f"\n{total_mb} MiB image, {layers} layers, skopeo over plain http on loopback, local filesystem")
print()
head = "| round |" + "".join(f" {r} {op} |" for op in ("push", "pull") for r in registries)
if len(registries) == 2:
    head += " push ratio | pull ratio |"
print(head)
print("|---:|" + "---:|" * (head.count("|") - 2))
for r in rounds:
    row = f"| {r} |"
    for op in ("push", "pull"):
        for reg in registries:
            s = times[(r, reg, op)]
            row += f" {s:.2f} s ({total_mb / s:.0f} MiB/s) |"
    if len(registries) == 2:
        for op in ("push", "pull"):
            row += f" {times[(r, 'capstan', op)] / times[(r, 'distribution', op)]:.2f} |"
    print(row)
print()
for reg in registries:
    for op in ("push", "pull"):
        m = statistics.median(times[(r, reg, op)] for r in rounds)
        print(f"median {reg:12} {op}: {m:6.2f} s  ({total_mb / m:.0f} MiB/s)")
if len(registries) == 2:
    for op in ("push", "pull"):
        ratio = statistics.median(times[(r, "capstan", op)] / times[(r, "distribution", op)] for r in rounds)
        verdict = "within" if ratio <= 1.2 else "OVER"
        print(f"median ratio capstan/distribution {op}: {ratio:.2f}  ({verdict} the 1.2 goal)")
largest = total_mb * 2 ** (int(layers) - 1) / (2 ** int(layers) - 1)
print(f"\npeak RSS (VmHWM), largest layer {largest:.0f} MiB:")
start_of = dict(starts)
for name, hwm, rss in ends:
    label = "distribution" if name == "docker-registry" else name
    print(f"  {label:12} during the transfers {int(hwm) / 1024:4.0f} MiB"
          f"   (while starting {int(start_of.get(name, 0)) / 1024:.0f} MiB, at the end {int(rss) / 1024:.0f} MiB)")
PY
