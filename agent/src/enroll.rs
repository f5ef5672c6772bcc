//! `capstan-agent enroll <origin>`: join a cluster with a jump code read from standard input.
//!
//! The order is the point: every local check (origin, state directory, an existing credential,
//! the code's shape, the hostname) runs before the code is spent; the token is drawn here and
//! only its SHA-256 is sent; a lost answer is asked for again with the exact same request, which
//! the host answers with the answer it recorded; the credential is written no-clobber.

use crate::origin::{check_jump_code, check_origin, short_hostname};
use crate::state::{Credential, StateDir, already_enrolled};
use crate::token::Token;
use crate::wire::{AGENT_VERSION, Client, EnrollAnswer, EnrollRequest, PROTOCOL, Retry};
use capstan_core::Refusal;
use serde_json::json;
use std::io::BufRead;

/// The longest line read from standard input.
const MAX_LINE: u64 = 1024;

/// What the enrollment needs besides the origin and the state directory.
pub struct Inputs<R> {
    /// Standard input (the code's one line).
    pub stdin: R,
    /// Whether standard input is a terminal (then a prompt is shown).
    pub interactive: bool,
    /// The machine's node name (`uname -n`).
    pub node_name: String,
    /// How a lost answer is asked for again.
    pub retry: Retry,
    /// The jump command said Capstan is a dev host (`--dev-host`): plain http beyond loopback.
    pub dev_host: bool,
}

/// What the agent says whenever it talks to a dev host over plain http.
pub fn dev_host_warning(origin: &str) -> String {
    format!(
        "capstan-agent: DEV HOST: {origin} is a Capstan dev host (serve --dev) reached over plain http; \
         the node's token crosses the network unencrypted. Use it to try Capstan out, never for machines that matter."
    )
}

