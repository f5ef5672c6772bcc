//! The dashboard through the whole router, as a browser would meet it.

use super::*;
use crate::state::test_state;
use axum::body::Body;
use tower::ServiceExt;

const PASSWORD: &str = "a-long-enough-admin-password";
/// The public origin `test_state` configures.
const ORIGIN: &str = "http://capstan.test";

/// A migrated host with the administrator `admin`.
async fn setup() -> (tempfile::TempDir, AppState) {
    let (dir, state) = unmigrated().await;
    capstan_server::migrate::run(&state.store, &state.chain, &capstan_server::migrate::LockOptions::for_this_process()).await.unwrap();
    (dir, state)
}

/// A host whose migrations have not run (so it is not ready), with the administrator `admin`.
async fn unmigrated() -> (tempfile::TempDir, AppState) {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path()).await;
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
    (dir, state)
}

/// `text` as the templates escape it.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
        .replace('/', "&#x2f;")
}

/// One answer, read whole.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn location(&self) -> Option<&str> {
        self.header("location")
    }

    /// The `name=value` of the first `Set-Cookie`, and the whole header.
    fn set_cookie(&self) -> Option<(String, String)> {
        let header = self.header("set-cookie")?.to_string();
        let pair = header.split(';').next().unwrap_or_default().trim().to_string();
        Some((pair, header))
    }

    fn assert_security_headers(&self, what: &str) {
        assert_eq!(self.header("content-security-policy"), Some(CONTENT_SECURITY_POLICY), "{what}: CSP");
        assert_eq!(self.header("x-content-type-options"), Some("nosniff"), "{what}: nosniff");
        assert_eq!(self.header("referrer-policy"), Some("same-origin"), "{what}: referrer policy");
    }
}

async fn send(state: &AppState, request: Request) -> Answer {
    let response = crate::api::router(state.clone(), crate::pages()).oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 22).await.unwrap();
    Answer { status, headers, body: String::from_utf8(bytes.to_vec()).unwrap() }
}

fn get(path: &str, cookie: Option<&str>) -> Request {
    let mut builder = Request::builder().uri(path).header("host", "capstan.test").header("accept", "text/html");
    if let Some(cookie) = cookie {
        builder = builder.header("cookie", cookie);
    }
    builder.body(Body::empty()).unwrap()
}

