//! The relay carries its cluster's node runtime sessions (docs/relays.md, "Carrying node
//! sessions"): nodes run `capstan-agent run --relay ws://ADDR:PORT` and open their runtime
//! session on the relay's `--nodes-listen` address exactly as they would on Capstan's socket;
//! the relay forwards the offer as `node-open` (the node's id and token: Capstan judges each node
//! by its own credential, the relay vouches for nothing), and then every frame both ways wrapped
//! as `{"type": "node", "node", "frame"}` on its one socket.
//!
//! A node's link ends when the node leaves (`node-close` is sent), when Capstan ends its session,
//! or with the relay's own session (the nodes reconnect, and find the relay again once it has).
//! One link per node: a node that connects again replaces its older link. A node that stops
//! reading is dropped rather than buffered for.

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use zeroize::Zeroizing;

/// How long a node has to send its offer, and then Capstan to answer its `node-open`.
const OPEN_TIMEOUT: Duration = Duration::from_secs(20);
/// Frames waiting for one node's link (Capstan pushes at most eight at once to a node).
const LINK_QUEUE: usize = 256;
/// The largest frame a node may send (Capstan's own frame limit applies upstream).
const MAX_FRAME: usize = 2 * 1024 * 1024;

/// What Capstan said to one node's link.
enum Down {
    Opened,
    Refused(Value),
    Frame(String),
    Close(Option<Value>),
}

struct Link {
    id: u64,
    down: mpsc::Sender<Down>,
}

/// The node links this relay carries, and the relay session they ride (while there is one).
pub struct Carrier {
    /// The socket protocol the relay speaks, named in each node's welcome.
    protocol: &'static str,
    links: Mutex<HashMap<String, Link>>,
    upstream: Mutex<Option<mpsc::Sender<String>>>,
    next: AtomicU64,
}

impl Carrier {
    /// A carrier of nodes speaking `protocol` (the relay's own).
    pub fn new(protocol: &'static str) -> Carrier {
        Carrier { protocol, links: Mutex::default(), upstream: Mutex::default(), next: AtomicU64::new(0) }
    }

    /// A relay session began: node frames go out through `upstream`.
    pub fn attach(&self, upstream: mpsc::Sender<String>) {
        *self.upstream.lock().expect("upstream") = Some(upstream);
    }

    /// The relay session ended: every node link ends with it (their nodes reconnect).
    pub fn detach(&self) {
        *self.upstream.lock().expect("upstream") = None;
        for (_, link) in self.links.lock().expect("links").drain() {
            let _ = link.down.try_send(Down::Close(None));
        }
    }

    /// How many nodes are carried now.
    #[cfg(test)]
    pub fn carried(&self) -> usize {
        self.links.lock().expect("links").len()
    }

    /// A frame from Capstan about a carried node (`node-opened`, `node-refused`, `node`,
    /// `node-close`).
    pub fn host_said(&self, frame: &Value) {
        let Some(node) = frame["node"].as_str() else { return };
        let down = match frame["type"].as_str().unwrap_or_default() {
            "node-opened" => Down::Opened,
            "node-refused" => Down::Refused(frame["error"].clone()),
            "node" => Down::Frame(frame["frame"].to_string()),
            _ => Down::Close(Some(frame["error"].clone()).filter(|e| !e.is_null())),
        };
        let mut links = self.links.lock().expect("links");
        let Some(link) = links.get(node) else { return };
        if link.down.try_send(down).is_err() {
            tracing::warn!(node, "a carried node stopped reading; its link is dropped");
            links.remove(node);
            if let Some(upstream) = self.upstream() {
                let _ = upstream.try_send(json!({ "type": "node-close", "node": node }).to_string());
            }
        }
    }

    fn upstream(&self) -> Option<mpsc::Sender<String>> {
        self.upstream.lock().expect("upstream").clone()
    }

    /// Keep `node`'s new link (an older one of the same node is closed).
    fn link(&self, node: &str) -> (u64, mpsc::Receiver<Down>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (down, receiver) = mpsc::channel(LINK_QUEUE);
        if let Some(older) = self.links.lock().expect("links").insert(node.to_string(), Link { id, down }) {
            let _ = older.down.try_send(Down::Close(Some(refusal("node-link-replaced", "a newer link of this node replaced this one"))));
        }
        (id, receiver)
    }

    /// Forget `node`'s link `id` if it is still the current one (answers whether it was).
    fn unlink(&self, node: &str, id: u64) -> bool {
        let mut links = self.links.lock().expect("links");
        if links.get(node).is_some_and(|l| l.id == id) {
            links.remove(node);
            return true;
        }
        false
    }
}

