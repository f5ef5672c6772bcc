//! The listener's bounds on a real socket: connections with nothing in flight are closed
//! (silent, kept alive, HTTP/2 without a stream), an answer still being sent is not, and a
//! request carries the body budget the listener was given.

use crate::bodies::BodyBudget;
use crate::listener::{Bounds, TrustedProxies, serve};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long a test waits for what should happen at once (liveness, not speed).
const PATIENCE: Duration = Duration::from_secs(20);
const IDLE: Duration = Duration::from_millis(400);

/// A listener with a short idle timeout over a router with `/ok`, `/slow` (an answer sent over
/// about three idle timeouts) and `/budget` (the budget the request carries).
async fn listen() -> SocketAddr {
    let router = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                let chunks = futures::stream::unfold(0, |n| async move {
                    (n < 6).then_some(())?;
                    tokio::time::sleep(IDLE / 2).await;
                    Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(format!("chunk{n};"))), n + 1))
                });
                Body::from_stream(chunks)
            }),
        )
        .route(
            "/budget",
            get(|budget: Option<axum::Extension<BodyBudget>>| async move { budget.map_or("none".into(), |b| b.0.total().to_string()) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bounds = Bounds { idle_timeout: IDLE, ..Bounds::new(16, 123_456) };
    tokio::spawn(serve(listener, router, bounds, TrustedProxies::default(), std::future::pending::<()>()));
    addr
}

/// Read until the server closes the connection; what was read, and how long it took.
async fn until_closed(stream: &mut TcpStream) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut read = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut read)).await.expect("the server closes the connection").ok();
    (read, started.elapsed())
}

/// `GET path` on a connection that closes after it: the whole answer, and how long it took.
async fn fetch(addr: SocketAddr, path: &str) -> (String, Duration) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let (read, took) = until_closed(&mut stream).await;
    (String::from_utf8_lossy(&read).into_owned(), took)
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let addr = listen().await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (read, _) = until_closed(&mut silent).await;
    assert!(read.is_empty(), "nothing is answered to nothing");
    // a head begun and never finished is closed too (it never became a request)
    let mut partial = TcpStream::connect(addr).await.unwrap();
    partial.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    until_closed(&mut partial).await;
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_once_idle_and_served_until_then() {
    let addr = listen().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    for _ in 0..3 {
        stream.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut answer = [0u8; 256];
        let n = stream.read(&mut answer).await.unwrap();
        assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"), "served while in use");
        tokio::time::sleep(IDLE / 2).await;
    }
    let (read, _) = until_closed(&mut stream).await;
    assert!(read.is_empty());
}

#[tokio::test]
async fn an_http2_connection_without_a_stream_is_closed() {
    let addr = listen().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // the client preface and an empty SETTINGS frame, then no stream
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let (read, _) = until_closed(&mut stream).await;
    assert!(read.len() >= 9 && read[3] == 4, "the server spoke HTTP/2 (its SETTINGS) before closing: {read:?}");
}

#[tokio::test]
async fn an_answer_still_being_sent_is_not_idle() {
    let (text, took) = fetch(listen().await, "/slow").await;
    assert!(took > IDLE, "the answer took longer than the idle timeout ({took:?})");
    for n in 0..6 {
        assert!(text.contains(&format!("chunk{n};")), "every chunk arrived: {text}");
    }
}

#[tokio::test]
async fn every_request_carries_the_listeners_body_budget() {
    let (text, _) = fetch(listen().await, "/budget").await;
    assert!(text.ends_with("123456"), "{text}");
}
