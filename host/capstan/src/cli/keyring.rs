//! `capstan keyring generate | check | rotate`: offline commands on the keyring file. They never start
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
    /// Add a new KEK to the keyring and make it the active one; print ids and fingerprints.
    ///
    /// The file is read under the strict private-file rules (like `check`) and replaced
    /// atomically (a same-directory temporary file, mode 0600, renamed over it). Every earlier
    /// KEK stays in the file, so what they sealed keeps opening. A running server picks the new
    /// KEK up when it restarts (every node of a fleet needs the new file); after that, new
    /// versions are sealed under it, and `capstan secrets rewrap` moves the data keys of the
    /// existing versions onto it without decrypting any value. Only once a rewrap has finished
    /// may an old KEK be retired.
    Rotate {
        /// The keyring file
        #[arg(long, value_name = "PATH", env = "CAPSTAN_KEYRING_PATH")]
        keyring: PathBuf,
        /// Id of the new KEK (letters, digits, - _ .; random when absent; must be new)
        #[arg(long, value_name = "ID")]
        kek_id: Option<String>,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

/// Load the keyring strictly, add a new active KEK, and replace the file atomically (0600).
fn rotate(path: &std::path::Path, kek_id: Option<&str>) -> crate::refusal::Result<Keyring> {
    let ring = Keyring::load_strict(path)?.with_new_active_kek(kek_id)?;
    capstan_core::private_file::replace_atomically(path, &ring.to_file_bytes(), 0o600).map_err(|e| {
        Refusal::new("keyring-write-failed", format!("replacing the keyring {} failed: {}", path.display(), e.kind()))
            .with_data(serde_json::json!({ "path": path.display().to_string() }))
    })?;
    Ok(ring)
}

pub fn run(command: KeyringCommand) -> ExitCode {
    let (result, json) = match command {
        KeyringCommand::Generate { output, kek_id, recipient_key_id, json } => {
            let result = Keyring::generate(kek_id.as_deref(), recipient_key_id.as_deref())
                .and_then(|ring| ring.write_new(&output).map(|()| (ring, Some(output))));
            (result, json)
        }
        KeyringCommand::Check { path, json } => (Keyring::load_strict(&path).map(|ring| (ring, None)), json),
        KeyringCommand::Rotate { keyring, kek_id, json } => {
            let result = rotate(&keyring, kek_id.as_deref()).map(|ring| (ring, None));
            if let (Ok((ring, _)), false) = (&result, json) {
                println!("added the KEK {} to {} and made it active (mode 0600)", ring.active_kek_id(), keyring.display());
                println!("  earlier KEKs stay and keep opening what they sealed; restart the servers to use it,");
                println!("  then run `capstan secrets rewrap` to move existing versions onto it");
            }
            (result, json)
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn rotate_adds_an_active_kek_and_keeps_the_old_ones_privately() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.path().join("keyring.json");
        let first = Keyring::generate(Some("kek-one"), None).unwrap();
        first.write_new(&path).unwrap();
        let rotated = rotate(&path, Some("kek-two")).unwrap();
        assert_eq!(rotated.active_kek_id(), "kek-two");
        let back = Keyring::load_strict(&path).unwrap();
        assert_eq!(back.report(), rotated.report());
        assert_eq!(back.report().keks.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(), ["kek-one", "kek-two"]);
        assert_eq!(back.report().ingress, first.report().ingress, "the ingress recipient stays");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
        assert_eq!(rotate(&path, Some("kek-two")).unwrap_err().code, "exists");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(rotate(&path, None).unwrap_err().code, "input-permissions");
    }
}
