//! The cluster ingress the reference relay runs (`capstan-agent relay --ingress-listen ADDR
//! --ingress-bearer-file FILE`): it registers with the ingress manager through the relay's
//! session (`ingress.register`), takes the route tables the manager pushes
//! (`ingress.applyRouteTable`) or that it reads at registration (`ingress.getRouteTable`), and
//! serves them with a small HTTP reverse proxy: a request's `Host` picks the route, a route with
//! a `sourceAllowList` answers only connections from those prefixes, and the request goes to one
//! of the route's targets (the service's ready replicas, in turn; a request without a body that
//! cannot connect to one is tried at the next, so a replica stopping before the table says so
//! costs no request).
//!
//! A table is applied whole and atomically; an older revision than the one held is refused
//! (`route-table-stale`), and the table held stays in force until a newer one arrives, across
//! reconnects of the session.

use crate::handler::{Answer, Handler, RelayContext};
use crate::relay::{Bearer, read_authorization};
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use capstan_core::Refusal;
use serde::Deserialize;
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::Notify;

/// A route as the manager issues it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub hostname: String,
    pub service_id: String,
    /// Empty while the service has no ready replica: the proxy answers 503.
    pub targets: Vec<Target>,
    #[serde(default)]
    pub source_allow_list: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Target {
    pub address: String,
    pub port: u16,
}

/// A complete, revisioned route table.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    pub cluster_id: String,
    pub revision: u64,
    pub routes: Vec<Route>,
    /// The designation the table was pushed under; one the ingress has not registered under
    /// makes it register again.
    #[serde(default)]
    pub designation_generation: u64,
}

/// A route with its allowlist parsed.
struct Served {
    route: Route,
    allow: Option<Vec<(IpAddr, u8)>>,
}

/// Where the external gateway reaches the proxy: a host (an IP address or a DNS name) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    pub host: String,
    pub port: u16,
}

/// `--ingress-advertise HOST:PORT` (`[v6]:port` for an IPv6 address).
pub fn parse_advertised(text: &str) -> Result<Advertised, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return advertised_from(addr).ok_or_else(|| format!("{text}: an unspecified address (0.0.0.0, [::]) or port 0 reaches nothing"));
    }
    let (host, port) = text.rsplit_once(':').ok_or_else(|| format!("{text}: expected HOST:PORT"))?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(|| format!("{text}: the port must be 1-65535"))?;
    let label = |l: &str| {
        (1..=63).contains(&l.len()) && !l.starts_with('-') && !l.ends_with('-') && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if host.len() > 253 || !host.split('.').all(label) {
        return Err(format!("{text}: the host must be an IP address or a DNS name"));
    }
    Ok(Advertised { host: host.to_ascii_lowercase(), port })
}

/// The address a listener bound to `addr` is reached at, unless it is unspecified.
fn advertised_from(addr: SocketAddr) -> Option<Advertised> {
    (!addr.ip().is_unspecified() && addr.port() != 0).then(|| Advertised { host: addr.ip().to_string(), port: addr.port() })
}

/// The ingress: its options and the table it serves.
pub struct Ingress {
    /// Where the proxy listens.
    pub listen: SocketAddr,
    /// Where the gateway reaches it, if known.
    advertised: Option<Advertised>,
    bearer_file: PathBuf,
    held: RwLock<Option<(u64, Arc<Vec<Served>>)>>,
    client: reqwest::Client,
    /// The designation generation the ingress last registered under (0: none yet).
    registered: AtomicU64,
    /// Turns the targets of every route (requests go to them in turn).
    turn: AtomicU64,
    /// Signalled when a push names another designation: the relay registers the ingress again.
    pub wanted: Notify,
}

