#!/usr/bin/env bash
# Build times of two commits, one after the other, each from a git worktree of its own in a
# fresh target directory (so "cold" includes every dependency and the nested wasm build of the
# first-party plugins): the cold release build of `capstan`, then the rebuild after touching one
# dashboard template, then after touching one inventory file. Run it with nothing else on the
# machine. Usage: tests/load/build_times.sh BEFORE_COMMIT AFTER_COMMIT (docs/benchmarks.md).
set -uo pipefail
side() { # name commit
    local name=$1 commit=$2 wt=/var/tmp/wt-$1
    rm -rf "$wt" "/var/tmp/bench-target-$name"
    git -C /work/main worktree add --detach "$wt" "$commit" >/dev/null 2>&1 || { echo "worktree $name failed"; return 1; }
    cd "$wt"
    export CARGO_TARGET_DIR=/var/tmp/bench-target-$name
    local t0=$(date +%s)
    /usr/bin/time -f "%M KB peak" cargo build --release --locked -p capstan >"/tmp/bench-$name-cold.log" 2>&1
    local t1=$(date +%s)
    echo "$name cold: $((t1 - t0)) s ($(tail -1 /tmp/bench-$name-cold.log))"
    touch dashboard/templates/fleet.html
    cargo build --release --locked -p capstan >"/tmp/bench-$name-tpl.log" 2>&1
    local t2=$(date +%s)
    echo "$name template: $((t2 - t1)) s ($(grep -c Compiling /tmp/bench-$name-tpl.log) crates: $(grep Compiling /tmp/bench-$name-tpl.log | awk '{print $2}' | tr '\n' ' '))"
    touch host/inventory/src/services.rs
    cargo build --release --locked -p capstan >"/tmp/bench-$name-inv.log" 2>&1
    local t3=$(date +%s)
    echo "$name inventory: $((t3 - t2)) s ($(grep -c Compiling /tmp/bench-$name-inv.log) crates: $(grep Compiling /tmp/bench-$name-inv.log | awk '{print $2}' | tr '\n' ' '))"
    ls -l "$CARGO_TARGET_DIR/release/capstan" | awk '{print "binary bytes", $5}'
    cd /; git -C /work/main worktree remove --force "$wt"; rm -rf "$CARGO_TARGET_DIR"
}
side before "$1"
side after "$2"
