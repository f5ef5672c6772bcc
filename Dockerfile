# Capstan host image: a release build of `capstan`, run as an unprivileged user.
#
#   docker build -t capstan .
#   docker run --rm -p 8080:8080 -v capstan-state:/var/lib/capstan \
#     -e CAPSTAN_PUBLIC_ORIGIN=https://capstan.example.com \
#     -e CAPSTAN_DATABASE_URL='mongodb://mongo:27017/?replicaSet=rs0' \
#     -e CAPSTAN_BLOB_URL=s3://capstan -e CAPSTAN_S3_ENDPOINT=http://minio:9000 … capstan
#
# docker-compose.yml runs it with MongoDB (single-node replica set) and MinIO.
#
# BINARIES names the stage or image the two binaries are copied from: the `build` stage below by
# default; CI (.ci/image) passes an image holding the release binaries it built on the host, in
# the same paths, and the build stage is then skipped.
ARG BINARIES=build

FROM rust:1-bookworm AS build
WORKDIR /src
# rust-toolchain.toml pins the toolchain; rustup installs it (and the wasm target) here.
COPY rust-toolchain.toml ./
RUN rustup show active-toolchain
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p capstan -p capstan-agent \
    && install -m 0755 target/release/capstan-agent /usr/local/bin/capstan-agent \
    && install -d /usr/local/lib/debug \
    && objcopy --only-keep-debug target/release/capstan /usr/local/lib/debug/capstan.debug \
    && objcopy --strip-debug --add-gnu-debuglink=/usr/local/lib/debug/capstan.debug target/release/capstan \
    && install -m 0755 target/release/capstan /usr/local/bin/capstan
# The image ships the binary without debug info (its symbol table stays, so backtraces name
# functions); the line tables stay in this stage's /usr/local/lib/debug/capstan.debug, which
# `docker build --target build` keeps for crash analysis (gdb follows the debuglink).

FROM ${BINARIES} AS binaries

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/capstan --shell /usr/sbin/nologin capstan \
    && install -d -o capstan -g capstan -m 0700 /var/lib/capstan /var/lib/capstan/keyring /var/lib/capstan/state
COPY --from=binaries /usr/local/bin/capstan /usr/local/bin/capstan
# the node agent the jump script installs on a new machine (GET /agent/v1/binary/<platform>
# serves the capstan-agent found next to capstan)
COPY --from=binaries /usr/local/bin/capstan-agent /usr/local/bin/capstan-agent

USER capstan
WORKDIR /var/lib/capstan
# The state volume: the keyring lives in its own directory so it can be mounted separately.
VOLUME ["/var/lib/capstan"]
# A container listens on all its interfaces, which is beyond loopback: the image states the
# network as the container's private one (override with CAPSTAN_NETWORK=public or wireguard).
ENV CAPSTAN_LISTEN=0.0.0.0:8080 \
    CAPSTAN_NETWORK=lan \
    CAPSTAN_STATE_DIR=/var/lib/capstan/state \
    CAPSTAN_KEYRING_PATH=/var/lib/capstan/keyring/keyring.json \
    CAPSTAN_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["capstan"]
CMD ["serve"]
