//! The fault-injecting UDP proxy on a node's gossip path: peers gossip to the
//! address the node advertises (`--advertise-gossip-addr`), which is this
//! proxy. Chitchat's socket is bound to the node's own loopback IP, so the
//! source of a datagram names the sender `a`.
//!
//! For each source address the proxy of node `b` opens one upstream socket
//! and forwards `a`'s datagrams from it to `b`'s real gossip port; `b`
//! answers to that socket, and the proxy relays the answer to `a` from its
//! listening address. A datagram `a -> b` is dropped while the directed link
//! `a -> b` is cut, an answer `b -> a` while `b -> a` is cut; both carry the
//! link's WAN delay.
//!
//! Invariant: while a link is cut, no datagram crosses it in that direction.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

use super::tcp_proxy::ProxyRules;

/// Stops a proxy (and its upstream sockets).
pub struct UdpProxyHandle {
    task: JoinHandle<()>,
}

impl Drop for UdpProxyHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Stops an upstream socket's relay when the proxy stops.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the gossip proxy of node `me` on `listen`, forwarding to `target`.
pub async fn spawn_udp_proxy(
    listen: &str,
    target: SocketAddr,
    me: usize,
    rules: ProxyRules,
) -> anyhow::Result<UdpProxyHandle> {
    let front = Arc::new(UdpSocket::bind(listen).await?);
    let task = tokio::spawn(async move {
        let mut upstreams: HashMap<SocketAddr, (Arc<UdpSocket>, AbortOnDrop)> = HashMap::new();
        let mut buffer = vec![0u8; 64 << 10];
        loop {
            let Ok((len, source)) = front.recv_from(&mut buffer).await else {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            };
            let from = rules.node_of(source.ip());
            if from.is_some_and(|from| rules.links.is_cut(from, me)) {
                continue;
            }
            if let Entry::Vacant(vacant) = upstreams.entry(source) {
                let Ok(socket) = UdpSocket::bind("127.0.0.1:0").await else {
                    continue;
                };
                let socket = Arc::new(socket);
                let answers = tokio::spawn(relay_answers(
                    socket.clone(),
                    front.clone(),
                    source,
                    from,
                    me,
                    rules.clone(),
                ));
                vacant.insert((socket, AbortOnDrop(answers)));
            }
            let upstream = upstreams[&source].0.clone();
            let datagram = buffer[..len].to_vec();
            let delay = rules.delay(from, me);
            tokio::spawn(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let _ = upstream.send_to(&datagram, target).await;
            });
        }
    });
    Ok(UdpProxyHandle { task })
}

/// Relays what the node answers on `upstream` back to `source`.
async fn relay_answers(
    upstream: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    source: SocketAddr,
    from: Option<usize>,
    me: usize,
    rules: ProxyRules,
) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let Ok(len) = upstream.recv(&mut buffer).await else {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            continue;
        };
        if from.is_some_and(|from| rules.links.is_cut(me, from)) {
            continue;
        }
        let datagram = buffer[..len].to_vec();
        let delay = rules.delay(Some(me), from.unwrap_or(me));
        let front = front.clone();
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let _ = front.send_to(&datagram, source).await;
        });
    }
}
