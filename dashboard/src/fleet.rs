//! The Fleet view (`/fleet`): the facts of `capstan fleet nodes` (and `fleet.listNodes`) as a
//! page, with the panel at `/fleet/panel` refreshed by htmx every few seconds. Administrators
//! only, like the API method.

use super::forms::Flash;
use super::{current_identity, message_page, nav, render, rfc3339, to_login, unavailable, user_view, utc};
use crate::Host;
use crate::Viewer;
use crate::refusal::{Refusal, Result};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use capstan_server::fleet::listing;
use minijinja::context;
use minijinja::value::Serde;
use serde::Serialize;

/// The binaries whose versions are shown, in this order.
const BINARIES: [&str; 3] = ["capstan", "wit", "wasmtime"];

#[derive(Serialize)]
struct FreezeView {
    since: String,
    since_iso: String,
    by: String,
    reason: String,
}

#[derive(Serialize)]
struct CoordinatorView {
    holder: String,
    fence: u64,
    /// The lease has not expired: the holder acts as coordinator.
    current: bool,
    /// `expires in 42 s` or `expired 3 min ago`.
    expiry: String,
    expires_iso: String,
}

#[derive(Serialize)]
struct VersionCount {
    version: String,
    count: usize,
    /// `on 3 nodes`
    on: String,
    /// `0.1.0 on 3 nodes`
    text: String,
    unreported: bool,
}

#[derive(Serialize)]
struct BinaryView {
    binary: &'static str,
    counts: Vec<VersionCount>,
    /// More than one reported version.
    mixed: bool,
}

#[derive(Serialize)]
struct Label {
    key: String,
    value: String,
}

#[derive(Serialize)]
struct RowView {
    node_id: String,
    state: String,
    answering: bool,
    /// `3 s ago`, or `never`.
    heartbeat: String,
    heartbeat_at: Option<String>,
    heartbeat_iso: Option<String>,
    address: String,
    version: Option<String>,
    labels: Vec<Label>,
    coordinator: bool,
}

#[derive(Serialize)]
struct FleetView {
    total: usize,
    live: usize,
    /// `2 nodes, 1 live`
    summary: String,
    freeze: Option<FreezeView>,
    coordinator: Option<CoordinatorView>,
    versions: Vec<BinaryView>,
    nodes: Vec<RowView>,
}

#[derive(Serialize)]
struct ErrorView {
    code: String,
    message: String,
}

