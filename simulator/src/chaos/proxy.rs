//! A small fault-injecting TCP proxy on a node's replication path: peers pull
//! from the address the node advertises (`--advertise-grpc-addr`), which is
//! this proxy; the proxy forwards to the node's real gRPC port, adds a WAN
//! delay, and can cut the link (existing connections are dropped and new
//! ones refused) until it is healed.
//!
//! Invariant: while cut, no byte reaches the node through the proxy, so no
//! peer can pull from it (a one-way partition: the node can still pull).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Controls one proxy.
#[derive(Clone)]
pub struct ProxyHandle {
    cut: Arc<AtomicBool>,
    generation_tx: Arc<watch::Sender<u64>>,
    delay_ms: Arc<AtomicU64>,
}

impl ProxyHandle {
    /// Cuts or heals the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            self.generation_tx
                .send_modify(|generation| *generation += 1);
        }
    }

    /// Sets the one-way delay added to every forwarded read.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }
}

/// Starts a proxy from `listen` to `target`.
pub async fn spawn_proxy(listen: &str, target: String) -> anyhow::Result<ProxyHandle> {
    let listener = TcpListener::bind(listen).await?;
    let (generation_tx, _) = watch::channel(0u64);
    let handle = ProxyHandle {
        cut: Arc::new(AtomicBool::new(false)),
        generation_tx: Arc::new(generation_tx),
        delay_ms: Arc::new(AtomicU64::new(0)),
    };
    let accept = handle.clone();
    tokio::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else {
                continue;
            };
            if accept.cut.load(Ordering::SeqCst) {
                drop(inbound);
                continue;
            }
            let Ok(outbound) = TcpStream::connect(&target).await else {
                continue;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let generation = accept.generation_tx.subscribe();
            let delay = accept.delay_ms.clone();
            tokio::spawn(relay(inbound, outbound, generation, delay));
        }
    });
    Ok(handle)
}

async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    mut generation: watch::Receiver<u64>,
    delay_ms: Arc<AtomicU64>,
) {
    let (mut in_read, mut in_write) = inbound.into_split();
    let (mut out_read, mut out_write) = outbound.into_split();
    let up_delay = delay_ms.clone();
    let up = async move {
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            let n = in_read.read(&mut buffer).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            pause(&up_delay).await;
            out_write.write_all(&buffer[..n]).await?;
        }
    };
    let down = async move {
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            let n = out_read.read(&mut buffer).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            pause(&delay_ms).await;
            in_write.write_all(&buffer[..n]).await?;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = generation.changed() => {}
    }
}

async fn pause(delay_ms: &AtomicU64) {
    let ms = delay_ms.load(Ordering::Relaxed);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
