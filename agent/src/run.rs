//! `capstan-agent run`: the heartbeat loop.
//!
//! Each pass re-reads the credential file (so a rotation by `capstan-agent rotate` is picked
//! up), beats with a report of the host, and after an accepted beat fetches the hostname intent
//! and applies it when it changed; a fresh apply is reported by a beat right away. The wait
//! before the next pass comes from the pure schedule in `backoff`. Each change of state (beats
//! accepted, Capstan unreachable, the credential refused, …) is logged once, not every beat.
//! Nothing here exits on a failure: the loop stops only when asked to (SIGTERM, ctrl-c).

use crate::applier::{self, Applier};
use crate::backoff::{After, next_delay};
use crate::report;
use crate::state::{BeatRecord, Credential, StateDir, Status};
use crate::wire::{Client, HeartbeatAnswer, HeartbeatRequest, HostAnswer, HostRequest, PROTOCOL, WireError};
use capstan_core::Refusal;
use std::future::Future;
use std::time::Duration;

/// How the loop runs.
pub struct Options {
    /// The state directory.
    pub state: StateDir,
    /// The beat interval (30 s; shorter in tests).
    pub interval: Duration,
    /// How the hostname intent is applied.
    pub applier: Box<dyn Applier>,
    /// The address the node's published ports are reached at (`--advertise-address`).
    pub advertised: Option<std::net::IpAddr>,
}

/// What the last pass came to, for logging each change once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Health {
    Starting,
    Accepted,
    Unreachable,
    Unauthorized,
    Refused(String),
    StateUnusable(String),
}

/// One pass's outcome.
struct Pass {
    health: Health,
    /// Run the next pass at once (a fresh apply to report).
    again_now: bool,
}

