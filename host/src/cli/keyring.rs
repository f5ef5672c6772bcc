//! `capstan keyring generate | check`: offline commands on the keyring file. They never start
//! the host and never print key material.

use super::refuse;
use crate::keyring::Keyring;
use crate::refusal::Refusal;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum KeyringCommand {
    /// Write a new keyring (one KEK, one X25519 ingress key pair) to a new private file.
    ///
    /// The file is created mode 0600 through a same-directory temporary file hard-linked into
    /// place: it holds the whole keyring or does not exist. An existing output (a symbolic link
    /// included) is refused `output-exists`; a directory writable by group or others is refused
    /// `output-directory-not-private`.
    Generate {
        /// Where to write the keyring (must not exist)
        #[arg(long, value_name = "PATH")]
        output: PathBuf,
        /// Id of the KEK (letters, digits, - _ .; random when absent)
        #[arg(long, value_name = "ID")]
        kek_id: Option<String>,
        /// Id of the ingress recipient key (random when absent)
        #[arg(long, value_name = "ID")]
        recipient_key_id: Option<String>,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Validate the keyring and print its key ids and fingerprints (never the keys).
    ///
    /// The file must be a regular file owned by you, mode 0600 or stricter, with one hard link,
    /// at most 64 KiB.
    Check {
        /// The keyring file
        #[arg(long, value_name = "PATH", env = "CAPSTAN_KEYRING_PATH")]
        path: PathBuf,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: KeyringCommand) -> ExitCode {
    let (result, json) = match command {
        KeyringCommand::Generate { output, kek_id, recipient_key_id, json } => {
            let result = Keyring::generate(kek_id.as_deref(), recipient_key_id.as_deref())
                .and_then(|ring| ring.write_new(&output).map(|()| (ring, Some(output))));
            (result, json)
        }
        KeyringCommand::Check { path, json } => (Keyring::load_strict(&path).map(|ring| (ring, None)), json),
    };
    match result {
        Ok((ring, written)) => {
            let report = ring.report();
            if json {
                let mut value = serde_json::json!({ "ok": true, "keyring": report });
                if let Some(path) = written {
                    value["output"] = serde_json::json!(path.display().to_string());
                }
                println!("{value}");
            } else {
                if let Some(path) = written {
                    println!("wrote a new keyring to {} (mode 0600)", path.display());
                }
                println!("active KEK: {}", report.active_kek_id);
                for kek in &report.keks {
                    println!("  KEK {}  {}", kek.id, kek.fingerprint);
                }
                println!("ingress recipient: {}  {}", report.ingress.id, report.ingress.fingerprint);
            }
            ExitCode::SUCCESS
        }
        Err(refusal) if json => print_json_refusal(&refusal),
        Err(refusal) => refuse(&refusal, 1),
    }
}

fn print_json_refusal(refusal: &Refusal) -> ExitCode {
    println!("{}", serde_json::json!({ "ok": false, "error": refusal }));
    ExitCode::from(1)
}
