# Sourced by .ci/run: install and start the real peers the tests need, on loopback, and export
# the variables that make those tests mandatory. Everything is stopped when the run ends.
#
#   CAPSTAN_TEST_MONGODB_URL  a MongoDB wire-protocol server (nx-27017, SQLite-backed; no real
#                             mongod can be installed on these machines — docs/compatibility.md)
#   CAPSTAN_TEST_S3_ENDPOINT  an S3 server (moto), path-style, any credentials
#   CAPSTAN_TEST_S3_AUTH_*    an S3 server checking credentials (moto with IAM authentication):
#                             _ENDPOINT, _BUCKET, and a key pair it knows (_ACCESS_KEY, _SECRET_KEY)
#   CAPSTAN_TEST_S3_ADMIN_*   a third moto checking credentials, for the object-storage bindings
#                             (host/storage): _ENDPOINT (S3 and IAM on one port) and an admin key
#                             pair allowed every S3 and IAM action (_ACCESS_KEY, _SECRET_KEY)
#   CAPSTAN_TEST_REQUIRE_S3_ADMIN  set, those tests fail instead of skipping without it
#   CAPSTAN_TEST_NPM_REGISTRY an npm registry (verdaccio) taking anonymous publishes, no uplink:
#                             the App Store's catalog package is published to it
#   CAPSTAN_TEST_REQUIRE_GATEWAY  the mail tests start tests/peers/gateway themselves (python3 with
#                             aiosmtpd); set, they fail instead of skipping when it cannot start
#   (the CoreMail tests start tests/peers/coremail themselves: python3's standard library only)
#   CAPSTAN_TEST_IDP          absolute path of tests/peers/idp/server.mjs, the OpenID Connect
#                             identity provider (oidc-provider on Node.js, docs/idp-peer.md) the
#                             platform login tests start one of per test; its npm packages are
#                             installed here (npm ci)
#   CAPSTAN_TEST_REQUIRE_IDP  set, those tests fail instead of skipping when it cannot start
#   CAPSTAN_TEST_REQUIRE_RELYING_PARTY  the hosted-app OpenID provider's test drives Python's
#                             authlib as its relying party; set, it fails instead of skipping
#                             when python3 or authlib is missing
#   CAPSTAN_TEST_REQUIRE_SKOPEO  the registry tests push and pull images with skopeo (Debian's
#                             package, installed here when missing); set, they fail instead of
#                             skipping when it is not on PATH
#   CAPSTAN_TEST_POSTGRES_URL a PostgreSQL server (Debian's package, installed here when missing;
#                             docs/postgres-peer.md): postgres://capstan_admin:<pw>@127.0.0.1:<port>/postgres,
#                             capstan_admin having CREATEROLE and CREATEDB, not a superuser
#   CAPSTAN_TEST_POSTGRES_BIN its binaries' directory (psql, pg_dump, …), also put on PATH
#   CAPSTAN_TEST_REQUIRE_POSTGRES  set, the PostgreSQL tests fail instead of skipping without it
#   CAPSTAN_TEST_ENGINE_*     a container engine (Podman's Docker-API service, .ci/engine.sh): _SOCKET,
#                             _IMAGE (a test image built locally), _CONTAINERS_CONF; with
#                             CAPSTAN_TEST_REQUIRE_ENGINE=1 the engine tests fail instead of skipping

PEERS_DIR="$(mktemp -d /tmp/capstan-peers.XXXXXX)"
PEER_PIDS=()

stop_peers() {
    for pid in "${PEER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$PEERS_DIR"
}
trap stop_peers EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for_port() { # name port log
    for _ in $(seq 1 150); do
        if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $2), 1)" 2>/dev/null; then
            echo "$1 is up on 127.0.0.1:$2"
            return 0
        fi
        sleep 0.2
    done
    echo "$1 did not come up on 127.0.0.1:$2; its log:" >&2
    cat "$3" >&2 || true
    return 1
}

python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore 'nx-27017' 'moto[server]' 'aiosmtpd' 'cryptography' 'authlib'
# pyenv installs console scripts behind shims that appear after a rehash
command -v pyenv >/dev/null && pyenv rehash || true

MONGO_PORT="$(free_port)"
# --data-dir: one SQLite file per database, so each test's fresh database really is fresh
mkdir -p "$PEERS_DIR/mongo"
nx-27017 --host 127.0.0.1 -p "$MONGO_PORT" --data-dir "$PEERS_DIR/mongo" \
    --log-file "$PEERS_DIR/mongo.log" --pid-file "$PEERS_DIR/mongo.pid" >"$PEERS_DIR/mongo.out" 2>&1 &
PEER_PIDS+=($!)
wait_for_port "MongoDB wire server (nx-27017)" "$MONGO_PORT" "$PEERS_DIR/mongo.out"
export CAPSTAN_TEST_MONGODB_URL="mongodb://127.0.0.1:$MONGO_PORT/?directConnection=true"

