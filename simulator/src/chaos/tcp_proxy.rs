//! The fault-injecting TCP proxy on a node's replication path: peers pull
//! from the address the node advertises (`--advertise-grpc-addr`), which is
//! this proxy; it forwards to the node's real gRPC port with a WAN delay.
//!
//! Every chaos node has its own loopback IP and binds its outgoing pulls to it
//! (`--peer-source-ip`), so the source IP of an accepted connection names the
//! puller `a`; the proxy of node `b` applies the rule of the directed link
//! `a -> b` from [`Links`].
//!
//! Invariant: while `a -> b` is cut, no byte from `a` reaches `b` through the
//! proxy: new connections from `a` are closed at once and open ones are
//! dropped when the rule changes. Connections from an unknown source (not a
//! chaos node) are forwarded without a rule or a delay.
//!
//! The client proxy ([`spawn_client_proxy`]) stands between a node and its
//! clients. While its cut flag is set, requests still reach the node but
//! the first byte of any answer closes the connection instead: the add was
//! applied and its client does not know (cut off mid-add).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::links::Links;

/// What every proxy of a run shares: the rule table, who is who, and the
/// delay of each directed link.
#[derive(Clone)]
pub struct ProxyRules {
    /// The cut links.
    pub links: Links,
    /// Node index of each node's loopback IP.
    pub node_of_ip: Arc<HashMap<IpAddr, usize>>,
    /// One-way delay between two nodes (`delays[a][b]`).
    pub delays: Arc<Vec<Vec<Duration>>>,
}

impl ProxyRules {
    /// The node behind a source address, if it is one of ours.
    pub fn node_of(&self, ip: IpAddr) -> Option<usize> {
        self.node_of_ip.get(&ip).copied()
    }

    /// The delay from `from` to `to` (zero for an unknown source).
    pub fn delay(&self, from: Option<usize>, to: usize) -> Duration {
        from.map(|from| self.delays[from][to]).unwrap_or_default()
    }
}

/// Stops a proxy.
pub struct TcpProxyHandle {
    task: JoinHandle<()>,
}

impl Drop for TcpProxyHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the proxy of node `me` on `listen`, forwarding to `target`.
pub async fn spawn_tcp_proxy(
    listen: &str,
    target: String,
    me: usize,
    rules: ProxyRules,
) -> anyhow::Result<TcpProxyHandle> {
    let listener = TcpListener::bind(listen).await?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((inbound, source)) = listener.accept().await else {
                continue;
            };
            let from = rules.node_of(source.ip());
            if from.is_some_and(|from| rules.links.is_cut(from, me)) {
                drop(inbound);
                continue;
            }
            let Ok(outbound) = TcpStream::connect(&target).await else {
                continue;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let delay = rules.delay(from, me);
            tokio::spawn(relay(inbound, outbound, from, me, rules.clone(), delay));
        }
    });
    Ok(TcpProxyHandle { task })
}

/// Starts the client proxy of a node on `listen`, forwarding to `target`;
/// `cut` says whether answers are being dropped, `dropped` counts the
/// connections closed on an answer.
pub async fn spawn_client_proxy(
    listen: &str,
    target: String,
    cut: watch::Receiver<bool>,
    dropped: Arc<AtomicU64>,
) -> anyhow::Result<TcpProxyHandle> {
    let listener = TcpListener::bind(listen).await?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else {
                continue;
            };
            let Ok(outbound) = TcpStream::connect(&target).await else {
                continue;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            let up = pump(in_read, out_write, Duration::ZERO);
            let down = answers_unless_cut(out_read, in_write, cut.clone(), dropped.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = up => {}
                    _ = down => {}
                }
            });
        }
    });
    Ok(TcpProxyHandle { task })
}

/// Copies a node's answers to its client, until the cut flag is set when
/// an answer arrives: then the answer is dropped with the connection.
async fn answers_unless_cut(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    cut: watch::Receiver<bool>,
    dropped: Arc<AtomicU64>,
) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        let n = from.read(&mut buffer).await?;
        if n == 0 {
            return Ok(());
        }
        if *cut.borrow() {
            dropped.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        to.write_all(&buffer[..n]).await?;
    }
}

async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    from: Option<usize>,
    me: usize,
    rules: ProxyRules,
    delay: Duration,
) {
    let mut changes = rules.links.subscribe();
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let up = pump(in_read, out_write, delay);
    let down = pump(out_read, in_write, delay);
    let cut = async move {
        loop {
            if changes.changed().await.is_err() {
                return std::future::pending::<()>().await;
            }
            if from.is_some_and(|from| rules.links.is_cut(from, me)) {
                return;
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut => {}
    }
}

/// Copies one direction of a connection, each read held for `delay`, until
/// end of stream or an error.
async fn pump(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    delay: Duration,
) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        let n = from.read(&mut buffer).await?;
        if n == 0 {
            return Ok(());
        }
        pause(delay).await;
        to.write_all(&buffer[..n]).await?;
    }
}

async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}