/// Enroll: answers the credential written.
pub async fn enroll<R: BufRead>(origin: &str, state: &StateDir, inputs: Inputs<R>) -> Result<Credential, Refusal> {
    let origin = check_origin(origin, inputs.dev_host)?;
    let dev_host = inputs.dev_host && origin.starts_with("http://");
    if dev_host {
        eprintln!("{}", dev_host_warning(&origin));
    }
    state.create()?;
    if state.has_credential() {
        return Err(already_enrolled(&state.credential_path()));
    }
    if inputs.interactive {
        eprint!("Jump code: ");
    }
    let mut line = String::new();
    inputs
        .stdin
        .take(MAX_LINE)
        .read_line(&mut line)
        .map_err(|e| Refusal::new("jump-code-missing", format!("reading the jump code from standard input failed: {}", e.kind())))?;
    let code = check_jump_code(&line)?;
    let hostname = short_hostname(&inputs.node_name)?;
    let token = Token::draw()?;
    let request = EnrollRequest {
        protocol: PROTOCOL,
        code,
        hostname: hostname.clone(),
        token_sha256: token.sha256_hex(),
        agent_version: AGENT_VERSION,
    };
    let client = Client::new(&origin)?;
    tracing::info!(origin = %origin, hostname = %hostname, "enrolling this machine");
    let answer: EnrollAnswer =
        client.post_retrying("/agent/v1/enroll", &request, None, inputs.retry).await.map_err(|e| e.into_refusal())?;
    tracing::info!(node_id = %answer.node_id, hostname = %answer.hostname, "Capstan enrolled this machine");
    let credential = Credential {
        origin,
        node_id: answer.node_id.clone(),
        cluster_id: answer.cluster_id.clone(),
        token,
        credential_generation: answer.credential_generation,
        pending_token: None,
        pending_mutation_id: None,
        dev_host,
    };
    state.write_new_credential(&credential).map_err(|r| {
        // the node exists but this machine could not keep its token: say which node to retire
        Refusal::new(
            "credential-not-kept",
            format!(
                "Capstan enrolled node {} but its credential could not be written ({}); retire that node and enroll again",
                answer.node_id, r
            ),
        )
        .with_data(json!({ "nodeId": answer.node_id }))
    })?;
    Ok(credential)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::Mock;
    use std::time::Duration;

    const CODE: &str = "AbCd1234EfGh5678";

    fn inputs(stdin: &'static str) -> Inputs<&'static [u8]> {
        Inputs {
            dev_host: false,
            stdin: stdin.as_bytes(),
            interactive: false,
            node_name: "Web-1.example.com".into(),
            retry: Retry { attempts: 4, first_pause: Duration::from_millis(10) },
        }
    }

    fn answer() -> serde_json::Value {
        json!({"protocol": PROTOCOL, "nodeId": "node_abc", "clusterId": "cls_1", "hostname": "web-1", "credentialGeneration": 1})
    }

    fn state() -> (tempfile::TempDir, StateDir) {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::new(root.path().join("state"));
        (root, dir)
    }

    #[tokio::test]
    async fn enrolls_sending_only_the_hash_and_keeps_the_credential() {
        let mock = Mock::start(|_, _| Some((200, answer()))).await;
        let (_root, dir) = state();
        let credential = enroll(&mock.origin, &dir, inputs("AbCd1234EfGh5678\n")).await.unwrap();
        assert_eq!(credential.node_id, "node_abc");
        assert_eq!(dir.read_credential().unwrap(), credential);
        let requests = mock.requests();
        assert_eq!(requests.len(), 1);
        let sent = &requests[0];
        assert_eq!(sent.path, "/agent/v1/enroll");
        assert!(!sent.headers.contains_key("authorization"));
        assert_eq!(sent.body["code"], CODE);
        assert_eq!(sent.body["hostname"], "web-1", "the short name, lowercased");
        assert_eq!(sent.body["tokenSha256"], credential.token.sha256_hex());
        let token = serde_json::to_value(&credential.token).unwrap();
        assert!(!sent.body.to_string().contains(token.as_str().unwrap()), "the token never crosses");
    }

    #[tokio::test]
    async fn a_lost_answer_is_asked_for_again_with_the_same_request() {
        let mock = Mock::start(|_, index| (index >= 2).then(|| (200, answer()))).await;
        let (_root, dir) = state();
        enroll(&mock.origin, &dir, inputs("AbCd1234EfGh5678\n")).await.unwrap();
        let bodies: Vec<_> = mock.requests().into_iter().map(|r| r.body).collect();
        assert_eq!(bodies.len(), 3);
        assert!(bodies.iter().all(|b| *b == bodies[0]), "{bodies:?}");
    }

    #[tokio::test]
    async fn a_refusal_names_the_servers_code_and_writes_nothing() {
        let mock = Mock::start(|_, _| {
            Some((404, json!({"error": {"code": "jump-code-invalid", "message": "unknown, expired or used jump code"}})))
        })
        .await;
        let (_root, dir) = state();
        let err = enroll(&mock.origin, &dir, inputs("AbCd1234EfGh5678\n")).await.unwrap_err();
        assert_eq!(err.code, "jump-code-invalid");
        assert_eq!(err.message, "unknown, expired or used jump code");
        assert_eq!(mock.requests().len(), 1, "a refusal is not retried");
        assert!(!dir.has_credential());
    }

    #[tokio::test]
    async fn local_checks_refuse_before_the_code_is_spent() {
        let mock = Mock::start(|_, _| Some((200, answer()))).await;
        let (_root, dir) = state();
        assert_eq!(enroll(&mock.origin, &dir, inputs("")).await.unwrap_err().code, "jump-code-missing");
        assert_eq!(enroll(&mock.origin, &dir, inputs("short\n")).await.unwrap_err().code, "jump-code-malformed");
        let mut bad_host = inputs("AbCd1234EfGh5678\n");
        bad_host.node_name = "under_score".into();
        assert_eq!(enroll(&mock.origin, &dir, bad_host).await.unwrap_err().code, "hostname-invalid");
        assert_eq!(enroll("http://192.0.2.1:1", &dir, inputs("AbCd1234EfGh5678\n")).await.unwrap_err().code, "origin-not-https");
        assert!(mock.requests().is_empty());

        enroll(&mock.origin, &dir, inputs("AbCd1234EfGh5678\n")).await.unwrap();
        let again = enroll(&mock.origin, &dir, inputs("AbCd1234EfGh5678\n")).await.unwrap_err();
        assert_eq!(again.code, "already-enrolled");
        assert_eq!(mock.requests().len(), 1);
    }

    #[tokio::test]
    async fn no_answer_at_all_is_capstan_unreachable() {
        let mock = Mock::start(|_, _| None).await;
        let (_root, dir) = state();
        let err = enroll(&mock.origin, &dir, inputs("AbCd1234EfGh5678\n")).await.unwrap_err();
        assert_eq!(err.code, "capstan-unreachable");
        assert_eq!(mock.requests().len(), 4);
        assert!(!dir.has_credential());
    }
}