/// Accept nodes on `listener` until the process ends.
pub async fn listen(listener: TcpListener, carrier: Arc<Carrier>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let carrier = carrier.clone();
                tokio::spawn(async move {
                    if let Err(why) = serve_node(stream, &carrier).await {
                        tracing::info!(%peer, "a node's link ended: {why}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("accepting a node failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

async fn refuse(ws: &mut Ws, code: u16, error: Value) {
    let reason = error["code"].as_str().unwrap_or("refused").to_string();
    let _ = ws.send(Message::text(json!({ "type": "error", "error": error }).to_string())).await;
    let _ = ws.close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.into() })).await;
}

fn refusal(code: &str, message: &str) -> Value {
    json!({ "code": code, "message": message })
}

/// One node's link, from its offer to its end.
async fn serve_node(stream: TcpStream, carrier: &Carrier) -> Result<(), String> {
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME))
        .max_frame_size(Some(MAX_FRAME));
    let mut ws = tokio::time::timeout(OPEN_TIMEOUT, tokio_tungstenite::accept_async_with_config(stream, Some(config)))
        .await
        .map_err(|_| "no upgrade in time".to_string())?
        .map_err(|e| format!("the upgrade failed: {e}"))?;
    let offer = match tokio::time::timeout(OPEN_TIMEOUT, ws.next()).await {
        Ok(Some(Ok(Message::Text(text)))) => serde_json::from_str::<Value>(text.as_str()).unwrap_or(Value::Null),
        _ => return Err("no offer".into()),
    };
    let (Some("offer"), Some("agent"), Some(node), Some(token)) =
        (offer["type"].as_str(), offer["kind"].as_str(), offer["node"].as_str(), offer["token"].as_str())
    else {
        let message = "a node offers {type: offer, kind: agent, node, token} on a relay";
        refuse(&mut ws, 1008, refusal("offer-invalid", message)).await;
        return Err("the offer was not a node's".into());
    };
    let (node, token) = (node.to_string(), Zeroizing::new(token.to_string()));
    let Some(upstream) = carrier.upstream() else {
        refuse(&mut ws, 1013, refusal("relay-not-connected", "this relay has no session with Capstan right now; try again shortly")).await;
        return Err("no relay session".into());
    };
    let (id, mut down) = carrier.link(&node);
    let open = Zeroizing::new(json!({ "type": "node-open", "node": node, "token": token.as_str() }).to_string());
    if upstream.send(open.to_string()).await.is_err() {
        carrier.unlink(&node, id);
        refuse(&mut ws, 1013, refusal("relay-not-connected", "this relay's session with Capstan ended; try again shortly")).await;
        return Err("the relay session ended".into());
    }
    let outcome = link(&mut ws, carrier.protocol, &node, &upstream, &mut down).await;
    if carrier.unlink(&node, id) {
        let _ = upstream.try_send(json!({ "type": "node-close", "node": node }).to_string());
    }
    outcome
}