impl Ingress {
    /// An ingress serving nothing yet.
    pub fn new(listen: SocketAddr, advertised: Option<Advertised>, bearer_file: PathBuf) -> Result<Arc<Ingress>, Refusal> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(std::time::Duration::from_secs(3))
            .build()
            .map_err(Refusal::internal)?;
        let advertised = advertised.or_else(|| advertised_from(listen));
        Ok(Arc::new(Ingress {
            listen,
            advertised,
            bearer_file,
            held: RwLock::new(None),
            client,
            registered: AtomicU64::new(0),
            turn: AtomicU64::new(0),
            wanted: Notify::new(),
        }))
    }

    /// The file the bearer is read from.
    pub fn bearer_file(&self) -> &std::path::Path {
        &self.bearer_file
    }

    /// The bearer the ingress registers with (the same private-file rules as the relay's).
    pub fn bearer(&self) -> Result<Bearer, Refusal> {
        read_authorization(&self.bearer_file).map_err(|r| Refusal {
            code: r.code.replacen("authorization-file", "ingress-bearer-file", 1).into(),
            message: r.message.replace("relay authorization file", "ingress bearer file").replace("relay bearer", "ingress bearer"),
            ..r
        })
    }

    /// The body of `ingress.register` for this relay's session.
    pub fn registration(&self, ctx: &RelayContext) -> Result<Value, Refusal> {
        let bearer = self.bearer()?;
        let mut body = json!({
            "clusterId": ctx.cluster_id, "nodeId": ctx.node_id, "bearer": bearer.expose(),
            "version": env!("CARGO_PKG_VERSION"), "relayVersion": ctx.version,
            "capabilities": {"routeSourceAllowList": true},
        });
        if let Some(a) = &self.advertised {
            body["advertisedTarget"] = json!({"host": a.host, "port": a.port});
        }
        Ok(body)
    }

    /// The revision held, 0 for none.
    #[cfg(test)]
    fn revision(&self) -> u64 {
        self.held.read().map(|h| h.as_ref().map_or(0, |(r, _)| *r)).unwrap_or(0)
    }

    /// Note the designation generation a registration was accepted under.
    pub fn registered_under(&self, generation: u64) {
        self.registered.store(generation, Ordering::Relaxed);
    }

    /// Apply `table` whole, for the cluster `cluster_id` (the revision held already: nothing
    /// changes).
    pub fn apply(&self, cluster_id: &str, table: Table) -> Result<u64, Refusal> {
        if table.cluster_id != cluster_id {
            return Err(Refusal::new(
                "route-table-foreign",
                format!("a route table of cluster {} reached the relay of {cluster_id}", table.cluster_id),
            ));
        }
        if table.designation_generation != 0 && table.designation_generation != self.registered.load(Ordering::Relaxed) {
            tracing::info!(generation = table.designation_generation, "the ingress designation changed; registering again");
            self.wanted.notify_one();
        }
        let mut served = Vec::with_capacity(table.routes.len());
        for route in table.routes {
            let allow = match &route.source_allow_list {
                None => None,
                Some(prefixes) => Some(prefixes.iter().map(|p| parse_prefix(p)).collect::<Option<Vec<_>>>().ok_or_else(|| {
                    Refusal::new("route-table-invalid", format!("the route for {} carries an unreadable source prefix", route.hostname))
                })?),
            };
            served.push(Served { route, allow });
        }
        let mut held = self.held.write().map_err(|_| Refusal::internal("the route table lock is poisoned"))?;
        let current = held.as_ref().map_or(0, |(r, _)| *r);
        if table.revision < current {
            return Err(Refusal::new("route-table-stale", format!("revision {} is older than the held {current}", table.revision))
                .with_data(json!({"heldRevision": current})));
        }
        if table.revision == current && held.is_some() {
            return Ok(current);
        }
        let hostnames: Vec<&str> = served.iter().map(|s| s.route.hostname.as_str()).collect();
        tracing::info!(revision = table.revision, routes = served.len(), hostnames = %hostnames.join(","), "route table applied");
        *held = Some((table.revision, Arc::new(served)));
        Ok(table.revision)
    }

    /// Serve the proxy until the process ends.
    pub async fn serve(self: Arc<Self>) -> Result<(), Refusal> {
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|e| Refusal::new("ingress-listen-failed", format!("cannot listen on {}: {e}", self.listen)))?;
        tracing::info!(listen = %self.listen, "ingress proxy listening");
        self.serve_on(listener).await
    }

    async fn serve_on(self: Arc<Self>, listener: tokio::net::TcpListener) -> Result<(), Refusal> {
        let app = axum::Router::new().fallback(proxy).with_state(self);
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .map_err(|e| Refusal::new("ingress-serve-failed", format!("the ingress proxy stopped: {e}")))
    }

    fn route_for(&self, host: &str) -> Option<(Arc<Vec<Served>>, usize)> {
        let held = self.held.read().ok()?;
        let (_, routes) = held.as_ref()?;
        let index = routes.iter().position(|s| s.route.hostname == host)?;
        Some((routes.clone(), index))
    }
}

