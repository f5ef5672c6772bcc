//! `capstan login --oidc`: sign in through the server's identity provider in a browser
//! (RFC 8252's loopback redirect). The command listens on a free port of 127.0.0.1, sends the
//! browser to the server's `/auth/oidc/start` with the S256 challenge of a verifier only it
//! knows, and waits for the browser to come back with the handoff code, which it exchanges with
//! that verifier (`federation.completeLogin`) for the session token.

use super::client::{Client, Credentials, LoginArgs, credentials_path, finish, report_login};
use crate::refusal::{Refusal, Result};
use base64::Engine;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// How long the command waits for the browser.
const WAIT: Duration = Duration::from_secs(5 * 60);

/// `capstan login --oidc`.
pub fn login(args: LoginArgs) -> ExitCode {
    let json = args.json;
    let run = || {
        let client = Client::anonymous(&args.connection)?;
        let path = credentials_path()?;
        let mut credentials = Credentials::load(&path)?;
        let answer = sign_in(&client, &mut credentials, !args.no_browser)?;
        report_login(&args, &client, &path, &answer, "")
    };
    finish(run(), json)
}

/// Sign in (see the module); the login's answer, its token stored in `credentials`.
pub fn sign_in(client: &Client, credentials: &mut Credentials, open_browser: bool) -> Result<Value> {
    let status = client.call_raw("federation.getStatus", b"{}".to_vec())?;
    if status["enabled"] != true {
        return Err(Refusal::new(
            "platform-oidc-off",
            format!("{} has no identity provider configured: log in with a username and password", client.url()),
        ));
    }
    let name = status["displayName"].as_str().unwrap_or("the identity provider").to_string();
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Refusal::new("listen-failed", format!("cannot listen on a loopback port for the browser: {}", e.kind())))?;
    let port = listener.local_addr().map_err(Refusal::internal)?.port();
    let verifier = Zeroizing::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>()));
    let challenge = capstan_server::federation::login::challenge_of(&verifier);
    let mut start = url::Url::parse(&format!("{}/auth/oidc/start", client.url()))
        .map_err(|e| Refusal::new("url-invalid", format!("the server address cannot carry a sign-in: {e}")))?;
    start.query_pairs_mut().append_pair("challenge", &challenge).append_pair("returnTo", &format!("http://127.0.0.1:{port}/callback"));
    eprintln!("Sign in with {name} in a browser:\n\n  {start}\n");
    if open_browser {
        open(start.as_str());
    }
    eprintln!("waiting for the browser (up to {} minutes; Ctrl-C to give up)…", WAIT.as_secs() / 60);
    let query = wait_for_browser(&listener)?;
    let param = |wanted: &str| query.iter().find(|(k, _)| k == wanted).map(|(_, v)| v.clone());
    if let Some(code) = param("error") {
        let message = param("message").unwrap_or_else(|| "the sign-in was refused".into());
        return Err(Refusal::new(code, message));
    }
    let handoff = param("handoff").ok_or_else(|| Refusal::new("response-invalid", "the browser came back without a sign-in"))?;
    let body = serde_json::to_vec(&json!({ "handoff": handoff, "verifier": verifier.as_str() })).map_err(Refusal::internal)?;
    let answer = client.call_raw("federation.completeLogin", body)?;
    let token = Zeroizing::new(
        answer["token"].as_str().ok_or_else(|| Refusal::new("response-invalid", "the sign-in answer holds no token"))?.to_string(),
    );
    credentials.set(client.url(), &token);
    credentials.save()?;
    Ok(answer)
}

/// Try the desktop's opener; the address is printed either way.
fn open(address: &str) {
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    let _ = std::process::Command::new(opener)
        .arg(address)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Accept connections until one asks for `/callback`: its query pairs. Anything else (a
/// favicon) is answered 404 and the wait goes on.
fn wait_for_browser(listener: &TcpListener) -> Result<Vec<(String, String)>> {
    listener.set_nonblocking(true).map_err(Refusal::internal)?;
    let deadline = Instant::now() + WAIT;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Some(query) = answer(stream)? {
                    return Ok(query);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Refusal::new("oidc-timeout", "the browser did not come back within 5 minutes: run the command again"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(Refusal::new("listen-failed", format!("waiting for the browser failed: {}", e.kind()))),
        }
    }
}

/// Read one request's head; answer it. `Some(query)` for the callback.
fn answer(mut stream: TcpStream) -> Result<Option<Vec<(String, String)>>> {
    stream.set_nonblocking(false).map_err(Refusal::internal)?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(Refusal::internal)?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let target = text.lines().next().and_then(|line| line.split(' ').nth(1)).unwrap_or("/");
    let url = url::Url::parse(&format!("http://127.0.0.1{target}")).ok();
    let Some(url) = url.filter(|u| u.path() == "/callback") else {
        let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return Ok(None);
    };
    let query: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    let refused = query.iter().any(|(k, _)| k == "error");
    let body = if refused {
        "<!doctype html><title>Capstan</title><p>The sign-in was refused; the terminal says why.</p>"
    } else {
        "<!doctype html><title>Capstan</title><p>Signed in to Capstan. You can close this tab and go back to the terminal.</p>"
    };
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncache-control: no-store\r\nreferrer-policy: no-referrer\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
    Ok(Some(query))
}
