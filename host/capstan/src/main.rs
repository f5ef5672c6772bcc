//! The `capstan` binary: `capstan serve` runs the host; every other command is a client of its API.

fn main() -> std::process::ExitCode {
    capstan::cli::main()
}