/// `ingress.applyRouteTable`: the manager's push.
pub struct Apply(pub Arc<Ingress>);

impl Handler for Apply {
    fn method(&self) -> &'static str {
        "ingress.applyRouteTable"
    }

    fn handle<'a>(&'a self, ctx: &'a RelayContext, body: Value) -> Answer<'a> {
        Box::pin(async move {
            let table: Table = serde_json::from_value(body)
                .map_err(|e| Refusal::new("route-table-invalid", format!("the route table is not in the expected shape: {e}")))?;
            let applied = self.0.apply(&ctx.cluster_id, table)?;
            Ok(json!({"appliedRevision": applied}))
        })
    }
}

const HOP_BY_HOP: [&str; 8] =
    ["connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"];

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(format!("{text}\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

async fn proxy(State(ingress): State<Arc<Ingress>>, ConnectInfo(peer): ConnectInfo<SocketAddr>, request: Request<Body>) -> Response<Body> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| h.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(h, |(name, _)| name))
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let Some((routes, index)) = ingress.route_for(&host) else {
        return plain(StatusCode::NOT_FOUND, &format!("no route for {}", capstan_core::text::truncate(&host, 253)));
    };
    let served = &routes[index];
    if let Some(allow) = &served.allow
        && !allow.iter().any(|(net, len)| contains(*net, *len, peer.ip()))
    {
        return plain(StatusCode::FORBIDDEN, "this hostname is not served to this source");
    }
    let targets = &served.route.targets;
    if targets.is_empty() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "no replica of the service behind this hostname is ready");
    }
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    let (parts, body) = request.into_parts();
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(ip) = HeaderValue::from_str(&peer.ip().to_string()) {
        headers.append("x-forwarded-for", ip);
    }
    if let Ok(h) = HeaderValue::from_str(&host) {
        headers.insert("x-forwarded-host", h);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    // a request without a body can be sent again to the next target when one refuses it
    let bodyless = !parts.headers.contains_key(header::TRANSFER_ENCODING)
        && parts.headers.get(header::CONTENT_LENGTH).is_none_or(|l| l.as_bytes() == b"0");
    let mut body = Some(body);
    let first = ingress.turn.fetch_add(1, Ordering::Relaxed) as usize;
    let mut last_failure = None;
    for attempt in 0..targets.len() {
        let target = &targets[(first + attempt) % targets.len()];
        let host_part = if target.address.contains(':') { format!("[{}]", target.address) } else { target.address.clone() };
        let url = format!("http://{host_part}:{}{path}", target.port);
        let sent = match (bodyless, body.take()) {
            (false, Some(body)) => reqwest::Body::wrap_stream(body.into_data_stream()),
            _ => reqwest::Body::from(Vec::new()),
        };
        match ingress.client.request(parts.method.clone(), &url).headers(headers.clone()).body(sent).send().await {
            Ok(answer) => {
                let mut response = Response::builder().status(answer.status().as_u16());
                for (name, value) in answer.headers() {
                    if !HOP_BY_HOP.contains(&name.as_str()) {
                        response = response.header(name, value);
                    }
                }
                return response
                    .body(Body::from_stream(answer.bytes_stream()))
                    .unwrap_or_else(|_| plain(StatusCode::BAD_GATEWAY, "bad upstream answer"));
            }
            Err(e) => {
                // a failure before the answer's head: the request never reached a target (a
                // connection refused), or one that cannot have changed anything (an idempotent
                // method without a body) — either may go to the next
                let idempotent = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
                let again = bodyless && (e.is_connect() || idempotent);
                last_failure = Some(e);
                if !again {
                    break;
                }
            }
        }
    }
    if let Some(e) = last_failure {
        tracing::warn!(hostname = %host, service_id = %served.route.service_id, "the route's targets did not answer: {e}");
    }
    plain(StatusCode::BAD_GATEWAY, "the service behind this hostname did not answer")
}