/// Run until `shutdown` completes.
pub async fn run(options: Options, shutdown: impl Future<Output = &'static str>) -> Result<(), Refusal> {
    // a credential that cannot be read at the start is a mistake to say at once
    let first = options.state.read_credential()?;
    if first.dev_host {
        tracing::warn!("{}", crate::enroll::dev_host_warning(&first.origin));
    }
    tracing::info!(
        origin = %first.origin,
        node_id = %first.node_id,
        interval = %humantime::format_duration(options.interval),
        applier = %options.applier.describe(),
        "capstan-agent running"
    );
    let mut agent = Agent { options, client: None, health: Health::Starting, failures: 0, intent_error: None };
    tokio::pin!(shutdown);
    loop {
        let pass = tokio::select! {
            why = &mut shutdown => return stopped(why),
            pass = agent.pass() => pass,
        };
        let after = match &pass.health {
            Health::Accepted => {
                agent.failures = 0;
                After::Accepted
            }
            Health::Unauthorized => {
                agent.failures += 1;
                After::Unauthorized(agent.failures)
            }
            _ => {
                agent.failures += 1;
                After::Failure(agent.failures)
            }
        };
        agent.note(pass.health);
        let delay = if pass.again_now { Duration::ZERO } else { next_delay(agent.options.interval, after, rand::random::<f64>()) };
        tracing::debug!(delay = %humantime::format_duration(delay), "next beat");
        tokio::select! {
            why = &mut shutdown => return stopped(why),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

fn stopped(why: &str) -> Result<(), Refusal> {
    tracing::info!("stopping ({why})");
    Ok(())
}

struct Agent {
    options: Options,
    client: Option<Client>,
    health: Health,
    failures: u32,
    intent_error: Option<String>,
}

impl Agent {
    fn client(&mut self, origin: &str) -> Result<Client, Refusal> {
        match &self.client {
            Some(client) if client.origin() == origin => Ok(client.clone()),
            _ => {
                let client = Client::new(origin)?;
                self.client = Some(client.clone());
                Ok(client)
            }
        }
    }

    /// Log a change of state once.
    fn note(&mut self, health: Health) {
        if health == self.health {
            return;
        }
        match &health {
            Health::Accepted if self.health == Health::Starting => tracing::info!("beats accepted"),
            Health::Accepted => tracing::info!("beats accepted again"),
            Health::Unreachable => tracing::warn!("Capstan cannot be reached; backing off (up to 5 min between attempts)"),
            Health::Unauthorized => tracing::error!(
                "Capstan refused this node's credential (node-unauthorized): it was revoked or replaced; an operator can rotate or re-enroll it; retrying slowly"
            ),
            Health::Refused(what) => tracing::warn!("Capstan refused the beat: {what}"),
            Health::StateUnusable(what) => tracing::error!("the credential file cannot be used: {what}; retrying slowly"),
            Health::Starting => {}
        }
        self.health = health;
    }

    async fn pass(&mut self) -> Pass {
        let credential = match self.options.state.read_credential() {
            Ok(credential) => credential,
            Err(refusal) => return Pass { health: Health::StateUnusable(refusal.to_string()), again_now: false },
        };
        let client = match self.client(&credential.origin) {
            Ok(client) => client,
            Err(refusal) => return Pass { health: Health::StateUnusable(refusal.to_string()), again_now: false },
        };
        let mut status = self.options.state.read_status();
        let beat = self.beat(&client, &credential, &status).await.and_then(|answer| {
            if answer.accepted {
                tracing::debug!(fresh_for_ms = answer.fresh_for_ms, "beat accepted");
                Ok(answer)
            } else {
                Err(WireError::Refused { status: 200, code: "answer-malformed".into(), message: "the beat was not accepted".into() })
            }
        });
        let health = match &beat {
            Ok(_) => Health::Accepted,
            Err(WireError::Unreachable(why)) => {
                tracing::debug!("beat not delivered: {why}");
                Health::Unreachable
            }
            Err(WireError::Refused { code, .. }) if code == "node-unauthorized" => Health::Unauthorized,
            Err(WireError::Refused { status, code, message }) => Health::Refused(format!("{code} ({status}): {message}")),
        };
        record_beat(&mut status, &beat);
        let mut again_now = false;
        if beat.is_ok() {
            // a beat may have finished a pending rotation: ask with the token now in use
            let credential = self.options.state.read_credential().unwrap_or(credential);
            again_now = self.follow_intent(&client, &credential, &mut status).await;
        }
        if let Err(refusal) = self.options.state.write_status(&status) {
            tracing::debug!("keeping the status failed: {refusal}");
        }
        Pass { health, again_now }
    }

    /// Beat with the current token; when it is refused and a rotation is pending, try the
    /// pending token: accepted, it proves the rotation committed, and it becomes the token.
    async fn beat(&self, client: &Client, credential: &Credential, status: &Status) -> Result<HeartbeatAnswer, WireError> {
        let hostname = self.options.applier.current().unwrap_or_else(os_hostname);
        let report = report::gather(hostname, status.host_apply.clone(), self.options.advertised);
        let request = HeartbeatRequest { protocol: PROTOCOL, node_id: &credential.node_id, report: &report };
        let answer = client.post("/agent/v1/heartbeat", &request, Some(&credential.token)).await;
        if !matches!(&answer, Err(e) if e.code() == Some("node-unauthorized")) {
            return answer;
        }
        // `rotate` may have changed the file since it was read: ask with what it holds now
        let now = self.options.state.read_credential().unwrap_or_else(|_| credential.clone());
        if now.token != credential.token && now.node_id == credential.node_id {
            return client.post("/agent/v1/heartbeat", &request, Some(&now.token)).await;
        }
        let Some(pending) = &now.pending_token else { return answer };
        let retried = client.post::<_, HeartbeatAnswer>("/agent/v1/heartbeat", &request, Some(pending)).await;
        if let Ok(accepted) = &retried {
            self.finish_rotation(pending, accepted.credential_generation);
        }
        retried
    }

    fn finish_rotation(&self, pending: &crate::token::Token, generation: u64) {
        let result = (|| {
            let lock = self.options.state.lock()?;
            let mut now = self.options.state.read_credential()?;
            if now.pending_token.as_ref() == Some(pending) {
                now.token = pending.clone();
                now.credential_generation = generation;
                now.pending_token = None;
                now.pending_mutation_id = None;
                self.options.state.replace_credential(&now, &lock)?;
            }
            Ok::<_, Refusal>(())
        })();
        match result {
            Ok(()) => tracing::info!(generation, "the pending rotation had committed; the new token is now in use"),
            Err(refusal) => tracing::warn!("finishing the pending rotation failed: {refusal}"),
        }
    }

    /// Fetch the hostname intent and apply it if it changed; answers whether something was
    /// applied (to be reported at once).
    async fn follow_intent(&mut self, client: &Client, credential: &Credential, status: &mut Status) -> bool {
        let request = HostRequest { protocol: PROTOCOL, node_id: &credential.node_id };
        let intent: HostAnswer = match client.post("/agent/v1/host", &request, Some(&credential.token)).await {
            Ok(intent) => intent,
            Err(e) => {
                let what = e.to_string();
                if self.intent_error.as_ref() != Some(&what) {
                    tracing::warn!("fetching the hostname intent failed: {what}");
                    self.intent_error = Some(what);
                }
                return false;
            }
        };
        self.intent_error = None;
        let Some(name) = applier::decide(intent.hostname.as_deref(), intent.generation, status.host_apply.as_ref()) else {
            return false;
        };
        let outcome = applier::apply(self.options.applier.as_ref(), &name, intent.generation);
        let changed = status.host_apply.as_ref() != Some(&outcome);
        match (&outcome.reason, changed) {
            (None, _) => {
                tracing::info!(hostname = %name, generation = intent.generation, "hostname set through {}", self.options.applier.describe())
            }
            (Some(reason), true) => {
                tracing::warn!(hostname = %name, generation = intent.generation, "setting the hostname failed: {reason}")
            }
            (Some(_), false) => {}
        }
        status.host_apply = Some(outcome);
        changed
    }
}

fn record_beat(status: &mut Status, beat: &Result<HeartbeatAnswer, WireError>) {
    let at_ms = capstan_core::clock::now_ms();
    let last_accepted_at_ms = status.last_beat.as_ref().and_then(|b| b.last_accepted_at_ms);
    status.last_beat = Some(match beat {
        Ok(answer) => BeatRecord {
            at_ms,
            outcome: "accepted".into(),
            code: None,
            message: None,
            credential_generation: Some(answer.credential_generation),
            last_accepted_at_ms: Some(at_ms),
        },
        Err(WireError::Unreachable(why)) => BeatRecord {
            at_ms,
            outcome: "unreachable".into(),
            code: Some("capstan-unreachable".into()),
            message: Some(why.clone()),
            credential_generation: None,
            last_accepted_at_ms,
        },
        Err(WireError::Refused { code, message, .. }) => BeatRecord {
            at_ms,
            outcome: if code == "node-unauthorized" { "unauthorized".into() } else { "refused".into() },
            code: Some(code.clone()),
            message: Some(message.clone()),
            credential_generation: None,
            last_accepted_at_ms,
        },
    });
}

/// The machine's short hostname, lowercased, as the operating system has it now.
pub fn os_hostname() -> String {
    let node = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let short = node.split('.').next().unwrap_or_default().to_ascii_lowercase();
    if short.is_empty() { "localhost".into() } else { capstan_core::text::escape_control(&short).into_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::applier::HostnameFile;
    use crate::mock::{Mock, enrolled};
    use crate::token::Token;
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    fn receipt(generation: u64) -> serde_json::Value {
        json!({"protocol": PROTOCOL, "accepted": true, "nodeId": "node_1", "credentialGeneration": generation,
            "acceptedAt": 1, "freshForMs": 180000})
    }

    #[tokio::test]
    async fn beats_apply_the_intent_and_report_it_on_the_next_beat() {
        let mock = Mock::start(|request, _| match request.path.as_str() {
            "/agent/v1/heartbeat" => Some((200, receipt(1))),
            "/agent/v1/host" => Some((200, json!({"protocol": PROTOCOL, "hostname": "db-2", "generation": 3}))),
            _ => Some((404, json!({"error": {"code": "not-found", "message": "no"}}))),
        })
        .await;
        let (root, dir, credential) = enrolled(&mock.origin);
        let file = root.path().join("hostname");
        let options = Options {
            state: dir.clone(),
            interval: Duration::from_millis(50),
            applier: Box::new(HostnameFile(file.clone())),
            advertised: Some("192.0.2.10".parse().unwrap()),
        };
        let stop = tokio::time::sleep(Duration::from_millis(400));
        run(options, async move {
            stop.await;
            "test"
        })
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "db-2\n");
        let requests = mock.requests();
        let beats: Vec<_> = requests.iter().filter(|r| r.path == "/agent/v1/heartbeat").collect();
        assert!(beats.len() >= 3, "{}", beats.len());
        assert_eq!(beats[0].headers["authorization"], credential.token.bearer().as_str());
        assert_eq!(beats[0].body["nodeId"], "node_1");
        assert!(beats[0].body["report"].get("hostApply").is_none(), "nothing applied before the first beat");
        assert_eq!(beats[1].body["report"]["hostApply"], json!({"generation": 3, "hostname": "db-2", "outcome": "applied"}));
        assert_eq!(beats[1].body["report"]["hostname"], "db-2", "the hostname as the applier sees it");
        assert_eq!(beats[0].body["report"]["advertisedAddress"], "192.0.2.10", "the operator's address rides every beat");
        let host = requests.iter().find(|r| r.path == "/agent/v1/host").unwrap();
        assert_eq!(host.body, json!({"protocol": PROTOCOL, "nodeId": "node_1"}));
        let applies = std::fs::read_to_string(&file).unwrap();
        assert_eq!(applies, "db-2\n");
        let status = dir.read_status();
        assert_eq!(status.last_beat.unwrap().outcome, "accepted");
        assert_eq!(status.host_apply.unwrap().generation, 3);
    }

    #[tokio::test]
    async fn a_rotation_written_to_the_file_is_picked_up_by_the_next_beat() {
        let mock = Mock::start(|_, _| Some((200, receipt(1)))).await;
        let (_root, dir, first) = enrolled(&mock.origin);
        let options = Options {
            state: dir.clone(),
            interval: Duration::from_millis(50),
            applier: Box::new(crate::applier::Unavailable),
            advertised: None,
        };
        let second = Token::draw().unwrap();
        let swap_dir = dir.clone();
        let swap_token = second.clone();
        let stop = async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let lock = swap_dir.lock().unwrap();
            let mut now = swap_dir.read_credential().unwrap();
            now.token = swap_token;
            swap_dir.replace_credential(&now, &lock).unwrap();
            drop(lock);
            tokio::time::sleep(Duration::from_millis(200)).await;
            "test"
        };
        run(options, stop).await.unwrap();
        let bearers: Vec<String> =
            mock.requests().iter().filter(|r| r.path == "/agent/v1/heartbeat").map(|r| r.headers["authorization"].clone()).collect();
        assert_eq!(bearers.first().unwrap(), first.token.bearer().as_str());
        assert_eq!(bearers.last().unwrap(), second.bearer().as_str());
    }

    #[tokio::test]
    async fn a_refused_credential_is_retried_slowly_and_a_committed_pending_rotation_is_finished() {
        let accepted_hash: Arc<Mutex<String>> = Arc::default();
        let hash = accepted_hash.clone();
        let mock = Mock::start(move |request, _| {
            let bearer = request.headers.get("authorization").cloned().unwrap_or_default();
            let ok = Token::parse(bearer.trim_start_matches("Bearer ")).is_some_and(|t| t.sha256_hex() == *hash.lock().unwrap());
            if ok {
                Some((
                    200,
                    if request.path == "/agent/v1/host" {
                        json!({"protocol": PROTOCOL, "hostname": null, "generation": 0})
                    } else {
                        receipt(2)
                    },
                ))
            } else {
                Some((401, json!({"error": {"code": "node-unauthorized", "message": "node credential refused"}})))
            }
        })
        .await;
        let (_root, dir, _) = enrolled(&mock.origin);
        // the credential is refused: beats go out slowly (not every 50 ms)
        let options = Options {
            state: dir.clone(),
            interval: Duration::from_millis(50),
            applier: Box::new(crate::applier::Unavailable),
            advertised: None,
        };
        let stop = tokio::time::sleep(Duration::from_millis(500));
        run(options, async move {
            stop.await;
            "test"
        })
        .await
        .unwrap();
        assert_eq!(mock.requests().len(), 1, "one refused beat, then a slow retry");
        assert_eq!(dir.read_status().last_beat.unwrap().outcome, "unauthorized");

        // a rotation committed on the host, its answer lost: the pending token is accepted
        let lock = dir.lock().unwrap();
        let mut credential = dir.read_credential().unwrap();
        let pending = Token::draw().unwrap();
        credential.pending_token = Some(pending.clone());
        credential.pending_mutation_id = Some("rot_1".into());
        dir.replace_credential(&credential, &lock).unwrap();
        drop(lock);
        *accepted_hash.lock().unwrap() = pending.sha256_hex();
        let options = Options {
            state: dir.clone(),
            interval: Duration::from_millis(50),
            applier: Box::new(crate::applier::Unavailable),
            advertised: None,
        };
        let stop = tokio::time::sleep(Duration::from_millis(300));
        run(options, async move {
            stop.await;
            "test"
        })
        .await
        .unwrap();
        let now = dir.read_credential().unwrap();
        assert_eq!(now.token, pending);
        assert_eq!((now.credential_generation, now.pending_token.is_none()), (2, true));
        assert_eq!(dir.read_status().last_beat.unwrap().outcome, "accepted");
    }

    #[tokio::test]
    async fn a_beat_refused_because_rotate_just_finished_is_sent_again_with_the_new_token() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::new(root.path().join("state"));
        dir.create().unwrap();
        let new_token = Token::draw().unwrap();
        let (file_dir, swapped) = (dir.clone(), new_token.clone());
        let mock = Mock::start(move |request, index| {
            if index == 0 {
                // `rotate` completes between the agent's read of the file and its beat
                let lock = file_dir.lock().unwrap();
                let mut now = file_dir.read_credential().unwrap();
                now.token = swapped.clone();
                now.credential_generation = 2;
                file_dir.replace_credential(&now, &lock).unwrap();
                return Some((401, json!({"error": {"code": "node-unauthorized", "message": "refused"}})));
            }
            assert_eq!(request.headers["authorization"], swapped.bearer().as_str());
            Some((
                200,
                if request.path == "/agent/v1/host" {
                    json!({"protocol": PROTOCOL, "hostname": null, "generation": 0})
                } else {
                    receipt(2)
                },
            ))
        })
        .await;
        let credential = Credential {
            origin: mock.origin.clone(),
            node_id: "node_1".into(),
            cluster_id: "cls_1".into(),
            token: Token::draw().unwrap(),
            credential_generation: 1,
            pending_token: None,
            pending_mutation_id: None,
            dev_host: false,
        };
        dir.write_new_credential(&credential).unwrap();
        let options = Options {
            state: dir.clone(),
            interval: Duration::from_secs(5),
            applier: Box::new(crate::applier::Unavailable),
            advertised: None,
        };
        let stop = tokio::time::sleep(Duration::from_millis(300));
        run(options, async move {
            stop.await;
            "test"
        })
        .await
        .unwrap();
        let paths: Vec<String> = mock.requests().into_iter().map(|r| r.path).collect();
        assert_eq!(paths, ["/agent/v1/heartbeat", "/agent/v1/heartbeat", "/agent/v1/host"]);
        assert_eq!(dir.read_status().last_beat.unwrap().outcome, "accepted");
    }

    #[tokio::test]
    async fn an_unreachable_capstan_is_not_a_reason_to_stop() {
        let mock = Mock::start(|_, _| None).await;
        let (_root, dir, _) = enrolled(&mock.origin);
        let options = Options {
            state: dir.clone(),
            interval: Duration::from_millis(20),
            applier: Box::new(crate::applier::Unavailable),
            advertised: None,
        };
        let stop = tokio::time::sleep(Duration::from_millis(400));
        run(options, async move {
            stop.await;
            "test"
        })
        .await
        .unwrap();
        let count = mock.requests().len();
        // 20, 40, 80, 160 ms (less jitter): a handful of attempts, not one per 20 ms
        assert!((2..=8).contains(&count), "{count}");
        let last = dir.read_status().last_beat.unwrap();
        assert_eq!((last.outcome.as_str(), last.code.as_deref()), ("unreachable", Some("capstan-unreachable")));
    }
}