fn plural(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// `3 s ago`, `4 min ago`, `5 h ago`, `2 d ago`.
pub(super) fn ago(ms: u64) -> String {
    match ms / 1000 {
        0 => "just now".into(),
        s if s < 120 => format!("{s} s ago"),
        s if s < 7200 => format!("{} min ago", s / 60),
        s if s < 172_800 => format!("{} h ago", s / 3600),
        s => format!("{} d ago", s / 86_400),
    }
}

/// `in 42 s`, `in 3 min`, `in 2 h`.
fn within(ms: u64) -> String {
    match ms.div_ceil(1000) {
        s if s < 120 => format!("in {s} s"),
        s if s < 7200 => format!("in {} min", s / 60),
        s => format!("in {} h", s / 3600),
    }
}

/// `13:45:07 UTC` (ms since the epoch), for the time of a refresh.
fn clock(ms: u64) -> String {
    let text = rfc3339(ms);
    text.get(11..19).map(|t| format!("{t} UTC")).unwrap_or(text)
}

fn view(listing: &listing::Listing) -> FleetView {
    let now = listing.now;
    let freeze = listing.freeze.as_ref().map(|f| FreezeView {
        since: utc(f.since),
        since_iso: rfc3339(f.since),
        by: f.by.clone(),
        reason: f.reason.clone(),
    });
    let coordinator = listing.coordinator.as_ref().map(|lease| {
        let current = lease.expires_at > now;
        let expiry = if current {
            format!("expires {}", within(lease.expires_at - now))
        } else {
            format!("expired {}", ago(now.saturating_sub(lease.expires_at)))
        };
        CoordinatorView { holder: lease.holder.clone(), fence: lease.fence, current, expiry, expires_iso: rfc3339(lease.expires_at) }
    });
    let versions = BINARIES
        .iter()
        .filter_map(|&binary| {
            let counts = listing.versions.get(binary).filter(|c| !c.is_empty())?;
            let counts: Vec<VersionCount> = counts
                .iter()
                .map(|(version, count)| VersionCount {
                    version: version.clone(),
                    count: *count,
                    on: format!("on {}", plural(*count, "node", "nodes")),
                    text: format!("{version} on {}", plural(*count, "node", "nodes")),
                    // the listing's own marker for nodes that did not say
                    unreported: version == "unreported",
                })
                .collect();
            let mixed = counts.iter().filter(|c| !c.unreported).count() > 1;
            Some(BinaryView { binary, counts, mixed })
        })
        .collect();
    let nodes = listing
        .nodes
        .iter()
        .map(|row| {
            let beat_at = row.heartbeat_age_ms.map(|age| now.saturating_sub(age));
            RowView {
                node_id: row.node_id.clone(),
                state: row.state.clone(),
                answering: row.answering,
                heartbeat: row.heartbeat_age_ms.map(ago).unwrap_or_else(|| "never".into()),
                heartbeat_at: beat_at.map(utc),
                heartbeat_iso: beat_at.map(rfc3339),
                address: row.address.clone(),
                version: row.capstan.clone(),
                labels: row.labels.iter().map(|(key, value)| Label { key: key.clone(), value: value.clone() }).collect(),
                coordinator: row.coordinator,
            }
        })
        .collect();
    FleetView {
        total: listing.total,
        live: listing.live,
        summary: format!("{}, {} live", plural(listing.total, "node", "nodes"), listing.live),
        freeze,
        coordinator,
        versions,
        nodes,
    }
}

/// The listing `fleet.listNodes` answers, as the API answers it to `identity`.
async fn read_listing(state: &Host, identity: &Viewer) -> Result<listing::Listing> {
    let answer = super::forms::call(state, identity, "fleet.listNodes", serde_json::json!({})).await?;
    serde_json::from_value(answer).map_err(Refusal::internal)
}

/// The panel's context: the fleet, or the refusal that kept it from being read (logged;
/// shown as its code and client-facing message, never its detail).
async fn panel_context(state: &Host, identity: &Viewer) -> minijinja::Value {
    let now = capstan_core::clock::now_ms();
    let checked = context! { checked_at => clock(now), checked_iso => rfc3339(now) };
    match read_listing(state, identity).await {
        Ok(listing) => context! { fleet => Serde(Some(view(&listing))), error => Serde(None::<ErrorView>), ..checked },
        Err(refusal) => {
            if refusal.http_status() >= 500 {
                tracing::error!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "the fleet view could not read the bucket: {}", refusal.message);
            } else {
                tracing::warn!(code = %refusal.code, "the fleet view could not read the bucket: {}", refusal.message);
            }
            let error = ErrorView { code: refusal.code.to_string(), message: refusal.message.clone() };
            context! { fleet => Serde(None::<FleetView>), error => Serde(Some(error)), ..checked }
        }
    }
}

fn forbidden() -> Response {
    message_page(
        StatusCode::FORBIDDEN,
        "Administrators only",
        "The fleet view is for administrators. Ask one to show you, or to make you one.",
    )
}

/// `GET /fleet`: the page.
pub(super) async fn page(State(state): State<Host>, headers: HeaderMap) -> Response {
    let identity = match current_identity(&state, &headers).await {
        Ok(Some(identity)) => identity,
        Ok(None) => return to_login(&state, &headers),
        Err(refusal) => return unavailable(refusal),
    };
    if !identity.is_human_admin() {
        return forbidden();
    }
    fleet_page(&state, &identity, StatusCode::OK, None).await
}

async fn fleet_page(state: &Host, identity: &Viewer, status: StatusCode, flash: Option<Flash>) -> Response {
    let ctx = context! {
        page => "Fleet",
        nav => Serde(nav(state, "fleet")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        ..panel_context(state, identity).await
    };
    render(status, "fleet.html", ctx)
}

/// What `fleet.rebalance` answers, as far as the page tells it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rebalanced {
    decided_by: String,
    fence: u64,
    placements: std::collections::BTreeMap<String, Vec<String>>,
}

/// `POST /fleet/rebalance`: decide placements now. The coordinator decides; on any other node
/// the call is forwarded there with the session's token, like the API's.
pub(super) async fn rebalance(State(state): State<Host>, request: axum::extract::Request) -> Response {
    let (identity, _) = match super::forms::post(&state, request).await {
        Ok(posted) => posted,
        Err(answer) => return answer,
    };
    if !identity.is_human_admin() {
        return forbidden();
    }
    let answer = super::forms::call(&state, &identity, "fleet.rebalance", serde_json::json!({})).await;
    let (status, flash) = match answer.and_then(|a| serde_json::from_value::<Rebalanced>(a).map_err(Refusal::internal)) {
        Ok(decided) => {
            let work = plural(decided.placements.len(), "workload", "workloads");
            let message = format!("{work} placed by {} under fence {}.", decided.decided_by, decided.fence);
            (StatusCode::OK, Flash::done("Placements decided", message))
        }
        Err(refusal) => (super::forms::status_of(&refusal), Flash::refused("Placements not decided", &refusal, "Try again shortly.")),
    };
    fleet_page(&state, &identity, status, Some(flash)).await
}