/// `192.0.2.0/24`, `2001:db8::/32`, or an address alone (its full length).
fn parse_prefix(text: &str) -> Option<(IpAddr, u8)> {
    let (address, len) = text.split_once('/').map_or((text, None), |(a, l)| (a, Some(l)));
    let ip: IpAddr = address.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => l.parse::<u8>().ok().filter(|n| *n <= max)?,
    };
    Some((ip, len))
}

fn contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    // an IPv4 peer may arrive mapped into IPv6 on a dual-stack listener
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(revision: u64, routes: Value) -> Table {
        serde_json::from_value(json!({"clusterId": "cluster_a", "revision": revision, "routes": routes, "issuedAt": 1})).unwrap()
    }

    #[test]
    fn prefixes_match_their_networks_only() {
        let (net, len) = parse_prefix("192.0.2.0/24").unwrap();
        assert!(contains(net, len, "192.0.2.77".parse().unwrap()));
        assert!(contains(net, len, "::ffff:192.0.2.77".parse().unwrap()), "a mapped IPv4 peer");
        assert!(!contains(net, len, "192.0.3.1".parse().unwrap()));
        let (net, len) = parse_prefix("2001:db8::/32").unwrap();
        assert!(contains(net, len, "2001:db8:1::5".parse().unwrap()));
        assert!(!contains(net, len, "192.0.2.1".parse().unwrap()));
        assert_eq!(parse_prefix("127.0.0.1"), Some(("127.0.0.1".parse().unwrap(), 32)));
        assert!(parse_prefix("10.0.0.0/33").is_none() && parse_prefix("host/8").is_none());
        assert!(contains("0.0.0.0".parse().unwrap(), 0, "203.0.113.9".parse().unwrap()));
    }

    #[test]
    fn a_table_is_applied_whole_and_never_replaced_by_an_older_one() {
        let ingress = Ingress::new("127.0.0.1:0".parse().unwrap(), None, PathBuf::from("/nonexistent")).unwrap();
        let route = json!([{"hostname": "a.example", "serviceId": "svc_a", "targets": [{"address": "127.0.0.1", "port": 8080}]}]);
        assert_eq!(ingress.apply("cluster_a", table(2, route.clone())).unwrap(), 2);
        assert!(ingress.route_for("a.example").is_some());
        let stale = ingress.apply("cluster_a", table(1, json!([]))).unwrap_err();
        assert_eq!(stale.code, "route-table-stale");
        assert!(ingress.route_for("a.example").is_some(), "the held table stays");
        let foreign = ingress.apply("cluster_b", table(3, json!([]))).unwrap_err();
        assert_eq!(foreign.code, "route-table-foreign");
        let bad = json!([{"hostname": "b.example", "serviceId": "svc_b", "targets": [{"address": "127.0.0.1", "port": 1}], "sourceAllowList": ["nope/8"]}]);
        assert_eq!(ingress.apply("cluster_a", table(3, bad)).unwrap_err().code, "route-table-invalid");
        assert_eq!(ingress.revision(), 2, "a refused table changes nothing");
        assert_eq!(ingress.apply("cluster_a", table(3, json!([]))).unwrap(), 3);
        assert!(ingress.route_for("a.example").is_none(), "a withdrawal takes effect");
    }

    #[tokio::test]
    async fn requests_go_to_the_targets_in_turn_and_past_one_that_refuses_the_connection() {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = upstream.local_addr().unwrap().port();
        let app = axum::Router::new().fallback(|request: Request<Body>| async move {
            let length = axum::body::to_bytes(request.into_body(), 1024).await.unwrap().len();
            format!("up {length}")
        });
        tokio::spawn(async move { axum::serve(upstream, app).await });
        // a port nothing listens on: a replica that stopped before the table said so
        let down = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let ingress = Ingress::new("127.0.0.1:0".parse().unwrap(), None, PathBuf::from("/nonexistent")).unwrap();
        let targets = json!([{"address": "127.0.0.1", "port": down}, {"address": "127.0.0.1", "port": up}]);
        let routes = json!([{"hostname": "a.example", "serviceId": "svc_a", "targets": targets},
                            {"hostname": "none.example", "serviceId": "svc_b", "targets": []}]);
        ingress.apply("cluster_a", table(1, routes)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(ingress.clone().serve_on(listener));
        let client = reqwest::Client::new();
        for _ in 0..4 {
            let answer = client.get(&proxy).header("host", "a.example").send().await.unwrap();
            assert_eq!((answer.status().as_u16(), answer.text().await.unwrap()), (200, "up 0".to_string()), "every GET lands");
        }
        // a request with a body goes to one target only: sent in turn, half of them find the closed one
        let mut statuses = Vec::new();
        for _ in 0..4 {
            statuses.push(client.post(&proxy).header("host", "a.example").body("hello").send().await.unwrap().status().as_u16());
        }
        assert!(statuses.contains(&200) && statuses.contains(&502), "{statuses:?}");
        let none = client.get(&proxy).header("host", "none.example").send().await.unwrap();
        assert_eq!(none.status().as_u16(), 503, "no ready replica");
    }

    #[test]
    fn the_advertised_address_is_the_flags_or_a_specific_listen_address() {
        assert_eq!(parse_advertised("192.0.2.10:80").unwrap(), Advertised { host: "192.0.2.10".into(), port: 80 });
        assert_eq!(parse_advertised("[2001:db8::1]:8080").unwrap(), Advertised { host: "2001:db8::1".into(), port: 8080 });
        assert_eq!(parse_advertised("Ingress.Example:443").unwrap(), Advertised { host: "ingress.example".into(), port: 443 });
        for bad in ["0.0.0.0:80", "192.0.2.10:0", "192.0.2.10", "host:99999", "bad_host:80", "-a.example:80", ":80"] {
            assert!(parse_advertised(bad).is_err(), "{bad}");
        }
        let specific = Ingress::new("127.0.0.1:8099".parse().unwrap(), None, PathBuf::from("/nonexistent")).unwrap();
        assert_eq!(specific.advertised, Some(Advertised { host: "127.0.0.1".into(), port: 8099 }));
        let any = Ingress::new("0.0.0.0:80".parse().unwrap(), None, PathBuf::from("/nonexistent")).unwrap();
        assert_eq!(any.advertised, None, "an unspecified listen address is advertised only by the flag");
        let flag = Advertised { host: "192.0.2.10".into(), port: 80 };
        let given = Ingress::new("0.0.0.0:80".parse().unwrap(), Some(flag.clone()), PathBuf::from("/nonexistent")).unwrap();
        assert_eq!(given.advertised, Some(flag));
    }
}
