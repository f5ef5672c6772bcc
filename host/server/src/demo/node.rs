//! The dev host's own node (`serve --dev --demo`): when a container engine answers on this
//! machine and a `capstan-agent` binary sits beside `capstan`, the host enrolls that agent into
//! the demo's cluster with a jump code of its own (once: the credential is kept under the data
//! directory) and runs it as a child process, so the demo's app starts on this machine. The agent
//! is the same binary a second machine runs after its jump command; nothing about it is special
//! but where its files live (`<data dir>/demo-node/`) and that its hostname intent goes to a
//! file, never to this machine's hostname.

use capstan_core::Refusal;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The hostname the demo's node enrolls under.
pub const HOSTNAME: &str = "capstan-dev";

/// Where engines usually listen, after `DOCKER_HOST`.
fn usual_engines() -> Vec<String> {
    let mut sockets = vec!["/run/docker.sock".to_string(), "/var/run/docker.sock".to_string()];
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        sockets.push(format!("{}/podman/podman.sock", Path::new(&runtime).display()));
    }
    sockets.push("/run/podman/podman.sock".into());
    sockets.into_iter().filter(|s| Path::new(s).exists()).map(|s| format!("unix://{s}")).collect()
}

/// The demo's node, once it may run: where its files live, its agent, its engine, Capstan's origin.
pub struct DemoNode {
    dir: PathBuf,
    agent: PathBuf,
    /// The engine's endpoint (`unix:///…` or `http://…`).
    pub engine: String,
    origin: String,
}

/// The demo's node, or in plain words why this host runs none (no agent binary, no engine
/// answering).
pub async fn find(data_dir: &Path, agent: Option<&Path>, engine: Option<&str>, origin: &str) -> Result<DemoNode, String> {
    let agent = agent
        .filter(|a| a.is_file())
        .ok_or("no capstan-agent binary beside capstan (build it: cargo build --release -p capstan-agent, or set CAPSTAN_AGENT_BINARY)")?;
    let candidates: Vec<String> = match engine {
        Some(given) => vec![given.to_string()],
        // DOCKER_HOST's tcp:// is the Engine API over plain HTTP, as the agent names it
        None => std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .map(|h| h.strip_prefix("tcp://").map_or(h.clone(), |rest| format!("http://{rest}")))
            .into_iter()
            .chain(usual_engines())
            .collect(),
    };
    for endpoint in &candidates {
        if answers(endpoint).await {
            return Ok(DemoNode {
                dir: data_dir.join("demo-node"),
                agent: agent.to_path_buf(),
                engine: endpoint.clone(),
                origin: origin.into(),
            });
        }
    }
    Err(match candidates.as_slice() {
        [] => "no container engine found (none at DOCKER_HOST or the usual Docker and Podman sockets; name one with --engine)".into(),
        tried => format!(
            "no container engine answers at {} (start Docker or `podman system service`, or name one with --engine)",
            tried.join(", ")
        ),
    })
}

/// Whether the Docker Engine API answers `GET /version` at `endpoint` within 3 s.
async fn answers(endpoint: &str) -> bool {
    let ask = async {
        let request = b"GET /version HTTP/1.0\r\nHost: engine\r\n\r\n";
        let mut answer = [0u8; 12];
        if let Some(path) = endpoint.strip_prefix("unix://") {
            let mut stream = tokio::net::UnixStream::connect(path).await?;
            stream.write_all(request).await?;
            tokio::io::AsyncReadExt::read_exact(&mut stream, &mut answer).await?;
        } else {
            let address = endpoint.strip_prefix("http://").unwrap_or(endpoint).trim_end_matches('/');
            let mut stream = tokio::net::TcpStream::connect(address).await?;
            stream.write_all(request).await?;
            tokio::io::AsyncReadExt::read_exact(&mut stream, &mut answer).await?;
        }
        std::io::Result::Ok(answer.starts_with(b"HTTP/1.") && &answer[9..12] == b"200")
    };
    matches!(tokio::time::timeout(Duration::from_secs(3), ask).await, Ok(Ok(true)))
}