/// `GET /fleet/panel`: the panel alone, for htmx to swap in place.
pub(super) async fn panel(State(state): State<Host>, headers: HeaderMap) -> Response {
    match current_identity(&state, &headers).await {
        Ok(Some(identity)) if identity.is_human_admin() => {
            render(StatusCode::OK, "fleet_panel.html", panel_context(&state, &identity).await)
        }
        Ok(Some(_)) => forbidden(),
        // htmx follows HX-Redirect with a full page load; a plain request gets the redirect
        Ok(None) if headers.contains_key("hx-request") => (StatusCode::UNAUTHORIZED, [("hx-redirect", "/login")]).into_response(),
        Ok(None) => to_login(&state, &headers),
        Err(refusal) => unavailable(refusal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_people_say_them() {
        assert_eq!(ago(400), "just now");
        assert_eq!(ago(3_200), "3 s ago");
        assert_eq!(ago(119_999), "119 s ago");
        assert_eq!(ago(125_000), "2 min ago");
        assert_eq!(ago(3 * 3600 * 1000), "3 h ago");
        assert_eq!(ago(3 * 86_400 * 1000), "3 d ago");
        assert_eq!(within(41_200), "in 42 s");
        assert_eq!(within(600_000), "in 10 min");
        assert_eq!(clock(1_700_000_007_000), "22:13:27 UTC");
        assert_eq!(plural(1, "node", "nodes"), "1 node");
    }

    fn record(id: &str, heartbeat_at: Option<u64>, capstan: Option<&str>) -> capstan_server::fleet::NodeRecord {
        capstan_server::fleet::NodeRecord {
            node_id: id.into(),
            public_key: String::new(),
            addresses: capstan_server::fleet::Addresses { internal: "10.0.0.1".into(), api_port: 8080 },
            labels: [("zone".to_string(), "a".to_string())].into(),
            versions: capstan.map(|v| capstan_server::fleet::Versions {
                capstan: v.into(),
                wit_world: capstan_core::build::PLUGIN_CONTRACT.into(),
                wasmtime: None,
            }),
            serves: vec![],
            network: None,
            booted_at: 0,
            heartbeat_at,
            draining_at: None,
            signature: None,
        }
    }

    #[test]
    fn the_view_says_what_the_listing_says() {
        let now = 10_000_000;
        let nodes = [
            record("fresh", Some(now - 3_000), Some("0.2.0")),
            record("old", Some(now - 600_000), Some("0.1.0")),
            record("mute", None, None),
        ];
        let lease = capstan_server::fleet::lease::LeaseRecord {
            holder: "old".into(),
            fence: 7,
            acquired_at: 0,
            renewed_at: 0,
            expires_at: now - 120_000,
        };
        let listing = listing::build(now, &capstan_server::fleet::Timing::default(), &nodes, None, Some(lease));
        let view = view(&listing);
        assert_eq!(view.summary, "3 nodes, 1 live");
        let states: Vec<(&str, &str, &str)> =
            view.nodes.iter().map(|r| (r.node_id.as_str(), r.state.as_str(), r.heartbeat.as_str())).collect();
        assert_eq!(states, [("fresh", "live", "3 s ago"), ("mute", "never", "never"), ("old", "stale", "10 min ago")]);
        assert!(view.nodes.iter().all(|r| !r.coordinator), "an expired lease makes no coordinator");
        let coordinator = view.coordinator.unwrap();
        assert_eq!((coordinator.holder.as_str(), coordinator.fence, coordinator.current), ("old", 7, false));
        assert_eq!(coordinator.expiry, "expired 2 min ago");
        let binaries: Vec<&str> = view.versions.iter().map(|b| b.binary).collect();
        assert_eq!(binaries, ["capstan", "wit", "wasmtime"]);
        let capstan: Vec<&str> = view.versions[0].counts.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(capstan, ["0.2.0 on 1 node", "0.1.0 on 1 node", "unreported on 1 node"]);
        assert!(view.versions[0].mixed && !view.versions[1].mixed && !view.versions[2].mixed);
        assert!(view.versions[2].counts[0].unreported);
    }
}