fn post_form(path: &str, body: &str, cookie: Option<&str>, origin: Option<&str>) -> Request {
    let mut builder = Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "capstan.test")
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(cookie) = cookie {
        builder = builder.header("cookie", cookie);
    }
    if let Some(origin) = origin {
        builder = builder.header("origin", origin);
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

fn form(username: &str, password: &str) -> String {
    let encode = |s: &str| {
        s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect::<String>()
    };
    format!("username={}&password={}", encode(username), encode(password))
}

/// Log in as the admin; returns the `capstan_session=<jwt>` pair.
async fn login_cookie(state: &AppState) -> String {
    let answer = send(state, post_form("/login", &form("admin", PASSWORD), None, Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    answer.set_cookie().expect("a session cookie").0
}

#[tokio::test]
async fn the_login_page_renders_with_security_headers() {
    let (_dir, state) = setup().await;
    let answer = send(&state, get("/login", None)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.header("content-type").unwrap().starts_with("text/html"), "{:?}", answer.headers);
    answer.assert_security_headers("GET /login");
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    assert!(answer.body.contains(r#"<form method="post" action="/login""#), "{}", answer.body);
    assert!(answer.body.contains(r#"name="username""#) && answer.body.contains(r#"name="password" type="password""#));
    assert!(!answer.body.contains("Login failed"), "no error before a try");
    // no inline script or style: everything comes from /static
    assert!(!answer.body.contains("<script>") && !answer.body.contains("<style") && !answer.body.contains("style="), "{}", answer.body);
    assert!(answer.body.contains(&assets::url("app.css").unwrap()));
    assert!(answer.body.contains(&assets::url("vendor/htmx.min.js").unwrap()));
}

#[tokio::test]
async fn a_wrong_password_shows_the_denial_and_sets_no_cookie() {
    let (_dir, state) = setup().await;
    for (user, password) in [("admin", "not-the-right-password-at-all"), ("nobody", PASSWORD), ("", "")] {
        let answer = send(&state, post_form("/login", &form(user, password), None, Some(ORIGIN))).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{user}");
        assert!(answer.body.contains(DENIAL), "{user}: {}", answer.body);
        assert!(answer.set_cookie().is_none(), "{user}: a failed login sets no cookie");
        assert!(!answer.body.contains(password) || password.is_empty(), "the password is never echoed");
        answer.assert_security_headers("failed login");
    }
}

#[tokio::test]
async fn the_right_password_sets_a_strict_http_only_cookie_and_redirects() {
    let (_dir, state) = setup().await;
    let answer = send(&state, post_form("/login", &form("admin", PASSWORD), None, Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_eq!(answer.location(), Some("/"));
    let (pair, header) = answer.set_cookie().expect("a session cookie");
    assert!(pair.starts_with("capstan_session=") && pair.len() > 40, "{header}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(header.contains(attribute), "the cookie should carry {attribute}: {header}");
    }
    assert!(!header.contains("Secure"), "an http origin gets no Secure attribute: {header}");
    let max_age: u64 = header.split("Max-Age=").nth(1).unwrap().split(';').next().unwrap().parse().unwrap();
    assert!(max_age > 11 * 3600 && max_age <= 12 * 3600, "the cookie lives as long as the session: {max_age}");

    // the login page now sends a logged-in browser to the overview
    let again = send(&state, get("/login", Some(&pair))).await;
    assert_eq!((again.status, again.location()), (StatusCode::SEE_OTHER, Some("/")));
}

#[tokio::test]
async fn an_https_origin_makes_the_cookie_secure() {
    let (_dir, mut state) = setup().await;
    state.public_origin = "https://capstan.example".into();
    let answer = send(&state, post_form("/login", &form("admin", PASSWORD), None, Some("https://capstan.example"))).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let (_, header) = answer.set_cookie().unwrap();
    assert!(header.contains("; Secure"), "{header}");
}

#[tokio::test]
async fn the_overview_needs_a_session_and_shows_who_and_the_status() {
    let (_dir, state) = setup().await;
    let anonymous = send(&state, get("/", None)).await;
    assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")));
    anonymous.assert_security_headers("GET / without a session");

    let forged = send(&state, get("/", Some("capstan_session=eyJhbGciOiJFZERTQSJ9.e30.AAAA"))).await;
    assert_eq!((forged.status, forged.location()), (StatusCode::SEE_OTHER, Some("/login")));
    let (pair, header) = forged.set_cookie().expect("a cookie that does not work is removed");
    assert_eq!(pair, "capstan_session=");
    assert!(header.contains("Max-Age=0"), "{header}");

    let cookie = login_cookie(&state).await;
    let page = send(&state, get("/", Some(&format!("theme=x; {cookie}; other=y")))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.assert_security_headers("GET /");
    assert_eq!(page.header("cache-control"), Some("no-store"));
    let body = &page.body;
    assert!(body.contains(r#"<span class="user-name" id="current-user">admin</span>"#), "{body}");
    assert!(body.contains("Administrator"), "{body}");
    assert!(body.contains(r#"id="readiness" data-ready="true""#) && body.contains("<strong>Ready</strong>"), "{body}");
    assert!(body.contains(&escaped(&state.store.describe())) && body.contains(&escaped(&state.blobs.describe())), "backends: {body}");
    let target = state.chain.target().to_string();
    assert!(body.contains(&format!("version {target} of {target}")), "migrations are shown: {body}");
    assert!(body.contains(env!("CARGO_PKG_VERSION")));
    assert!(body.contains("Session expires") && body.contains(" UTC"), "{body}");
    // the host's sections are in the rail; a manager's section comes with its plugin, none is
    // shown before it is loaded
    for section in ["Overview", "Services", "Secrets", "Settings"] {
        assert!(body.contains(&format!(">{section}<")), "{section} should be in the rail");
    }
    assert!(!body.contains("coming soon"), "no section waits for a plugin: {body}");
    for path in ["clusters", "services", "secrets", "tasks", "settings"] {
        assert!(body.contains(&format!(r#"href="&#x2f;{path}""#)), "{path} is linked in the rail: {body}");
    }
    assert!(body.contains(r#"href="&#x2f;" aria-current="page""#), "{body}");
    // the JWT is only ever in the Set-Cookie header
    let token = cookie.trim_start_matches("capstan_session=");
    assert!(!body.contains(token));

    // the status panel alone, for htmx
    let panel = send(&state, get("/overview/status", Some(&cookie))).await;
    assert_eq!(panel.status, StatusCode::OK);
    assert!(panel.body.trim_start().starts_with("<section") && panel.body.contains(r#"data-ready="true""#), "{}", panel.body);
    let mut request = get("/overview/status", None);
    request.headers_mut().insert("hx-request", HeaderValue::from_static("true"));
    let anonymous = send(&state, request).await;
    assert_eq!((anonymous.status, anonymous.header("hx-redirect")), (StatusCode::UNAUTHORIZED, Some("/login")));
    let anonymous = send(&state, get("/overview/status", None)).await;
    assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")));
}

#[tokio::test]
async fn a_host_that_is_not_ready_says_why() {
    let (_dir, state) = unmigrated().await;
    let cookie = login_cookie(&state).await;
    let page = send(&state, get("/", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains(r#"id="readiness" data-ready="false""#) && page.body.contains("<strong>Not ready</strong>"),
        "{}",
        page.body
    );
    assert!(page.body.contains("The migrations are not done."), "{}", page.body);
    assert!(page.body.contains("version unknown of"), "{}", page.body);
}

#[tokio::test]
async fn logout_ends_the_session() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    assert_eq!(send(&state, get("/", Some(&cookie))).await.status, StatusCode::OK);

    let answer = send(&state, post_form("/logout", "", Some(&cookie), Some(ORIGIN))).await;
    assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/login")));
    let (pair, header) = answer.set_cookie().expect("the cookie is cleared");
    assert_eq!(pair, "capstan_session=");
    assert!(header.contains("Max-Age=0") && header.contains("HttpOnly") && header.contains("SameSite=Strict"), "{header}");

    // the old cookie no longer works, on the page and on the API
    let after = send(&state, get("/", Some(&cookie))).await;
    assert_eq!((after.status, after.location()), (StatusCode::SEE_OTHER, Some("/login")));
    let token = cookie.trim_start_matches("capstan_session=");
    assert!(state.auth.authenticate(token).await.unwrap_err().is("unauthenticated"));

    // logging out without a session is harmless
    let again = send(&state, post_form("/logout", "", None, Some(ORIGIN))).await;
    assert_eq!((again.status, again.location()), (StatusCode::SEE_OTHER, Some("/login")));

    // the dashboard's login and logout are in the audit log, as the API's are, a wrong password too
    let wrong = send(&state, post_form("/login", &form("admin", "not-the-password"), None, Some(ORIGIN))).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let admin = state.auth.login("admin", PASSWORD, None).await.unwrap().token;
    for (method, outcomes) in [("auth.login", ["ok", "unauthenticated"].as_slice()), ("auth.logout", ["ok"].as_slice())] {
        let invocation = capstan_rpc::Invocation {
            method: "audit.list",
            caller: capstan_rpc::Caller::Bearer(Some(&admin)),
            source: None,
            request_id: "",
            forwarded: false,
            body: capstan_rpc::Body::Value(serde_json::json!({ "method": method })),
        };
        let listed = state.methods.invoke(invocation).await.unwrap().into_value().unwrap();
        let records = listed["records"].as_array().unwrap();
        for outcome in outcomes {
            assert!(records.iter().any(|r| r["outcome"] == *outcome), "{method} {outcome}: {listed}");
        }
        assert!(!listed.to_string().contains(PASSWORD) && !listed.to_string().contains(token), "{listed}");
    }
}

#[tokio::test]
async fn cross_origin_posts_are_refused() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    for origin in ["https://evil.example", "null", "http://capstan.test.evil.example", "capstan.test"] {
        let answer = send(&state, post_form("/login", &form("admin", PASSWORD), None, Some(origin))).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{origin}: {}", answer.body);
        assert!(answer.set_cookie().is_none(), "{origin}");
        assert!(answer.body.contains("Request refused"), "{}", answer.body);
        answer.assert_security_headers("cross-origin login");

        let answer = send(&state, post_form("/logout", "", Some(&cookie), Some(origin))).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{origin}");
    }
    // the session survived the refused logouts
    assert_eq!(send(&state, get("/", Some(&cookie))).await.status, StatusCode::OK);

    // an Origin that only matches the Host the client chose, and a post with no Origin at
    // all, are refused: the configured public origin is the only one trusted
    let mut request = post_form("/login", &form("admin", PASSWORD), None, Some("http://evil.example"));
    request.headers_mut().insert("host", HeaderValue::from_static("evil.example"));
    assert_eq!(send(&state, request).await.status, StatusCode::FORBIDDEN, "an Origin equal to a spoofed Host");
    assert_eq!(send(&state, post_form("/login", &form("admin", PASSWORD), None, None)).await.status, StatusCode::FORBIDDEN);
    assert_eq!(send(&state, post_form("/logout", "", Some(&cookie), None)).await.status, StatusCode::FORBIDDEN);
    assert_eq!(send(&state, get("/", Some(&cookie))).await.status, StatusCode::OK, "the session survived");
    assert_eq!(
        send(&state, post_form("/login", &form("admin", PASSWORD), None, Some("HTTP://CAPSTAN.TEST"))).await.status,
        StatusCode::SEE_OTHER
    );

    // a browser's Sec-Fetch-Site decides when present: same-origin passes whatever name the
    // host was opened by; cross-site or same-site is refused even beside a matching Origin
    let fetch_site = |site: &'static str, origin: Option<&str>| {
        let mut request = post_form("/login", &form("admin", PASSWORD), None, origin);
        request.headers_mut().insert("sec-fetch-site", HeaderValue::from_static(site));
        request
    };
    assert_eq!(send(&state, fetch_site("same-origin", Some("http://127.0.0.1:8080"))).await.status, StatusCode::SEE_OTHER);
    assert_eq!(send(&state, fetch_site("same-origin", None)).await.status, StatusCode::SEE_OTHER);
    for site in ["cross-site", "same-site", "none"] {
        assert_eq!(send(&state, fetch_site(site, Some(ORIGIN))).await.status, StatusCode::FORBIDDEN, "{site}");
    }
}

#[tokio::test]
async fn what_a_user_typed_is_escaped() {
    let (_dir, state) = setup().await;
    let typed = r#""><script>alert(1)</script>"#;
    let answer = send(&state, post_form("/login", &form(typed, "whatever-password"), None, Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert!(!answer.body.contains("<script>alert"), "{}", answer.body);
    assert!(answer.body.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"), "{}", answer.body);
    assert!(answer.body.contains(r#"value="&quot;&gt;&lt;script"#), "the value attribute cannot be broken out of: {}", answer.body);
}

#[tokio::test]
async fn repeated_failures_show_the_wait() {
    let (_dir, state) = setup().await;
    // five free failures, then each attempt waits longer after the last failure
    for _ in 0..5 {
        let answer = send(&state, post_form("/login", &form("admin", "not-the-right-password-at-all"), None, Some(ORIGIN))).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    }
    let answer = send(&state, post_form("/login", &form("admin", PASSWORD), None, Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{}", answer.body);
    assert!(answer.set_cookie().is_none());
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert!(answer.body.contains("Too many failed logins. Wait 1 second before trying again."), "{}", answer.body);
}

#[tokio::test]
async fn unreadable_forms_are_refused_plainly() {
    let (_dir, state) = setup().await;
    let mut request = post_form("/login", "{\"username\":\"admin\"}", None, Some(ORIGIN));
    request.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    let answer = send(&state, request).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.body.contains("The login form could not be read"), "{}", answer.body);

    let huge = format!("username=admin&password={}", "a".repeat(FORM_LIMIT + 1));
    let answer = send(&state, post_form("/login", &huge, None, Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(answer.set_cookie().is_none());
    assert!(!answer.body.contains("aaaaaaaa"));
}

#[tokio::test]
async fn static_assets_are_immutable_under_their_hash() {
    let (_dir, state) = setup().await;
    for asset in assets::ASSETS {
        let url = assets::url(asset.path).unwrap();
        let answer = send(&state, get(&url, None)).await;
        assert_eq!(answer.status, StatusCode::OK, "{url}");
        assert_eq!(answer.header("content-type"), Some(asset.content_type), "{url}");
        assert_eq!(answer.header("cache-control"), Some("public, max-age=31536000, immutable"), "{url}");
        assert_eq!(answer.body.len(), asset.bytes.len(), "{url}");
        answer.assert_security_headers(&url);
    }
    assert!(assets::url("vendor/htmx.min.js").unwrap().ends_with("/vendor/htmx.min.js"));
    let wrong = send(&state, get("/static/0000000000000000/app.css", None)).await;
    assert_eq!(wrong.status, StatusCode::NOT_FOUND);
    assert_eq!(wrong.header("cache-control"), Some("no-store"));
    assert_eq!(send(&state, get("/static/x/../../etc/passwd", None)).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn unknown_paths_are_html_for_browsers_and_json_for_the_api() {
    let (_dir, state) = setup().await;
    let page = send(&state, get("/nowhere", None)).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(page.header("content-type").unwrap().starts_with("text/html"));
    assert!(page.body.contains("Page not found"));
    page.assert_security_headers("HTML 404");

    for (path, accept) in [("/api/v1/", "text/html"), ("/api/nowhere", "text/html"), ("/nowhere", "*/*"), ("/nowhere", "application/json")]
    {
        let request = Request::builder().uri(path).header("accept", accept).body(Body::empty()).unwrap();
        let answer = send(&state, request).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
        let body: serde_json::Value =
            serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{path} {accept}: {e}: {}", answer.body));
        assert_eq!(body["error"]["code"], "not-found", "{path}");
    }
    // the JSON API and the probes are unchanged
    let status = send(&state, Request::builder().uri("/status").body(Body::empty()).unwrap()).await;
    assert_eq!(status.status, StatusCode::OK);
    assert!(status.header("content-type").unwrap().starts_with("application/json"));
    assert!(status.header("content-security-policy").is_none(), "API answers are not dashboard pages");
    let healthz = send(&state, Request::builder().uri("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(healthz.body, r#"{"status":"ok"}"#);
    let wrong_verb = send(&state, Request::builder().method("DELETE").uri("/").body(Body::empty()).unwrap()).await;
    assert_eq!(wrong_verb.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[test]
fn every_template_compiles() {
    for (name, _) in TEMPLATES {
        TEMPLATE_ENV.get_template(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let page = message_page(StatusCode::NOT_FOUND, "<b>title</b>", "a & b");
    assert_eq!(page.status(), StatusCode::NOT_FOUND);
}

#[test]
fn times_are_shown_in_utc() {
    // every moment is milliseconds since the epoch
    assert_eq!(utc(0), "1970-01-01 00:00 UTC");
    assert_eq!(utc(1_700_000_000_000), "2023-11-14 22:13 UTC");
    assert_eq!(rfc3339(1_700_000_000_999), "2023-11-14T22:13:20Z");
    assert_eq!(utc(u64::MAX), "9999-12-31 23:59 UTC");
    assert_eq!(time_left(now_ms() + (3 * 3600 + 120 + 30) * 1000), "in 3 h 2 min");
    assert_eq!(time_left(0), "in less than a minute");
}

#[test]
fn session_cookies_are_found_among_others() {
    let mut headers = HeaderMap::new();
    headers.append(header::COOKIE, HeaderValue::from_static("a=1; capstan_sessionx=no"));
    assert_eq!(session_token(&headers), None);
    headers.append(header::COOKIE, HeaderValue::from_static("b=2;capstan_session=tok.en.sig ; c=3"));
    assert_eq!(session_token(&headers), Some("tok.en.sig"));
    let mut empty = HeaderMap::new();
    empty.insert(header::COOKIE, HeaderValue::from_static("capstan_session="));
    assert_eq!(session_token(&empty), None);
}

// ---------------------------------------------------------------------------------------
// The Fleet view

/// A human operator (not an administrator) `oscar`, with the admin's password.
async fn add_operator(state: &AppState) {
    let verifier = crate::auth::password::hash(PASSWORD).unwrap();
    state
        .store
        .transact(|tx| {
            let verifier = verifier.clone();
            async move {
                let at = capstan_core::clock::now_ms();
                let user =
                    crate::auth::User { username: "oscar".into(), kind: "human".into(), admin: false, created_at: at, disabled: false };
                let credential = crate::auth::Credential {
                    kind: "human".into(),
                    generation: 1,
                    verifier: Some(verifier),
                    token_hash: None,
                    updated_at: at,
                    token_expires_at: None,
                };
                crate::auth::insert_user(&tx, &capstan_core::ids::new_id("user"), &user, &credential).await
            }
        })
        .await
        .unwrap();
}

/// A fleet member `id` of `state`'s bucket, its identity kept under `dir`.
fn fleet_node(state: &AppState, dir: &std::path::Path, id: &str) -> capstan_server::fleet::Node {
    let (identity, _) = capstan_server::fleet::identity::NodeIdentity::load_or_create(dir, Some(id)).unwrap();
    capstan_server::fleet::Node::new(state.blobs.clone(), identity, capstan_server::fleet::Timing::default(), None)
}

fn fleet_addresses(port: u16) -> capstan_server::fleet::Addresses {
    capstan_server::fleet::Addresses { internal: "10.0.0.7".into(), api_port: port }
}

#[tokio::test]
async fn the_fleet_view_needs_an_administrator() {
    let (_dir, state) = setup().await;
    for path in ["/fleet", "/fleet/panel"] {
        let anonymous = send(&state, get(path, None)).await;
        assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
        anonymous.assert_security_headers(path);
    }
    let mut request = get("/fleet/panel", None);
    request.headers_mut().insert("hx-request", HeaderValue::from_static("true"));
    let anonymous = send(&state, request).await;
    assert_eq!((anonymous.status, anonymous.header("hx-redirect")), (StatusCode::UNAUTHORIZED, Some("/login")));

    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let operator = answer.set_cookie().unwrap().0;
    // an operator sees the overview, with the Fleet entry, but not the fleet
    let overview = send(&state, get("/", Some(&operator))).await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(overview.body.contains("Operator"), "{}", overview.body);
    for path in ["/fleet", "/fleet/panel"] {
        let refused = send(&state, get(path, Some(&operator))).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{path}: {}", refused.body);
        assert!(refused.body.contains("Administrators only"), "{}", refused.body);
        assert!(!refused.body.contains(r#"id="fleet""#), "{}", refused.body);
        refused.assert_security_headers(path);
    }

    let admin = login_cookie(&state).await;
    assert_eq!(send(&state, get("/fleet", Some(&admin))).await.status, StatusCode::OK);
}

#[tokio::test]
async fn rebalance_now_is_an_administrators_form_and_names_why_nothing_was_decided() {
    let (_dir, state) = setup().await;
    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let refused = send(&state, post_form("/fleet/rebalance", "", Some(&operator), Some(ORIGIN))).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.body.contains("Administrators only"), "{}", refused.body);

    let admin = login_cookie(&state).await;
    let page = send(&state, get("/fleet", Some(&admin))).await;
    assert!(page.body.contains(r#"<form method="post" action="/fleet/rebalance""#), "{}", page.body);
    let elsewhere = send(&state, post_form("/fleet/rebalance", "", Some(&admin), Some("https://evil.example"))).await;
    assert_eq!(elsewhere.status, StatusCode::FORBIDDEN, "a form from another site: {}", elsewhere.body);
    // this test host holds no coordinator lease and no node does: the call goes through the
    // door to the fleet, which names why it cannot be answered, and the page says so
    let unanswered = send(&state, post_form("/fleet/rebalance", "", Some(&admin), Some(ORIGIN))).await;
    assert_eq!(unanswered.status, StatusCode::SERVICE_UNAVAILABLE, "{}", unanswered.body);
    assert!(unanswered.body.contains(r#"data-code="coordinator-unavailable""#), "{}", unanswered.body);
    assert!(unanswered.body.contains("Placements not decided (coordinator-unavailable)"), "{}", unanswered.body);
    assert!(unanswered.body.contains(r#"id="fleet-rebalance""#), "the page stays usable: {}", unanswered.body);
}

#[tokio::test]
async fn the_fleet_view_shows_nodes_versions_the_coordinator_and_a_freeze() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;

    // an empty bucket: a clear empty state
    let page = send(&state, get("/fleet", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.assert_security_headers("GET /fleet");
    let body = &page.body;
    assert!(body.contains("<title>Fleet · Capstan</title>"), "{body}");
    assert!(body.contains(r#"id="fleet-summary">0 nodes, 0 live<"#), "{body}");
    assert!(body.contains(r#"id="fleet-empty""#) && body.contains("No nodes yet"), "{body}");
    assert!(!body.contains(r#"id="fleet-nodes""#) && !body.contains(r#"id="fleet-freeze""#), "{body}");
    // the rail links the fleet as the current page
    assert!(body.contains(r#"href="&#x2f;fleet" aria-current="page""#), "{body}");
    assert!(body.find(">Overview<").unwrap() < body.find(">Fleet<").unwrap());
    assert!(body.find(">Fleet<").unwrap() < body.find(">Clusters<").unwrap());
    // live: the panel polls its own route; nothing inline
    assert!(body.contains(r#"hx-get="/fleet/panel" hx-trigger="every 5s" hx-swap="outerHTML""#), "{body}");
    assert!(!body.contains("<script>") && !body.contains("<style") && !body.contains("style="), "{body}");

    // two nodes, one drained, one with labels that need escaping; alpha holds the lease
    let identities = tempfile::tempdir().unwrap();
    let typed = r#""><script>alert(1)</script>"#;
    let labels: std::collections::BTreeMap<String, String> =
        [("tier".to_string(), "fast".to_string()), ("note".to_string(), typed.to_string())].into();
    let alpha = fleet_node(&state, &identities.path().join("a"), "alpha");
    alpha.register(fleet_addresses(8080), labels, vec![]).await.unwrap();
    let beta = fleet_node(&state, &identities.path().join("b"), "beta");
    beta.register(fleet_addresses(8081), Default::default(), vec![]).await.unwrap();
    beta.drain().await;
    let lease = capstan_server::fleet::lease::Coordinator::new(state.blobs.clone(), "alpha", Duration::from_secs(60));
    assert_eq!(lease.tick().await, capstan_server::fleet::lease::Role::Holder { fence: 1 });

    let page = send(&state, get("/fleet", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    assert!(body.contains(r#"id="fleet-summary">2 nodes, 1 live<"#), "{body}");
    assert!(body.contains(r#"<tr data-node="alpha" data-state="live">"#), "{body}");
    assert!(body.contains(r#"<tr data-node="beta" data-state="draining">"#), "{body}");
    assert!(body.contains(r#"<span class="pill state state-draining">draining</span>"#), "{body}");
    assert!(body.contains(r#"<span class="pill state state-live">live</span>"#), "{body}");
    assert!(body.contains("10.0.0.7:8080") && body.contains("10.0.0.7:8081"), "{body}");
    assert!(body.contains(r#"<span class="answer answer-yes">yes</span>"#), "a draining node still answers: {body}");
    assert!(body.contains(" s ago</time>") || body.contains("just now</time>"), "heartbeat ages: {body}");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        body.contains(&format!(
            r#"<span class="version-binary">capstan:</span> <span class="version"><span class="mono">{version}</span> on 2 nodes</span>"#
        )),
        "{body}"
    );
    // the plugin contract and engine each node reports
    for (binary, value) in [("wit", capstan_core::build::PLUGIN_CONTRACT), ("wasmtime", capstan_core::build::PLUGIN_ENGINE)] {
        let shown = format!(
            r#"<span class="version-binary">{binary}:</span> <span class="version"><span class="mono">{value}</span> on 2 nodes</span>"#
        );
        assert!(body.contains(&shown), "{binary}: {body}");
    }
    assert!(!body.contains("unreported"), "every node reports its versions: {body}");
    assert!(body.contains(r#"id="coordinator-holder">alpha<"#) && body.contains("fence 1"), "{body}");
    assert_eq!(body.matches(">coordinator</span>").count(), 1, "one row carries the coordinator badge: {body}");
    assert!(body.find(">coordinator</span>").unwrap() > body.find(r#"data-node="alpha""#).unwrap());
    assert!(body.find(">coordinator</span>").unwrap() < body.find(r#"data-node="beta""#).unwrap());
    // labels are chips, escaped
    assert!(body.contains(r#"<span class="chip"><span class="chip-key">tier</span>=fast</span>"#), "{body}");
    assert!(!body.contains("<script>alert"), "{body}");
    assert!(body.contains(&escaped(typed)), "{body}");
    assert!(!body.contains(r#"id="fleet-freeze""#), "no freeze yet");

    // a freeze: its banner, by whom and why
    let freeze = capstan_server::fleet::freeze(&state.blobs, "alice", "release week").await.unwrap();
    let page = send(&state, get("/fleet", Some(&cookie))).await;
    let body = &page.body;
    assert!(body.contains(r#"id="fleet-freeze""#) && body.contains("Deploys are frozen"), "{body}");
    assert!(body.contains(r#"<b id="freeze-by">alice</b>"#) && body.contains(r#"<q id="freeze-reason">release week</q>"#), "{body}");
    assert!(body.contains(&utc(freeze.since)), "since, in UTC: {body}");

    // the panel route: only the fragment, with the same facts
    let panel = send(&state, get("/fleet/panel", Some(&cookie))).await;
    assert_eq!(panel.status, StatusCode::OK);
    panel.assert_security_headers("GET /fleet/panel");
    let fragment = panel.body.trim_start();
    assert!(fragment.starts_with(r#"<div class="stack" id="fleet""#), "{fragment}");
    assert!(!fragment.contains("<html") && !fragment.contains("<title>") && !fragment.contains(r#"class="rail""#), "{fragment}");
    assert!(fragment.contains("2 nodes, 1 live") && fragment.contains(r#"id="fleet-freeze""#), "{fragment}");
    assert!(fragment.contains(r#"hx-trigger="every 5s""#), "the fragment keeps polling: {fragment}");
    // the JWT is never in a page
    assert!(!body.contains(cookie.trim_start_matches("capstan_session=")));
}

#[tokio::test]
async fn an_unreadable_bucket_is_an_error_panel_not_an_error_page() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    state
        .blobs
        .put_bytes(capstan_server::fleet::FREEZE_KEY, b"{not json".to_vec(), capstan_server::blobs::PutMode::Overwrite)
        .await
        .unwrap();
    for path in ["/fleet", "/fleet/panel"] {
        let answer = send(&state, get(path, Some(&cookie))).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.body);
        let body = &answer.body;
        assert!(body.contains(r#"id="fleet-error" data-code="fleet-record-invalid""#), "{path}: {body}");
        assert!(body.contains("The fleet could not be read (fleet-record-invalid)"), "{body}");
        assert!(body.contains(r#"hx-trigger="every 5s""#), "the panel keeps trying: {body}");
        assert!(!body.contains("expected") && !body.contains("line 1"), "the parser's detail stays in the log: {body}");
    }
}

// ---------------------------------------------------------------------------------------
// The Plugins view

use capstan_server::plugins::bundle::{Bundle, PublisherKey, generate_key};
use capstan_server::plugins::host::{InstalledVersion, PLUGINS, Record};

/// Every form post of the Plugins view, with a body that would be acceptable.
const PLUGIN_POSTS: [(&str, &str); 7] = [
    ("/plugins/install", "upload=0123456789abcdef0123456789abcdef&approve=log"),
    ("/plugins/upgrade", "upload=0123456789abcdef0123456789abcdef&approve=log"),
    ("/plugins/discard", "upload=0123456789abcdef0123456789abcdef"),
    ("/plugins/rollback", "id=example"),
    ("/plugins/disable", "id=example"),
    ("/plugins/enable", "id=example"),
    ("/plugins/rebind", "id=example&publicKey=capstan-ed25519:AAAA"),
];

const MULTIPART_BOUNDARY: &str = "capstan-test-boundary-7MA4YWxkTrZu0gW";

/// A `multipart/form-data` post of `fields` (name, file name for a file, content).
fn post_multipart(path: &str, fields: &[(&str, Option<&str>, &[u8])], cookie: Option<&str>, origin: Option<&str>) -> Request {
    let mut body = Vec::new();
    for (name, file, data) in fields {
        let file = file.map(|f| format!("; filename=\"{f}\"")).unwrap_or_default();
        body.extend(format!("--{MULTIPART_BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"{file}\r\n").as_bytes());
        if !file.is_empty() {
            body.extend(b"Content-Type: application/octet-stream\r\n");
        }
        body.extend(b"\r\n");
        body.extend(*data);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{MULTIPART_BOUNDARY}--\r\n").as_bytes());
    let mut builder = Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "capstan.test")
        .header("content-type", format!("multipart/form-data; boundary={MULTIPART_BOUNDARY}"))
        .header("content-length", body.len());
    if let Some(cookie) = cookie {
        builder = builder.header("cookie", cookie);
    }
    if let Some(origin) = origin {
        builder = builder.header("origin", origin);
    }
    builder.body(Body::from(body)).unwrap()
}

/// The install form with `bundle` as the file.
fn upload(bundle: &[u8], cookie: &str) -> Request {
    post_multipart(
        "/plugins/inspect",
        &[("intent", None, b"install"), ("bundle", Some("x.capstan-plugin"), bundle)],
        Some(cookie),
        Some(ORIGIN),
    )
}

/// How many uploads are kept.
async fn kept_uploads(state: &AppState) -> usize {
    state.blobs.list(capstan_server::plugins::uploads::UPLOADS, None, 100).await.unwrap().items.len()
}

/// A signed bundle of 3 MiB, more than a form or axum's default body limit, that parses (its
/// component is a component header and noise, so it never compiles); its signer is trusted
/// as `Tests`.
async fn parsing_bundle(state: &AppState) -> Vec<u8> {
    let manifest = "[plugin]\nid = \"example\"\nname = \"Example\"\nversion = \"0.3.0\"\nwit = \"capstan:plugin@0.1.0\"\ndescription = \"A test bundle.\"\n\n[capabilities]\nrequested = [\"store\", \"log\"]\n";
    let mut component = b"\0asm\x0d\x00\x01\x00".to_vec();
    component.extend((0..3u32 << 20).map(|i| (i * 7 % 251) as u8));
    let key = generate_key();
    let public = PublisherKey::from(&key).to_string();
    state.plugins.add_trusted_publisher(&public, "Tests", "admin").await.unwrap();
    let mut bundle = Bundle::new(manifest.to_string(), component).unwrap();
    bundle.sign(&key);
    bundle.to_bytes()
}

/// The upload id an approval page carries.
fn upload_id(body: &str) -> String {
    let at = body.find(r#"name="upload" value=""#).unwrap_or_else(|| panic!("no upload id: {body}"));
    body[at + 21..at + 53].to_string()
}

fn installed(version: &str, publisher: &str, grants: &[&str]) -> InstalledVersion {
    InstalledVersion {
        version: version.into(),
        bundle_key: format!("_capstan/plugins/test/{version}-0000000000000000.capstan-plugin"),
        digest: "ab".repeat(32),
        publisher: publisher.into(),
        grants: grants.iter().map(|g| g.to_string()).collect(),
        installed_at: 1_700_000_000_000,
        installed_by: "admin".into(),
        wit: capstan_server::plugins::manifest::CURRENT_WIT.into(),
        settings: Vec::new(),
        pages: Vec::new(),
        faces: Default::default(),
    }
}

/// Put a registry record straight into the store (its bundle is not in the bucket, so it
/// never loads: cheap, and it shows how a plugin that fails to load looks).
async fn put_record(state: &AppState, record: Record) {
    let value = serde_json::to_value(&record).unwrap();
    state
        .store
        .transact(|tx| {
            let (id, value) = (record.id.clone(), value.clone());
            async move { tx.insert(PLUGINS, &id, value).await.map(drop) }
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn the_plugins_view_needs_an_administrator() {
    let (_dir, state) = setup().await;
    let anonymous = send(&state, get("/plugins", None)).await;
    assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")));
    anonymous.assert_security_headers("GET /plugins");
    for (path, body) in PLUGIN_POSTS {
        let answer = send(&state, post_form(path, body, None, Some(ORIGIN))).await;
        assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
    }
    let answer = send(&state, post_multipart("/plugins/inspect", &[("bundle", Some("b"), b"junk")], None, Some(ORIGIN))).await;
    assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/login")));
    // a plugin's pages and forms need a session too (the method's own role decides the rest)
    for answer in [
        send(&state, get("/p/example", None)).await,
        send(&state, post_form("/p/example/-/call/putNote", "_page=&id=n&text=t", None, Some(ORIGIN))).await,
    ] {
        assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/login")), "{}", answer.body);
    }

    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let refused = send(&state, get("/plugins", Some(&operator))).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.body.contains("Administrators only"), "{}", refused.body);
    assert!(!refused.body.contains(r#"id="plugins""#), "{}", refused.body);
    refused.assert_security_headers("GET /plugins as an operator");
    for (path, body) in PLUGIN_POSTS {
        let answer = send(&state, post_form(path, body, Some(&operator), Some(ORIGIN))).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path}: {}", answer.body);
    }
    let answer = send(&state, upload(b"junk", &operator)).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert_eq!(kept_uploads(&state).await, 0);

    // an administrator sees the view, linked in the rail, empty at first
    let admin = login_cookie(&state).await;
    let page = send(&state, get("/plugins", Some(&admin))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.assert_security_headers("GET /plugins");
    let body = &page.body;
    assert!(body.contains("<title>Plugins · Capstan</title>"), "{body}");
    assert!(body.contains(r#"href="&#x2f;plugins" aria-current="page""#), "{body}");
    assert!(body.contains(r#"id="plugins-empty""#) && body.contains("No plugins installed"), "{body}");
    assert!(body.contains(r#"action="/plugins/inspect" enctype="multipart/form-data""#), "{body}");
    assert!(!body.contains("<script>") && !body.contains("<style") && !body.contains("style="), "{body}");
    // the rail shows an operator no link that would answer 403
    let overview = send(&state, get("/", Some(&operator))).await;
    assert!(!overview.body.contains(r#"href="&#x2f;plugins""#), "{}", overview.body);
}

#[tokio::test]
async fn the_plugins_view_lists_versions_publishers_status_and_grants() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let host = state.plugins.clone();
    let key = PublisherKey::from(&generate_key());
    host.add_trusted_publisher(&key.to_string(), "Example Corp", "admin").await.unwrap();
    put_record(
        &state,
        Record {
            id: "example".into(),
            name: "Example".into(),
            enabled: true,
            current: installed("0.2.0", &key.to_string(), &["events:publish", "log", "store"]),
            previous: Some(installed("0.1.0", &key.to_string(), &["log", "store"])),
            rebound_publisher: None,
        },
    )
    .await;
    put_record(
        &state,
        Record {
            id: "quiet".into(),
            name: "Quiet".into(),
            enabled: false,
            current: installed("1.0.0", "first-party", &[]),
            previous: None,
            rebound_publisher: None,
        },
    )
    .await;
    // the example's bundle is not in the bucket: loading it fails and says why
    host.sync().await.unwrap();

    let page = send(&state, get("/plugins", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    assert!(body.contains(r#"id="plugins-summary">2 installed<"#), "{body}");
    assert!(body.contains(r#"<tr data-plugin="example" data-status="failed">"#), "{body}");
    assert!(body.contains(r#"<tr data-plugin="quiet" data-status="disabled">"#), "{body}");
    let example = &body[body.find(r#"data-plugin="example""#).unwrap()..body.find(r#"data-plugin="quiet""#).unwrap()];
    let quiet = &body[body.find(r#"data-plugin="quiet""#).unwrap()..];
    assert!(example.contains(r#"data-version="0.2.0""#) && example.contains("previously 0.1.0"), "{example}");
    assert!(example.contains(&key.fingerprint()) && example.contains("Example Corp"), "publisher: {example}");
    assert!(!example.contains(&key.to_string()[20..]) || example.contains(&format!(r#"title="{}""#, escaped(&key.to_string()))));
    assert!(example.contains(r#"data-error="bundle-missing""#), "the load error is shown: {example}");
    for grant in ["events:publish", "log", "store"] {
        assert!(example.contains(&format!(r#"<span class="chip">{grant}</span>"#)), "{grant}: {example}");
    }
    assert!(example.contains(r#"data-action="rollback""#) && example.contains("Roll back to 0.1.0"), "{example}");
    assert!(example.contains(r#"data-action="disable""#) && !example.contains(r#"data-action="enable""#), "{example}");
    assert!(example.contains(r#"<input type="hidden" name="plugin" value="example">"#), "an Upgrade form per row: {example}");
    assert!(quiet.contains(r#"<span class="pill pill-info">first-party</span>"#), "{quiet}");
    assert!(quiet.contains(r#"data-action="enable""#) && !quiet.contains(r#"data-action="rollback""#), "{quiet}");
    assert!(quiet.contains(r#"<span class="muted">none</span>"#), "no grants: {quiet}");

    // disable: a 303 back to the page, which says so
    let answer = send(&state, post_form("/plugins/disable", "id=example", Some(&cookie), Some(ORIGIN))).await;
    assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/plugins?done=disabled&id=example")), "{}", answer.body);
    let page = send(&state, get("/plugins?done=disabled&id=example", Some(&cookie))).await;
    assert!(page.body.contains(r#"id="plugins-flash" role="status""#) && page.body.contains("Plugin disabled"), "{}", page.body);
    assert!(page.body.contains(r#"<tr data-plugin="example" data-status="disabled">"#), "{}", page.body);
    assert!(!host.record("example").await.unwrap().unwrap().0.enabled);

    // another publisher may be allowed to sign the next upgrade: only a trusted key, not for a
    // first-party plugin (which offers no such form)
    assert!(example.contains(r#"data-action="rebind""#) && !quiet.contains(r#"data-action="rebind""#), "{example}");
    let stranger = PublisherKey::from(&generate_key()).to_string();
    let answer = send(&state, post_form("/plugins/rebind", &format!("id=example&publicKey={stranger}"), Some(&cookie), Some(ORIGIN))).await;
    assert!(answer.body.contains(r#"data-code="publisher-untrusted""#), "{}", answer.body);
    let other = PublisherKey::from(&generate_key());
    host.add_trusted_publisher(&other.to_string(), "Other", "admin").await.unwrap();
    let answer = send(&state, post_form("/plugins/rebind", &format!("id=example&publicKey={other}"), Some(&cookie), Some(ORIGIN))).await;
    assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/plugins?done=rebound&id=example")), "{}", answer.body);
    assert_eq!(host.record("example").await.unwrap().unwrap().0.rebound_publisher, Some(other.to_string()));

    // refusals are shown by code, with the refusal's status
    let answer = send(&state, post_form("/plugins/rollback", "id=quiet", Some(&cookie), Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert!(answer.body.contains(r#"data-code="rollback-unavailable""#), "{}", answer.body);
    assert!(answer.body.contains("(rollback-unavailable)") && answer.body.contains("no previous version"), "{}", answer.body);
    let answer = send(&state, post_form("/plugins/enable", "id=nothing", Some(&cookie), Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", answer.body);
    assert!(answer.body.contains(r#"data-code="not-found""#), "{}", answer.body);
    // an unknown `done` says nothing
    let page = send(&state, get("/plugins?done=%3Cb%3E&id=%3Cscript%3E", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains(r#"id="plugins-flash""#) && !page.body.contains("<script>"), "{}", page.body);
}

#[tokio::test]
async fn an_invalid_upload_shows_bundle_malformed_and_keeps_nothing() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let answer = send(&state, upload(b"this is not a bundle", &cookie)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    answer.assert_security_headers("POST /plugins/inspect");
    assert!(answer.body.contains(r#"id="plugins-flash" data-code="bundle-malformed""#), "{}", answer.body);
    assert!(
        answer.body.contains("The bundle was not accepted (bundle-malformed)") && answer.body.contains("Nothing was kept"),
        "{}",
        answer.body
    );
    assert!(answer.body.contains(r#"id="install-form""#), "the page is there to try again: {}", answer.body);
    assert_eq!(kept_uploads(&state).await, 0);

    // no file chosen, not multipart, and more than a bundle may be: refused by name too
    let empty = send(&state, upload(b"", &cookie)).await;
    let empty_unnamed = send(
        &state,
        post_multipart("/plugins/inspect", &[("intent", None, b"install"), ("bundle", Some(""), b"")], Some(&cookie), Some(ORIGIN)),
    )
    .await;
    assert!(empty.body.contains(r#"data-code="bundle-malformed""#), "{}", empty.body);
    assert!(empty_unnamed.body.contains(r#"data-code="invalid-request""#), "{}", empty_unnamed.body);
    let json = send(&state, post_form("/plugins/inspect", "bundle=x", Some(&cookie), Some(ORIGIN))).await;
    assert_eq!(json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", json.body);
    assert!(json.body.contains(r#"data-code="unsupported-media-type""#), "{}", json.body);
    let mut huge = upload(b"junk", &cookie);
    huge.headers_mut().insert("content-length", HeaderValue::from(plugins::UPLOAD_LIMIT as u64 + 1));
    let huge = send(&state, huge).await;
    assert_eq!(huge.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", huge.body);
    assert!(huge.body.contains(r#"data-code="bundle-too-large""#), "{}", huge.body);
    assert_eq!(huge.header("connection"), Some("close"), "the rest of the body is not read");
    // a body that does not say its length is cut off where a bundle would be too large
    let oversized = vec![0u8; capstan_server::plugins::bundle::MAX_BUNDLE_BYTES + 1];
    let mut streamed = upload(&oversized, &cookie);
    drop(oversized);
    streamed.headers_mut().remove("content-length");
    let streamed = send(&state, streamed).await;
    assert_eq!(streamed.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", streamed.body);
    assert!(streamed.body.contains(r#"data-code="bundle-too-large""#), "{}", streamed.body);
    assert_eq!(kept_uploads(&state).await, 0);
}

#[tokio::test]
async fn a_bundle_is_installed_only_with_every_requested_capability_approved() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let bundle = parsing_bundle(&state).await;

    // the approval step: what the bundle is, who signed it, a checkbox per capability
    let answer = send(&state, upload(&bundle, &cookie)).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.assert_security_headers("the approval page");
    let body = &answer.body;
    assert!(body.contains("<title>Approve the install · Capstan</title>"), "{body}");
    assert!(body.contains(r#"id="bundle-id">example<"#) && body.contains(r#"id="bundle-version">0.3.0<"#), "{body}");
    assert!(body.contains("trusted: Tests") && body.contains("3.0 MiB"), "{body}");
    // what the operator approves in memory: per instance × instances, and the ceiling
    assert!(body.contains(r#"id="bundle-limits">64 MiB memory per instance × 16 concurrent instances: up to 1024 MiB"#), "{body}");
    assert!(body.contains(r#"<form method="post" action="/plugins/install" class="form" id="approve-form">"#), "{body}");
    for capability in ["log", "store"] {
        assert!(body.contains(&format!(r#"<input type="checkbox" name="approve" value="{capability}">"#)), "{capability}: {body}");
    }
    assert_eq!(kept_uploads(&state).await, 1);
    let upload = upload_id(body);

    // one box unticked: the host's refusal, on the approval page again, the upload kept
    let partial = format!("upload={upload}&approve=log");
    let answer = send(&state, post_form("/plugins/install", &partial, Some(&cookie), Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert!(answer.body.contains(r#"data-code="capabilities-not-approved""#), "{}", answer.body);
    assert!(answer.body.contains("not approved: store"), "{}", answer.body);
    assert!(answer.body.contains(r#"value="log" checked>"#) && answer.body.contains(r#"value="store">"#), "{}", answer.body);
    assert_eq!(upload_id(&answer.body), upload);
    assert_eq!(kept_uploads(&state).await, 1);

    // all ticked: the host goes on and refuses the component (it never compiles); the
    // refusal is shown by code and the upload is discarded
    let all = format!("upload={upload}&approve=log&approve=store");
    let answer = send(&state, post_form("/plugins/install", &all, Some(&cookie), Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert!(answer.body.contains(r#"data-code="bundle-malformed""#), "{}", answer.body);
    assert!(answer.body.contains("The plugin was not installed (bundle-malformed)"), "{}", answer.body);
    assert_eq!(kept_uploads(&state).await, 0);
    assert!(state.plugins.record("example").await.unwrap().is_none());
    let again = send(&state, post_form("/plugins/install", &all, Some(&cookie), Some(ORIGIN))).await;
    assert!(again.body.contains(r#"data-code="upload-not-found""#), "{}", again.body);

    // an Upgrade button's bundle must be the plugin it was for; else nothing is kept
    let fields: [(&str, Option<&str>, &[u8]); 3] =
        [("intent", None, b"upgrade"), ("plugin", None, b"other"), ("bundle", Some("x.capstan-plugin"), &bundle)];
    let answer = send(&state, post_multipart("/plugins/inspect", &fields, Some(&cookie), Some(ORIGIN))).await;
    assert!(answer.body.contains(r#"data-code="bundle-plugin-mismatch""#), "{}", answer.body);
    assert_eq!(kept_uploads(&state).await, 0);
    let fields: [(&str, Option<&str>, &[u8]); 3] =
        [("intent", None, b"upgrade"), ("plugin", None, b"example"), ("bundle", Some("x.capstan-plugin"), &bundle)];
    let answer = send(&state, post_multipart("/plugins/inspect", &fields, Some(&cookie), Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(answer.body.contains(r#"action="/plugins/upgrade""#) && answer.body.contains("Approve and upgrade"), "{}", answer.body);
    assert!(answer.body.contains("example is not installed"), "the page warns before the host refuses: {}", answer.body);

    // cancelling discards the upload
    let upload = upload_id(&answer.body);
    let answer = send(&state, post_form("/plugins/discard", &format!("upload={upload}"), Some(&cookie), Some(ORIGIN))).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_eq!(kept_uploads(&state).await, 0);
    let answer = send(&state, post_form("/plugins/discard", "upload=..%2F..%2Fx", Some(&cookie), Some(ORIGIN))).await;
    assert!(answer.body.contains(r#"data-code="invalid-request""#), "{}", answer.body);
}

/// A bundle whose signer is not trusted is shown for what it is, but no install is offered:
/// the host would refuse it. Memory × instances sits with the capabilities approved.
#[tokio::test]
async fn an_untrusted_bundle_is_reviewed_but_not_offered_for_install() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let trusted = parsing_bundle(&state).await;
    let answer = send(&state, upload(&trusted, &cookie)).await;
    assert!(answer.body.contains(r#"id="approve-submit""#) && !answer.body.contains(r#"id="approve-untrusted""#), "{}", answer.body);
    assert!(
        answer.body.contains(r#"<p id="approve-limits"><strong>Resources:</strong> 64 MiB memory per instance × 16"#),
        "{}",
        answer.body
    );

    let manifest = "[plugin]\nid = \"example\"\nname = \"Example\"\nversion = \"0.3.0\"\nwit = \"capstan:plugin@0.1.0\"\n";
    let mut bundle = Bundle::new(manifest.to_string(), b"\0asm\x0d\x00\x01\x00".to_vec()).unwrap();
    bundle.sign(&generate_key());
    let answer = send(&state, upload(&bundle.to_bytes(), &cookie)).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(answer.body.contains("not a trusted publisher") && answer.body.contains(r#"id="approve-untrusted""#), "{}", answer.body);
    assert!(answer.body.contains("Signed by a key this host does not trust"), "{}", answer.body);
    assert!(!answer.body.contains(r#"id="approve-submit""#), "no install is offered: {}", answer.body);
}

#[tokio::test]
async fn plugin_posts_from_another_origin_are_refused() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    put_record(
        &state,
        Record {
            id: "example".into(),
            name: "Example".into(),
            enabled: true,
            current: installed("1.0.0", "first-party", &[]),
            previous: None,
            rebound_publisher: None,
        },
    )
    .await;
    let bundle = parsing_bundle(&state).await;
    for origin in ["https://evil.example", "null", "http://capstan.test.evil.example"] {
        for (path, body) in PLUGIN_POSTS {
            let answer = send(&state, post_form(path, body, Some(&cookie), Some(origin))).await;
            assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path} from {origin}: {}", answer.body);
            assert!(answer.body.contains("Request refused"), "{}", answer.body);
            answer.assert_security_headers(path);
        }
        let fields: [(&str, Option<&str>, &[u8]); 1] = [("bundle", Some("x.capstan-plugin"), &bundle)];
        let answer = send(&state, post_multipart("/plugins/inspect", &fields, Some(&cookie), Some(origin))).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "inspect from {origin}: {}", answer.body);
    }
    assert_eq!(kept_uploads(&state).await, 0, "nothing was kept");
    assert!(state.plugins.record("example").await.unwrap().unwrap().0.enabled, "nothing was disabled");
}

// ---------------------------------------------------------------------------------------
// The inventory views: clusters, services, settings, live updates

/// A form body from pairs, percent-encoded.
fn encoded(fields: &[(&str, &str)]) -> String {
    fields.iter().map(|(k, v)| format!("{}={}", forms::encode(k), forms::encode(v))).collect::<Vec<_>>().join("&")
}

fn as_refs<'a>(fields: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    fields.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Post a dashboard form as the session `cookie`, from this host.
async fn submit(state: &AppState, path: &str, fields: &[(&str, &str)], cookie: &str) -> Answer {
    send(state, post_form(path, &encoded(fields), Some(cookie), Some(ORIGIN))).await
}

/// The value of the `value` attribute of the element with `id`, unescaped.
fn value_of(body: &str, id: &str) -> String {
    let at = body.find(&format!(r#"id="{id}""#)).unwrap_or_else(|| panic!("no element #{id}: {body}"));
    let tag_end = at + body[at..].find('>').unwrap();
    let tag = &body[body[..at].rfind('<').unwrap()..tag_end];
    let value = tag.split(r#"value=""#).nth(1).unwrap_or_else(|| panic!("#{id} has no value: {tag}"));
    value[..value.find('"').unwrap()]
        .replace("&#x2f;", "/")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The path a `303` answered, and the id its last segment names (`/clusters/<id>?…`).
fn redirected_id(answer: &Answer) -> String {
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let location = answer.location().unwrap();
    let path = location.split('?').next().unwrap();
    path.rsplit('/').next().unwrap().to_string()
}

async fn method(state: &AppState, cookie: &str, name: &str, body: serde_json::Value) -> serde_json::Value {
    let token = cookie.trim_start_matches("capstan_session=");
    let identity = state.auth.authenticate(token).await.unwrap();
    let viewer = Viewer { identity, bearer: capstan_core::text::SecretString::new(token.to_string()) };
    forms::call(&Host::from_ref(state), &viewer, name, body).await.unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[tokio::test]
async fn the_inventory_views_need_a_session_and_render_for_an_admin() {
    let (_dir, state) = setup().await;
    for path in [
        "/clusters",
        "/clusters/panel",
        "/services",
        "/services/panel",
        "/settings",
        "/settings/panel",
        "/clusters/x",
        "/services/x/delete",
    ] {
        let anonymous = send(&state, get(path, None)).await;
        assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
        anonymous.assert_security_headers(path);
    }
    let mut request = get("/live/wait?after=0&areas=cluster", None);
    request.headers_mut().insert("hx-request", HeaderValue::from_static("true"));
    let anonymous = send(&state, request).await;
    assert_eq!((anonymous.status, anonymous.header("hx-redirect")), (StatusCode::UNAUTHORIZED, Some("/login")));
    for path in ["/clusters/create", "/services/create", "/organizations/create", "/settings/update", "/clusters/x/delete"] {
        let answer = send(&state, post_form(path, "name=x", None, Some(ORIGIN))).await;
        assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
    }

    let cookie = login_cookie(&state).await;
    for (path, title, section) in
        [("/clusters", "Clusters", "clusters"), ("/services", "Services", "services"), ("/settings", "Settings", "settings")]
    {
        let page = send(&state, get(path, Some(&cookie))).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
        page.assert_security_headers(path);
        let body = &page.body;
        assert!(body.contains(&format!("<title>{title} · Capstan</title>")), "{body}");
        assert!(body.contains(&format!(r#"href="&#x2f;{section}" aria-current="page""#)), "{body}");
        assert!(body.contains(r#"id="live" data-head="0" data-changed="false""#), "the live element waits from the head: {body}");
        assert!(!body.contains("<script>") && !body.contains("<style") && !body.contains("style="), "{body}");
    }
    let clusters = send(&state, get("/clusters", Some(&cookie))).await.body;
    assert!(clusters.contains(r#"id="clusters-empty""#) && clusters.contains(r#"action="/clusters/create""#), "{clusters}");
    let services = send(&state, get("/services", Some(&cookie))).await.body;
    assert!(services.contains(r#"id="organizations-empty""#) && services.contains(r#"action="/organizations/create""#), "{services}");
    assert!(!services.contains(r#"id="service-create-form""#), "no service form without an organization: {services}");
    // every key settings.get knows is on the page, with what it is for
    let settings = send(&state, get("/settings", Some(&cookie))).await.body;
    let document = method(&state, &cookie, "settings.get", serde_json::json!({})).await;
    let known = document["known"].as_array().unwrap();
    assert!(known.len() >= 3, "the host's own keys at least: {known:?}");
    for key in known {
        assert!(settings.contains(&format!(r#"data-setting="{}""#, key["key"].as_str().unwrap())), "{key}: {settings}");
        assert!(settings.contains(&escaped(key["summary"].as_str().unwrap())), "{key}");
    }
    assert!(settings.contains(r#"id="settings-revision">0<"#), "{settings}");

    // an operator sees the views, and the methods' own refusal where the API refuses
    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let page = send(&state, get("/clusters", Some(&operator))).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(r#"id="clusters-error" data-code="forbidden""#), "{}", page.body);
    let answer = submit(&state, "/clusters/create", &[("name", "eu-1")], &operator).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert!(answer.body.contains(r#"id="flash" data-code="forbidden""#), "{}", answer.body);
    let page = send(&state, get("/settings", Some(&operator))).await;
    assert!(page.body.contains(r#"id="settings-readonly""#) && !page.body.contains(r#"id="settings-submit""#), "{}", page.body);
    let answer = submit(
        &state,
        "/settings/update",
        &[("expectedRevision", "0"), ("otherKey", "deploymentArchiveRetentionDays"), ("otherValue", "30")],
        &operator,
    )
    .await;
    assert!(answer.body.contains(r#"id="flash" data-code="forbidden""#), "{}", answer.body);
    let services = send(&state, get("/services", Some(&operator))).await.body;
    assert!(!services.contains(r#"id="organization-create-form""#), "{services}");
}

#[tokio::test]
async fn a_cluster_token_is_shown_once_and_never_on_its_page() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let answer = submit(
        &state,
        "/clusters/create",
        &[("name", "eu-1"), ("description", "Frankfurt"), ("labels", "region=eu\ntier=prod\n")],
        &cookie,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.assert_security_headers("the created page");
    assert_eq!(answer.header("cache-control"), Some("no-store"), "the token page is never cached");
    assert!(answer.body.contains("Copy it now: it is not shown again"), "{}", answer.body);
    let token = value_of(&answer.body, "cluster-token");
    assert!(token.len() > 20, "{token}");
    let session = state.auth.exchange_token(&token, None).await.expect("the token shown is the machine user's");
    let machine = state.auth.authenticate(&session.token).await.unwrap();
    assert_eq!(machine.username, "cluster-eu-1");

    let listed = method(&state, &cookie, "clusters.list", serde_json::json!({})).await;
    let id = listed["items"][0]["id"].as_str().unwrap().to_string();
    let list = send(&state, get("/clusters", Some(&cookie))).await;
    assert!(list.body.contains(r#"<tr data-cluster="eu-1" data-phase="pallet">"#), "{}", list.body);
    assert!(list.body.contains(r#"<span class="chip-key">region</span>=eu"#), "{}", list.body);
    let detail = send(&state, get(&format!("/clusters/{id}"), Some(&cookie))).await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    assert!(detail.body.contains(&format!(r#"id="cluster-machine-user">{}<"#, machine.user_id)), "{}", detail.body);
    assert!(detail.body.contains(r#"data-phase="pallet""#) && detail.body.contains(r#"id="cluster-generation">1<"#), "{}", detail.body);
    for page in [&list.body, &detail.body, &send(&state, get(&format!("/clusters/{id}/panel"), Some(&cookie))).await.body] {
        assert!(!page.contains(&token), "the token is never shown again");
    }

    // an edit states the revision it read: a stale one is the method's conflict, the typed edit kept
    assert_eq!(value_of(&detail.body, "edit-revision"), "1", "the edit form states the revision it read");
    let edit = |revision: &'static str, description: &'static str| {
        vec![("expectedRevision", revision), ("name", "eu-1"), ("description", description), ("labels", "region=eu")]
    };
    let stale = submit(&state, &format!("/clusters/{id}/update"), &edit("0", "Typed by me"), &cookie).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert!(stale.body.contains(r#"id="flash" data-code="conflict""#) && stale.body.contains("(conflict)"), "{}", stale.body);
    assert!(stale.body.contains(">Typed by me</textarea>"), "the form keeps what was typed: {}", stale.body);
    // a text area's CRLF line breaks reach the method as LF (it refuses a bare CR)
    let done = submit(&state, &format!("/clusters/{id}/update"), &edit("1", "Frankfurt,\r\nrack 4"), &cookie).await;
    assert_eq!(done.location(), Some(format!("/clusters/{id}?done=updated").as_str()), "{}", done.body);
    let got = method(&state, &cookie, "clusters.get", serde_json::json!({"id": id})).await;
    assert_eq!(
        (got["description"].as_str(), got["labels"].clone(), got["revision"].as_u64()),
        (Some("Frankfurt,\nrack 4"), serde_json::json!({"region": "eu"}), Some(2))
    );

    // a refused name shows its code, the form as typed
    let bad = submit(&state, "/clusters/create", &[("name", "Bad Name"), ("labels", "zone=a")], &cookie).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body.contains(r#"id="flash" data-code="name-invalid""#), "{}", bad.body);
    assert_eq!(value_of(&bad.body, "cluster-name"), "Bad Name");
    let shapeless = submit(&state, "/clusters/create", &[("name", "eu-2"), ("labels", "zone")], &cookie).await;
    assert!(shapeless.body.contains(r#"data-code="invalid-request""#) && shapeless.body.contains("labels, line 1"), "{}", shapeless.body);

    // the phase moves with the generation read
    let stale = submit(&state, &format!("/clusters/{id}/phase"), &[("phase", "draining"), ("expectedGeneration", "0")], &cookie).await;
    assert!(stale.body.contains(r#"id="flash" data-code="conflict""#), "{}", stale.body);
    let moved = submit(&state, &format!("/clusters/{id}/phase"), &[("phase", "draining"), ("expectedGeneration", "1")], &cookie).await;
    assert_eq!(moved.status, StatusCode::SEE_OTHER, "{}", moved.body);
    let detail = send(&state, get(&format!("/clusters/{id}?done=phase"), Some(&cookie))).await;
    assert!(detail.body.contains(r#"data-phase="draining""#) && detail.body.contains(r#"id="cluster-generation">2<"#), "{}", detail.body);

    // deletion: a confirmation page, the name typed, then gone with its machine user
    let confirm = send(&state, get(&format!("/clusters/{id}/delete"), Some(&cookie))).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains(r#"id="delete-form""#) && confirm.body.contains(&machine.user_id), "{}", confirm.body);
    let wrong = submit(&state, &format!("/clusters/{id}/delete"), &[("expectedRevision", "2"), ("confirm", "eu-2")], &cookie).await;
    assert!(wrong.body.contains(r#"id="flash" data-code="confirmation-mismatch""#), "{}", wrong.body);
    method(&state, &cookie, "clusters.get", serde_json::json!({"id": id})).await;
    let gone = submit(&state, &format!("/clusters/{id}/delete"), &[("expectedRevision", "2"), ("confirm", "eu-1")], &cookie).await;
    assert_eq!(gone.location(), Some("/clusters?done=deleted&name=eu-1"), "{}", gone.body);
    assert!(state.auth.authenticate(&session.token).await.is_err(), "its machine user's sessions ended");
    let list = send(&state, get("/clusters?done=deleted&name=eu-1", Some(&cookie))).await;
    assert!(list.body.contains("Cluster eu-1 deleted") && list.body.contains(r#"id="clusters-empty""#), "{}", list.body);
    let missing = send(&state, get(&format!("/clusters/{id}"), Some(&cookie))).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains(r#"data-code="cluster-not-found""#), "{}", missing.body);
}

#[tokio::test]
async fn services_are_created_edited_and_deleted_through_forms() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let refused = submit(&state, "/organizations/create", &[("name", "Acme Inc")], &cookie).await;
    assert!(refused.body.contains(r#"id="flash" data-code="name-invalid""#), "{}", refused.body);
    assert_eq!(value_of(&refused.body, "org-name"), "Acme Inc");
    let created = submit(&state, "/organizations/create", &[("name", "acme")], &cookie).await;
    let org = created.location().unwrap().split("org=").nth(1).unwrap().split('&').next().unwrap().to_string();
    assert!(created.location().unwrap().ends_with("&done=organization-created&name=acme"), "{:?}", created.location());
    let page = send(&state, get(created.location().unwrap(), Some(&cookie))).await;
    assert!(page.body.contains("Organization acme created") && page.body.contains(r#"id="services-empty""#), "{}", page.body);
    assert!(page.body.contains(&format!(r#"<option value="{org}" selected>acme</option>"#)), "{}", page.body);

    let fields = |name: &'static str, environment: &'static str| {
        vec![
            ("organizationId", org.clone()),
            ("name", name.to_string()),
            ("image", "ghcr.io/acme/web:1.0".to_string()),
            ("scale", "2".to_string()),
            ("ports", "443:8080/http\n53/udp".to_string()),
            ("domains", "web.acme.example".to_string()),
            ("environment", environment.to_string()),
            ("volumes", "data:/var/lib/web".to_string()),
            ("mailAddresses", "web@acme.example".to_string()),
        ]
    };
    // a credential in the environment: the method's refusal, by code and field, the form kept
    let typed = fields("web", "LOG_LEVEL=info\nDB_PASSWORD=hunter2-hunter2");
    let answer = submit(&state, "/services/create", &as_refs(&typed), &cookie).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert!(answer.body.contains(r#"id="flash" data-code="environment-value-is-secret""#), "{}", answer.body);
    assert!(answer.body.contains("Field: <code>environment.DB_PASSWORD</code>"), "{}", answer.body);
    assert_eq!(value_of(&answer.body, "service-image"), "ghcr.io/acme/web:1.0");
    let bad_port = fields("web", "");
    let mut bad_port = as_refs(&bad_port);
    bad_port[4] = ("ports", "http");
    let answer = submit(&state, "/services/create", &bad_port, &cookie).await;
    assert!(answer.body.contains(r#"data-code="port-invalid""#) && answer.body.contains("Field: <code>ports</code>"), "{}", answer.body);
    // the CLI's former order is refused as the CLI refuses it, with the one way to write it
    bad_port[4] = ("ports", "8080/http:443");
    let answer = submit(&state, "/services/create", &bad_port, &cookie).await;
    assert!(answer.body.contains(r#"data-code="port-syntax-old""#) && answer.body.contains("write 443:8080&#x2f;http"), "{}", answer.body);

    let typed = fields("web", "LOG_LEVEL=info");
    let answer = submit(&state, "/services/create", &as_refs(&typed), &cookie).await;
    let id = redirected_id(&answer);
    let detail = send(&state, get(&format!("/services/{id}?done=created"), Some(&cookie))).await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    for shown in [
        "Service created",
        "ghcr.io&#x2f;acme&#x2f;web:1.0",
        "443:8080&#x2f;http",
        "53&#x2f;udp",
        "web.acme.example",
        "web@acme.example",
        "data:&#x2f;var&#x2f;lib&#x2f;web",
        "2 replicas",
    ] {
        assert!(detail.body.contains(shown), "{shown}: {}", detail.body);
    }
    assert!(detail.body.contains(r#"<span class="chip-key">LOG_LEVEL</span>=info"#), "{}", detail.body);
    assert!(detail.body.contains(r#"id="service-state" data-state="active""#), "{}", detail.body);
    let list = send(&state, get(&format!("/services?org={org}"), Some(&cookie))).await;
    assert!(list.body.contains(r#"<tr data-service="web" data-state="active">"#), "{}", list.body);

    // edit with the revision read; absent scale stays
    let mut edit = as_refs(&typed);
    edit[0] = ("expectedRevision", "1");
    edit[2] = ("image", "ghcr.io/acme/web:1.1");
    edit[3] = ("scale", "");
    let answer = submit(&state, &format!("/services/{id}/update"), &edit, &cookie).await;
    assert_eq!(answer.location(), Some(format!("/services/{id}?done=updated").as_str()), "{}", answer.body);
    let stale = submit(&state, &format!("/services/{id}/update"), &edit, &cookie).await;
    assert!(stale.body.contains(r#"id="flash" data-code="conflict""#), "{}", stale.body);
    let got = method(&state, &cookie, "services.get", serde_json::json!({"id": id})).await;
    assert_eq!((got["image"].as_str(), got["scale"].as_u64(), got["revision"].as_u64()), (Some("ghcr.io/acme/web:1.1"), Some(2), Some(2)));

    // a manager holds it: deletion leaves it deleting, and the page says what holds it
    state
        .store
        .transact(|tx| async move { tx.insert(capstan_server::plugins::host::PLUGINS, "mail", serde_json::json!({"id": "mail"})).await })
        .await
        .unwrap();
    crate::inventory::services::hold(&state.store, &id, "plugin:mail").await.unwrap();
    let wrong = submit(&state, &format!("/services/{id}/delete"), &[("expectedRevision", "2"), ("confirm", "api")], &cookie).await;
    assert!(wrong.body.contains(r#"data-code="confirmation-mismatch""#), "{}", wrong.body);
    let answer = submit(&state, &format!("/services/{id}/delete"), &[("expectedRevision", "2"), ("confirm", "web")], &cookie).await;
    assert_eq!(answer.location(), Some(format!("/services/{id}?done=deleting").as_str()), "{}", answer.body);
    let detail = send(&state, get(&format!("/services/{id}?done=deleting"), Some(&cookie))).await;
    assert!(detail.body.contains(r#"id="service-state" data-state="deleting""#), "{}", detail.body);
    assert!(detail.body.contains(r#"id="service-holds"><span class="chip">plugin:mail</span>"#), "{}", detail.body);
    assert!(!detail.body.contains(r#"id="service-edit-form""#), "a deleting service takes no edits: {}", detail.body);
    crate::inventory::services::release(&state.store, &capstan_links::HostDependents, &id, "plugin:mail").await.unwrap();
    let panel = send(&state, get(&format!("/services/{id}/panel"), Some(&cookie))).await;
    assert!(panel.body.contains(r#"id="service-error" data-code="service-not-found""#), "{}", panel.body);

    // nothing holds the next one: it is gone at once
    let answer = submit(&state, "/services/create", &as_refs(&fields("api", "")), &cookie).await;
    let id = redirected_id(&answer);
    let answer = submit(&state, &format!("/services/{id}/delete"), &[("expectedRevision", "1"), ("confirm", "api")], &cookie).await;
    assert_eq!(answer.location(), Some(format!("/services?org={org}&done=deleted&name=api").as_str()), "{}", answer.body);
}

#[tokio::test]
async fn settings_refusals_are_banners_and_changes_are_saved_with_their_revision() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let base = [("expectedRevision", "0"), ("value.deploymentArchiveRetentionDays", ""), ("read.deploymentArchiveRetentionDays", "")];
    for (key, value, code) in [
        ("colour", "blue", "setting-unknown"),
        ("dcrouterGatewayToken", "hunter2-token", "setting-is-secret"),
        ("deploymentArchiveRetentionDays", "https", "setting-invalid"),
    ] {
        let mut fields = base.to_vec();
        fields.extend([("otherKey", key), ("otherValue", value)]);
        let answer = submit(&state, "/settings/update", &fields, &cookie).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{key}: {}", answer.body);
        assert!(answer.body.contains(&format!(r#"id="flash" data-code="{code}""#)), "{key}: {}", answer.body);
        assert_eq!(value_of(&answer.body, "other-key"), key, "the form keeps what was typed");
    }
    let saved = submit(
        &state,
        "/settings/update",
        &[("expectedRevision", "0"), ("value.deploymentArchiveRetentionDays", "30"), ("read.deploymentArchiveRetentionDays", "")],
        &cookie,
    )
    .await;
    assert_eq!(saved.location(), Some("/settings?done=updated"), "{}", saved.body);
    let page = send(&state, get("/settings?done=updated", Some(&cookie))).await;
    assert!(
        page.body.contains("Settings saved") && page.body.contains(r#"<tr data-setting="deploymentArchiveRetentionDays" data-set="true">"#),
        "{}",
        page.body
    );
    assert_eq!(value_of(&page.body, "setting-deploymentArchiveRetentionDays"), "30");
    // the same form again: it read revision 0, now stale
    let stale = submit(
        &state,
        "/settings/update",
        &[("expectedRevision", "0"), ("value.deploymentArchiveRetentionDays", "31"), ("read.deploymentArchiveRetentionDays", "")],
        &cookie,
    )
    .await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert!(stale.body.contains(r#"id="flash" data-code="conflict""#), "{}", stale.body);
    assert_eq!(value_of(&stale.body, "setting-deploymentArchiveRetentionDays"), "31");
    let unchanged = submit(
        &state,
        "/settings/update",
        &[("expectedRevision", "1"), ("value.deploymentArchiveRetentionDays", "30"), ("read.deploymentArchiveRetentionDays", "30")],
        &cookie,
    )
    .await;
    assert_eq!(unchanged.location(), Some("/settings?done=unchanged"));
    // the status panel says when the document moved past what the page read
    let panel = send(&state, get("/settings/panel?read=0", Some(&cookie))).await;
    assert!(panel.body.contains(r#"id="settings-moved""#), "{}", panel.body);
    let panel = send(&state, get("/settings/panel?read=1", Some(&cookie))).await;
    assert!(!panel.body.contains(r#"id="settings-moved""#), "{}", panel.body);
}

#[tokio::test]
async fn the_gateway_card_shows_the_enrollment_and_seals_the_admin_token_for_the_configured_target() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let page = send(&state, get("/settings", Some(&cookie))).await.body;
    assert!(page.contains(r#"id="gateway" data-state="admin-bootstrap-required""#), "{page}");
    assert!(!page.contains(r#"id="gateway-bootstrap-form""#), "no form before a target is set: {page}");
    method(
        &state,
        &cookie,
        "settings.update",
        serde_json::json!({ "expectedRevision": 0, "set": { "gatewayUrl": "https://gw.example.com", "gatewayClientId": "capstan-prod" } }),
    )
    .await;
    let page = send(&state, get("/settings", Some(&cookie))).await.body;
    assert!(page.contains(r#"data-method="gateway.bootstrapCredential""#), "{page}");
    assert!(page.contains(r#"data-key="capstan-prod""#) && page.contains("data-owner=\"https:&#x2f;&#x2f;gw.example.com\""), "{page}");
    assert!(page.contains("seal.js"), "the page seals in the browser");
    // the admin token's field is never sent: it has no name
    let field = &page[page.find(r#"id="gateway-admin-token""#).unwrap()..];
    assert!(!field[..field.find('>').unwrap()].contains("name="), "{field}");
    // a post without a sealed token is refused by name, and nothing is kept
    let answer = submit(
        &state,
        "/settings/gateway/bootstrap",
        &[("gatewayUrl", "https://gw.example.com"), ("clientId", "capstan-prod"), ("sealed", "")],
        &cookie,
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert!(answer.body.contains(r#"id="flash" data-code="bootstrap-token-invalid""#), "{}", answer.body);
    // another target than the settings name: refused before anything opens
    let answer = submit(
        &state,
        "/settings/gateway/bootstrap",
        &[
            ("gatewayUrl", "https://other.example.com"),
            ("clientId", "capstan-prod"),
            (
                "sealed",
                r#"{"profile":"capstan-sealed-input-v1","recipientId":"r","ephemeralPublicKey":"AA==","nonce":"AA==","ciphertext":"AA=="}"#,
            ),
        ],
        &cookie,
    )
    .await;
    assert!(answer.body.contains(r#"id="flash" data-code="gateway-target-mismatch""#), "{}", answer.body);
}

#[tokio::test]
async fn the_live_endpoint_answers_when_an_event_of_its_areas_commits() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let head = capstan_server::events::head(&state.store).await.unwrap();
    // nothing happens: a short watch answers "unchanged" at the same head; another area's event does not count
    let watch = |areas: &'static [&'static str]| {
        let body = serde_json::json!({ "after": head, "areas": areas, "waitMs": 600 });
        method(&state, &cookie, "events.watch", body)
    };
    assert_eq!(watch(&["cluster"]).await, serde_json::json!({ "head": head, "changed": false }));
    method(&state, &cookie, "organizations.create", serde_json::json!({"name": "acme"})).await;
    let moved = watch(&["cluster"]).await;
    assert_eq!(moved, serde_json::json!({ "head": head + 1, "changed": false }), "the head moves on past events of other areas");
    assert_eq!(watch(&["organization"]).await, serde_json::json!({ "head": head + 1, "changed": true }));
    let head_now = method(&state, &cookie, "events.head", serde_json::json!({})).await;
    assert_eq!(head_now["head"], head + 1);

    // a page's poll waits, and answers as soon as a cluster is created
    let waiting = {
        let (state, cookie) = (state.clone(), cookie.clone());
        tokio::spawn(async move { send(&state, get(&format!("/live/wait?after={}&areas=cluster", head + 1), Some(&cookie))).await })
    };
    tokio::time::sleep(capstan_server::events::methods::POLL_EVERY * 2).await;
    assert!(!waiting.is_finished(), "nothing changed yet: the poll waits");
    method(&state, &cookie, "clusters.create", serde_json::json!({"name": "eu-1"})).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the poll answers once the event commits").unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.assert_security_headers("/live/wait");
    assert_eq!(answer.header("hx-trigger"), Some(live::CHANGED));
    let head = capstan_server::events::head(&state.store).await.unwrap();
    assert!(answer.body.contains(&format!(r#"id="live" data-head="{head}" data-changed="true""#)), "{}", answer.body);
    assert!(answer.body.contains(&format!("after={head}&amp;areas=cluster")), "the next poll waits from the new head: {}", answer.body);
    // what it cannot read is refused plainly
    for query in ["after=x&areas=cluster", "after=1&areas=bogus", "areas=cluster"] {
        assert_eq!(send(&state, get(&format!("/live/wait?{query}"), Some(&cookie))).await.status, StatusCode::BAD_REQUEST, "{query}");
    }
}

#[tokio::test]
async fn inventory_posts_from_another_origin_are_refused() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    for path in
        ["/clusters/create", "/organizations/create", "/services/create", "/settings/update", "/clusters/x/update", "/services/x/delete"]
    {
        let answer = send(
            &state,
            post_form(
                path,
                "name=evil&otherKey=deploymentArchiveRetentionDays&otherValue=1&expectedRevision=0",
                Some(&cookie),
                Some("https://evil.example"),
            ),
        )
        .await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path}: {}", answer.body);
        assert!(answer.body.contains("Request refused"), "{}", answer.body);
    }
    let clusters = method(&state, &cookie, "clusters.list", serde_json::json!({})).await;
    let orgs = method(&state, &cookie, "organizations.list", serde_json::json!({})).await;
    assert!(clusters["items"].as_array().unwrap().is_empty() && orgs["items"].as_array().unwrap().is_empty(), "nothing was created");
}

// ---------------------------------------------------------------------------------------
// The Tasks view

/// The host tasks `capstan serve` registers besides `host.cleanup` (which every scheduler
/// has): the session reaper, and `host.slow`, a run that goes on until it is cancelled.
fn register_tasks(state: &AppState) {
    let scheduler = &state.scheduler;
    let store = state.store.clone();
    scheduler
        .register(capstan_server::scheduler::HostTask::new(
            "host.reap-expired-sessions",
            "Remove expired sessions",
            "*/5 * * * *",
            move |log| {
                let store = store.clone();
                async move {
                    let reaped = crate::auth::reap_expired_sessions(&store).await?;
                    log.line(format!("removed {reaped} expired sessions"));
                    Ok(())
                }
            },
        ))
        .unwrap();
    scheduler
        .register(capstan_server::scheduler::HostTask::new("host.slow", "Take a while", "0 3 * * *", |log| async move {
            log.line("started; waiting to be cancelled");
            tokio::time::sleep(Duration::from_secs(600)).await;
            Ok(())
        }))
        .unwrap();
}

/// The execution `id` once it has ended (polled through the method).
async fn ended_execution(state: &AppState, cookie: &str, id: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let execution = method(state, cookie, "tasks.getExecution", serde_json::json!({ "id": id })).await;
        if execution["status"] != "running" {
            return execution;
        }
        assert!(tokio::time::Instant::now() < deadline, "execution {id} should end: {execution}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The newest execution of `task`.
async fn newest_execution(state: &AppState, cookie: &str, task: &str) -> serde_json::Value {
    let page = method(state, cookie, "tasks.listExecutions", serde_json::json!({ "taskId": task, "limit": 1 })).await;
    page["executions"][0].clone()
}

#[tokio::test]
async fn the_tasks_view_needs_a_session_and_lists_every_task() {
    let (_dir, state) = setup().await;
    register_tasks(&state);
    for path in ["/tasks", "/tasks/panel", "/tasks/host.cleanup", "/tasks/host.cleanup/panel", "/tasks/host.cleanup/disable"] {
        let anonymous = send(&state, get(path, None)).await;
        assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
        anonymous.assert_security_headers(path);
    }
    let mut request = get("/tasks/panel", None);
    request.headers_mut().insert("hx-request", HeaderValue::from_static("true"));
    let anonymous = send(&state, request).await;
    assert_eq!((anonymous.status, anonymous.header("hx-redirect")), (StatusCode::UNAUTHORIZED, Some("/login")));

    let cookie = login_cookie(&state).await;
    let page = send(&state, get("/tasks", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.assert_security_headers("GET /tasks");
    let body = &page.body;
    assert!(body.contains("<title>Tasks · Capstan</title>"), "{body}");
    assert!(body.contains(r#"href="&#x2f;tasks" aria-current="page""#), "the rail links and marks Tasks: {body}");
    assert!(!body.contains("<script>") && !body.contains("<style") && !body.contains("style="), "{body}");
    for (task, title, cron) in
        [("host.cleanup", "Clean up history", "0 * * * *"), ("host.reap-expired-sessions", "Remove expired sessions", "*&#x2f;5 * * * *")]
    {
        let row = format!(r#"<tr data-task="{task}" data-enabled="true" data-running="false">"#);
        assert!(body.contains(&row), "{task}: {body}");
        assert!(body.contains(&format!(r#"href="&#x2f;tasks&#x2f;{task}">{task}</a>"#)), "{task} links to its page: {body}");
        assert!(body.contains(cron), "{task}'s schedule: {body}");
        assert!(body.contains(&format!(r#"<span class="muted small">{title}</span>"#)), "{task}'s title: {body}");
    }
    assert!(body.contains("never run") && body.contains(r#"data-action="run""#) && body.contains(r#"data-action="disable""#), "{body}");
    // nothing runs: the list does not refresh itself
    assert!(body.contains(r#"id="tasks-panel" aria-labelledby="tasks-title" data-refreshing="false">"#), "{body}");
    assert!(!body.contains("every 2s"), "{body}");

    // the detail of a task that was never run
    let detail = send(&state, get("/tasks/host.reap-expired-sessions", Some(&cookie))).await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    assert!(detail.body.contains("<title>Task host.reap-expired-sessions · Capstan</title>"), "{}", detail.body);
    assert!(detail.body.contains(r#"id="executions-empty""#) && detail.body.contains(r#"id="task-run""#), "{}", detail.body);
    assert!(!detail.body.contains("every 2s"), "{}", detail.body);
    // an unknown task is the method's refusal, by name
    let missing = send(&state, get("/tasks/host.nothing", Some(&cookie))).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    assert!(missing.body.contains(r#"id="task-error" data-code="task-not-found""#), "{}", missing.body);
}

#[tokio::test]
async fn run_now_shows_the_execution_and_its_outcome() {
    let (_dir, state) = setup().await;
    register_tasks(&state);
    let cookie = login_cookie(&state).await;
    let answer = submit(&state, "/tasks/host.cleanup/run", &[("from", "list")], &cookie).await;
    assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/tasks/host.cleanup?done=started")), "{}", answer.body);
    let execution = newest_execution(&state, &cookie, "host.cleanup").await;
    let id = execution["id"].as_str().unwrap().to_string();
    assert_eq!(execution["trigger"], "manual");
    let detail = send(&state, get("/tasks/host.cleanup?done=started", Some(&cookie))).await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    assert!(detail.body.contains("Task started"), "{}", detail.body);
    assert!(detail.body.contains(&format!(r#"data-execution="{id}""#)), "the run is on the task's page: {}", detail.body);

    // once it ended: succeeded, with its duration, node and log
    let done = ended_execution(&state, &cookie, &id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let detail = send(&state, get("/tasks/host.cleanup", Some(&cookie))).await;
    let body = &detail.body;
    assert!(body.contains(&format!(r#"<tbody class="execution" data-execution="{id}" data-status="succeeded">"#)), "{body}");
    assert!(body.contains(&tasks::duration(done["durationMs"].as_u64().unwrap())), "the duration is shown: {body}");
    assert!(body.contains(r#"<td class="execution-node"><span class="mono">test-node</span>"#), "{body}");
    assert!(body.contains(r#"<span class="muted small">by you</span>"#), "{body}");
    assert!(body.contains(r#"<pre class="log-tail">"#), "the log tail is there to expand: {body}");
    for line in done["log"].as_array().unwrap() {
        assert!(body.contains(&escaped(line.as_str().unwrap())), "{line}: {body}");
    }
    assert!(!body.contains("every 2s") && !body.contains("execution-cancel"), "nothing runs: {body}");
    let list = send(&state, get("/tasks", Some(&cookie))).await;
    assert!(list.body.contains(r#"data-status="succeeded">succeeded</span>"#), "the list shows the last run: {}", list.body);
}

#[tokio::test]
async fn a_disabled_task_is_refused_on_run_now_until_enabled_again() {
    let (_dir, state) = setup().await;
    register_tasks(&state);
    let cookie = login_cookie(&state).await;
    // disabling asks first, and says what it means
    let confirm = send(&state, get("/tasks/host.cleanup/disable?from=list", Some(&cookie))).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains(r#"id="disable-form""#) && confirm.body.contains("task-disabled"), "{}", confirm.body);
    assert!(confirm.body.contains(r#"name="from" value="list""#), "{}", confirm.body);
    let answer = submit(&state, "/tasks/host.cleanup/disable", &[("from", "list")], &cookie).await;
    assert_eq!(answer.location(), Some("/tasks?done=disabled&task=host.cleanup"), "{}", answer.body);
    let list = send(&state, get("/tasks?done=disabled&task=host.cleanup", Some(&cookie))).await;
    assert!(list.body.contains("Task host.cleanup disabled"), "{}", list.body);
    assert!(list.body.contains(r#"<tr data-task="host.cleanup" data-enabled="false""#), "{}", list.body);
    assert!(list.body.contains(r#"data-action="enable""#), "{}", list.body);
    let row = list.body.split(r#"<tr data-task="host.cleanup""#).nth(1).and_then(|rest| rest.split("</tr>").next()).unwrap();
    assert!(!row.contains(r#"data-action="run""#), "a disabled task offers no Run now: {row}");
    let page = send(&state, get("/tasks/host.cleanup", Some(&cookie))).await;
    assert!(!page.body.contains(r#"id="task-run""#) && page.body.contains(r#"id="task-enable""#), "{}", page.body);
    // a crafted link cannot put words in the banner
    let crafted = send(&state, get("/tasks?done=disabled&task=Pay%20now", Some(&cookie))).await;
    assert!(crafted.body.contains("Task disabled") && !crafted.body.contains("Pay now"), "{}", crafted.body);

    // Run now: the method's refusal, by code, on the page the form was on
    let refused = submit(&state, "/tasks/host.cleanup/run", &[("from", "list")], &cookie).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(refused.body.contains(r#"id="flash" data-code="task-disabled""#), "{}", refused.body);
    assert!(refused.body.contains(r#"id="tasks-panel""#), "the list again: {}", refused.body);
    let refused = submit(&state, "/tasks/host.cleanup/run", &[("from", "task")], &cookie).await;
    assert!(refused.body.contains(r#"id="flash" data-code="task-disabled""#), "{}", refused.body);
    assert!(refused.body.contains(r#"id="task-enabled" data-enabled="false""#), "the task's page again: {}", refused.body);
    let record = method(&state, &cookie, "tasks.get", serde_json::json!({ "id": "host.cleanup" })).await;
    assert!(record["recentExecutions"].as_array().unwrap().is_empty(), "nothing ran: {record}");

    // enabled again from its page: it runs
    let answer = submit(&state, "/tasks/host.cleanup/enable", &[("from", "task")], &cookie).await;
    assert_eq!(answer.location(), Some("/tasks/host.cleanup?done=enabled"), "{}", answer.body);
    let detail = send(&state, get("/tasks/host.cleanup?done=enabled", Some(&cookie))).await;
    assert!(detail.body.contains("Task enabled") && detail.body.contains(r#"data-enabled="true""#), "{}", detail.body);
    let answer = submit(&state, "/tasks/host.cleanup/run", &[("from", "task")], &cookie).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
}

#[tokio::test]
async fn a_running_execution_refreshes_its_panels_and_can_be_cancelled() {
    let (_dir, state) = setup().await;
    register_tasks(&state);
    let cookie = login_cookie(&state).await;
    let answer = submit(&state, "/tasks/host.slow/run", &[("from", "task")], &cookie).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let id = newest_execution(&state, &cookie, "host.slow").await["id"].as_str().unwrap().to_string();

    // while it runs, both panels re-fetch themselves every 2 s, and it can be cancelled
    let detail = send(&state, get("/tasks/host.slow", Some(&cookie))).await;
    let body = &detail.body;
    assert!(body.contains(&format!(r#"data-execution="{id}" data-status="running""#)), "{body}");
    assert!(body.contains(r#"hx-get="&#x2f;tasks&#x2f;host.slow&#x2f;panel" hx-trigger="every 2s""#), "{body}");
    assert!(body.contains(&format!(r#"name="executionId" value="{id}""#)) && body.contains("execution-cancel"), "{body}");
    assert!(body.contains("so far"), "a running execution's duration so far: {body}");
    let list = send(&state, get("/tasks", Some(&cookie))).await;
    assert!(list.body.contains(r#"data-refreshing="true" hx-get="/tasks/panel" hx-trigger="every 2s""#), "{}", list.body);
    assert!(list.body.contains(r#"<tr data-task="host.slow" data-enabled="true" data-running="true">"#), "{}", list.body);
    let panel = send(&state, get("/tasks/host.slow/panel", Some(&cookie))).await;
    assert!(panel.body.trim_start().starts_with(r#"<div class="stack" id="task-panel""#), "{}", panel.body);
    assert!(panel.body.contains("every 2s"), "{}", panel.body);

    // one at a time
    let busy = submit(&state, "/tasks/host.slow/run", &[("from", "list")], &cookie).await;
    assert!(busy.body.contains(r#"id="flash" data-code="task-running""#), "{}", busy.body);

    let answer = submit(&state, "/tasks/host.slow/cancel", &[("executionId", &id)], &cookie).await;
    assert_eq!(answer.location(), Some("/tasks/host.slow?done=cancel-requested"), "{}", answer.body);
    let done = ended_execution(&state, &cookie, &id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    // nothing runs any more: the panels stop refreshing
    let panel = send(&state, get("/tasks/host.slow/panel", Some(&cookie))).await;
    assert!(panel.body.contains(r#"data-status="cancelled""#) && !panel.body.contains("every 2s"), "{}", panel.body);
    let list = send(&state, get("/tasks/panel", Some(&cookie))).await;
    assert!(!list.body.contains("every 2s"), "{}", list.body);
    // cancelling again is the method's refusal
    let again = submit(&state, "/tasks/host.slow/cancel", &[("executionId", &id)], &cookie).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert!(again.body.contains(r#"id="flash" data-code="execution-not-running""#), "{}", again.body);
}

#[tokio::test]
async fn the_tasks_view_shows_an_operator_forbidden() {
    let (_dir, state) = setup().await;
    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let page = send(&state, get("/tasks", Some(&operator))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"id="tasks-error" data-code="forbidden""#), "{}", page.body);
    assert!(!page.body.contains("data-task="), "{}", page.body);
    let detail = send(&state, get("/tasks/host.cleanup", Some(&operator))).await;
    assert_eq!(detail.status, StatusCode::FORBIDDEN, "{}", detail.body);
    assert!(detail.body.contains(r#"id="task-error" data-code="forbidden""#), "{}", detail.body);
    let answer = submit(&state, "/tasks/host.cleanup/run", &[("from", "list")], &operator).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert!(answer.body.contains(r#"id="flash" data-code="forbidden""#), "{}", answer.body);
    let answer = submit(&state, "/tasks/host.cleanup/disable", &[("from", "list")], &operator).await;
    assert!(answer.body.contains(r#"data-code="forbidden""#), "{}", answer.body);
    // and the posts from another site are refused before anything
    let cookie = login_cookie(&state).await;
    for path in ["/tasks/host.cleanup/run", "/tasks/host.cleanup/disable", "/tasks/host.cleanup/enable", "/tasks/host.cleanup/cancel"] {
        let answer = send(&state, post_form(path, "from=list&executionId=x", Some(&cookie), Some("https://evil.example"))).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path}: {}", answer.body);
        assert!(answer.body.contains("Request refused"), "{}", answer.body);
    }
    let tasks = method(&state, &cookie, "tasks.list", serde_json::json!({})).await;
    let cleanup = tasks["tasks"].as_array().unwrap().iter().find(|t| t["id"] == "host.cleanup").unwrap().clone();
    assert_eq!((cleanup["enabled"].as_bool(), cleanup["lastExecution"].is_null()), (Some(true), true), "nothing was done: {cleanup}");
}

// ---------------------------------------------------------------------------------------
// The Secrets view

const PLANTED: &str = "hunter2-planted-dashboard-3f9c";
const PLANTED_ROTATED: &str = "hunter2-planted-dashboard-rotated-81d0";

/// A value sealed as seal.js seals it: to `state`'s ingress recipient, for `method`, `owner`, `key`.
fn sealed(state: &AppState, method: &str, owner: &str, key: &str, value: &[u8]) -> String {
    let target = capstan_server::secrets::ingress::target(method, owner, key);
    let input = capstan_server::secrets::ingress::seal_to(state.keyring.ingress_id(), state.keyring.ingress_public_key(), &target, value);
    serde_json::to_string(&input).unwrap()
}

/// An organization `acme` with the service `web`; the service's id.
async fn secret_service(state: &AppState, cookie: &str) -> String {
    let org = method(state, cookie, "organizations.create", serde_json::json!({"name": "acme"})).await;
    let service =
        method(state, cookie, "services.create", serde_json::json!({"organizationId": org["id"], "name": "web", "image": "nginx"})).await;
    service["id"].as_str().unwrap().to_string()
}

async fn current_value(state: &AppState, id: &str) -> Vec<u8> {
    capstan_server::secrets::methods::open_current(&state.store, &state.keyring, id).await.unwrap().to_vec()
}

/// Every page a test read, checked at the end: no planted value on any.
#[derive(Default)]
struct Pages(Vec<String>);

impl Pages {
    fn keep(&mut self, answer: Answer) -> Answer {
        self.0.push(answer.body.clone());
        answer
    }

    fn assert_value_free(&self) {
        for page in &self.0 {
            assert!(!page.contains(PLANTED) && !page.contains(PLANTED_ROTATED), "a value was shown: {page}");
            assert!(!page.contains("hunter2"), "a value was shown: {page}");
        }
    }
}

/// The banner's refusal code on a page.
fn flash_code(body: &str) -> Option<String> {
    let at = body.find(r#"id="flash" data-code=""#)? + r#"id="flash" data-code=""#.len();
    Some(body[at..at + body[at..].find('"')?].to_string())
}

#[tokio::test]
async fn the_secrets_view_needs_a_session_and_offers_a_sealing_form() {
    let (_dir, state) = setup().await;
    for path in ["/secrets", "/secrets/services/x", "/secrets/services/x/panel", "/secrets/x/rotate", "/secrets/x/revoke"] {
        let anonymous = send(&state, get(path, None)).await;
        assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
        anonymous.assert_security_headers(path);
    }
    for path in ["/secrets/services/x/create", "/secrets/x/rotate", "/secrets/x/revoke"] {
        let answer = send(&state, post_form(path, "key=A&sealed=x", None, Some(ORIGIN))).await;
        assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
    }

    let cookie = login_cookie(&state).await;
    let empty = send(&state, get("/secrets", Some(&cookie))).await;
    assert_eq!(empty.status, StatusCode::OK, "{}", empty.body);
    assert!(empty.body.contains(r#"id="organizations-empty""#) && empty.body.contains(r#"id="secret-services-empty""#), "{}", empty.body);
    assert!(empty.body.contains(r#"href="&#x2f;secrets" aria-current="page""#), "the rail links the view: {}", empty.body);
    let id = secret_service(&state, &cookie).await;
    let service = send(&state, get(&format!("/services/{id}"), Some(&cookie))).await;
    assert!(service.body.contains(&format!(r#"href="/secrets/services/{id}" id="service-secrets""#)), "{}", service.body);
    let index = send(&state, get("/secrets", Some(&cookie))).await;
    assert!(
        index.body.contains(&format!(r#"<li data-service="web"><a class="row-link" href="&#x2f;secrets&#x2f;services&#x2f;{id}">web</a>"#)),
        "{}",
        index.body
    );

    let page = send(&state, get(&format!("/secrets/services/{id}"), Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.assert_security_headers("the secrets page");
    let body = &page.body;
    assert!(body.contains("<title>Secrets of web · Capstan</title>"), "{body}");
    assert!(body.contains(r#"id="secrets-empty""#) && body.contains(r#"id="live" data-head="#), "{body}");
    // the form carries the recipient and the target, and loads the sealing script from /static
    let form_tag = &body[body.find(r#"id="secret-create-form""#).unwrap()..];
    let form_tag = &form_tag[..form_tag.find('>').unwrap()];
    for attribute in [
        format!(r#"data-recipient-id="{}""#, escaped(state.keyring.ingress_id())),
        r#"data-method="secrets.create""#.to_string(),
        format!(r#"data-owner="service:{id}""#),
        "data-seal ".to_string(),
    ] {
        assert!(form_tag.contains(&attribute), "{attribute}: {form_tag}");
    }
    let public_key = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(state.keyring.ingress_public_key().as_bytes())
    };
    assert!(form_tag.contains(&format!(r#"data-recipient-key="{}""#, escaped(&public_key))), "{form_tag}");
    assert!(body.contains(&format!(r#"<script src="{}" defer></script>"#, assets::url("seal.js").unwrap())), "{body}");
    assert!(!body.contains("<script>") && !body.contains("<style") && !body.contains("style="), "{body}");
    // the plain fields have no name: only `sealed` is ever sent
    for marker in ["data-seal-typed", "data-seal-generated"] {
        let at = body.find(marker).unwrap_or_else(|| panic!("{marker}: {body}"));
        let tag = &body[body[..at].rfind('<').unwrap()..at + body[at..].find('>').unwrap()];
        assert!(!tag.contains("name="), "{marker} must not be sent: {tag}");
    }
    assert!(body.contains(r#"<input type="hidden" name="sealed" value="">"#), "{body}");
}

#[tokio::test]
async fn secrets_are_created_rotated_and_revoked_with_sealed_values_only() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let id = secret_service(&state, &cookie).await;
    let owner = format!("service:{id}");
    let create = format!("/secrets/services/{id}/create");
    let mut pages = Pages::default();

    // refusals, each by its code, the typed key kept and nothing stored
    let other_ring = capstan_server::keyring::Keyring::generate(None, None).unwrap();
    let elsewhere = serde_json::to_string(&capstan_server::secrets::ingress::seal_to(
        other_ring.ingress_id(),
        other_ring.ingress_public_key(),
        &capstan_server::secrets::ingress::target("secrets.create", &owner, "DB_PASSWORD"),
        PLANTED.as_bytes(),
    ))
    .unwrap();
    let oversized = "x".repeat(capstan_server::secrets::methods::MAX_VALUE_BYTES + 1);
    for (key, value, code, status) in [
        ("DB_PASSWORD", String::new(), "input-not-sealed", StatusCode::BAD_REQUEST),
        ("DB_PASSWORD", "{not json".to_string(), "sealed-input-invalid", StatusCode::BAD_REQUEST),
        (
            "DB_PASSWORD",
            sealed(&state, "secrets.create", &owner, "API_TOKEN", PLANTED.as_bytes()),
            "sealed-input-invalid",
            StatusCode::BAD_REQUEST,
        ),
        (
            "DB_PASSWORD",
            sealed(&state, "secrets.rotate", &owner, "DB_PASSWORD", PLANTED.as_bytes()),
            "sealed-input-invalid",
            StatusCode::BAD_REQUEST,
        ),
        ("DB_PASSWORD", elsewhere, "sealed-input-recipient-unknown", StatusCode::BAD_REQUEST),
        ("DB_PASSWORD", sealed(&state, "secrets.create", &owner, "DB_PASSWORD", b""), "input-empty", StatusCode::BAD_REQUEST),
        (
            "DB_PASSWORD",
            sealed(&state, "secrets.create", &owner, "DB_PASSWORD", oversized.as_bytes()),
            "input-oversized",
            StatusCode::BAD_REQUEST,
        ),
        (
            "db password",
            sealed(&state, "secrets.create", &owner, "db password", PLANTED.as_bytes()),
            "environment-key-invalid",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let answer = pages.keep(submit(&state, &create, &[("key", key), ("environment", ""), ("sealed", &value)], &cookie).await);
        assert_eq!(answer.status, status, "{code}: {}", answer.body);
        assert_eq!(flash_code(&answer.body).as_deref(), Some(code), "{}", answer.body);
        assert!(answer.body.contains(&format!("({code})")), "the code is in the banner's title: {}", answer.body);
        assert_eq!(value_of(&answer.body, "secret-key"), key, "the key typed is kept");
        assert!(!answer.body.contains(&value) || value.is_empty(), "the sealed input is never echoed");
    }
    let listed = method(&state, &cookie, "secrets.list", serde_json::json!({"owner": {"kind": "service", "serviceId": id}})).await;
    assert_eq!(listed["items"], serde_json::json!([]), "nothing was stored");

    // created: the server opens exactly what the browser sealed
    let value = sealed(&state, "secrets.create", &owner, "DB_PASSWORD", PLANTED.as_bytes());
    let answer =
        submit(&state, &create, &[("key", "DB_PASSWORD"), ("environment", ""), ("valueMode", "typed"), ("sealed", &value)], &cookie).await;
    assert_eq!(answer.location(), Some(format!("/secrets/services/{id}?done=created&key=DB_PASSWORD").as_str()), "{}", answer.body);
    let listed = method(&state, &cookie, "secrets.list", serde_json::json!({"owner": {"kind": "service", "serviceId": id}})).await;
    let secret = listed["items"][0].clone();
    let secret_id = secret["id"].as_str().unwrap().to_string();
    assert_eq!((secret["key"].as_str(), secret["environment"].as_str()), (Some("DB_PASSWORD"), Some("production")));
    assert_eq!(current_value(&state, &secret_id).await, PLANTED.as_bytes());
    let page = pages.keep(send(&state, get(answer.location().unwrap(), Some(&cookie))).await);
    assert!(page.body.contains("Secret DB_PASSWORD created"), "{}", page.body);
    assert!(
        page.body.contains(&format!(
            r#"<tr data-secret="DB_PASSWORD" data-environment="production" data-state="active" data-id="{secret_id}">"#
        )),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"data-versions="1">1<"#), "{}", page.body);
    pages.keep(send(&state, get(&format!("/secrets/services/{id}/panel"), Some(&cookie))).await);

    // the same key again in the same environment: exists; another environment is another secret
    let again = pages.keep(submit(&state, &create, &[("key", "DB_PASSWORD"), ("sealed", &value)], &cookie).await);
    assert_eq!((again.status, flash_code(&again.body).as_deref()), (StatusCode::CONFLICT, Some("exists")), "{}", again.body);
    assert!(again.body.contains("rotate it instead"), "{}", again.body);
    let staging = sealed(&state, "secrets.create", &owner, "DB_PASSWORD", PLANTED.as_bytes());
    let answer = submit(&state, &create, &[("key", "DB_PASSWORD"), ("environment", "staging"), ("sealed", &staging)], &cookie).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);

    // rotation: the form states the version read; a stale one is conflict
    let rotate = format!("/secrets/{secret_id}/rotate");
    let rotating = pages.keep(send(&state, get(&rotate, Some(&cookie))).await);
    assert_eq!(rotating.status, StatusCode::OK, "{}", rotating.body);
    let version = secret["currentVersionId"].as_str().unwrap().to_string();
    let body = &rotating.body;
    assert!(body.contains(&format!(r#"<input type="hidden" name="expectedVersionId" value="{version}">"#)), "{body}");
    assert!(body.contains(r#"data-key="DB_PASSWORD""#) && body.contains(r#"data-method="secrets.rotate""#), "{body}");
    assert!(body.contains(&format!(r#"data-owner="service:{id}""#)), "{body}");
    let next = sealed(&state, "secrets.rotate", &owner, "DB_PASSWORD", PLANTED_ROTATED.as_bytes());
    let stale = pages.keep(submit(&state, &rotate, &[("expectedVersionId", "ver_old"), ("sealed", &next)], &cookie).await);
    assert_eq!((stale.status, flash_code(&stale.body).as_deref()), (StatusCode::CONFLICT, Some("conflict")), "{}", stale.body);
    assert!(stale.body.contains(&format!(r#"name="expectedVersionId" value="{version}""#)), "the form states the version read now");
    let for_create = pages.keep(submit(&state, &rotate, &[("expectedVersionId", &version), ("sealed", &value)], &cookie).await);
    assert_eq!(flash_code(&for_create.body).as_deref(), Some("sealed-input-invalid"), "a value sealed for the create does not rotate");
    let answer = submit(&state, &rotate, &[("expectedVersionId", &version), ("sealed", &next)], &cookie).await;
    assert_eq!(answer.location(), Some(format!("/secrets/services/{id}?done=rotated&key=DB_PASSWORD").as_str()), "{}", answer.body);
    assert_eq!(current_value(&state, &secret_id).await, PLANTED_ROTATED.as_bytes());
    let page = pages.keep(send(&state, get(answer.location().unwrap(), Some(&cookie))).await);
    assert!(page.body.contains("Secret DB_PASSWORD rotated") && page.body.contains(r#"data-versions="2">2<"#), "{}", page.body);

    // revocation: confirmed by typing the key
    let revoke = format!("/secrets/{secret_id}/revoke");
    let confirm = pages.keep(send(&state, get(&revoke, Some(&cookie))).await);
    assert!(confirm.body.contains(r#"id="revoke-form""#) && confirm.body.contains("Revoke the secret"), "{}", confirm.body);
    assert!(confirm.body.contains("Back to the service web"), "the owner is named: {}", confirm.body);
    let wrong = pages.keep(submit(&state, &revoke, &[("confirm", "API_TOKEN")], &cookie).await);
    assert_eq!(flash_code(&wrong.body).as_deref(), Some("confirmation-mismatch"), "{}", wrong.body);
    assert_eq!(method(&state, &cookie, "secrets.get", serde_json::json!({"id": secret_id})).await["state"], "active");
    let answer = submit(&state, &revoke, &[("confirm", "DB_PASSWORD")], &cookie).await;
    assert_eq!(answer.location(), Some(format!("/secrets/services/{id}?done=revoked&key=DB_PASSWORD").as_str()), "{}", answer.body);
    let page = pages.keep(send(&state, get(answer.location().unwrap(), Some(&cookie))).await);
    assert!(page.body.contains(r#"data-environment="production" data-state="revoked""#), "{}", page.body);
    let next = sealed(&state, "secrets.rotate", &owner, "DB_PASSWORD", PLANTED.as_bytes());
    let revoked = pages.keep(submit(&state, &rotate, &[("expectedVersionId", "x"), ("sealed", &next)], &cookie).await);
    assert_eq!(flash_code(&revoked.body).as_deref(), Some("secret-revoked"), "{}", revoked.body);

    // a secret a manager owns: no actions offered, and the methods refuse the dashboard's writes
    let scoped = method(
        &state,
        &cookie,
        "secrets.create",
        serde_json::json!({"owner": {"kind": "service", "serviceId": id}, "key": "SMTP_PASSWORD", "managementScope": format!("mail:{id}"),
            "value": {"generate": {"length": 24, "alphabet": "hex"}}}),
    )
    .await;
    let scoped_id = scoped["id"].as_str().unwrap();
    let page = pages.keep(send(&state, get(&format!("/secrets/services/{id}"), Some(&cookie))).await);
    assert!(page.body.contains("changed by its manager"), "{}", page.body);
    let next = sealed(&state, "secrets.rotate", &owner, "SMTP_PASSWORD", PLANTED.as_bytes());
    let version = scoped["currentVersionId"].as_str().unwrap();
    let answer = pages
        .keep(submit(&state, &format!("/secrets/{scoped_id}/rotate"), &[("expectedVersionId", version), ("sealed", &next)], &cookie).await);
    assert_eq!(flash_code(&answer.body).as_deref(), Some("management-scope-mismatch"), "{}", answer.body);
    let answer = pages.keep(submit(&state, &format!("/secrets/{scoped_id}/revoke"), &[("confirm", "SMTP_PASSWORD")], &cookie).await);
    assert_eq!(flash_code(&answer.body).as_deref(), Some("management-scope-mismatch"), "{}", answer.body);

    // an unknown secret's pages say so
    let missing = pages.keep(send(&state, get("/secrets/sec_nothing/rotate", Some(&cookie))).await);
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    assert!(missing.body.contains(r#"id="secret-error" data-code="secret-not-found""#), "{}", missing.body);
    pages.assert_value_free();

    // an operator sees the methods' refusal; another site's posts are refused before anything
    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    // (a service it may not read is one it cannot tell from a missing one)
    let page = send(&state, get(&format!("/secrets/services/{id}"), Some(&operator))).await;
    assert!(page.body.contains(r#"data-code="service-not-found""#) && !page.body.contains("data-secret="), "{}", page.body);
    let value = sealed(&state, "secrets.create", &owner, "API_TOKEN", PLANTED.as_bytes());
    let answer = submit(&state, &create, &[("key", "API_TOKEN"), ("sealed", &value)], &operator).await;
    assert_eq!((answer.status, flash_code(&answer.body).as_deref()), (StatusCode::FORBIDDEN, Some("forbidden")), "{}", answer.body);
    for path in [create.as_str(), rotate.as_str(), revoke.as_str()] {
        let answer = send(
            &state,
            post_form(path, &encoded(&[("key", "API_TOKEN"), ("sealed", &value)]), Some(&cookie), Some("https://evil.example")),
        )
        .await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path}: {}", answer.body);
    }
    let listed = method(&state, &cookie, "secrets.list", serde_json::json!({"owner": {"kind": "service", "serviceId": id}})).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 3, "DB_PASSWORD twice and SMTP_PASSWORD: {listed}");
}

#[tokio::test]
async fn secret_sets_are_created_attached_previewed_and_retired_through_forms() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let web = secret_service(&state, &cookie).await;
    let org = method(&state, &cookie, "services.get", serde_json::json!({"id": web})).await["organizationId"].as_str().unwrap().to_string();
    let mut pages = Pages::default();

    let index = pages.keep(send(&state, get(&format!("/secrets?org={org}"), Some(&cookie))).await);
    assert!(index.body.contains(r#"id="secret-sets-empty""#) && index.body.contains(r#"id="set-create-form""#), "{}", index.body);
    let refused = pages.keep(submit(&state, "/secrets/sets/create", &[("organizationId", &org), ("name", "Shared SMTP")], &cookie).await);
    assert_eq!(flash_code(&refused.body).as_deref(), Some("name-invalid"), "{}", refused.body);
    assert_eq!(value_of(&refused.body, "set-name"), "Shared SMTP");
    let created =
        submit(&state, "/secrets/sets/create", &[("organizationId", &org), ("name", "smtp"), ("description", "Relay")], &cookie).await;
    let set = redirected_id(&created);
    assert_eq!(created.location(), Some(format!("/secrets/sets/{set}?done=set-created&name=smtp").as_str()));
    let page = pages.keep(send(&state, get(created.location().unwrap(), Some(&cookie))).await);
    assert!(page.body.contains("SecretSet smtp created") && page.body.contains(r#"id="set-state" data-state="active""#), "{}", page.body);
    let owner = format!("organization:{org}/secretSet:{set}");
    assert!(page.body.contains(&format!(r#"data-owner="{}""#, escaped(&owner))), "the set's owner reference is the target: {}", page.body);

    // member secrets, sealed for the set's owner reference
    let add = format!("/secrets/sets/{set}/create");
    let for_service = sealed(&state, "secrets.create", &format!("service:{web}"), "SMTP_PASSWORD", PLANTED.as_bytes());
    let wrong = pages.keep(submit(&state, &add, &[("key", "SMTP_PASSWORD"), ("sealed", &for_service)], &cookie).await);
    assert_eq!(flash_code(&wrong.body).as_deref(), Some("sealed-input-invalid"), "{}", wrong.body);
    for key in ["SMTP_PASSWORD", "SMTP_RELAY"] {
        let value = sealed(&state, "secrets.create", &owner, key, PLANTED.as_bytes());
        let answer = submit(&state, &add, &[("key", key), ("environment", ""), ("sealed", &value)], &cookie).await;
        assert_eq!(answer.location(), Some(format!("/secrets/sets/{set}?done=created&key={key}").as_str()), "{}", answer.body);
    }
    let detail = method(&state, &cookie, "secrets.getSecretSet", serde_json::json!({"id": set})).await;
    let member =
        detail["secrets"].as_array().unwrap().iter().find(|s| s["key"] == "SMTP_PASSWORD").unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(current_value(&state, &member).await, PLANTED.as_bytes());
    let page = pages.keep(send(&state, get(&format!("/secrets/sets/{set}"), Some(&cookie))).await);
    assert!(
        page.body.contains(r#"<tr data-secret="SMTP_RELAY""#) && page.body.contains(r#"id="secrets-summary">2 secrets<"#),
        "{}",
        page.body
    );
    // its rotation page leads back to the set
    let rotating = pages.keep(send(&state, get(&format!("/secrets/{member}/rotate"), Some(&cookie))).await);
    assert!(rotating.body.contains(&format!(r#"data-owner="{}""#, escaped(&owner))), "{}", rotating.body);
    assert!(rotating.body.contains(&format!(r#"href="&#x2f;secrets&#x2f;sets&#x2f;{set}""#)), "{}", rotating.body);

    // rename with the revision read
    let update = format!("/secrets/sets/{set}/update");
    let stale =
        pages.keep(submit(&state, &update, &[("expectedRevision", "0"), ("name", "smtp-relay"), ("description", "Typed")], &cookie).await);
    assert_eq!((stale.status, flash_code(&stale.body).as_deref()), (StatusCode::CONFLICT, Some("conflict")), "{}", stale.body);
    assert_eq!((value_of(&stale.body, "set-name"), value_of(&stale.body, "set-edit-revision")), ("smtp-relay".into(), "1".into()));
    let renamed = submit(&state, &update, &[("expectedRevision", "1"), ("name", "smtp-relay"), ("description", "Relay")], &cookie).await;
    assert_eq!(renamed.location(), Some(format!("/secrets/sets/{set}?done=set-updated&name=smtp-relay").as_str()), "{}", renamed.body);

    // the service has its own SMTP_PASSWORD: attached, the set fills in SMTP_RELAY and the conflict is named
    let own = sealed(&state, "secrets.create", &format!("service:{web}"), "SMTP_PASSWORD", PLANTED_ROTATED.as_bytes());
    let answer = submit(&state, &format!("/secrets/services/{web}/create"), &[("key", "SMTP_PASSWORD"), ("sealed", &own)], &cookie).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let service_page = format!("/secrets/services/{web}");
    let page = pages.keep(send(&state, get(&service_page, Some(&cookie))).await);
    assert!(
        page.body.contains(r#"id="attachments-empty""#) && page.body.contains(&format!(r#"<option value="{set}">smtp-relay</option>"#)),
        "{}",
        page.body
    );
    let attach = format!("/secrets/services/{web}/attach");
    let answer = submit(&state, &attach, &[("secretSetId", &set), ("expectedSecretsRevision", "0")], &cookie).await;
    assert_eq!(answer.location(), Some(format!("{service_page}?done=attached&name=smtp-relay").as_str()), "{}", answer.body);
    let stale = pages.keep(submit(&state, &attach, &[("secretSetId", &set), ("expectedSecretsRevision", "0")], &cookie).await);
    assert_eq!(flash_code(&stale.body).as_deref(), Some("conflict"), "{}", stale.body);
    let twice = pages.keep(submit(&state, &attach, &[("secretSetId", &set), ("expectedSecretsRevision", "1")], &cookie).await);
    assert_eq!(flash_code(&twice.body).as_deref(), Some("secret-set-already-attached"), "{}", twice.body);
    let page = pages.keep(send(&state, get(answer.location().unwrap(), Some(&cookie))).await);
    let body = &page.body;
    assert!(body.contains("SecretSet smtp-relay attached") && body.contains(r#"<li data-attached="smtp-relay">"#), "{body}");
    assert!(body.contains(r#"id="secrets-revision">1<"#), "{body}");
    assert!(body.contains(r#"<tr data-resolved="SMTP_PASSWORD" data-environment="production" data-from="service">"#), "{body}");
    assert!(body.contains(r#"<tr data-resolved="SMTP_RELAY" data-environment="production" data-from="smtp-relay">"#), "{body}");
    assert!(body.contains(r#"<li data-conflict="SMTP_PASSWORD" data-environment="production">"#), "{body}");
    assert!(body.contains("shadowing SecretSet <a"), "the shadowed source is named: {body}");

    // detached, attached again, then retired (confirmed by name): detached everywhere at once
    let detach = format!("/secrets/services/{web}/detach");
    let answer = submit(&state, &detach, &[("secretSetId", &set), ("expectedSecretsRevision", "1")], &cookie).await;
    assert_eq!(answer.location(), Some(format!("{service_page}?done=detached&name=smtp-relay").as_str()), "{}", answer.body);
    let again = pages.keep(submit(&state, &detach, &[("secretSetId", &set), ("expectedSecretsRevision", "2")], &cookie).await);
    assert_eq!(flash_code(&again.body).as_deref(), Some("secret-set-not-attached"), "{}", again.body);
    submit(&state, &attach, &[("secretSetId", &set), ("expectedSecretsRevision", "2")], &cookie).await;
    let retire = format!("/secrets/sets/{set}/retire");
    let confirm = pages.keep(send(&state, get(&retire, Some(&cookie))).await);
    assert!(confirm.body.contains(r#"id="retire-form""#) && confirm.body.contains(r#"<span class="mono">web</span>"#), "{}", confirm.body);
    let wrong = pages.keep(submit(&state, &retire, &[("expectedRevision", "2"), ("confirm", "smtp")], &cookie).await);
    assert_eq!(flash_code(&wrong.body).as_deref(), Some("confirmation-mismatch"), "{}", wrong.body);
    let answer = submit(&state, &retire, &[("expectedRevision", "2"), ("confirm", "smtp-relay")], &cookie).await;
    assert_eq!(
        answer.location(),
        Some(format!("/secrets/sets/{set}?done=set-retired&name=smtp-relay&detached=1").as_str()),
        "{}",
        answer.body
    );
    let page = pages.keep(send(&state, get(answer.location().unwrap(), Some(&cookie))).await);
    assert!(page.body.contains("It was detached from 1 service") && page.body.contains(r#"id="set-retired""#), "{}", page.body);
    assert!(!page.body.contains(r#"id="secret-create-form""#) && !page.body.contains(r#"id="set-edit-form""#), "{}", page.body);
    let page = pages.keep(send(&state, get(&service_page, Some(&cookie))).await);
    assert!(page.body.contains(r#"id="attachments-empty""#) && !page.body.contains(r#"id="attach-form""#), "{}", page.body);
    let retired = pages.keep(submit(&state, &attach, &[("secretSetId", &set), ("expectedSecretsRevision", "4")], &cookie).await);
    assert_eq!(flash_code(&retired.body).as_deref(), Some("secret-set-retired"), "{}", retired.body);
    let value = sealed(&state, "secrets.create", &owner, "LATE", PLANTED.as_bytes());
    let late = pages.keep(submit(&state, &add, &[("key", "LATE"), ("sealed", &value)], &cookie).await);
    assert_eq!(flash_code(&late.body).as_deref(), Some("secret-set-retired"), "{}", late.body);
    let index = pages.keep(send(&state, get(&format!("/secrets?org={org}"), Some(&cookie))).await);
    assert!(index.body.contains(r#"<tr data-set="smtp-relay" data-state="retired">"#), "{}", index.body);
    pages.assert_value_free();
}

// ---------------------------------------------------------------------------------------
// The App Store view

/// The catalog publisher the App Store tests trust.
fn catalog_key() -> capstan_catalog::SigningKey {
    capstan_catalog::SigningKey::from_bytes(&[42; 32])
}

/// A signed catalog with the app `wiki` in `versions` (`(version, withdrawal reason)`).
fn wiki_envelope(versions: &[(&str, Option<&str>)], revision: u64, key: &capstan_catalog::SigningKey) -> String {
    let versions: Vec<serde_json::Value> = versions
        .iter()
        .map(|(v, withdrawn)| {
            let mut version = serde_json::json!({
                "version": v,
                "notes": format!("release {v}"),
                "template": {
                    "image": format!("registry.example.com/wiki:{v}"),
                    "ports": [{ "port": 8080, "protocol": "http" }],
                    "environment": { "WIKI_VERSION": v },
                    "volumes": [{ "name": "data", "mountPath": "/var/lib/wiki" }]
                }
            });
            if let Some(reason) = withdrawn {
                version["withdrawn"] = serde_json::json!({ "reason": reason });
            }
            version
        })
        .collect();
    let catalog: capstan_catalog::Catalog = serde_json::from_value(serde_json::json!({
        "apps": [{ "id": "wiki", "name": "Wiki", "description": "A small wiki.", "categories": ["docs"], "versions": versions }]
    }))
    .unwrap();
    capstan_catalog::sign(&catalog, revision, key).unwrap().to_json()
}

/// The `_done`/`_answer` redirect of a plugin form, without its answer token.
fn done_location(answer: &Answer) -> String {
    let location = answer.location().unwrap_or_else(|| panic!("a form that answered redirects: {}", answer.body));
    match location.find("&_answer=answer_") {
        Some(at) => location[..at].to_string(),
        None => panic!("the redirect carries the kept answer: {location}"),
    }
}

#[tokio::test]
async fn the_app_store_pages_need_a_session_and_say_when_the_plugin_is_not_loaded() {
    let (_dir, state) = setup().await;
    for path in ["/p/appstore", "/p/appstore/app?appId=wiki", "/p/appstore/upgrade?serviceId=x"] {
        let anonymous = send(&state, get(path, None)).await;
        assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
        anonymous.assert_security_headers(path);
    }
    for path in ["/p/appstore/-/call/refreshCatalog", "/p/appstore/-/call/importCatalog", "/p/appstore/-/call/install"] {
        let answer = send(&state, post_form(path, "_page=&envelope=x", None, Some(ORIGIN))).await;
        assert_eq!((answer.status, answer.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
        let foreign = send(&state, post_form(path, "_page=&envelope=x", None, Some("https://evil.example"))).await;
        assert_eq!(foreign.status, StatusCode::FORBIDDEN, "{path}");
    }
    // the old address leads to the plugin's pages
    let cookie = login_cookie(&state).await;
    let old = send(&state, get("/appstore", Some(&cookie))).await;
    assert_eq!((old.status, old.location()), (StatusCode::PERMANENT_REDIRECT, Some("/p/appstore")));

    // the embedded App Store is installed in the background at start: until it is, its pages say so
    let page = send(&state, get("/p/appstore", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE, "retryable, never an internal error: {}", page.body);
    page.assert_security_headers("/p/appstore");
    assert!(page.body.contains("plugin-not-loaded") && page.body.contains("Reload this page"), "{}", page.body);
    let answer = submit(&state, "/p/appstore/-/call/importCatalog", &[("_page", ""), ("envelope", "{}")], &cookie).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{}", answer.body);
    assert!(answer.body.contains("plugin-not-loaded"), "{}", answer.body);
    let home = send(&state, get("/", Some(&cookie))).await;
    assert!(!home.body.contains("/p/appstore"), "the rail lists only pages of loaded plugins: {}", home.body);
}

#[tokio::test]
async fn the_app_store_imports_a_catalog_installs_and_upgrades_through_its_plugin_pages() {
    let (_dir, state) = setup().await;
    let plugins = state.plugins.clone();
    plugins.install_first_party().await.unwrap();
    assert!(plugins.get("appstore").is_some(), "the embedded App Store is loaded: {:?}", plugins.load_error("appstore"));
    let cookie = login_cookie(&state).await;
    let import = "/p/appstore/-/call/importCatalog";

    // no catalog yet: the status says why, nothing is offered
    let page = send(&state, get("/p/appstore", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    assert!(body.contains("<title>App Store · Capstan</title>"), "{body}");
    assert!(body.contains(r#"href="&#x2f;p&#x2f;appstore" aria-current="page""#), "the rail links the page: {body}");
    assert!(body.contains(r#"href="&#x2f;p&#x2f;appstore&#x2f;upgrades""#), "and the upgrades page: {body}");
    assert!(!body.contains(r#"href="&#x2f;p&#x2f;appstore&#x2f;app""#), "never a detail page: {body}");
    assert!(body.contains(r#"id="plugin-page" data-plugin="appstore" data-templated="true""#), "{body}");
    assert!(body.contains(r#"id="catalog-status" data-available="false""#), "{body}");
    assert!(body.contains(r#"id="catalog-unavailable" data-code="catalog-not-loaded""#), "{body}");
    assert!(body.contains(r#"id="apps-empty""#) && body.contains(r#"id="catalog-import-form""#), "{body}");
    assert!(body.contains(r#"id="catalog-refresh""#), "{body}");
    assert!(!body.contains("<script>") && !body.contains("style="), "{body}");
    let missing = send(&state, get("/p/appstore/app?appId=wiki", Some(&cookie))).await;
    assert_eq!(missing.status, StatusCode::SERVICE_UNAVAILABLE, "{}", missing.body);
    assert!(missing.body.contains(r#"id="page-error" data-code="appstore-catalog-unavailable""#), "{}", missing.body);

    // bad imports are refused by the catalog's own code, nothing activates, the text is kept
    let publisher = catalog_key();
    let first = wiki_envelope(&[("0.9.0", Some("data loss on upgrade")), ("1.0.0", None)], 1, &publisher);
    for (envelope, code) in
        [(first.as_str(), "catalog-key-untrusted"), ("{\"not\": \"an envelope\"}", "catalog-malformed"), ("", "invalid-request")]
    {
        let answer = submit(&state, import, &[("_page", ""), ("envelope", envelope)], &cookie).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{code}: {}", answer.body);
        assert_eq!(flash_code(&answer.body).as_deref(), Some(code), "{}", answer.body);
        assert!(answer.body.contains(r#"data-available="false""#), "{}", answer.body);
    }
    let answer = submit(&state, import, &[("_page", ""), ("envelope", "{\"not\": 1}")], &cookie).await;
    assert!(answer.body.contains("{&quot;not&quot;: 1}</textarea>"), "what was pasted is kept: {}", answer.body);
    let settings = method(&state, &cookie, "settings.get", serde_json::json!({})).await;
    let trusted = capstan_catalog::PublisherKey::from(&publisher).to_string();
    method(
        &state,
        &cookie,
        "settings.update",
        serde_json::json!({ "expectedRevision": settings["revision"], "set": { "appstore.trustedCatalogKeys": [trusted] } }),
    )
    .await;
    // the plugin's settings are a group of their own in the Settings view
    let page = send(&state, get("/settings", Some(&cookie))).await;
    assert!(page.body.contains(r#"<tbody data-group="appstore">"#), "{}", page.body);
    assert!(page.body.contains(r#"<tr data-setting="appstore.trustedCatalogKeys" data-set="true">"#), "{}", page.body);
    assert!(page.body.contains(r#"placeholder="default: []""#), "an unset plugin setting shows its default: {}", page.body);
    // the keys carried over from the earlier platform are folded away, closed while none is set
    let carried =
        page.body.split(r#"<details class="settings-carried" id="settings-carried">"#).nth(1).unwrap_or_else(|| panic!("{}", page.body));
    assert!(carried.contains(r#"<tr data-setting="corebuildWorkerUrl""#), "{}", page.body);
    assert!(!page.body.split("settings-carried").next().unwrap().contains(r#"data-setting="corebuildWorkerUrl""#), "not in the main table");

    // a trusted catalog activates; its apps are listed
    let answer = submit(&state, import, &[("_page", ""), ("envelope", &first)], &cookie).await;
    assert_eq!(done_location(&answer), "/p/appstore?_done=importCatalog", "{}", answer.body);
    let page = send(&state, get(answer.location().unwrap(), Some(&cookie))).await;
    let body = &page.body;
    assert!(body.contains("Catalog revision 1 activated"), "{body}");
    assert!(body.contains(r#"data-available="true""#) && body.contains(r#"id="catalog-revision">1<"#), "{body}");
    assert!(body.contains(&format!(r#"id="catalog-signer">{}<"#, escaped(&trusted))), "{body}");
    assert!(body.contains(r#"<tr data-app="wiki">"#) && body.contains(r#"data-latest="1.0.0""#), "{body}");
    assert!(body.contains("A small wiki.") && body.contains("1 offered, 1 withdrawn"), "{body}");
    let again = submit(&state, import, &[("_page", ""), ("envelope", &first)], &cookie).await;
    let page = send(&state, get(again.location().unwrap(), Some(&cookie))).await;
    assert!(page.body.contains("Catalog revision 1 is already active"), "{}", page.body);
    // an answer is shown only to the person whose form it was
    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let peeked = send(&state, get(again.location().unwrap(), Some(&operator))).await;
    assert!(!peeked.body.contains("is already active"), "{}", peeked.body);
    // no sources to ask: the refresh says so, the catalog stays
    let refreshed = submit(&state, "/p/appstore/-/call/refreshCatalog", &[("_page", "")], &cookie).await;
    assert_eq!(done_location(&refreshed), "/p/appstore?_done=refreshCatalog", "{}", refreshed.body);
    let page = send(&state, get(refreshed.location().unwrap(), Some(&cookie))).await;
    assert!(
        page.body.contains("No catalog sources to ask") && page.body.contains(r#"id="catalog-last-outcome">no-sources<"#),
        "{}",
        page.body
    );
    let older = wiki_envelope(&[("1.0.0", None)], 1, &publisher);
    let older = submit(&state, import, &[("_page", ""), ("envelope", &older)], &cookie).await;
    assert_eq!(flash_code(&older.body).as_deref(), Some("catalog-revision-not-newer"), "{}", older.body);

    // the app's page: its versions, the withdrawn one marked, and the install form
    let org =
        method(&state, &cookie, "organizations.create", serde_json::json!({ "name": "acme" })).await["id"].as_str().unwrap().to_string();
    let app_page = format!("/p/appstore/app?appId=wiki&organizationId={org}");
    let app = send(&state, get(&app_page, Some(&cookie))).await;
    assert_eq!(app.status, StatusCode::OK, "{}", app.body);
    let body = &app.body;
    assert!(body.contains("<title>App Wiki · Capstan</title>"), "the title names the app: {body}");
    assert!(body.contains(r#"href="&#x2f;p&#x2f;appstore" aria-current="page""#), "a detail page marks its plugin's first: {body}");
    assert!(body.contains(r#"<li data-version="1.0.0" data-withdrawn="false">"#), "{body}");
    assert!(body.contains(r#"<li data-version="0.9.0" data-withdrawn="true">"#) && body.contains("data loss on upgrade"), "{body}");
    assert!(body.contains(r#"id="app-version" data-version="1.0.0""#) && body.contains("registry.example.com&#x2f;wiki:1.0.0"), "{body}");
    assert!(body.contains(&format!(r#"<option value="{org}" selected>acme</option>"#)), "{body}");
    assert!(
        body.contains(r#"<option value="1.0.0" selected>1.0.0 (latest)</option>"#) && !body.contains(r#"<option value="0.9.0""#),
        "{body}"
    );
    let withdrawn = send(&state, get("/p/appstore/app?appId=wiki&version=0.9.0", Some(&cookie))).await;
    assert!(withdrawn.body.contains(r#"id="version-withdrawn""#), "{}", withdrawn.body);

    // refusals keep what was typed and show the plugin's code
    let install = "/p/appstore/-/call/install";
    let back = format!("appId=wiki&organizationId={org}");
    let fields = |org: &str, name: &str, version: &str| {
        vec![
            ("_page", "app".to_string()),
            ("_return", back.clone()),
            ("appId", "wiki".to_string()),
            ("organizationId", org.to_string()),
            ("name", name.to_string()),
            ("version", version.to_string()),
        ]
    };
    let answer = submit(&state, install, &as_refs(&fields(&org, "Team Wiki", "1.0.0")), &cookie).await;
    assert_eq!(flash_code(&answer.body).as_deref(), Some("name-invalid"), "{}", answer.body);
    assert_eq!(value_of(&answer.body, "install-name"), "Team Wiki");
    let answer = submit(&state, install, &as_refs(&fields(&org, "old-wiki", "0.9.0")), &cookie).await;
    assert_eq!(flash_code(&answer.body).as_deref(), Some("appstore-version-withdrawn"), "{}", answer.body);
    let answer = submit(&state, install, &as_refs(&fields("org_nope", "wiki", "1.0.0")), &cookie).await;
    assert!(flash_code(&answer.body).is_some_and(|c| c.ends_with("not-found")), "{}", answer.body);

    // installed: a service in the organization with the version's snapshot
    let mut scaled = fields(&org, "team-wiki", "1.0.0");
    scaled.push(("scale", "2".into()));
    let answer = submit(&state, install, &as_refs(&scaled), &cookie).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_eq!(done_location(&answer), format!("/p/appstore/app?{back}&_done=install"));
    let page = send(&state, get(answer.location().unwrap(), Some(&cookie))).await;
    assert!(page.body.contains("App wiki installed as team-wiki"), "{}", page.body);
    let listed = method(&state, &cookie, "services.list", serde_json::json!({ "organizationId": org })).await;
    let service = &listed["items"][0];
    let service_id = service["id"].as_str().unwrap().to_string();
    assert!(page.body.contains(&format!(r#"href="/services/{service_id}" id="installed-service""#)), "{}", page.body);
    assert_eq!(
        (service["name"].as_str(), service["image"].as_str(), service["scale"].as_u64()),
        (Some("team-wiki"), Some("registry.example.com/wiki:1.0.0"), Some(2))
    );
    assert_eq!(service["template"]["version"], "1.0.0");

    // the upgrades page asks for an organization, then lists what has a newer version
    let page = send(&state, get("/p/appstore/upgrades", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"id="organization-picker""#) && page.body.contains("Choose an organization"), "{}", page.body);
    let upgrades = format!("/p/appstore/upgrades?organizationId={org}");
    let page = send(&state, get(&upgrades, Some(&cookie))).await;
    assert!(page.body.contains(r#"id="upgradeable-empty""#) && page.body.contains("up to date"), "{}", page.body);

    // a newer revision offers an upgrade: previewed, then written against the revision read
    let second = wiki_envelope(&[("0.9.0", Some("data loss on upgrade")), ("1.0.0", None), ("1.1.0", None)], 2, &publisher);
    let answer = submit(&state, import, &[("_page", ""), ("envelope", &second)], &cookie).await;
    let page = send(&state, get(answer.location().unwrap(), Some(&cookie))).await;
    assert!(page.body.contains("Catalog revision 2 activated"), "{}", page.body);
    let page = send(&state, get(&upgrades, Some(&cookie))).await;
    assert!(page.body.contains(r#"<tr data-service="team-wiki" data-current="1.0.0">"#), "{}", page.body);
    let preview_href = format!("/p/appstore/upgrade?organizationId={org}&serviceId={service_id}&version=1.1.0");
    assert!(page.body.contains(&preview_href.replace('&', "&amp;")), "{}", page.body);
    let preview = send(&state, get(&preview_href, Some(&cookie))).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    let body = &preview.body;
    assert!(body.contains("<title>Upgrade team-wiki · Capstan</title>"), "{body}");
    assert!(body.contains(r#"id="upgrade-preview" data-from="1.0.0" data-to="1.1.0""#), "{body}");
    assert!(body.contains("registry.example.com&#x2f;wiki:1.0.0") && body.contains("registry.example.com&#x2f;wiki:1.1.0"), "{body}");
    assert!(body.contains(r#"id="preview-env-changed"><span class="chips"><span class="chip mono">WIKI_VERSION</span>"#), "{body}");
    assert!(body.contains("1.1.0: release 1.1.0"), "the release notes: {body}");
    let revision = value_of(body, "upgrade-revision");
    assert_eq!(revision, service["revision"].as_u64().unwrap().to_string());
    let upgrade = |revision: String| {
        vec![
            ("_page", "upgrade".to_string()),
            ("_return", format!("organizationId={org}&serviceId={service_id}&version=1.1.0")),
            ("_next", "upgrades".to_string()),
            ("organizationId", org.clone()),
            ("serviceId", service_id.clone()),
            ("version", "1.1.0".to_string()),
            ("expectedRevision", revision),
        ]
    };
    let stale = submit(&state, "/p/appstore/-/call/upgrade", &as_refs(&upgrade("99".into())), &cookie).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert_eq!(flash_code(&stale.body).as_deref(), Some("conflict"), "{}", stale.body);
    assert!(stale.body.contains(r#"id="upgrade-form""#), "the preview is shown again: {}", stale.body);
    let answer = submit(&state, "/p/appstore/-/call/upgrade", &as_refs(&upgrade(revision)), &cookie).await;
    assert_eq!(
        done_location(&answer),
        format!("/p/appstore/upgrades?organizationId={org}&serviceId={service_id}&version=1.1.0&_done=upgrade"),
        "{}",
        answer.body
    );
    let page = send(&state, get(answer.location().unwrap(), Some(&cookie))).await;
    assert!(page.body.contains("Service team-wiki upgraded to 1.1.0"), "{}", page.body);
    assert!(page.body.contains(r#"id="upgradeable-empty""#), "{}", page.body);
    let upgraded = method(&state, &cookie, "services.get", serde_json::json!({ "id": service_id })).await;
    assert_eq!(
        (upgraded["image"].as_str(), upgraded["template"]["version"].as_str(), upgraded["environment"]["WIKI_VERSION"].as_str()),
        (Some("registry.example.com/wiki:1.1.0"), Some("1.1.0"), Some("1.1.0"))
    );
    let done = send(&state, get(&format!("/p/appstore/upgrade?organizationId={org}&serviceId={service_id}"), Some(&cookie))).await;
    assert!(done.body.contains(r#"id="page-error" data-code="appstore-up-to-date""#), "{}", done.body);
    let unknown = send(&state, get("/p/appstore/app?appId=nope", Some(&cookie))).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body.contains(r#"id="page-error" data-code="appstore-app-not-found""#), "{}", unknown.body);

    // an operator sees the catalog and the apps, and the plugin's own refusal where it refuses
    let page = send(&state, get("/p/appstore", Some(&operator))).await;
    assert!(page.body.contains(r#"<tr data-app="wiki">"#) && !page.body.contains(r#"id="catalog-import-form""#), "{}", page.body);
    let answer = submit(&state, import, &[("_page", ""), ("envelope", &second)], &operator).await;
    assert_eq!((answer.status, flash_code(&answer.body).as_deref()), (StatusCode::FORBIDDEN, Some("forbidden")), "{}", answer.body);
    let answer = submit(&state, install, &as_refs(&fields(&org, "sneaky", "1.1.0")), &operator).await;
    assert_eq!(flash_code(&answer.body).as_deref(), Some("forbidden"), "{}", answer.body);
}

#[test]
fn the_create_secret_form_renders_and_says_when_values_cannot_be_sealed() {
    use minijinja::value::Serde;
    let source = r#"{% from "secrets_value.html" import create_form %}{{ create_form(seal, seal_error, "/secrets/x", typed, "SMTP_PASSWORD", "Seal and add") }}"#;
    let with = |seal: serde_json::Value, seal_error: serde_json::Value| {
        let typed = serde_json::json!({"key": "API_KEY", "environment": ""});
        let ctx = minijinja::context! { seal => Serde(seal), seal_error => Serde(seal_error), typed => Serde(typed) };
        super::TEMPLATE_ENV.render_str(source, ctx).unwrap_or_else(|e| panic!("{e:#}"))
    };
    let page = with(
        serde_json::json!({"recipient_id": "r1", "public_key": "AAAA", "method": "secrets.create", "owner": "service:s1"}),
        serde_json::Value::Null,
    );
    assert!(page.contains(r#"action="/secrets/x/create""#) && page.contains("e.g. SMTP_PASSWORD"), "{page}");
    assert!(page.contains(r#"value="API_KEY""#) && page.contains(">Seal and add</button>"), "{page}");
    let page = with(serde_json::Value::Null, serde_json::json!({"code": "keyring-unavailable", "message": "no recipient"}));
    assert!(page.contains(r#"id="seal-unavailable" data-code="keyring-unavailable""#), "{page}");
    assert!(!page.contains(r#"id="secret-create-form""#), "{page}");
}

// ---------------------------------------------------------------------------------------
// Nodes

/// An agent's request to `path` (`/agent/v1/…`), with its bearer when it has one.
fn agent_request(path: &str, body: serde_json::Value, token: Option<&str>) -> Request {
    let mut builder = Request::builder().method("POST").uri(path).header("host", "capstan.test").header("content-type", "application/json");
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

#[tokio::test]
async fn a_cluster_s_nodes_are_added_watched_renamed_revoked_retired_and_deleted_from_the_dashboard() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    // dev mode renders a jump script for its http origin
    let state = crate::state::test_state_at(dir.path(), ORIGIN, true).await;
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
    capstan_server::migrate::run(&state.store, &state.chain, &capstan_server::migrate::LockOptions::for_this_process()).await.unwrap();
    let cookie = login_cookie(&state).await;
    let cluster = method(&state, &cookie, "clusters.create", serde_json::json!({ "name": "edge" })).await;
    let cluster_id = cluster["cluster"]["id"].as_str().or(cluster["id"].as_str()).unwrap().to_string();
    let nodes = format!("/clusters/{cluster_id}/nodes");
    for path in [nodes.as_str(), "/nodes/x", "/nodes/x/retire"] {
        let anonymous = send(&state, get(path, None)).await;
        assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")), "{path}");
    }
    let detail = send(&state, get(&format!("/clusters/{cluster_id}"), Some(&cookie))).await;
    assert!(detail.body.contains(&format!(r#"href="&#x2f;clusters&#x2f;{cluster_id}/nodes" id="cluster-nodes""#)), "{}", detail.body);

    // no node yet; a jump command is shown once, with its copy button
    let page = send(&state, get(&nodes, Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"id="nodes-empty""#) && page.body.contains(r#"id="jump-form""#), "{}", page.body);
    let refused = submit(&state, &format!("{nodes}/jump"), &[("nodeName", "Edge 1")], &cookie).await;
    assert_eq!(flash_code(&refused.body).as_deref(), Some("name-invalid"), "{}", refused.body);
    assert_eq!(value_of(&refused.body, "jump-name"), "Edge 1");
    let jumped =
        submit(&state, &format!("{nodes}/jump"), &[("nodeName", "edge-1"), ("setHostname", "true"), ("ttlMinutes", "15")], &cookie).await;
    assert_eq!(jumped.status, StatusCode::OK, "{}", jumped.body);
    let command = value_of(&jumped.body, "jump-command");
    assert!(command.starts_with("curl -fsSL 'http://capstan.test/jump/") && command.ends_with("' | sudo bash"), "{command}");
    assert!(jumped.body.contains(r#"data-copy="jump-command""#) && jumped.body.contains("copy.js"), "{}", jumped.body);
    let code = command.trim_start_matches("curl -fsSL 'http://capstan.test/jump/").split('\'').next().unwrap().to_string();
    // a browser opening the command's URL gets the dashboard's look; a dead code is a page, not JSON
    let landing = send(&state, get(&format!("/jump/{code}"), None)).await;
    assert_eq!(landing.status, StatusCode::OK, "{}", landing.body);
    assert!(
        landing.body.contains("Join the cluster") && landing.body.contains("/static/") && landing.body.contains(r#"id="jump-command""#),
        "{}",
        landing.body
    );
    assert_eq!((landing.header("referrer-policy"), landing.header("cache-control")), (Some("no-referrer"), Some("no-store")));
    let dead = send(&state, get("/jump/AAAAAAAAAAAAAAAA", None)).await;
    assert_eq!(dead.status, StatusCode::NOT_FOUND);
    assert!(dead.body.contains("This jump command no longer works") && dead.body.contains("jump-code-invalid"), "{}", dead.body);

    // a machine enrolls and beats: the table shows it live, renamed as the code asked
    let token = "ab".repeat(32);
    let token_sha = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    let enroll = serde_json::json!({ "protocol": "capstan-agent/1", "code": code, "hostname": "debian", "tokenSha256": token_sha, "agentVersion": "0.1.0" });
    let enrolled = send(&state, agent_request("/agent/v1/enroll", enroll, None)).await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.body);
    let node_id = serde_json::from_str::<serde_json::Value>(&enrolled.body).unwrap()["nodeId"].as_str().unwrap().to_string();
    let report = serde_json::json!({
        "hostname": "worker-edge-1", "os": "Debian GNU/Linux 13", "kernel": "6.12.0", "arch": "x86_64", "cpus": 4,
        "memoryBytes": 8_589_934_592u64, "diskBytes": 107_374_182_400u64, "diskFreeBytes": 53_687_091_200u64,
        "agentVersion": "0.1.0", "uptimeSeconds": 7200, "addresses": ["192.0.2.10"]
    });
    let beat = serde_json::json!({ "protocol": "capstan-agent/1", "nodeId": node_id, "report": report });
    let accepted = send(&state, agent_request("/agent/v1/heartbeat", beat.clone(), Some(&token))).await;
    assert_eq!(accepted.status, StatusCode::OK, "{}", accepted.body);
    let panel = send(&state, get(&format!("{nodes}/panel"), Some(&cookie))).await;
    assert!(panel.body.contains(&format!(r#"<tr data-node="{node_id}" data-liveness="live">"#)), "{}", panel.body);
    assert!(panel.body.contains(">worker-edge-1</a>") && panel.body.contains("1 of 1 live"), "{}", panel.body);
    assert!(panel.body.contains(r#"hx-trigger="every 10s""#), "{}", panel.body);

    // its page: the report, the credential; a new hostname intent is pending until reported
    let node = format!("/nodes/{node_id}");
    let page = send(&state, get(&node, Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("<title>Node worker-edge-1 · Capstan</title>"), "{}", page.body);
    assert!(page.body.contains("Debian GNU&#x2f;Linux 13") && page.body.contains("8.0 GiB"), "{}", page.body);
    assert!(page.body.contains(r#"id="credential-generation">1<"#), "{}", page.body);
    let renamed = submit(&state, &format!("{node}/hostname"), &[("expectedGeneration", "0"), ("hostname", "edge-one")], &cookie).await;
    assert_eq!(renamed.location(), Some(format!("{node}?done=hostname").as_str()), "{}", renamed.body);
    let page = send(&state, get(renamed.location().unwrap(), Some(&cookie))).await;
    assert!(
        page.body.contains("Hostname intent stored") && page.body.contains(r#"pill-warn">pending</span> <span class="mono">edge-one"#),
        "{}",
        page.body
    );
    let stale = submit(&state, &format!("{node}/hostname"), &[("expectedGeneration", "0"), ("hostname", "edge-two")], &cookie).await;
    assert_eq!(flash_code(&stale.body).as_deref(), Some("conflict"), "{}", stale.body);
    let bad = submit(&state, &format!("{node}/rotate"), &[("expectedGeneration", "1"), ("tokenSha256", "nope")], &cookie).await;
    assert_eq!(flash_code(&bad.body).as_deref(), Some("invalid-request"), "{}", bad.body);

    // revoke, confirmed: beats are refused by name
    let confirm = send(&state, get(&format!("{node}/revoke"), Some(&cookie))).await;
    assert!(
        confirm.body.contains(r#"id="confirm-form""#) && confirm.body.contains(r#"name="expectedGeneration" value="1""#),
        "{}",
        confirm.body
    );
    let revoked = submit(&state, &format!("{node}/revoke"), &[("expectedGeneration", "1"), ("expectedRevision", "0")], &cookie).await;
    assert_eq!(revoked.location(), Some(format!("{node}?done=revoked").as_str()), "{}", revoked.body);
    let refused = send(&state, agent_request("/agent/v1/heartbeat", beat, Some(&token))).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);
    assert!(refused.body.contains("node-unauthorized") && !refused.body.contains(&token), "{}", refused.body);

    // retire, then delete, each confirmed against the revision read
    let confirm = send(&state, get(&format!("{node}/retire"), Some(&cookie))).await;
    assert!(confirm.body.contains("Retire worker-edge-1?"), "{}", confirm.body);
    let read = method(&state, &cookie, "nodes.get", serde_json::json!({ "id": node_id })).await;
    let stale = submit(&state, &format!("{node}/retire"), &[("expectedRevision", "999")], &cookie).await;
    assert_eq!(flash_code(&stale.body).as_deref(), Some("conflict"), "{}", stale.body);
    let retired = submit(&state, &format!("{node}/retire"), &[("expectedRevision", &read["revision"].to_string())], &cookie).await;
    assert_eq!(retired.location(), Some(format!("{node}?done=retired").as_str()), "{}", retired.body);
    let page = send(&state, get(&node, Some(&cookie))).await;
    assert!(page.body.contains(r#"id="node-state">retired<"#) && page.body.contains(r#"id="node-delete""#), "{}", page.body);
    let read = method(&state, &cookie, "nodes.get", serde_json::json!({ "id": node_id })).await;
    let deleted = submit(&state, &format!("{node}/delete"), &[("expectedRevision", &read["revision"].to_string())], &cookie).await;
    assert_eq!(deleted.location(), Some(format!("{nodes}?done=deleted").as_str()), "{}", deleted.body);
    let page = send(&state, get(deleted.location().unwrap(), Some(&cookie))).await;
    assert!(page.body.contains("Node deleted") && page.body.contains(r#"id="nodes-empty""#), "{}", page.body);
    let gone = send(&state, get(&node, Some(&cookie))).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
    assert!(gone.body.contains(r#"id="node-error" data-code="node-missing""#), "{}", gone.body);
    assert_eq!(send(&state, get(&format!("{node}/nonsense"), Some(&cookie))).await.status, StatusCode::NOT_FOUND);
}

/// The section of `body` from the element with `id` to the end of its `<section>`.
fn section_of<'a>(body: &'a str, id: &str) -> &'a str {
    let at = body.find(&format!(r#"id="{id}""#)).unwrap_or_else(|| panic!("no element #{id}: {body}"));
    let start = body[..at].rfind("<section").unwrap();
    &body[start..at + body[at..].find("</section>").unwrap()]
}

#[tokio::test]
async fn a_service_is_run_held_and_resumed_from_its_page_and_its_slots_show_on_the_cluster_and_node_pages() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    // dev mode renders a jump command for its http origin
    let state = crate::state::test_state_at(dir.path(), ORIGIN, true).await;
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
    capstan_server::migrate::run(&state.store, &state.chain, &capstan_server::migrate::LockOptions::for_this_process()).await.unwrap();
    let cookie = login_cookie(&state).await;
    use serde_json::json;
    let org = method(&state, &cookie, "organizations.create", json!({ "name": "acme" })).await["id"].as_str().unwrap().to_string();
    let cluster = method(&state, &cookie, "clusters.create", json!({ "name": "eu-1" })).await;
    let cluster_id = cluster["cluster"]["id"].as_str().unwrap().to_string();
    let image = format!("reg.example/x@sha256:{}", "ab".repeat(32));
    let service = method(
        &state,
        &cookie,
        "services.create",
        json!({ "organizationId": org, "name": "web", "image": image, "ports": [{ "port": 8080, "protocol": "http" }] }),
    )
    .await;
    let service_id = service["id"].as_str().unwrap().to_string();
    // a node enrolls and beats: live
    let jump = method(&state, &cookie, "nodes.createJumpCommand", json!({ "clusterId": cluster_id, "nodeName": "alpha" })).await;
    let code = jump["url"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
    let token = "cd".repeat(32);
    let enroll = json!({ "protocol": "capstan-agent/1", "code": code, "hostname": "debian", "tokenSha256": hex::encode(sha2::Sha256::digest(token.as_bytes())), "agentVersion": "0.1.0" });
    let enrolled = send(&state, agent_request("/agent/v1/enroll", enroll, None)).await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.body);
    let node_id = serde_json::from_str::<serde_json::Value>(&enrolled.body).unwrap()["nodeId"].as_str().unwrap().to_string();
    let report = json!({ "hostname": "worker-alpha", "os": "Debian GNU/Linux 13", "kernel": "6.12.0", "arch": "x86_64", "cpus": 2,
        "memoryBytes": 1u64 << 31, "diskBytes": 1u64 << 34, "diskFreeBytes": 1u64 << 33, "agentVersion": "0.1.0", "uptimeSeconds": 60, "addresses": [] });
    let beat = json!({ "protocol": "capstan-agent/1", "nodeId": node_id, "report": report });
    assert_eq!(send(&state, agent_request("/agent/v1/heartbeat", beat, Some(&token))).await.status, StatusCode::OK);

    // the page: runs nowhere yet; the form picks the cluster by name and the node, and never shows a revision
    let page_path = format!("/services/{service_id}");
    let page = send(&state, get(&page_path, Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"data-areas="service,organization,runtime""#), "the page watches the runtime: {}", page.body);
    let card = section_of(&page.body, "runtime-panel");
    assert!(card.contains(r#"id="runtime-empty""#) && card.contains(r#"hx-trigger="capstan-changed from:body""#), "{card}");
    let run_form = section_of(&page.body, "runtime-run-form");
    assert!(run_form.contains(&format!(r#"<option value="{cluster_id}">eu-1</option>"#)), "{run_form}");
    assert!(run_form.contains(&format!(r#"name="node" value="{node_id}""#)) && run_form.contains(">alpha<"), "{run_form}");
    assert!(!run_form.contains("expectedRevision"), "{run_form}");

    let run_path = format!("/services/{service_id}/runtime/run");
    let every = [
        ("cluster", cluster_id.as_str()),
        ("placement", "every"),
        ("replicasPerNode", "1"),
        ("restart", "on-failure"),
        ("healthKind", "http"),
        ("healthPort", "8080"),
        ("healthPath", "/up"),
    ];
    // a port the service does not declare: the method's refusal, the form as typed
    let mut undeclared = every;
    undeclared[5] = ("healthPort", "9999");
    let refused = submit(&state, &run_path, &undeclared, &cookie).await;
    assert_eq!(flash_code(&refused.body).as_deref(), Some("health-port-undeclared"), "{}", refused.body);
    assert_eq!(value_of(&refused.body, "run-health-port"), "9999");
    let answer = submit(&state, &run_path, &every, &cookie).await;
    assert_eq!(answer.location(), Some(format!("{page_path}?done=runtime-run").as_str()), "{}", answer.body);
    let spec = method(&state, &cookie, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id })).await;
    assert_eq!(spec["items"][0]["revision"], 1);
    assert_eq!(spec["items"][0]["placement"], json!({ "everyNode": true }));
    assert_eq!((spec["items"][0]["health"]["kind"].as_str(), spec["items"][0]["health"]["path"].as_str()), (Some("http"), Some("/up")));

    // a second run replaces it against the revision read when sent; "chosen nodes" names at least one
    let none_chosen = submit(&state, &run_path, &[("cluster", &cluster_id), ("placement", "nodes")], &cookie).await;
    assert_eq!(flash_code(&none_chosen.body).as_deref(), Some("invalid-request"), "{}", none_chosen.body);
    let chosen = [
        ("cluster", cluster_id.as_str()),
        ("placement", "nodes"),
        ("node", node_id.as_str()),
        ("replicasPerNode", "2"),
        ("healthKind", "none"),
    ];
    let answer = submit(&state, &run_path, &chosen, &cookie).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let spec =
        &method(&state, &cookie, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id })).await["items"][0];
    assert_eq!((spec["revision"].as_u64(), spec["replicasPerNode"].as_u64()), (Some(2), Some(2)));
    assert_eq!(spec["placement"], json!({ "nodes": [node_id] }));
    let unknown = submit(&state, &run_path, &[("cluster", "cluster_nosuch"), ("placement", "every")], &cookie).await;
    assert_eq!(flash_code(&unknown.body).as_deref(), Some("cluster-not-found"), "{}", unknown.body);

    // before the runtime decided: the card says so; after a pass: a verdict in words and the slots
    let page = send(&state, get(&format!("{page_path}?done=runtime-run"), Some(&cookie))).await;
    assert!(page.body.contains("Runtime spec written"), "{}", page.body);
    let card = section_of(&page.body, "runtime-panel");
    assert!(
        card.contains(&format!(r#"data-cluster="{cluster_id}" data-verdict="""#)) && card.contains("Waiting for the runtime to decide"),
        "{card}"
    );
    assert!(card.contains("node alpha, 2 replicas per node, restart on-failure, no health check"), "{card}");
    assert!(card.contains(&format!(r#"id="runtime-stop-{cluster_id}""#)), "{card}");
    let run_form = section_of(&page.body, "runtime-run-form");
    assert!(
        run_form.contains(&format!(r#"name="node" value="{node_id}" checked"#))
            && run_form.contains(r#"value="nodes" id="run-chosen" checked"#),
        "the form reads back the spec: {run_form}"
    );
    capstan_server::runtime::producer::pass(&state.runtime).await.unwrap();
    let panel = send(&state, get(&format!("{page_path}/runtime/panel"), Some(&cookie))).await;
    assert_eq!(panel.status, StatusCode::OK, "{}", panel.body);
    assert!(!panel.body.contains(r#"data-verdict="""#), "a verdict now: {}", panel.body);
    assert!(panel.body.contains(&format!(r#"<tr data-slot="{node_id}.0" data-phase="pending" data-ready="false">"#)), "{}", panel.body);
    assert!(panel.body.contains(&format!(r#"<tr data-slot="{node_id}.1""#)) && panel.body.contains(">alpha</a>"), "{}", panel.body);

    // the cluster's and the node's pages list the slots, for an administrator
    let cluster_page = send(&state, get(&format!("/clusters/{cluster_id}"), Some(&cookie))).await;
    let slots = section_of(&cluster_page.body, "runtime-slots");
    assert!(slots.contains(&format!(r#"data-slot="{node_id}.0" data-service="{service_id}""#)) && slots.contains(">web</a>"), "{slots}");
    assert!(slots.contains(">alpha</a>"), "the node column: {slots}");
    let node_page = send(&state, get(&format!("/nodes/{node_id}"), Some(&cookie))).await;
    assert!(node_page.body.contains(r#"data-areas="runtime""#), "{}", node_page.body);
    let slots = section_of(&node_page.body, "runtime-slots");
    assert!(
        slots.contains(&format!(r#"data-slot="{node_id}.1" data-service="{service_id}""#)) && slots.contains("on this node"),
        "{slots}"
    );
    let panel = send(&state, get(&format!("/nodes/{node_id}/runtime/panel"), Some(&cookie))).await;
    assert!(panel.body.contains(r#"id="runtime-slots-table""#), "{}", panel.body);
    // nothing for anyone else
    add_operator(&state).await;
    let operator = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await.set_cookie().unwrap().0;
    for path in [format!("/nodes/{node_id}/runtime/panel"), format!("/clusters/{cluster_id}/runtime/panel")] {
        let panel = send(&state, get(&path, Some(&operator))).await;
        assert_eq!(panel.status, StatusCode::OK, "{path}");
        assert!(!panel.body.contains("runtime-slots"), "{path}: {}", panel.body);
    }

    // Stop (hold) keeps the spec; Resume runs it again
    let hold_path = format!("/services/{service_id}/runtime/hold");
    let held = submit(&state, &hold_path, &[("clusterId", &cluster_id), ("hold", "true")], &cookie).await;
    assert_eq!(held.location(), Some(format!("{page_path}?done=runtime-held").as_str()), "{}", held.body);
    let spec =
        &method(&state, &cookie, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id })).await["items"][0];
    assert_eq!((spec["hold"].as_bool(), spec["revision"].as_u64(), spec["replicasPerNode"].as_u64()), (Some(true), Some(3), Some(2)));
    let page = send(&state, get(held.location().unwrap(), Some(&cookie))).await;
    assert!(page.body.contains("Stopped (held)") && page.body.contains(&format!(r#"id="runtime-resume-{cluster_id}""#)), "{}", page.body);
    let resumed = submit(&state, &hold_path, &[("clusterId", &cluster_id), ("hold", "false")], &cookie).await;
    assert_eq!(resumed.location(), Some(format!("{page_path}?done=runtime-resumed").as_str()), "{}", resumed.body);
    let spec =
        &method(&state, &cookie, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id })).await["items"][0];
    assert_eq!((spec["hold"].as_bool(), spec["revision"].as_u64()), (Some(false), Some(4)));
    let missing = submit(&state, &hold_path, &[("clusterId", "cluster_nosuch"), ("hold", "true")], &cookie).await;
    assert_eq!(flash_code(&missing.body).as_deref(), Some("spec-not-found"), "{}", missing.body);

    // a post from elsewhere changes nothing
    let foreign = send(&state, post_form(&run_path, &encoded(&every), Some(&cookie), Some("https://evil.example"))).await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN, "{}", foreign.body);
    let spec =
        &method(&state, &cookie, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id })).await["items"][0];
    assert_eq!(spec["revision"], 4);
}

#[tokio::test]
async fn a_jump_command_needs_an_https_origin_outside_dev_mode() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let cluster = method(&state, &cookie, "clusters.create", serde_json::json!({ "name": "edge" })).await;
    let cluster_id = cluster["cluster"]["id"].as_str().or(cluster["id"].as_str()).unwrap().to_string();
    let refused = submit(&state, &format!("/clusters/{cluster_id}/nodes/jump"), &[], &cookie).await;
    assert_eq!(flash_code(&refused.body).as_deref(), Some("public-origin-not-https"), "{}", refused.body);
    assert!(refused.body.contains(r#"id="nodes-empty""#), "the page is shown again: {}", refused.body);
}

// ---------------------------------------------------------------------------------------
// A cluster's Relays panel, and live updates over the socket

/// What a stand-in `relays.list` answers (`items`) and every body it was asked.
struct FakeRelays {
    items: std::sync::Arc<std::sync::Mutex<serde_json::Value>>,
    asked: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

/// `state` with a stand-in `relays.list` in place of the host's (or of none, on a host that
/// does not serve it yet): it answers the items the test sets.
fn fake_relays_list(state: &mut AppState) -> FakeRelays {
    let fake = FakeRelays { items: Default::default(), asked: Default::default() };
    *fake.items.lock().unwrap() = serde_json::json!([]);
    let registry = std::sync::Arc::get_mut(&mut state.methods).expect("the test's registry is not shared yet");
    let (items, asked) = (fake.items.clone(), fake.asked.clone());
    let handler = move |_: capstan_rpc::Call, body: serde_json::Value| {
        asked.lock().unwrap().push(body);
        let items = items.lock().unwrap().clone();
        async move { Ok(serde_json::json!({ "items": items })) }
    };
    if registry.get("relays.list").is_some() {
        // the host serves it already: the stand-in answers first, the host's registry after it
        let mut fresh = capstan_server::api::Registry::default();
        fresh.add("relays.list", "the test's stand-in", capstan_server::api::Access::Admin, handler);
        fresh.add_source(std::sync::Arc::new(Existing(std::mem::take(registry))));
        *registry = fresh;
    } else {
        registry.add("relays.list", "the test's stand-in", capstan_server::api::Access::Admin, handler);
    }
    fake
}

/// The host's own registry, served after a test's stand-ins.
struct Existing(capstan_server::api::Registry);

// (the trait is `#[async_trait]`: `absent` written as the macro writes it, without the crate)
impl capstan_rpc::MethodSource for Existing {
    fn get(&self, name: &str) -> Option<std::sync::Arc<capstan_rpc::Method>> {
        self.0.get(name)
    }

    fn list(&self) -> Vec<std::sync::Arc<capstan_rpc::Method>> {
        self.0.list()
    }

    fn absent<'a, 'b, 'f>(
        &'a self,
        name: &'b str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<crate::refusal::Refusal>> + Send + 'f>>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        Box::pin(async move { self.0.resolve(name).await.err().filter(|refusal| !refusal.is("method-unknown")) })
    }
}

async fn set_relay_zone(state: &AppState, cookie: &str) {
    let settings = method(state, cookie, "settings.get", serde_json::json!({})).await;
    let body = serde_json::json!({ "expectedRevision": settings["revision"], "set": { "clusterRelayZone": "relays.example.com" } });
    method(state, cookie, "settings.update", body).await;
}

/// A `relays.list` item for `cluster`.
fn relay_item(cluster: &str, live: bool, address: Option<(&str, u16)>) -> serde_json::Value {
    let mut item = serde_json::json!({
        "clusterId": cluster, "nodeId": "node_relay1", "version": "0.1.0", "sequence": 3,
        "acceptedAt": 1_764_650_000_000u64,
        "acceptedRegistration": { "id": "relayreg_1", "generation": 7, "digest": "ab" },
        "credential": { "id": "relaycred_1", "generation": 1, "digest": "cd" },
        "live": live, "liveSessions": if live { 1 } else { 0 },
    });
    if let Some((ip, port)) = address {
        item["listenAddress"] = serde_json::json!(ip);
        item["listenPort"] = serde_json::json!(port);
    }
    item
}

/// The text of the element with `id` (up to its first tag).
fn text_of(body: &str, id: &str) -> String {
    let at = body.find(&format!(r#"id="{id}""#)).unwrap_or_else(|| panic!("no element #{id}: {body}"));
    let start = at + body[at..].find('>').unwrap() + 1;
    body[start..start + body[start..].find('<').unwrap()].to_string()
}

#[tokio::test]
async fn the_relays_panel_shows_off_awaiting_registered_live_and_socket_gone() {
    let (_dir, mut state) = setup().await;
    let fake = fake_relays_list(&mut state);
    let cookie = login_cookie(&state).await;
    let created = method(&state, &cookie, "clusters.create", serde_json::json!({"name": "eu-1"})).await;
    let id = created["cluster"]["id"].as_str().unwrap().to_string();
    let detail = |path: String| {
        let (state, cookie) = (state.clone(), cookie.clone());
        async move { send(&state, get(&path, Some(&cookie))).await }
    };

    // off until enabled: the enable form states the revision read; no credential yet
    let page = detail(format!("/clusters/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"id="relay-state" data-state="off""#), "{}", page.body);
    assert_eq!(text_of(&page.body, "relay-summary"), "off");
    assert_eq!(value_of(&page.body, "relay-enable-revision"), "1");
    assert!(
        page.body.contains(&format!(r#"action="{}/enable""#, escaped(&format!("/clusters/{id}/relay"))))
            && !page.body.contains("relay-disable-form"),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"id="relay-credential-none""#) && !page.body.contains(r#"id="relay-live""#), "{}", page.body);
    assert_eq!(text_of(&page.body, "relay-export"), format!("capstan keyring export-relay-authorization --cluster {id} --out FILE"));

    // refusals are shown by name: no relay zone yet, then a stale revision
    let enable = |revision: &'static str| {
        let (state, cookie, path) = (state.clone(), cookie.clone(), format!("/clusters/{id}/relay/enable"));
        async move { submit(&state, &path, &[("expectedRevision", revision)], &cookie).await }
    };
    let unset = enable("1").await;
    assert_eq!(flash_code(&unset.body).as_deref(), Some("relay-zone-unset"), "{}", unset.body);
    assert!(unset.body.contains("(relay-zone-unset)") && unset.body.contains(r#"data-state="off""#), "{}", unset.body);
    set_relay_zone(&state, &cookie).await;
    let stale = enable("0").await;
    assert_eq!((stale.status, flash_code(&stale.body).as_deref()), (StatusCode::CONFLICT, Some("conflict")), "{}", stale.body);

    // enabled: the method got the body the form posted, and nothing registered yet
    let done = enable("1").await;
    assert_eq!(done.location(), Some(format!("/clusters/{id}?done=relay-enabled").as_str()), "{}", done.body);
    let got = method(&state, &cookie, "clusters.get", serde_json::json!({"id": id})).await;
    assert_eq!((got["relay"]["enabled"].as_bool(), got["revision"].as_u64()), (Some(true), Some(2)), "{got}");
    let page = detail(format!("/clusters/{id}?done=relay-enabled")).await;
    assert!(page.body.contains("Relay enabled"), "{}", page.body);
    assert!(page.body.contains(r#"id="relay-state" data-state="awaiting""#), "{}", page.body);
    assert_eq!(text_of(&page.body, "relay-summary"), "enabled, awaiting relay registration");
    assert_eq!(text_of(&page.body, "relay-origin"), escaped(got["relay"]["origin"].as_str().unwrap()));
    assert_eq!(value_of(&page.body, "relay-disable-revision"), "2");
    assert!(!page.body.contains("relay-enable-form"), "{}", page.body);
    assert_eq!(fake.asked.lock().unwrap().last(), Some(&serde_json::json!({ "clusterIds": [id] })));

    // registered, carried by a socket now; another cluster's item is not this one's
    method(&state, &cookie, "relays.mutateCredential", serde_json::json!({"clusterId": id, "action": "ensure", "mutationId": "mint-1"}))
        .await;
    *fake.items.lock().unwrap() =
        serde_json::json!([relay_item("cluster_other", false, None), relay_item(&id, true, Some(("10.0.0.5", 8443)))]);
    let page = detail(format!("/clusters/{id}")).await;
    let since = utc(1_764_650_000_000);
    assert!(page.body.contains(r#"id="relay-state" data-state="registered""#), "{}", page.body);
    assert_eq!(text_of(&page.body, "relay-summary"), format!("registered · 10.0.0.5:8443 · 0.1.0 · since {since}"));
    assert!(page.body.contains(r#"id="relay-live" data-live="true">live<"#), "{}", page.body);
    assert!(page.body.contains(&format!(r#"href="{}" id="relay-node">node_relay1<"#, escaped("/nodes/node_relay1"))), "{}", page.body);
    assert_eq!(text_of(&page.body, "relay-credential-generation"), "1");

    // registered, no socket carries it now; no address: that part is left out
    *fake.items.lock().unwrap() = serde_json::json!([relay_item(&id, false, None)]);
    let panel = detail(format!("/clusters/{id}/relay/panel")).await;
    assert_eq!(panel.status, StatusCode::OK, "{}", panel.body);
    assert!(
        panel.body.contains(&format!(r#"hx-get="{}""#, escaped(&format!("/clusters/{id}/relay/panel")))),
        "the panel refreshes itself: {}",
        panel.body
    );
    assert_eq!(text_of(&panel.body, "relay-summary"), format!("registered · 0.1.0 · since {since}"));
    assert!(panel.body.contains(r#"id="relay-live" data-live="false">socket gone<"#), "{}", panel.body);

    // disabled: a stale revision refused by name, then off again (a registration is not shown)
    let disable = |revision: &'static str| {
        let (state, cookie, path) = (state.clone(), cookie.clone(), format!("/clusters/{id}/relay/disable"));
        async move { submit(&state, &path, &[("expectedRevision", revision)], &cookie).await }
    };
    let stale = disable("1").await;
    assert_eq!(flash_code(&stale.body).as_deref(), Some("conflict"), "{}", stale.body);
    let done = disable("2").await;
    assert_eq!(done.location(), Some(format!("/clusters/{id}?done=relay-disabled").as_str()), "{}", done.body);
    let page = detail(format!("/clusters/{id}?done=relay-disabled")).await;
    assert!(page.body.contains("Relay disabled") && page.body.contains(r#"id="relay-state" data-state="off""#), "{}", page.body);
    assert_eq!(value_of(&page.body, "relay-enable-revision"), "3");

    // the panel of a cluster that is not there says why
    let missing = detail("/clusters/cluster_nope/relay/panel".into()).await;
    assert!(missing.body.contains(r#"id="relay-error" data-code="cluster-not-found""#), "{}", missing.body);
    // relay posts come from this host's pages only
    let foreign = send(
        &state,
        post_form(&format!("/clusters/{id}/relay/enable"), "expectedRevision=3", Some(&cookie), Some("https://elsewhere.example")),
    )
    .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN, "{}", foreign.body);
}

#[tokio::test]
async fn an_enabled_relay_without_a_registration_awaits_it_and_an_unserved_method_is_none() {
    // the host's own relays.list: an empty list (or, on a host that does not serve it yet,
    // method-unknown) — either way an enabled relay awaits its registration, without an error
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let created = method(&state, &cookie, "clusters.create", serde_json::json!({"name": "eu-1"})).await;
    let id = created["cluster"]["id"].as_str().unwrap().to_string();
    set_relay_zone(&state, &cookie).await;
    method(&state, &cookie, "clusters.enableRelay", serde_json::json!({"id": id, "expectedRevision": 1})).await;
    let page = send(&state, get(&format!("/clusters/{id}"), Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(text_of(&page.body, "relay-summary"), "enabled, awaiting relay registration");
    assert!(!page.body.contains("relay-registration-error") && !page.body.contains("relay-live"), "{}", page.body);
    // a method this host does not serve reads as nothing, not as a failure
    let token = cookie.trim_start_matches("capstan_session=");
    let identity = state.auth.authenticate(token).await.unwrap();
    let identity = Viewer { identity, bearer: capstan_core::text::SecretString::new(token.to_string()) };
    let unserved = forms::call_if_served(&Host::from_ref(&state), &identity, "relays.notYetServed", serde_json::json!({})).await;
    assert!(matches!(unserved, Ok(None)), "{unserved:?}");
    let served = forms::call_if_served(&Host::from_ref(&state), &identity, "events.head", serde_json::json!({})).await.unwrap();
    assert!(served.is_some_and(|answer| answer["head"].is_u64()));
}

#[tokio::test]
async fn pages_wait_for_changes_over_the_socket_and_poll_only_as_the_fallback() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let created = method(&state, &cookie, "clusters.create", serde_json::json!({"name": "eu-1"})).await;
    let id = created["cluster"]["id"].as_str().unwrap().to_string();
    let page = send(&state, get(&format!("/clusters/{id}"), Some(&cookie))).await;
    // the socket client is on every page; the page's element waits for it, not polling yet
    assert!(page.body.contains(&assets::url("live.js").unwrap()), "{}", page.body);
    assert!(page.body.contains(r#"data-areas="cluster,relay,runtime" data-socket="connecting""#), "{}", page.body);
    assert!(page.body.contains(r#"hx-trigger="capstan-poll, htmx:responseError"#), "no poll starts on load: {}", page.body);
    // the fallback's answer keeps polling
    let head = capstan_server::events::head(&state.store).await.unwrap();
    // from before the cluster's creation: answered at once
    let poll = send(&state, get(&format!("/live/wait?after={}&areas=cluster,relay", head - 1), Some(&cookie))).await;
    assert_eq!(poll.status, StatusCode::OK, "{}", poll.body);
    assert!(poll.body.contains(r#"data-socket="polling""#) && poll.body.contains(r#"hx-trigger="load, capstan-poll"#), "{}", poll.body);
}

#[test]
fn the_socket_takes_the_session_cookie_from_this_hosts_pages_only() {
    let headers = |pairs: &[(&'static str, &str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    };
    let judge = |map: &HeaderMap| page_session_bearer(ORIGIN, map);
    let cookie = "theme=x; capstan_session=eyJ.abc.def";
    assert_eq!(judge(&headers(&[("cookie", cookie), ("sec-fetch-site", "same-origin")])).as_deref(), Some("eyJ.abc.def"));
    assert_eq!(judge(&headers(&[("cookie", cookie), ("origin", ORIGIN)])).as_deref(), Some("eyJ.abc.def"));
    assert_eq!(judge(&headers(&[("cookie", cookie), ("sec-fetch-site", "cross-site"), ("origin", ORIGIN)])), None);
    assert_eq!(judge(&headers(&[("cookie", cookie), ("origin", "https://elsewhere.example")])), None);
    assert_eq!(judge(&headers(&[("cookie", cookie)])), None, "no origin at all: not from a page");
    assert_eq!(judge(&headers(&[("origin", ORIGIN)])), None, "no session");
}

// ---------------------------------------------------------------------------------------
// People, organizations, publishers

/// The `value` of the hidden `expectedGeneration` in the form posting to `action`.
fn generation_in(body: &str, action: &str) -> String {
    let at = body.find(&format!(r#"action="{action}""#)).unwrap_or_else(|| panic!("a form posting to {action} in:\n{body}"));
    let rest = &body[at..];
    let value = rest.split(r#"name="expectedGeneration" value=""#).nth(1).unwrap();
    value.split('"').next().unwrap().to_string()
}

#[tokio::test]
async fn people_are_created_disabled_enabled_and_given_a_password_shown_once() {
    let (_dir, state) = setup().await;
    let admin = login_cookie(&state).await;
    let page = send(&state, get("/users", Some(&admin))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"data-user="admin""#) && page.body.contains("(you)"), "{}", page.body);
    assert!(!page.body.contains(r#"id="disable-admin""#), "no disabling yourself: {}", page.body);

    let created = send(&state, post_form("/users", "username=pat", Some(&admin), Some(ORIGIN))).await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    let password = created.body.split(r#"id="generated-value">"#).nth(1).unwrap().split('<').next().unwrap().to_string();
    assert!(password.len() >= 20, "{password}");
    let again = send(&state, get("/users", Some(&admin))).await;
    assert!(!again.body.contains(&password), "the password is shown on the creation's answer only");
    let id = again.body.split(r#"data-user="pat" data-user-id=""#).nth(1).unwrap().split('"').next().unwrap().to_string();
    assert_eq!(send(&state, post_form("/login", &form("pat", &password), None, Some(ORIGIN))).await.status, StatusCode::SEE_OTHER);

    // disabled: the login shows the one denial
    let action = format!("/users/{id}/disable");
    let body = format!("expectedGeneration={}", generation_in(&again.body, &action));
    let disabled = send(&state, post_form(&action, &body, Some(&admin), Some(ORIGIN))).await;
    assert!(disabled.status == StatusCode::OK && disabled.body.contains("Disabled pat"), "{}", disabled.body);
    assert!(disabled.body.contains(r#"id="enable-pat""#) && disabled.body.contains("disabled</span>"), "{}", disabled.body);
    assert_eq!(send(&state, post_form("/login", &form("pat", &password), None, Some(ORIGIN))).await.status, StatusCode::UNAUTHORIZED);
    // the same form again: the generation moved on, refused by name
    let stale = send(&state, post_form(&action, &body, Some(&admin), Some(ORIGIN))).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert!(stale.body.contains(r#"data-code="conflict""#), "{}", stale.body);

    let action = format!("/users/{id}/enable");
    let body = format!("expectedGeneration={}", generation_in(&disabled.body, &action));
    let enabled = send(&state, post_form(&action, &body, Some(&admin), Some(ORIGIN))).await;
    assert!(enabled.body.contains("Enabled pat"), "{}", enabled.body);

    let action = format!("/users/{id}/reset-password");
    let body = format!("expectedGeneration={}", generation_in(&enabled.body, &action));
    let reset = send(&state, post_form(&action, &body, Some(&admin), Some(ORIGIN))).await;
    assert!(reset.body.contains("New password for pat"), "{}", reset.body);
    let new_password = reset.body.split(r#"id="generated-value">"#).nth(1).unwrap().split('<').next().unwrap().to_string();
    assert_ne!(new_password, password);
    assert_eq!(send(&state, post_form("/login", &form("pat", &password), None, Some(ORIGIN))).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&state, post_form("/login", &form("pat", &new_password), None, Some(ORIGIN))).await.status, StatusCode::SEE_OTHER);

    // refusals by name; a form from elsewhere is refused before anything runs
    let taken = send(&state, post_form("/users", "username=pat", Some(&admin), Some(ORIGIN))).await;
    assert!(taken.body.contains(r#"data-code="exists""#), "{}", taken.body);
    let foreign = send(&state, post_form("/users", "username=eve", Some(&admin), Some("https://evil.example"))).await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert!(!send(&state, get("/users", Some(&admin))).await.body.contains(r#"data-user="eve""#));
}

#[tokio::test]
async fn an_operator_sees_only_what_their_role_can_use() {
    let (_dir, state) = setup().await;
    add_operator(&state).await;
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let overview = send(&state, get("/", Some(&operator))).await;
    for hidden in ["/fleet", "/clusters", "/secrets", "/plugins", "/tasks", "/users", "/publishers", "/settings"] {
        assert!(
            !overview.body.contains(&format!(r#"href="{}""#, escaped(hidden))),
            "an operator's rail links {hidden}:\n{}",
            overview.body
        );
    }
    for shown in ["/services", "/organizations"] {
        assert!(overview.body.contains(&format!(r#"href="{}""#, escaped(shown))), "{shown}");
    }
    for path in ["/users", "/publishers"] {
        let refused = send(&state, get(path, Some(&operator))).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{path}");
        assert!(refused.body.contains("Administrators only"), "{}", refused.body);
    }
    assert_eq!(send(&state, get("/organizations", Some(&operator))).await.status, StatusCode::OK);
    let refused = send(&state, post_form("/users", "username=mallory", Some(&operator), Some(ORIGIN))).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.body.contains(r#"data-code="forbidden""#), "{}", refused.body);

    let admin = login_cookie(&state).await;
    let overview = send(&state, get("/", Some(&admin))).await;
    for shown in ["/fleet", "/clusters", "/plugins", "/users", "/publishers", "/settings", "/organizations"] {
        assert!(overview.body.contains(&format!(r#"href="{}""#, escaped(shown))), "an administrator's rail links {shown}");
    }
}

#[tokio::test]
async fn organizations_are_created_renamed_and_given_members_with_roles() {
    let (_dir, state) = setup().await;
    add_operator(&state).await;
    let admin = login_cookie(&state).await;
    let created = send(&state, post_form("/organizations", "name=acme", Some(&admin), Some(ORIGIN))).await;
    assert_eq!(created.status, StatusCode::SEE_OTHER, "{}", created.body);
    let location = created.location().unwrap().to_string();
    let path = location.split('?').next().unwrap().to_string();
    let page = send(&state, get(&location, Some(&admin))).await;
    assert!(page.body.contains("Organization created") && page.body.contains(r#"id="members-empty""#), "{}", page.body);

    let added = send(&state, post_form(&format!("{path}/members"), "user=oscar&role=member", Some(&admin), Some(ORIGIN))).await;
    assert!(added.body.contains(r#"data-member="oscar" data-role="member""#), "{}", added.body);
    let unknown = send(&state, post_form(&format!("{path}/members"), "user=nobody&role=member", Some(&admin), Some(ORIGIN))).await;
    assert!(unknown.body.contains(r#"data-code="user-not-found""#), "{}", unknown.body);

    // the member sees the organization, without the owner's forms
    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let listed = send(&state, get("/organizations", Some(&operator))).await;
    assert!(listed.body.contains(r#"data-organization="acme""#) && !listed.body.contains("organization-create-form"), "{}", listed.body);
    let seen = send(&state, get(&path, Some(&operator))).await;
    assert!(seen.body.contains(r#"data-member="oscar""#) && !seen.body.contains("member-add-form"), "{}", seen.body);

    let revision = page.body.split(r#"name="expectedRevision" value=""#).nth(1).unwrap().split('"').next().unwrap().to_string();
    let renamed = send(
        &state,
        post_form(&format!("{path}/rename"), &format!("name=acme-two&expectedRevision={revision}"), Some(&admin), Some(ORIGIN)),
    )
    .await;
    assert!(renamed.body.contains("acme-two"), "{}", renamed.body);
    let stale =
        send(&state, post_form(&format!("{path}/rename"), &format!("name=acme-3&expectedRevision={revision}"), Some(&admin), Some(ORIGIN)))
            .await;
    assert!(stale.body.contains(r#"data-code="conflict""#), "{}", stale.body);
}

#[tokio::test]
async fn publishers_are_listed_with_their_names_added_and_removed() {
    let (_dir, state) = setup().await;
    let admin = login_cookie(&state).await;
    let empty = send(&state, get("/publishers", Some(&admin))).await;
    assert!(empty.body.contains(r#"id="publishers-empty""#), "{}", empty.body);
    let key = capstan_server::plugins::bundle::PublisherKey::from(&capstan_server::plugins::bundle::generate_key()).to_string();
    let encoded: String =
        key.bytes().map(|b| if b.is_ascii_alphanumeric() || b == b'-' { (b as char).to_string() } else { format!("%{b:02X}") }).collect();
    let body = format!("name=Acme+Plugins&publicKey={encoded}");
    let added = send(&state, post_form("/publishers", &body, Some(&admin), Some(ORIGIN))).await;
    assert!(added.body.contains("Trusting Acme Plugins") && added.body.contains(r#"data-publisher="Acme Plugins""#), "{}", added.body);
    let bad = send(&state, post_form("/publishers", "name=x&publicKey=not-a-key", Some(&admin), Some(ORIGIN))).await;
    assert!(bad.body.contains(r#"data-code="publisher-key-invalid""#), "{}", bad.body);
    let body = format!("publicKey={encoded}");
    let removed = send(&state, post_form("/publishers/remove", &body, Some(&admin), Some(ORIGIN))).await;
    assert!(removed.body.contains("Publisher removed") && removed.body.contains(r#"id="publishers-empty""#), "{}", removed.body);
}

#[tokio::test]
async fn the_api_reference_lists_every_method_with_its_schemas() {
    let (_dir, state) = setup().await;
    assert_eq!(send(&state, get("/docs/api", None)).await.status, StatusCode::SEE_OTHER, "a session is needed");
    let cookie = login_cookie(&state).await;
    let answer = send(&state, get("/docs/api", Some(&cookie))).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.assert_security_headers("/docs/api");
    let methods = state.methods.list();
    assert!(answer.body.contains(&format!("{} operations", methods.len())), "{}", answer.body);
    for method in &methods {
        assert!(answer.body.contains(&format!("data-operation=\"{}\"", method.name)), "{} missing", method.name);
    }
    // the schemas are in the page (escaped), the document is linked, and no script renders it
    assert!(answer.body.contains(&escaped("\"username\"")) && answer.body.contains("href=\"/api/v1/openapi.json\""));
    assert!(answer.body.contains(&format!("href=\"{}\" aria-current=\"page\"", escaped("/docs/api"))), "the rail marks the page");
}

#[tokio::test]
async fn the_audit_view_shows_administrators_the_calls_the_dashboard_made() {
    let (_dir, state) = setup().await;
    add_operator(&state).await;
    let admin = login_cookie(&state).await;
    let created = send(&state, post_form("/organizations", "name=audited-org", Some(&admin), Some(ORIGIN))).await;
    assert!(created.status.is_redirection() || created.status == StatusCode::OK, "{}", created.body);
    let page = send(&state, get("/audit", Some(&admin))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"data-method="organizations.create" data-outcome="ok""#), "{}", page.body);
    assert!(!page.body.contains("audited-org"), "no body value: {}", page.body);
    assert!(page.body.contains(r#"href="/audit""#), "the rail links the view for an administrator");
    let filtered = send(&state, get("/audit?method=users.setDisabled&outcome=ok", Some(&admin))).await;
    assert!(filtered.body.contains(r#"id="audit-empty""#), "{}", filtered.body);

    let answer = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await;
    let operator = answer.set_cookie().unwrap().0;
    let refused = send(&state, get("/audit", Some(&operator))).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(!send(&state, get("/", Some(&operator))).await.body.contains(r#"href="/audit""#), "an operator's rail has no Audit");
}

#[tokio::test]
async fn the_backups_section_is_the_backups_plugins_page_once_it_is_loaded() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    let before = send(&state, get("/", Some(&cookie))).await;
    assert!(!before.body.contains(">Backups<") && !before.body.contains(">Mail<"), "a manager's section comes with it: {}", before.body);

    state.plugins.install_first_party().await.unwrap();
    assert!(state.plugins.get("backups").is_some(), "the embedded backups manager is loaded: {:?}", state.plugins.load_error("backups"));
    let page = send(&state, get("/p/backups", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    assert!(body.contains("<title>Backups · Capstan</title>"), "{body}");
    assert_eq!(body.matches(">Backups<").count(), 2, "one rail entry, the section the plugin declares (and the heading): {body}");
    assert!(body.contains(">Mail<") && body.contains(">Ingress<"), "the other managers' sections, declared by them: {body}");
    assert!(body.contains(r#"href="&#x2f;p&#x2f;backups" aria-current="page""#), "the rail's Backups links the page: {body}");
    assert!(body.find(">Secrets<").unwrap() < body.find(">Backups<").unwrap(), "in the section's place: {body}");
    assert!(body.contains(r#"<dd id="schedule-keep-last">the newest 24 complete backups</dd>"#), "the overview shows retention: {body}");
}

#[tokio::test]
async fn a_plugins_panel_shows_its_facet_on_the_entitys_page_and_its_refusals_answer_their_status() {
    let (_dir, state) = setup().await;
    let cookie = login_cookie(&state).await;
    state.plugins.install_first_party().await.unwrap();
    assert!(state.plugins.get("mail").is_some(), "the embedded mail manager is loaded: {:?}", state.plugins.load_error("mail"));
    let org = method(&state, &cookie, "organizations.create", serde_json::json!({ "name": "acme" })).await;
    let body = serde_json::json!({
        "organizationId": org["id"], "name": "web", "image": "registry.example.com/web:1", "mailAddresses": ["web@acme.example"],
    });
    let service = method(&state, &cookie, "services.create", body).await;
    let id = service["id"].as_str().unwrap().to_string();
    let page = send(&state, get(&format!("/services/{id}"), Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"id="mail-service-panel""#) && page.body.contains(r#"data-plugin="mail""#), "{}", page.body);
    assert!(page.body.contains("None of its addresses is bound yet"), "{}", page.body);

    // the mail manager's record of the service, as it writes it: its panel shows it
    let record = serde_json::json!({ "bindings": [{
        "address": "web@acme.example", "smtpUsername": "capstan.web", "credentialVersion": 1,
        "inbound": { "host": "10.0.0.5", "port": 30025 }, "targetType": "direct", "retired": false,
    }] });
    let write =
        capstan_server::inventory::facets::Write { kind: "service", id: &id, plugin: "mail", value: Some(record), expected_revision: None };
    capstan_server::inventory::facets::set(&state.store, &capstan_links::HostDependents, write).await.unwrap();
    for path in [format!("/services/{id}"), format!("/services/{id}/panel")] {
        let shown = send(&state, get(&path, Some(&cookie))).await;
        assert!(shown.body.contains("web@acme.example: sending as capstan.web, receiving at 10.0.0.5:30025"), "{path}: {}", shown.body);
    }

    // a refusal code the ingress manager declares answers the status it declared
    let token = cookie.trim_start_matches("capstan_session=");
    let request = Request::builder()
        .method("POST")
        .uri("/api/v1/ingress.exportBearer")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"clusterId":"cl_none"}"#))
        .unwrap();
    let answer = send(&state, request).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.body);
    assert!(answer.body.contains("ingress-not-designated"), "{}", answer.body);
}

// ---------------------------------------------------------------------------------------
// A service and one node

/// A dev host (nodes enroll over its http origin), its administrator signed in, an
/// organization, a cluster `eu-1`, a service `web` pinned by digest, and one node enrolled
/// (named `node_name` when given).
struct OneNode {
    _dir: tempfile::TempDir,
    state: AppState,
    cookie: String,
    cluster_id: String,
    service_id: String,
    node_id: String,
}

async fn one_node(node_name: Option<&str>) -> OneNode {
    use serde_json::json;
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let state = crate::state::test_state_at(dir.path(), ORIGIN, true).await;
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
    capstan_server::migrate::run(&state.store, &state.chain, &capstan_server::migrate::LockOptions::for_this_process()).await.unwrap();
    let cookie = login_cookie(&state).await;
    let org = method(&state, &cookie, "organizations.create", json!({ "name": "acme" })).await["id"].as_str().unwrap().to_string();
    let cluster_id =
        method(&state, &cookie, "clusters.create", json!({ "name": "eu-1" })).await["cluster"]["id"].as_str().unwrap().to_string();
    let image = format!("reg.example/x@sha256:{}", "ab".repeat(32));
    let service = method(&state, &cookie, "services.create", json!({ "organizationId": org, "name": "web", "image": image })).await;
    let service_id = service["id"].as_str().unwrap().to_string();
    let mut jump = json!({ "clusterId": cluster_id });
    if let Some(name) = node_name {
        jump["nodeName"] = json!(name);
    }
    let jump = method(&state, &cookie, "nodes.createJumpCommand", jump).await;
    let code = jump["url"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
    let token = "cd".repeat(32);
    let enroll = json!({ "protocol": "capstan-agent/1", "code": code, "hostname": "debian", "tokenSha256": hex::encode(sha2::Sha256::digest(token.as_bytes())), "agentVersion": "0.1.0" });
    let enrolled = send(&state, agent_request("/agent/v1/enroll", enroll, None)).await;
    let node_id = serde_json::from_str::<serde_json::Value>(&enrolled.body).unwrap()["nodeId"].as_str().unwrap().to_string();
    OneNode { _dir: dir, state, cookie, cluster_id, service_id, node_id }
}

// ---------------------------------------------------------------------------------------
// Logs

#[tokio::test]
async fn a_services_logs_page_shows_its_replicas_lines_and_losses_and_answers_new_lines_after_its_cursor() {
    use serde_json::json;
    let OneNode { _dir, state, cookie, cluster_id, service_id, node_id, .. } = one_node(None).await;
    let spec = json!({ "serviceId": service_id, "clusterId": cluster_id, "expectedRevision": null, "placement": { "everyNode": true }, "replicasPerNode": 1 });
    method(&state, &cookie, "runtime.setServiceSpec", spec).await;

    // the service's page links to its logs; before any replica ran there are none, and the page says why
    let detail = send(&state, get(&format!("/services/{service_id}"), Some(&cookie))).await;
    assert!(detail.body.contains(&format!(r#"href="/services/{service_id}/logs" id="service-logs""#)), "{}", detail.body);
    let logs = format!("/services/{service_id}/logs");
    let anonymous = send(&state, get(&logs, None)).await;
    assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")));
    let page = send(&state, get(&logs, Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains(r#"id="logs-none""#) && page.body.contains("No replica has run yet, or its logs were let go"),
        "{}",
        page.body
    );
    assert!(page.body.contains("#runtime-panel\">Runtime card</a>"), "it points to the Runtime card: {}", page.body);

    // a replica's attempt: two batches, a hole between them, lines the node could not read
    capstan_server::runtime::producer::pass(&state.runtime).await.unwrap();
    let slots = method(&state, &cookie, "runtime.getClusterAssignments", json!({ "clusterId": cluster_id })).await;
    let assignment = slots["items"][0]["assignmentId"].as_str().unwrap().to_string();
    let report = |sequence: u64, entries: serde_json::Value, lost: Option<serde_json::Value>| {
        let mut batch = json!({ "assignmentId": assignment, "captureId": "00112233445566ff", "sequence": sequence, "entries": entries });
        if let Some(lost) = lost {
            batch["lost"] = lost;
        }
        let runtime = state.runtime.clone();
        let node = node_id.clone();
        async move { capstan_server::runtime::logs::accept(&runtime, &node, serde_json::from_value(batch).unwrap()).await.unwrap() }
    };
    let entry = |ts: &str, stream: &str, line: &str| json!({ "ts": ts, "stream": stream, "line": line });
    report(
        1,
        json!([
            entry("2026-12-06T10:00:00.1Z", "stdout", "listening on :8080"),
            entry("2026-12-06T10:00:00.2Z", "stderr", "<b>bold</b> failed")
        ]),
        None,
    )
    .await;
    report(3, json!([entry("2026-12-06T10:00:01Z", "stdout", "ready")]), Some(json!({ "entries": 3, "reason": "engine-error" }))).await;

    let page = send(&state, get(&logs, Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    assert!(body.contains("<title>Logs of web · Capstan</title>"), "{body}");
    assert!(body.contains(&format!(r#"data-slot="{node_id}.0" aria-current="page""#)), "the replica is picked: {body}");
    assert!(body.contains(&format!(r#"<li data-attempt="{assignment}" class="chosen""#)), "its newest attempt: {body}");
    let panel = section_of(body, "logs-panel");
    assert!(panel.contains(r#"data-cursor="0.3""#), "{panel}");
    assert!(
        panel.contains(&format!(r#"data-follow-href="&#x2f;services&#x2f;{service_id}&#x2f;logs&#x2f;{assignment}&#x2f;after""#)),
        "{panel}"
    );
    let texts: Vec<&str> = panel.split(r#"<span class="log-text">"#).skip(1).map(|t| t.split("</span>").next().unwrap()).collect();
    assert_eq!(
        texts,
        [
            "listening on :8080",
            "&lt;b&gt;bold&lt;&#x2f;b&gt; failed",
            "1 batch of lines never arrived",
            "ready",
            "3 lines the node could not read (engine-error)"
        ],
        "in order, escaped, every loss in its place: {panel}"
    );
    assert!(panel.contains(r#"<li class="log-line log-error" data-kind="stderr">"#) && panel.contains(">stderr</span>"), "{panel}");
    assert!(
        panel.contains(r#"<li class="log-line log-info" data-kind="stdout"><time class="log-time" datetime="2026-12-06T10:00:00.1Z""#),
        "{panel}"
    );
    assert_eq!(panel.matches(r#"class="log-line log-warning" data-kind="loss""#).count(), 2, "{panel}");
    assert!(panel.contains(">2026-12-06 10:00:00.100<") || panel.contains(">2026-12-06 10:00:00.1<"), "{panel}");
    assert!(
        panel.contains(r#"id="logs-matches" aria-live="polite">3 lines<"#) && panel.contains(r#"id="logs-no-lines" hidden"#),
        "{panel}"
    );
    assert!(!body.contains("<b>bold"), "never unescaped: {body}");

    // new lines after the page's cursor, as JSON for the page's script
    report(4, json!([entry("2026-12-06T10:00:02Z", "stderr", "a <new> line")]), None).await;
    let after = format!("{logs}/{assignment}/after");
    let answer = send(&state, get(&format!("{after}?cursor=0.3"), Some(&cookie))).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let answered: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(answered["cursor"], "0.4", "{answered}");
    assert_eq!(
        answered["lines"],
        json!([{ "kind": "stderr", "level": "error", "ts": "2026-12-06T10:00:02Z", "at": "2026-12-06 10:00:02", "text": "a <new> line", "cut": null }])
    );
    // from the start (nothing was kept when the page was read): every line so far
    let answer = send(&state, get(&after, Some(&cookie))).await;
    let answered: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!((answered["lines"].as_array().map(Vec::len), answered["cursor"].as_str()), (Some(6), Some("0.4")), "{answered}");

    // the methods' refusals: the page's error banner with their status, never a 500
    let missing = send(&state, get(&format!("{logs}?attempt=asg_nosuch"), Some(&cookie))).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    assert!(missing.body.contains(r#"id="logs-error" data-code="attempt-not-found""#), "{}", missing.body);
    assert!(missing.body.contains(r#"id="logs-replicas""#), "the picker stays: {}", missing.body);
    let bad = send(&state, get(&format!("{after}?cursor=nonsense"), Some(&cookie))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&bad.body).unwrap()["error"]["code"], "cursor-invalid");
    add_operator(&state).await;
    let operator = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await.set_cookie().unwrap().0;
    let hidden = send(&state, get(&logs, Some(&operator))).await;
    assert!(hidden.status.is_client_error(), "{}", hidden.body);
    assert!(hidden.body.contains(r#"id="service-error" data-code=""#), "{}", hidden.body);
    let hidden = send(&state, get(&after, Some(&operator))).await;
    assert!(hidden.status.is_client_error(), "{}", hidden.body);
    assert!(serde_json::from_str::<serde_json::Value>(&hidden.body).unwrap()["error"]["code"].is_string(), "{}", hidden.body);
}

// ---------------------------------------------------------------------------------------
// Runtime events

#[tokio::test]
async fn a_replicas_history_shows_under_its_slot_newest_first_and_the_events_page_lists_every_event() {
    use capstan_server::runtime::history::{RuntimeEvent, record};
    use serde_json::json;
    let OneNode { _dir, state, cookie, cluster_id, service_id, node_id, .. } = one_node(Some("alpha")).await;
    let events_path = format!("/services/{service_id}/events");

    // nothing scheduled yet: the card links to the events, the page says there are none
    let page = send(&state, get(&format!("/services/{service_id}"), Some(&cookie))).await;
    let card = section_of(&page.body, "runtime-panel");
    assert!(card.contains(&format!(r#"href="{}" id="runtime-events""#, escaped(&events_path))), "{card}");
    let anonymous = send(&state, get(&events_path, None)).await;
    assert_eq!((anonymous.status, anonymous.location()), (StatusCode::SEE_OTHER, Some("/login")));
    let empty = send(&state, get(&events_path, Some(&cookie))).await;
    assert_eq!(empty.status, StatusCode::OK, "{}", empty.body);
    assert!(empty.body.contains(r#"id="events-none""#), "{}", empty.body);

    // the runtime schedules the replica (the producer's own event), then the node's and the
    // runtime's words of a failure and a restart, written as the runtime writes them
    let spec = json!({ "serviceId": service_id, "clusterId": cluster_id, "expectedRevision": null, "placement": { "everyNode": true }, "replicasPerNode": 1 });
    method(&state, &cookie, "runtime.setServiceSpec", spec).await;
    capstan_server::runtime::producer::pass(&state.runtime).await.unwrap();
    let slots = method(&state, &cookie, "runtime.getClusterAssignments", json!({ "clusterId": cluster_id })).await;
    let assignment = slots["items"][0]["assignmentId"].as_str().unwrap().to_string();
    let slot = format!("{node_id}.0");
    let start = capstan_core::clock::now_ms() + 1000;
    let said = [
        ("pulling", "pulling the image"),
        ("starting", "starting the container"),
        ("ready", "running and ready"),
        ("exited", "exited: exited with status 1 <b>boom</b>"),
        ("stopping", "stopping the failed replica: its backoff passed (failure 1)"),
        ("stopped", "the container stopped"),
        ("removing", "removing the stopped container"),
        ("removed", "the container was removed"),
        ("restarted", "restarted after its backoff (failure 1)"),
        ("starting", "starting the container"),
        ("ready", "running and ready"),
    ];
    let mut events: Vec<RuntimeEvent> = said
        .iter()
        .enumerate()
        .map(|(i, (kind, words))| RuntimeEvent {
            service_id: service_id.clone(),
            at: start + i as u64 * 1000,
            slot: slot.clone(),
            node_id: node_id.clone(),
            assignment_id: assignment.clone(),
            kind: kind.to_string(),
            words: words.to_string(),
        })
        .collect();
    // a replica released before: on the Events page only
    events.push(RuntimeEvent {
        service_id: service_id.clone(),
        at: start + 20_000,
        slot: format!("{node_id}.7"),
        node_id: node_id.clone(),
        assignment_id: "asg_gone".into(),
        kind: "released".into(),
        words: "the slot is released".into(),
    });
    state
        .store
        .transact(|tx| {
            let events = events.clone();
            async move {
                for event in &events {
                    record(&tx, event).await?;
                }
                Ok(())
            }
        })
        .await
        .unwrap();

    // the card: the slot's history folded under its row, newest first, the last 10 of its 12
    let panel = send(&state, get(&format!("/services/{service_id}/runtime/panel"), Some(&cookie))).await;
    assert_eq!(panel.status, StatusCode::OK, "{}", panel.body);
    let body = &panel.body;
    assert!(!body.contains("runtime-events-error"), "{body}");
    let fold_at = body.find(&format!(r#"<details class="runtime-history" id="history-{slot}" data-keep-open>"#)).expect(body);
    assert!(body.find(&format!(r#"<tr data-slot="{slot}""#)).unwrap() < fold_at, "under its slot's row: {body}");
    let fold = &body[fold_at..fold_at + body[fold_at..].find("</details>").unwrap()];
    assert!(fold.contains("· 12 events</span>"), "{fold}");
    let kinds: Vec<&str> = fold.split(r#"<li class="event "#).skip(1).map(|li| li.split('"').nth(2).unwrap()).collect();
    assert_eq!(
        kinds,
        ["ready", "starting", "restarted", "removed", "removing", "stopped", "stopping", "exited", "ready", "starting"],
        "newest first: {fold}"
    );
    assert!(fold.contains(r#"<li class="event event-error" data-kind="exited""#), "a failure is an error: {fold}");
    assert!(fold.contains(r#"<span class="pill badge pill-error">exited</span>"#), "{fold}");
    assert!(fold.contains(r#"<li class="event event-warning" data-kind="restarted""#), "a restart is a warning: {fold}");
    assert!(fold.contains(r#"<li class="event event-warning" data-kind="stopping""#), "{fold}");
    assert!(fold.contains(r#"<li class="event event-ok" data-kind="ready""#), "ready is success: {fold}");
    assert!(fold.contains(r#"<li class="event event-info" data-kind="stopped""#), "{fold}");
    assert!(fold.contains(r#"<span class="event-words">restarted after its backoff (failure 1)</span>"#), "{fold}");
    assert!(fold.contains("exited: exited with status 1 &lt;b&gt;boom&lt;&#x2f;b&gt;"), "escaped: {fold}");
    assert!(!body.contains("<b>boom"), "never unescaped: {body}");
    assert!(fold.contains(" UTC</time>"), "{fold}");
    assert!(
        fold.contains(&format!(r#"and 2 earlier · <a href="{}">"#, escaped(&format!("{events_path}?slot={slot}")))),
        "the rest on the Events page: {fold}"
    );
    assert!(!fold.contains(r#"data-kind="pulling""#), "{fold}");
    assert!(!body.contains(&format!("{node_id}.7")), "a released slot has no row: {body}");

    // the Events page: every event, newest first, the node by name, each replica to pick
    let page = send(&state, get(&events_path, Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    assert!(body.contains("<title>Events of web · Capstan</title>"), "{body}");
    assert!(body.contains(r#"data-areas="runtime""#), "it watches the runtime: {body}");
    let section = section_of(body, "events-panel");
    assert!(section.contains(r#"hx-trigger="capstan-changed from:body""#), "{section}");
    let rows: Vec<(&str, &str)> = section
        .split(r#"<tr class="event-row "#)
        .skip(1)
        .map(|tr| (tr.split('"').nth(2).unwrap(), tr.split(r#"data-slot=""#).nth(1).unwrap().split('"').next().unwrap()))
        .collect();
    assert_eq!(rows.len(), 13, "{section}");
    assert_eq!(rows[0], ("released", format!("{node_id}.7").as_str()), "newest first: {section}");
    assert_eq!(rows[1].0, "ready");
    assert_eq!(rows[12], ("scheduled", slot.as_str()), "the producer's own event, oldest: {section}");
    assert!(section.contains(&format!("scheduled on node {node_id}")) || section.contains("scheduled on node alpha"), "{section}");
    assert!(section.contains(r#"<tr class="event-row event-error" data-kind="exited""#), "{section}");
    assert!(section.contains(&format!(r#"<a href="{}">alpha</a>"#, escaped(&format!("/nodes/{node_id}")))), "the node by name: {section}");
    assert!(section.contains("&lt;b&gt;boom&lt;&#x2f;b&gt;") && !body.contains("<b>boom"), "{section}");
    assert!(section.contains(&format!(r#"data-slot="{node_id}.7""#)) && section.contains(r#"id="events-all""#), "{section}");

    // one replica's events; the panel alone for htmx
    let one = send(&state, get(&format!("{events_path}?slot={slot}"), Some(&cookie))).await;
    let section = section_of(&one.body, "events-panel");
    assert_eq!(section.matches(r#"<tr class="event-row "#).count(), 12, "{section}");
    assert!(!section.contains(r#"data-kind="released""#), "{section}");
    assert!(section.contains(&format!(r#"data-slot="{slot}" aria-current="page""#)), "{section}");
    let panel = send(&state, get(&format!("{events_path}/panel?slot={node_id}.7"), Some(&cookie))).await;
    assert_eq!(panel.status, StatusCode::OK, "{}", panel.body);
    assert_eq!(panel.body.matches(r#"<tr class="event-row "#).count(), 1, "{}", panel.body);
    let none = send(&state, get(&format!("{events_path}?slot=node_nosuch.0"), Some(&cookie))).await;
    assert!(none.body.contains(r#"id="events-none-here""#), "{}", none.body);

    // someone who may not see the service: the page's banner with its status, the panel's banner, never a 500
    add_operator(&state).await;
    let operator = send(&state, post_form("/login", &form("oscar", PASSWORD), None, Some(ORIGIN))).await.set_cookie().unwrap().0;
    let hidden = send(&state, get(&events_path, Some(&operator))).await;
    assert!(hidden.status.is_client_error(), "{}", hidden.body);
    assert!(hidden.body.contains(r#"id="service-error" data-code=""#), "{}", hidden.body);
    let hidden = send(&state, get(&format!("{events_path}/panel"), Some(&operator))).await;
    assert_eq!(hidden.status, StatusCode::OK, "{}", hidden.body);
    assert!(hidden.body.contains(r#"id="events-error" data-code=""#) && !hidden.body.contains("event-row"), "{}", hidden.body);
}