S3_PORT="$(free_port)"
moto_server -H 127.0.0.1 -p "$S3_PORT" >"$PEERS_DIR/moto.log" 2>&1 &
PEER_PIDS+=($!)
wait_for_port "S3 server (moto)" "$S3_PORT" "$PEERS_DIR/moto.log"
export CAPSTAN_TEST_S3_ENDPOINT="http://127.0.0.1:$S3_PORT"

# A second S3 server that checks credentials, as a backups target outside Capstan is tested
# against it: moto with IAM authentication from its fifth request on (the first four, made by
# .ci/s3-auth-setup.py, create a user, its key, its policy and the bucket).
S3_AUTH_PORT="$(free_port)"
INITIAL_NO_AUTH_ACTION_COUNT=4 moto_server -H 127.0.0.1 -p "$S3_AUTH_PORT" >"$PEERS_DIR/moto-auth.log" 2>&1 &
PEER_PIDS+=($!)
wait_for_port "S3 server checking credentials (moto)" "$S3_AUTH_PORT" "$PEERS_DIR/moto-auth.log"
export CAPSTAN_TEST_S3_AUTH_ENDPOINT="http://127.0.0.1:$S3_AUTH_PORT"
export CAPSTAN_TEST_S3_AUTH_BUCKET="capstan-offsite"
read -r CAPSTAN_TEST_S3_AUTH_ACCESS_KEY CAPSTAN_TEST_S3_AUTH_SECRET_KEY \
    < <(python3 .ci/s3-auth-setup.py "$CAPSTAN_TEST_S3_AUTH_ENDPOINT" "$CAPSTAN_TEST_S3_AUTH_BUCKET")
if [ -z "${CAPSTAN_TEST_S3_AUTH_SECRET_KEY:-}" ]; then
    echo "setting up the S3 server checking credentials failed; its log:" >&2
    cat "$PEERS_DIR/moto-auth.log" >&2
    exit 1
fi
export CAPSTAN_TEST_S3_AUTH_ACCESS_KEY CAPSTAN_TEST_S3_AUTH_SECRET_KEY

# A third one for the object-storage bindings (host/storage/tests/s3.rs): its first three
# requests create the admin user, its key and its policy (every S3 and IAM action); the
# bindings' users and buckets the tests make are then held to their policies.
S3_ADMIN_PORT="$(free_port)"
INITIAL_NO_AUTH_ACTION_COUNT=3 moto_server -H 127.0.0.1 -p "$S3_ADMIN_PORT" >"$PEERS_DIR/moto-admin.log" 2>&1 &
PEER_PIDS+=($!)
wait_for_port "S3 and IAM server for bindings (moto)" "$S3_ADMIN_PORT" "$PEERS_DIR/moto-admin.log"
export CAPSTAN_TEST_S3_ADMIN_ENDPOINT="http://127.0.0.1:$S3_ADMIN_PORT"
read -r CAPSTAN_TEST_S3_ADMIN_ACCESS_KEY CAPSTAN_TEST_S3_ADMIN_SECRET_KEY \
    < <(python3 .ci/s3-auth-setup.py --admin "$CAPSTAN_TEST_S3_ADMIN_ENDPOINT")
if [ -z "${CAPSTAN_TEST_S3_ADMIN_SECRET_KEY:-}" ]; then
    echo "setting up the S3 and IAM server for bindings failed; its log:" >&2
    cat "$PEERS_DIR/moto-admin.log" >&2
    exit 1
fi
export CAPSTAN_TEST_S3_ADMIN_ACCESS_KEY CAPSTAN_TEST_S3_ADMIN_SECRET_KEY
export CAPSTAN_TEST_REQUIRE_S3_ADMIN=1

# verdaccio from the npm registry, into the peers directory: anonymous publish and no uplinks,
# so nothing it serves comes from the internet
npm install --silent --no-audit --no-fund --prefix "$PEERS_DIR/npm" verdaccio@6
mkdir -p "$PEERS_DIR/npm/storage"
cat >"$PEERS_DIR/npm/config.yaml" <<YAML
storage: $PEERS_DIR/npm/storage
auth:
  htpasswd:
    file: $PEERS_DIR/npm/htpasswd
    max_users: -1
uplinks: {}
packages:
  '**':
    access: \$all
    publish: \$all
    unpublish: \$all
log: { type: stdout, format: pretty, level: warn }
YAML
NPM_PORT="$(free_port)"
"$PEERS_DIR/npm/node_modules/.bin/verdaccio" --config "$PEERS_DIR/npm/config.yaml" --listen "127.0.0.1:$NPM_PORT" \
    >"$PEERS_DIR/verdaccio.log" 2>&1 &
PEER_PIDS+=($!)
wait_for_port "npm registry (verdaccio)" "$NPM_PORT" "$PEERS_DIR/verdaccio.log"
export CAPSTAN_TEST_NPM_REGISTRY="http://127.0.0.1:$NPM_PORT/"

# aiosmtpd is installed above; the mail tests start their own gateway from tests/peers/gateway
export CAPSTAN_TEST_REQUIRE_GATEWAY=1