impl DemoNode {
    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// Whether the agent was enrolled by an earlier start.
    pub fn enrolled(&self) -> bool {
        self.state_dir().join("credential.json").is_file()
    }

    /// Enroll the agent with the jump `code` (read from its standard input, as on any machine).
    pub async fn enroll(&self, code: &str) -> Result<(), Refusal> {
        let state = self.state_dir();
        create_private(&state).map_err(|e| failed(format!("creating {}: {e}", state.display())))?;
        let mut child = tokio::process::Command::new(&self.agent)
            .arg("--state-dir")
            .arg(&state)
            .args(["enroll", &self.origin, "--hostname", HOSTNAME, "--dev-host"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("starting {}: {e}", self.agent.display())))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(format!("{code}\n").as_bytes()).await.map_err(|e| failed(format!("handing the agent its code: {e}")))?;
        }
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .map_err(|_| failed("the agent's enrollment took over a minute".into()))?
            .map_err(|e| failed(format!("the agent's enrollment: {e}")))?;
        if !out.status.success() {
            // the agent's own words: `error: <code>: <message>`, never the code it was handed
            return Err(failed(format!("the agent's enrollment failed: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        Ok(())
    }

    /// Run the agent on the engine until this host stops (the child is killed when the handle
    /// is dropped); its log goes to `<data dir>/demo-node/agent.log`.
    pub fn run(&self) -> Result<tokio::process::Child, Refusal> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .map_err(|e| failed(format!("opening the agent's log: {e}")))?;
        let errors = log.try_clone().map_err(|e| failed(format!("opening the agent's log: {e}")))?;
        let secrets = self.dir.join("secrets");
        create_private(&secrets).map_err(|e| failed(format!("creating {}: {e}", secrets.display())))?;
        let mut command = tokio::process::Command::new(&self.agent);
        // SAFETY: prctl is async-signal-safe; the child only asks to be sent SIGTERM when this
        // process ends, so the agent ends with the host however the host ends
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        command
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("run")
            .arg("--hostname-file")
            .arg(self.dir.join("hostname"))
            .args(["--engine", &self.engine])
            .arg("--volumes-dir")
            .arg(self.dir.join("volumes"))
            .arg("--secrets-dir")
            .arg(&secrets)
            // published ports are reached on this machine
            .args(["--advertise-address", "127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(errors)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("starting {}: {e}", self.agent.display())))
    }
}

fn failed(message: String) -> Refusal {
    Refusal::new("demo-failed", message)
}

/// `dir` and its parents, `dir` itself private to this user (the agent refuses looser state).
fn create_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_agent_or_no_engine_is_said_in_plain_words() {
        let dir = tempfile::tempdir().unwrap();
        let none = find(dir.path(), None, None, "http://127.0.0.1:1").await.err().unwrap();
        assert!(none.contains("cargo build --release -p capstan-agent"), "{none}");
        let agent = dir.path().join("capstan-agent");
        std::fs::write(&agent, b"").unwrap();
        let socket = dir.path().join("absent.sock");
        let engine = format!("unix://{}", socket.display());
        let silent = find(dir.path(), Some(&agent), Some(&engine), "http://127.0.0.1:1").await.err().unwrap();
        assert!(silent.contains("no container engine answers at unix://") && silent.contains("--engine"), "{silent}");
    }

    #[tokio::test]
    async fn an_engine_answering_its_version_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0u8; 64];
                let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut request).await;
                let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}").await;
            }
        });
        let agent = dir.path().join("capstan-agent");
        std::fs::write(&agent, b"").unwrap();
        let engine = format!("unix://{}", socket.display());
        let node = find(dir.path(), Some(&agent), Some(&engine), "http://127.0.0.1:1").await.unwrap();
        assert_eq!(node.engine, engine);
        assert!(!node.enrolled());
    }
}
