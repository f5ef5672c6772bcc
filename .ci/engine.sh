# Sourced by .ci/peers.sh (PEERS_DIR, PEER_PIDS and stop_peers come from there): the container
# engine peer. Podman's Docker-compatible API service on a unix socket, its storage under
# $PEERS_DIR/engine, and a test image built locally (no registry outside is reachable), for the
# node agent's engine driver tests (agent/src/engine). The shared notes' PEERS.md, "Container
# engine", records why the configuration is what it is.
#
#   CAPSTAN_TEST_ENGINE_SOCKET          the service's unix socket (Docker Engine API, v1.41)
#   CAPSTAN_TEST_ENGINE_IMAGE           localhost/capstan-test-httpd:1: busybox httpd -f -p 8080
#                                       -h /www, from scratch (~2 MB), in that engine's storage
#   CAPSTAN_TEST_ENGINE_CONTAINERS_CONF the containers.conf it runs with, for tests that start
#                                       engines of their own (one per network namespace; each
#                                       with its own --root, --runroot and --tmpdir, where
#                                       lock_type "file" keeps its locks)
#   CAPSTAN_TEST_REQUIRE_ENGINE=1       the engine tests fail instead of skipping without them

engine_started=$SECONDS
ENGINE_DIR="$PEERS_DIR/engine"
mkdir -p "$ENGINE_DIR/build/rootfs/bin" "$ENGINE_DIR/build/rootfs/www"

# From Debian when missing (the package lists are refreshed only if the install cannot find
# them). busybox-static is the test image's one binary.
engine_need=()
# docker-registry (the distribution registry) stands in for Docker Hub in the demo node test
# (tests/e2e/appstore_demo.rs).
for engine_tool in podman:podman runc:runc buildah:buildah /bin/busybox:busybox-static docker-registry:docker-registry; do
    if [ "${engine_tool%%:*}" = /bin/busybox ]; then
        [ -x /bin/busybox ] || engine_need+=("${engine_tool#*:}")
    else
        command -v "${engine_tool%%:*}" >/dev/null || engine_need+=("${engine_tool#*:}")
    fi
done
if [ "${#engine_need[@]}" -gt 0 ]; then
    echo "installing ${engine_need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q "${engine_need[@]}"; then
        apt-get update -q
        apt-get install -y -q "${engine_need[@]}"
    fi
fi
podman --version
buildah --version

# No CAP_SYS_RESOURCE here: a container's rlimits must not exceed the hard limits the service
# has (else runc fails "error setting rlimit type 7"); crun refuses this machine's cgroup
# layout, runc takes it; no systemd. lock_type "file" keeps this engine's locks in its own
# --tmpdir instead of the machine-wide shared memory segment other podman runs use.
engine_nofile=$(ulimit -Hn)
engine_nproc=$(ulimit -Hu)
[ "$engine_nofile" = unlimited ] && engine_nofile=1048576
{ [ "$engine_nproc" = unlimited ] || [ "$engine_nproc" -gt 32768 ]; } && engine_nproc=32768
cat >"$ENGINE_DIR/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$engine_nofile:$engine_nofile", "nproc=$engine_nproc:$engine_nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
lock_type = "file"
EOF

# every podman or buildah command on this engine's storage
engine_storage=(--storage-driver vfs --root "$ENGINE_DIR/root" --runroot "$ENGINE_DIR/run")
engine_podman() {
    CONTAINERS_CONF="$ENGINE_DIR/containers.conf" podman "${engine_storage[@]}" --tmpdir "$ENGINE_DIR/tmp" "$@"
}

# Containers a test left behind are removed while the service still runs (their conmon
# processes and shm mounts would outlive it), then the service is stopped.
engine_stop() {
    engine_podman rm --all --force --time 0 >/dev/null 2>&1 || true
    if [ -n "${ENGINE_PID:-}" ]; then
        kill "$ENGINE_PID" 2>/dev/null || true
        wait "$ENGINE_PID" 2>/dev/null || true
    fi
    grep -o " $ENGINE_DIR/[^ ]*" /proc/mounts 2>/dev/null | sort -r | xargs -r umount -l 2>/dev/null || true
}
trap 'engine_stop; stop_peers' EXIT

ENGINE_SOCKET="$ENGINE_DIR/engine.sock"
# a simple command, not the function: $! is then podman's own pid (a function in the background
# is a subshell, and killing it would leave the service running)
CONTAINERS_CONF="$ENGINE_DIR/containers.conf" podman "${engine_storage[@]}" --tmpdir "$ENGINE_DIR/tmp" \
    system service --time=0 "unix://$ENGINE_SOCKET" >"$ENGINE_DIR/service.log" 2>&1 &
ENGINE_PID=$!
PEER_PIDS+=("$ENGINE_PID")
engine_up=
for _ in $(seq 1 150); do
    if curl -fsS --max-time 2 --unix-socket "$ENGINE_SOCKET" http://engine/v1.41/version >"$ENGINE_DIR/version.json" 2>/dev/null; then
        engine_up=1
        break
    fi
    sleep 0.2
done
if [ -z "$engine_up" ]; then
    echo "the container engine (podman system service) did not answer on $ENGINE_SOCKET; its log:" >&2
    cat "$ENGINE_DIR/service.log" >&2 || true
    exit 1
fi
echo "container engine is up on $ENGINE_SOCKET: $(python3 -c 'import json,sys; v=json.load(sys.stdin); print(v.get("Version"), "API", v.get("ApiVersion"))' <"$ENGINE_DIR/version.json")"

# The test image, into the engine's own storage: FROM scratch, busybox httpd serving /www.
ENGINE_IMAGE=localhost/capstan-test-httpd:1
cp /bin/busybox "$ENGINE_DIR/build/rootfs/bin/busybox"
echo 'capstan test httpd' >"$ENGINE_DIR/build/rootfs/www/index.html"
cat >"$ENGINE_DIR/build/Containerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
EXPOSE 8080
ENTRYPOINT ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]
EOF
if ! buildah "${engine_storage[@]}" bud --quiet -t "$ENGINE_IMAGE" -f "$ENGINE_DIR/build/Containerfile" \
    "$ENGINE_DIR/build" >"$ENGINE_DIR/build.log" 2>&1; then
    echo "building the test image $ENGINE_IMAGE with buildah failed:" >&2
    cat "$ENGINE_DIR/build.log" >&2
    exit 1
fi
if ! curl -fsS --max-time 5 --unix-socket "$ENGINE_SOCKET" "http://engine/v1.41/images/$ENGINE_IMAGE/json" >/dev/null; then
    echo "the engine does not list the test image $ENGINE_IMAGE it was built into" >&2
    exit 1
fi

export CAPSTAN_TEST_ENGINE_SOCKET="$ENGINE_SOCKET"
export CAPSTAN_TEST_ENGINE_IMAGE="$ENGINE_IMAGE"
export CAPSTAN_TEST_ENGINE_CONTAINERS_CONF="$ENGINE_DIR/containers.conf"
export CAPSTAN_TEST_REQUIRE_ENGINE=1
echo "container engine peer ready with $ENGINE_IMAGE in $((SECONDS - engine_started)) s"
