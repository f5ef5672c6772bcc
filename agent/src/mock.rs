//! Test peers: a tiny HTTP/1.1 server for the unit tests (each connection carries one request,
//! which a handler answers with status and JSON — or raw bytes, [`Mock::start_raw`] — or drops
//! unanswered: `None`, a lost answer),
//! and a WebSocket host speaking `/api/v1/socket` as a script says ([`SocketMock`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A request as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The method (`GET`, `PUT`, …).
    pub method: String,
    /// The path.
    pub path: String,
    /// Headers, names lowercased.
    pub headers: HashMap<String, String>,
    /// The body, as JSON (`null` when it is not).
    pub body: serde_json::Value,
    /// The body's bytes.
    pub raw: Vec<u8>,
}

/// An answer: status, content type, body.
pub type RawAnswer = (u16, &'static str, Vec<u8>);

type Handler = Box<dyn Fn(&Received, usize) -> Option<RawAnswer> + Send + Sync>;

/// The server: its origin and what it received.
pub struct Mock {
    /// `http://127.0.0.1:<port>`.
    pub origin: String,
    /// Every request, in order.
    pub received: Arc<Mutex<Vec<Received>>>,
}

impl Mock {
    /// Start serving with `handler(request, index)`.
    pub async fn start(handler: impl Fn(&Received, usize) -> Option<(u16, serde_json::Value)> + Send + Sync + 'static) -> Mock {
        Mock::start_raw(move |request, index| {
            handler(request, index).map(|(status, answer)| (status, "application/json", answer.to_string().into_bytes()))
        })
        .await
    }

    /// Start serving with `handler(request, index)` answering raw bytes.
    pub async fn start_raw(handler: impl Fn(&Received, usize) -> Option<RawAnswer> + Send + Sync + 'static) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(Box::new(handler));
        let log = received.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                let handler = handler.clone();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let (head_end, content_length) = loop {
                        let n = stream.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buffer[..at]).to_string();
                            let length = head
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap())
                                })
                                .unwrap_or(0);
                            break (at + 4, length);
                        }
                    };
                    while buffer.len() < head_end + content_length {
                        let n = stream.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                    }
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
                    let mut lines = head.lines();
                    let mut request_line = lines.next().unwrap().split(' ');
                    let method = request_line.next().unwrap().to_string();
                    let path = request_line.next().unwrap().to_string();
                    let headers = lines
                        .filter_map(|l| l.split_once(':'))
                        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                        .collect();
                    let raw = buffer[head_end..head_end + content_length].to_vec();
                    let body = serde_json::from_slice(&raw).unwrap_or(serde_json::Value::Null);
                    let request = Received { method, path, headers, body, raw };
                    let index = {
                        let mut log = log.lock().unwrap();
                        log.push(request.clone());
                        log.len() - 1
                    };
                    let Some((status, content_type, body)) = handler(&request, index) else {
                        return; // dropped: the answer is lost
                    };
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(&body).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Mock { origin, received }
    }

    /// What was received so far.
    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A state directory holding the credential of `node_1` of `cls_1`, enrolled at `origin`.
pub fn enrolled(origin: &str) -> (tempfile::TempDir, crate::state::StateDir, crate::state::Credential) {
    let root = tempfile::tempdir().unwrap();
    let dir = crate::state::StateDir::new(root.path().join("state"));
    dir.create().unwrap();
    let credential = crate::state::Credential {
        origin: origin.into(),
        node_id: "node_1".into(),
        cluster_id: "cls_1".into(),
        token: crate::token::Token::draw().unwrap(),
        credential_generation: 1,
        pending_token: None,
        pending_mutation_id: None,
        dev_host: false,
    };
    dir.write_new_credential(&credential).unwrap();
    (root, dir, credential)
}

/// One accepted socket of [`SocketMock`], as the host's side sees it.
pub struct Peer {
    /// The path the upgrade asked for.
    pub path: String,
    ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
}

impl Peer {
    /// The next text frame, as JSON (pings and pongs skipped); `None` when the relay closed
    /// or dropped the socket. Panics after 10 s of nothing.
    pub async fn recv(&mut self) -> Option<serde_json::Value> {
        use futures::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        loop {
            let next =
                tokio::time::timeout(std::time::Duration::from_secs(10), self.ws.next()).await.expect("the relay sent nothing for 10 s");
            match next {
                Some(Ok(Message::Text(text))) => return Some(serde_json::from_str(text.as_str()).unwrap()),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                _ => return None,
            }
        }
    }

    /// Send `frame` as a text frame.
    pub async fn send(&mut self, frame: serde_json::Value) {
        use futures::SinkExt;
        let _ = self.ws.send(tokio_tungstenite::tungstenite::Message::text(frame.to_string())).await;
    }

    /// Close with `code` and its name as the reason.
    pub async fn close(mut self, code: u16, reason: &str) {
        use tokio_tungstenite::tungstenite::protocol::CloseFrame;
        let frame = CloseFrame { code: code.into(), reason: reason.to_string().into() };
        let _ = self.ws.close(Some(frame)).await;
    }

    /// Welcome a relay session of `cluster_id`.
    pub async fn welcome(&mut self, cluster_id: &str) {
        self.send(serde_json::json!({
            "type": "welcome", "protocol": "capstan-socket/1", "sessionId": "socket_1", "kind": "relay",
            "identity": {"userId": "user_m", "username": "cluster-edge", "kind": "machine", "admin": false},
            "relay": {"clusterId": cluster_id, "credential": {"id": "relaycred_1", "generation": 2, "digest": "c0"}},
            "limits": {"maxFrameBytes": 1064960, "maxInFlight": 16, "outboundQueue": 64, "pingIntervalMs": 20000, "silenceTimeoutMs": 60000}
        }))
        .await;
    }

    /// Answer the call `call` with `result`.
    pub async fn result(&mut self, call: &serde_json::Value, result: serde_json::Value) {
        self.send(serde_json::json!({"type": "result", "id": call["id"], "requestId": "req_1", "result": result})).await;
    }

    /// Keep the socket open until the relay goes.
    pub async fn hold(mut self) {
        use futures::StreamExt;
        while let Some(Ok(_)) = self.ws.next().await {}
    }
}

/// A WebSocket host: each accepted socket is handed to the script with its index (0 first).
pub struct SocketMock {
    /// `http://127.0.0.1:<port>`.
    pub origin: String,
}

impl SocketMock {
    /// Start accepting; `session(peer, index)` plays the host's side of each socket.
    #[allow(clippy::result_large_err)] // tungstenite's handshake callback answers its own error type
    pub async fn start<F, Fut>(session: F) -> SocketMock
    where
        F: Fn(Peer, usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut index = 0;
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let path = Arc::new(Mutex::new(String::new()));
                let seen = path.clone();
                let callback = move |request: &Request, response: Response| {
                    *seen.lock().unwrap() = request.uri().path().to_string();
                    Ok(response)
                };
                let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else { continue };
                let path = path.lock().unwrap().clone();
                tokio::spawn(session(Peer { path, ws }, index));
                index += 1;
            }
        });
        SocketMock { origin }
    }
}
