# Conveniences; the README's two commands are the source of truth.

export CARGO_TARGET_DIR := env_var_or_default("CARGO_TARGET_DIR", "/var/tmp/capstan-target")

# run Capstan with embedded defaults
run:
    cargo run --release -- serve --dev

# run the tests
test:
    cargo test --workspace

# the full CI (formatting, clippy, tests with real peers)
ci:
    .ci/run

# only the end-to-end tests (they start the real binary)
e2e:
    cargo test -p capstan --test e2e