async fn link(
    ws: &mut Ws,
    protocol: &str,
    node: &str,
    upstream: &mpsc::Sender<String>,
    down: &mut mpsc::Receiver<Down>,
) -> Result<(), String> {
    match tokio::time::timeout(OPEN_TIMEOUT, down.recv()).await {
        Ok(Some(Down::Opened)) => {
            let welcome = json!({ "type": "welcome", "protocol": protocol, "kind": "agent", "node": { "nodeId": node }, "via": "relay" });
            ws.send(Message::text(welcome.to_string())).await.map_err(|e| e.to_string())?;
            tracing::info!(node, "carrying a node's runtime session");
        }
        Ok(Some(Down::Refused(error))) => {
            let close = if error["code"] == "unauthenticated" { 4003 } else { 1008 };
            refuse(ws, close, error).await;
            return Err("Capstan refused the node".into());
        }
        Ok(Some(_)) | Ok(None) => {
            refuse(ws, 1013, refusal("relay-not-connected", "this relay's session with Capstan ended; try again shortly")).await;
            return Err("the relay session ended".into());
        }
        Err(_) => {
            refuse(ws, 1013, refusal("relay-timeout", "Capstan did not answer the node's opening in time")).await;
            return Err("no answer to the node's opening".into());
        }
    }
    loop {
        tokio::select! {
            message = ws.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    let Ok(Value::Object(frame)) = serde_json::from_str::<Value>(text.as_str()) else {
                        refuse(ws, 1007, refusal("frame-malformed", "a frame is a JSON object with a \"type\"")).await;
                        return Err("a frame that is not JSON".into());
                    };
                    let wrapped = json!({ "type": "node", "node": node, "frame": frame }).to_string();
                    upstream.send(wrapped).await.map_err(|_| "the relay session ended".to_string())?;
                }
                Some(Ok(Message::Close(_))) | None => return Ok(()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("reading from the node failed: {e}")),
            },
            down = down.recv() => match down {
                Some(Down::Frame(text)) => ws.send(Message::text(text)).await.map_err(|e| e.to_string())?,
                Some(Down::Close(error)) => {
                    let error = error.unwrap_or_else(|| refusal("relay-not-connected", "the relay's session with Capstan ended; reconnect"));
                    refuse(ws, 1013, error).await;
                    return Ok(());
                }
                Some(Down::Opened | Down::Refused(_)) => {}
                None => return Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

    async fn start() -> (Arc<Carrier>, String) {
        let carrier = Arc::new(Carrier::new("capstan-socket/1"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/", listener.local_addr().unwrap());
        tokio::spawn(listen(listener, carrier.clone()));
        (carrier, url)
    }

    async fn node(url: &str, offer: Value) -> Client {
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        ws.send(Message::text(offer.to_string())).await.unwrap();
        ws
    }

    fn offer(node: &str) -> Value {
        json!({ "type": "offer", "kind": "agent", "protocols": ["capstan-socket/1"], "node": node, "token": "t0ken" })
    }

    async fn next(ws: &mut Client) -> Value {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a frame in time") {
                Some(Ok(Message::Text(text))) => return serde_json::from_str(text.as_str()).unwrap(),
                Some(Ok(Message::Close(frame))) => return json!({ "closed": frame.map(|f| u16::from(f.code)) }),
                Some(Ok(_)) => continue,
                other => return json!({ "ended": format!("{other:?}") }),
            }
        }
    }

    async fn up(upstream: &mut mpsc::Receiver<String>) -> Value {
        let text = tokio::time::timeout(Duration::from_secs(10), upstream.recv()).await.expect("upstream in time").unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[tokio::test]
    async fn nodes_ride_the_relay_session_each_on_its_own_link() {
        let (carrier, url) = start().await;
        // no relay session: a node is told to come back
        let mut early = node(&url, offer("node_a")).await;
        assert_eq!(next(&mut early).await["error"]["code"], "relay-not-connected");
        // a stranger's offer is refused
        let mut stranger = node(&url, json!({ "type": "offer", "kind": "dashboard" })).await;
        assert_eq!(next(&mut stranger).await["error"]["code"], "offer-invalid");

        let (sender, mut upstream) = mpsc::channel(64);
        carrier.attach(sender);
        let mut a = node(&url, offer("node_a")).await;
        assert_eq!(up(&mut upstream).await, json!({ "type": "node-open", "node": "node_a", "token": "t0ken" }));
        carrier.host_said(&json!({ "type": "node-opened", "node": "node_a" }));
        let welcome = next(&mut a).await;
        assert_eq!((welcome["type"].as_str(), welcome["node"]["nodeId"].as_str()), (Some("welcome"), Some("node_a")), "{welcome}");
        // Capstan refuses another node: its link closes with Capstan's refusal, the first stays
        let mut b = node(&url, offer("node_b")).await;
        assert_eq!(up(&mut upstream).await["node"], "node_b");
        carrier.host_said(&json!({ "type": "node-refused", "node": "node_b", "error": { "code": "relay-node-foreign", "message": "m" } }));
        assert_eq!(next(&mut b).await["error"]["code"], "relay-node-foreign");
        assert_eq!(next(&mut b).await["closed"], 1008);
        assert_eq!(up(&mut upstream).await, json!({ "type": "node-close", "node": "node_b" }), "what was opened is closed");

        // frames both ways, wrapped upstream and unwrapped to the node
        a.send(Message::text(json!({ "type": "call", "id": 1, "method": "runtime.registerSession" }).to_string())).await.unwrap();
        let wrapped = up(&mut upstream).await;
        assert_eq!(
            wrapped,
            json!({ "type": "node", "node": "node_a", "frame": { "type": "call", "id": 1, "method": "runtime.registerSession" } })
        );
        carrier.host_said(&json!({ "type": "node", "node": "node_a", "frame": { "type": "result", "id": 1, "result": { "ok": true } } }));
        assert_eq!(next(&mut a).await, json!({ "type": "result", "id": 1, "result": { "ok": true } }));

        // the same node connecting again replaces its older link
        let mut again = node(&url, offer("node_a")).await;
        assert_eq!(up(&mut upstream).await["type"], "node-open");
        assert_eq!(next(&mut a).await["error"]["code"], "node-link-replaced", "the older link is closed");
        assert_eq!(next(&mut a).await["closed"], 1013);
        carrier.host_said(&json!({ "type": "node-opened", "node": "node_a" }));
        assert_eq!(next(&mut again).await["type"], "welcome");
        assert_eq!(carrier.carried(), 1);
        // a node that leaves is closed upstream
        again.close(None).await.unwrap();
        assert_eq!(up(&mut upstream).await, json!({ "type": "node-close", "node": "node_a" }));

        // the relay's session ending ends every link
        let mut c = node(&url, offer("node_c")).await;
        up(&mut upstream).await;
        carrier.host_said(&json!({ "type": "node-opened", "node": "node_c" }));
        assert_eq!(next(&mut c).await["type"], "welcome");
        carrier.detach();
        assert_eq!(next(&mut c).await["error"]["code"], "relay-not-connected");
        assert_eq!(carrier.carried(), 0);
    }
}