# The test identity provider's npm packages, pinned by its package-lock.json; the platform login
# tests start their own instance of tests/peers/idp/server.mjs with node
idp_started=$SECONDS
if ! (cd tests/peers/idp && npm ci --no-audit --no-fund --loglevel=error) >"$PEERS_DIR/idp-npm.log" 2>&1; then
    echo "npm ci in tests/peers/idp failed; its log:" >&2
    cat "$PEERS_DIR/idp-npm.log" >&2
    exit 1
fi
echo "test identity provider's packages installed (npm ci, node $(node --version)) in $((SECONDS - idp_started)) s"
export CAPSTAN_TEST_IDP="$PWD/tests/peers/idp/server.mjs"
export CAPSTAN_TEST_REQUIRE_IDP=1
# authlib (installed above) is the relying party host/hosted-oidc's test completes a code flow with
export CAPSTAN_TEST_REQUIRE_RELYING_PARTY=1

# From Debian when missing (the package lists are refreshed only if the install cannot find the
# package): skopeo, the registry tests' OCI client; openssl, which the gateway test verifies the
# certificates Capstan hands out with.
for package in skopeo openssl; do
    if ! command -v "$package" >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y -q "$package"; then
            apt-get update -q
            apt-get install -y -q "$package"
        fi
    fi
done
skopeo --version
openssl version
export CAPSTAN_TEST_REQUIRE_SKOPEO=1

# PostgreSQL for the database bindings' tests (host/storage, docs/postgres-peer.md): Debian's
# package when missing, a cluster of its own under $PEERS_DIR run as the package's postgres
# user (initdb refuses root), on 127.0.0.1 only, its socket in its data directory. The tests
# connect as capstan_admin: CREATEROLE and CREATEDB, not a superuser, as on a node.
postgres_started=$SECONDS
postgres_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
PG_BIN="$(postgres_bin)"
if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ] || [ ! -x "$PG_BIN/pg_ctl" ]; then
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q postgresql; then
        apt-get update -q
        apt-get install -y -q postgresql
    fi
    PG_BIN="$(postgres_bin)"
fi
PG_DIR="$PEERS_DIR/postgres"
chmod 711 "$PEERS_DIR" # the postgres user reaches its data directory through it
mkdir -p "$PG_DIR"
chown postgres:postgres "$PG_DIR"
chmod 700 "$PG_DIR"
# from / : the postgres user may not read the clone's directory
if ! (cd / && runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DIR" -U postgres -E UTF8 --locale=C \
    --auth-local=trust --auth-host=scram-sha-256) >"$PEERS_DIR/postgres-initdb.log" 2>&1; then
    echo "initdb failed; its log:" >&2
    cat "$PEERS_DIR/postgres-initdb.log" >&2
    exit 1
fi
# trust on the socket (only the postgres user reaches it, for the setup below), passwords as
# SCRAM over TCP from loopback
cat >"$PG_DIR/pg_hba.conf" <<'HBA'
local all all trust
host all all 127.0.0.1/32 scram-sha-256
HBA
PG_PORT="$(free_port)"
# in the foreground of its own background job, so PEER_PIDS stops it
(cd / && exec runuser -u postgres -- "$PG_BIN/postgres" -D "$PG_DIR" -k "$PG_DIR" -h 127.0.0.1 -p "$PG_PORT" \
    -c password_encryption=scram-sha-256) >"$PEERS_DIR/postgres.log" 2>&1 &
PEER_PIDS+=($!)
wait_for_port "PostgreSQL" "$PG_PORT" "$PEERS_DIR/postgres.log"
for _ in $(seq 1 50); do
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
    sleep 0.2
done
PG_ADMIN_PASSWORD="$(python3 -c 'import secrets, string; print("".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32)))')"
if ! (cd / && runuser -u postgres -- "$PG_BIN/psql" -h "$PG_DIR" -p "$PG_PORT" -U postgres -d postgres -q \
    -v ON_ERROR_STOP=1 -c "CREATE ROLE capstan_admin WITH LOGIN CREATEROLE CREATEDB PASSWORD '$PG_ADMIN_PASSWORD'"); then
    echo "creating PostgreSQL's capstan_admin role failed; the server's log:" >&2
    cat "$PEERS_DIR/postgres.log" >&2
    exit 1
fi
export CAPSTAN_TEST_POSTGRES_URL="postgres://capstan_admin:$PG_ADMIN_PASSWORD@127.0.0.1:$PG_PORT/postgres"
export CAPSTAN_TEST_REQUIRE_POSTGRES=1
export CAPSTAN_TEST_POSTGRES_BIN="$PG_BIN"
export PATH="$PG_BIN:$PATH"
echo "PostgreSQL $("$PG_BIN/postgres" --version | sed 's/^postgres (PostgreSQL) //') up on 127.0.0.1:$PG_PORT in $((SECONDS - postgres_started)) s"

source .ci/engine.sh
