//! `capstan keyring generate | check | rotate`: offline commands on the keyring file. They never start
//! the host and never print key material.
//!
//! `capstan keyring export-relay-authorization` is the one subcommand that is a client of a
//! running host instead. A relay's bearer is not key material of the keyring file: it is a
//! secret version in the store, sealed under the keyring, and only a process holding both the
//! database and the keyring can open it — the host. The CLI reaches everything the store keeps
//! through the API (as `capstan secrets` and `capstan nodes` do), so the export calls the
//! administrators' `relays.exportAuthorization` (which proves the version against the hash the
//! generation issued and writes a receipt first) and writes the answer to a private file. The
//! value is never logged and never printed unless `--stdout` asks for it.

use super::client::{Client, Connection, finish, print_json};
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
        #[arg(id = "out", long = "out", value_name = "PATH")]
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
    /// Write a cluster relay's bearer to a new private file, for the operator who deploys it.
    ///
    /// Asks the running host (`relays.exportAuthorization`, administrators) for the bearer of
    /// the credential's current generation, or of --expected-generation. The file is created
    /// mode 0600 whatever the umask, atomically, in a directory owned by you that nobody else
    /// can write (`output-directory-not-private`); an existing output is refused `output-exists`
    /// and left untouched unless --force replaces a regular file (never a symbolic link,
    /// `output-not-regular-file`). The bearer is never printed unless --stdout asks; standard
    /// output carries the generation, the byte length and the SHA-256 of what was written.
    ExportRelayAuthorization {
        #[command(flatten)]
        connection: Connection,
        /// The cluster whose relay bearer is exported (`cluster_…`)
        #[arg(long, value_name = "ID")]
        cluster: String,
        #[command(flatten)]
        to: ExportTo,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

/// Where an export of a relay's bearer goes (`keyring export-relay-authorization`, `relays
/// export`).
#[derive(clap::Args)]
pub(crate) struct ExportTo {
    /// The file to write (must not exist unless --force)
    #[arg(id = "out", long = "out", value_name = "FILE", required_unless_present = "stdout")]
    pub(crate) output: Option<PathBuf>,
    /// Export exactly this generation (default: the current one)
    #[arg(long, value_name = "N")]
    pub(crate) expected_generation: Option<u64>,
    /// Replace an existing regular file at --out
    #[arg(long)]
    pub(crate) force: bool,
    /// Print the bearer itself on standard output (nothing else is printed then)
    #[arg(long)]
    pub(crate) stdout: bool,
}

/// Write `bytes` to `output` as a private file: a new file by the private-file rules, or with
/// `force` the atomic replacement (mode 0600) of an existing regular file in a private directory.
pub(crate) fn write_private(output: &std::path::Path, bytes: &[u8], force: bool) -> crate::refusal::Result<()> {
    use capstan_core::private_file;
    let path = || serde_json::json!({ "path": output.display().to_string() });
    let existing = match std::fs::symlink_metadata(output) {
        Ok(meta) if force => meta,
        _ => return private_file::write_new(output, bytes),
    };
    if !existing.file_type().is_file() {
        return Err(Refusal::new(
            "output-not-regular-file",
            format!("{} is not a regular file; --force replaces only one", output.display()),
        )
        .with_data(path()));
    }
    let dir = output.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let private = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && private_file::owned_unshared(&m));
    if !private {
        return Err(Refusal::new(
            "output-directory-not-private",
            format!("the output directory {} must be owned by you and not writable by group or others", dir.display()),
        )
        .with_data(path()));
    }
    private_file::replace_atomically(output, bytes, 0o600)
        .map_err(|e| Refusal::new("output-write-failed", format!("replacing {} failed: {}", output.display(), e.kind())).with_data(path()))
}

/// What an export of a relay's bearer writes: the cluster's, where, and whether as JSON.
pub(crate) struct Export {
    pub(crate) cluster: String,
    pub(crate) to: ExportTo,
    pub(crate) json: bool,
}

pub(crate) fn export_relay_authorization(connection: &Connection, export: &Export) -> crate::refusal::Result<()> {
    use sha2::Digest;
    let client = Client::new(connection)?;
    let generation = match export.to.expected_generation {
        Some(generation) => generation,
        None => {
            let state = client.call("relays.getCredential", &serde_json::json!({ "clusterId": export.cluster }))?;
            state["credential"]["generation"].as_u64().ok_or_else(|| {
                Refusal::new("relay-credential-absent", format!("the cluster {} has no relay credential: ensure one first", export.cluster))
            })?
        }
    };
    let answer =
        client.call("relays.exportAuthorization", &serde_json::json!({ "clusterId": export.cluster, "expectedGeneration": generation }))?;
    // the answer must be the one asked for
    let bearer = answer["authorization"].as_str().map(|b| zeroize::Zeroizing::new(b.as_bytes().to_vec()));
    let exported_generation = answer["credential"]["generation"].as_u64();
    let (Some(bearer), Some(exported_generation)) = (bearer, exported_generation) else {
        return Err(Refusal::new("relay-authorization-missing", "the host's answer carries no relay authorization"));
    };
    if answer["clusterId"].as_str() != Some(export.cluster.as_str()) || exported_generation != generation {
        return Err(Refusal::new("relay-credential-generation-mismatch", "the host answered another cluster or generation than asked"));
    }
    if let Some(output) = &export.to.output {
        write_private(output, &bearer, export.to.force)?;
    }
    if export.to.stdout {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        out.write_all(&bearer)
            .and_then(|()| out.flush())
            .map_err(|e| Refusal::new("output-write-failed", format!("writing standard output failed: {}", e.kind())))?;
        return Ok(());
    }
    let sha256 = hex::encode(sha2::Sha256::digest(&*bearer));
    let output = export.to.output.as_ref().map(|p| p.display().to_string());
    if export.json {
        print_json(&serde_json::json!({
            "ok": true,
            "command": "keyring export-relay-authorization",
            "clusterId": export.cluster,
            "generation": generation,
            "outputPath": output,
            "byteLength": bearer.len(),
            "sha256": sha256,
            "receiptId": answer["receiptId"],
        }));
    } else {
        println!(
            "wrote the relay authorization of {} (generation {generation}) to {} (mode 0600)",
            export.cluster,
            output.unwrap_or_default()
        );
        println!("  {} bytes, sha256 {sha256}; check every copy with sha256sum, and shred it after the handover", bearer.len());
    }
    Ok(())
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
        KeyringCommand::ExportRelayAuthorization { connection, cluster, to, json } => {
            let stdout = to.stdout;
            return finish(export_relay_authorization(&connection, &Export { cluster, to, json }), json && !stdout);
        }
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
                print_json(&value);
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
        Err(refusal) => finish(Err(refusal), json),
    }
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

    #[test]
    fn a_private_output_is_new_unless_forced_and_force_replaces_only_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.path().join("relay-authorization");
        write_private(&path, b"first", false).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(write_private(&path, b"second", false).unwrap_err().code, "output-exists");
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"second", true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(write_private(&link, b"third", true).unwrap_err().code, "output-not-regular-file");
        assert_eq!(write_private(&link, b"third", false).unwrap_err().code, "output-exists");
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
    }
}
