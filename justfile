# Conveniences; the README's two commands are the source of truth.

export CARGO_TARGET_DIR := env_var_or_default("CARGO_TARGET_DIR", "/var/tmp/capstan-target")

# run Capstan with embedded defaults
run:
    cargo run --release -- serve --dev

# the shipped shape: a release binary without debug info (symbols kept), and its line tables in
# capstan.debug beside it, linked so gdb and addr2line find them
dist:
    cargo build --release --locked -p capstan
    objcopy --only-keep-debug "$CARGO_TARGET_DIR/release/capstan" "$CARGO_TARGET_DIR/release/capstan.debug"
    objcopy --strip-debug --add-gnu-debuglink="$CARGO_TARGET_DIR/release/capstan.debug" "$CARGO_TARGET_DIR/release/capstan"
    ls -l "$CARGO_TARGET_DIR/release/capstan" "$CARGO_TARGET_DIR/release/capstan.debug"

# run the tests
test:
    cargo test --workspace

# the full CI (formatting, clippy, tests with real peers)
ci:
    .ci/run

# only the end-to-end tests (they start the real binary)
e2e:
    cargo test -p capstan --test e2e
