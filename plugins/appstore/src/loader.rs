//! Asking the configured sources for a newer catalog, in the background: the setting
//! `appstore.catalogSources` lists URLs and `appstore.catalogRegistries` npm registries holding
//! the catalog package (`npm`), asked in that order until one answers a catalog that is the
//! active one or may succeed it. After a success the next pass is due in 15 minutes; after a
//! failure in 1, 2, 4, … up to 30 minutes. The schedule and the last outcome live in
//! `loader/state`, so every node (and the status method) sees them.

use crate::active::{self, Outcome, now_ms};
use capstan_sdk::http::Request;
use capstan_sdk::store;
use capstan_sdk::{Refusal, Result, Value, json};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const LOADER: &str = "loader";
const STATE: &str = "state";
const AFTER_SUCCESS_MS: u64 = 15 * 60 * 1000;
const BACKOFF_FIRST_MS: u64 = 60 * 1000;
const BACKOFF_MAX_MS: u64 = 30 * 60 * 1000;
const FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// One source's refusal or failure in the last pass.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceError {
    pub source: String,
    pub code: String,
    pub message: String,
    /// The refusal's `data.cause` when it names one (e.g. `certificate-unknown-issuer` for
    /// `http-tls-failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

/// `loader/state`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub last_attempt_at: Option<u64>,
    pub last_success_at: Option<u64>,
    /// What the last pass did: `activated`, `unchanged`, `superseded`, `failed` or `no-sources`.
    pub last_outcome: Option<String>,
    /// Why each source failed in the last pass (empty after a success).
    #[serde(default)]
    pub errors: Vec<SourceError>,
    pub consecutive_failures: u32,
    pub next_attempt_at: Option<u64>,
}

pub fn state() -> Result<State> {
    Ok(store::get::<State>(LOADER, STATE)?.map(|d| d.data).unwrap_or_default())
}

/// One place a pass asks: an HTTPS source, or an npm registry for the catalog package.
enum Origin {
    Source(String),
    Registry(String, String),
}

impl Origin {
    fn name(&self) -> &str {
        match self {
            Origin::Source(url) | Origin::Registry(url, _) => url,
        }
    }
}

/// The sources, then the registries, in the order the settings list them.
fn origins() -> Result<Vec<Origin>> {
    let settings = crate::settings::get()?;
    let mut all: Vec<Origin> = settings.catalog_sources.0.into_iter().map(Origin::Source).collect();
    let package = settings.catalog_package.0;
    all.extend(settings.catalog_registries.0.into_iter().map(|registry| Origin::Registry(registry, package.clone())));
    Ok(all)
}

/// Whether a background pass is due now.
pub fn due() -> Result<bool> {
    Ok(state()?.next_attempt_at.is_none_or(|at| now_ms() >= at))
}

fn backoff(failures: u32) -> u64 {
    BACKOFF_FIRST_MS.saturating_mul(1u64 << failures.saturating_sub(1).min(10)).min(BACKOFF_MAX_MS)
}

/// Ask the sources in order; record the outcome and the next due time.
pub fn pass() -> Result<State> {
    let sources = origins()?;
    let started = now_ms();
    let mut errors = Vec::new();
    let mut outcome: Option<Outcome> = None;
    for origin in &sources {
        let source = origin.name();
        let fetched = match origin {
            Origin::Source(url) => fetch_and_activate(url),
            Origin::Registry(registry, package) => fetch_package_and_activate(registry, package),
        };
        match fetched {
            Ok(done) => {
                outcome = Some(done);
                break;
            }
            Err(e) => {
                capstan_sdk::warn!("catalog source {source}: {} ({})", e.message(), e.code());
                let cause = e.data().and_then(|d| d.get("cause")).and_then(Value::as_str).map(String::from);
                errors.push(SourceError { source: source.to_string(), code: e.code().into(), message: e.message().into(), cause });
            }
        }
    }
    let previous = state()?;
    let next = match outcome {
        Some(done) => State {
            last_attempt_at: Some(started),
            last_success_at: Some(started),
            last_outcome: Some(json!(done).as_str().unwrap_or("activated").to_string()),
            errors: Vec::new(),
            consecutive_failures: 0,
            next_attempt_at: Some(started + AFTER_SUCCESS_MS),
        },
        None => {
            let failures = if sources.is_empty() { 0 } else { previous.consecutive_failures + 1 };
            State {
                last_attempt_at: Some(started),
                last_success_at: previous.last_success_at,
                last_outcome: Some(if sources.is_empty() { "no-sources" } else { "failed" }.into()),
                errors,
                consecutive_failures: failures,
                next_attempt_at: Some(started + if sources.is_empty() { AFTER_SUCCESS_MS } else { backoff(failures) }),
            }
        }
    };
    // the last writer wins: both passes asked the same sources
    store::update_with_retry(LOADER, STATE, |_: Option<State>| Ok(Some(next.clone())), 5)?;
    Ok(next)
}

fn fetch_and_activate(source: &str) -> Result<Outcome> {
    let response = Request::get(source).timeout(FETCH_TIMEOUT).header("accept", "application/json").send()?;
    if !response.is_success() {
        return Err(Refusal::new("catalog-source-failed", format!("{source} answered HTTP {}", response.status))
            .with_data(json!({ "status": response.status })));
    }
    active::activate(&response.body, source).map(|(outcome, _)| outcome)
}

fn fetch_package_and_activate(registry: &str, package: &str) -> Result<Outcome> {
    let spec = crate::npm::PackageSpec::parse(package)?;
    let fetched = crate::npm::fetch(registry, &spec)?;
    active::activate(&fetched.envelope, &fetched.source).map(|(outcome, _)| outcome)
}
