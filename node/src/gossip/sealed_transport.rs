//! Chitchat over sealed UDP datagrams ([`super::seal`]): a chitchat
//! `Transport` whose socket seals every datagram it sends and drops, counts
//! and logs (once a minute per sender) every one it receives that does not
//! open under the cluster's gossip keys. Nothing of an unsealed datagram
//! reaches chitchat, so a process without the key is never a member and
//! publishes nothing.
//!
//! chitchat 0.13 keeps its wire encoding private (`ChitchatEnvelope`'s
//! `serialize` and `deserialize` are crate-internal), so the socket uses a
//! chitchat `UdpSocket` on loopback as its codec: an envelope to send goes
//! through it to a mirror socket, which hands over the bytes to seal; an
//! opened datagram goes from the mirror to it, which decodes the envelope.
//! One datagram at a time is in the codec; a receive that chitchat cancels
//! (its loop selects over receives and timers) resumes where it stopped,
//! and a decoded envelope is matched to its sender by that order. Both
//! codec sockets are bound to 127.0.0.1 and take datagrams from each other
//! only (others are dropped).
//!
//! Turning sealing on in a running cluster (`--gossip-accept-plain`): such
//! a node also takes plain datagrams, and answers a sender it heard in
//! plain within [`PLAIN_PEER_MEMORY`] in plain, so nodes not yet restarted
//! with the key keep gossiping with it; once every node seals, restart them
//! without the flag.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use chitchat::ChitchatEnvelope;

use super::seal::{GossipKeys, Refused};
use crate::metrics::Metrics;
use crate::security::identity::RefusalLog;

/// The largest datagram read.
const MAX_DATAGRAM: usize = 65_535;
/// How long the codec may take to decode one opened datagram before it is
/// taken as dropped (chitchat drops a datagram it cannot decode without a
/// word to the caller).
const CODEC_WAIT: Duration = Duration::from_millis(200);
/// How long a peer heard in plain is answered in plain (with
/// `--gossip-accept-plain`).
pub const PLAIN_PEER_MEMORY: Duration = Duration::from_secs(60);
/// The most peers heard in plain remembered at once.
const MAX_PLAIN_PEERS: usize = 4096;

/// See the module documentation.
pub struct SealedTransport {
    keys: Arc<Mutex<GossipKeys>>,
    metrics: Arc<Metrics>,
    accept_plain: bool,
}

impl SealedTransport {
    /// Seals and opens with `keys`, counting refusals in `metrics`; with
    /// `accept_plain`, also takes (and answers) plain gossip.
    pub fn new(
        keys: Arc<Mutex<GossipKeys>>,
        metrics: Arc<Metrics>,
        accept_plain: bool,
    ) -> SealedTransport {
        SealedTransport {
            keys,
            metrics,
            accept_plain,
        }
    }
}

#[async_trait]
impl Transport for SealedTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let public = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .map_err(|error| {
                anyhow::anyhow!("failed to bind to {listen_addr}/UDP for gossip: {error}")
            })?;
        let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
        let codec = chitchat::transport::UdpSocket::open(loopback).await?;
        let mirror = tokio::net::UdpSocket::bind(loopback).await?;
        let codec_addr = codec.local_addr()?;
        let mirror_addr = mirror.local_addr()?;
        Ok(Box::new(SealedSocket {
            public,
            codec,
            codec_addr,
            mirror,
            mirror_addr,
            in_codec: VecDeque::new(),
            accept_plain: self.accept_plain,
            plain_peers: HashMap::new(),
            keys: self.keys.clone(),
            metrics: self.metrics.clone(),
            refusal_log: RefusalLog::default(),
            buffer: vec![0; MAX_DATAGRAM],
        }))
    }
}

struct SealedSocket {
    /// The gossip port: sealed datagrams only.
    public: tokio::net::UdpSocket,
    /// chitchat's encoder and decoder, on loopback.
    codec: chitchat::transport::UdpSocket,
    codec_addr: SocketAddr,
    /// The codec's other end, on loopback.
    mirror: tokio::net::UdpSocket,
    mirror_addr: SocketAddr,
    /// Senders of the opened datagrams handed to the codec and not yet
    /// decoded, with their sealed sizes (at most one in practice).
    in_codec: VecDeque<(SocketAddr, usize)>,
    /// Takes plain gossip too (`--gossip-accept-plain`).
    accept_plain: bool,
    /// Peers heard in plain, and when (answered in plain meanwhile).
    plain_peers: HashMap<SocketAddr, Instant>,
    keys: Arc<Mutex<GossipKeys>>,
    metrics: Arc<Metrics>,
    refusal_log: RefusalLog,
    buffer: Vec<u8>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

impl SealedSocket {
    /// Remembers that `peer` gossips in plain (bounded: the oldest go
    /// first).
    fn note_plain_peer(&mut self, peer: SocketAddr) {
        if self.plain_peers.len() >= MAX_PLAIN_PEERS && !self.plain_peers.contains_key(&peer) {
            self.plain_peers
                .retain(|_, at| at.elapsed() < PLAIN_PEER_MEMORY);
            if self.plain_peers.len() >= MAX_PLAIN_PEERS {
                self.plain_peers.clear();
            }
        }
        self.plain_peers.insert(peer, Instant::now());
    }

    /// The plain bytes of `envelope`, as chitchat encodes them.
    async fn encode(&mut self, envelope: ChitchatEnvelope) -> anyhow::Result<Vec<u8>> {
        self.codec.send(self.mirror_addr, envelope).await?;
        loop {
            let (size, from) = self.mirror.recv_from(&mut self.buffer).await?;
            if from == self.codec_addr {
                return Ok(self.buffer[..size].to_vec());
            }
        }
    }

    /// The envelope of the datagram in the codec, if it decodes in time.
    async fn decode(&mut self) -> anyhow::Result<Option<RecvOutcome>> {
        let Some(&(from_addr, num_bytes_received)) = self.in_codec.front() else {
            return Ok(None);
        };
        let decoded = loop {
            match tokio::time::timeout(CODEC_WAIT, self.codec.recv()).await {
                Ok(outcome) => {
                    let outcome = outcome?;
                    if outcome.from_addr == self.mirror_addr {
                        break Some(outcome.envelope);
                    }
                }
                Err(_) => break None,
            }
        };
        self.in_codec.pop_front();
        Ok(decoded.map(|envelope| RecvOutcome {
            from_addr,
            envelope,
            num_bytes_received,
        }))
    }
}

#[async_trait]
impl Socket for SealedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.public.local_addr()?)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let plain = self.encode(envelope).await?;
        let heard_plain = self
            .plain_peers
            .get(&to)
            .is_some_and(|at| at.elapsed() < PLAIN_PEER_MEMORY);
        let datagram = if heard_plain {
            plain
        } else {
            let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.seal(now_ms(), rand::random(), &plain)
        };
        let num_bytes_sent = self.public.send_to(&datagram, to).await?;
        Ok(SendOutcome { num_bytes_sent })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            // A receive cancelled while the codec decoded resumes there.
            if !self.in_codec.is_empty() {
                if let Some(outcome) = self.decode().await? {
                    return Ok(outcome);
                }
                self.metrics.refused("gossip_undecodable");
                continue;
            }
            let (size, from) = match self.public.recv_from(&mut self.buffer).await {
                Ok(received) => received,
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::OutOfMemory
                    ) =>
                {
                    continue
                }
                Err(error) => return Err(error.into()),
            };
            let opened = {
                let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
                keys.open(now_ms(), &self.buffer[..size])
            };
            let opened = match opened {
                Err(Refused::NotSealed) if self.accept_plain => {
                    self.note_plain_peer(from);
                    Ok(self.buffer[..size].to_vec())
                }
                other => other,
            };
            match opened {
                Ok(plain) => {
                    self.mirror.send_to(&plain, self.codec_addr).await?;
                    self.in_codec.push_back((from, size));
                }
                Err(refused) => {
                    self.metrics.refused(refused.reason());
                    if self
                        .refusal_log
                        .should_log(Some(from.ip()), refused.reason())
                    {
                        tracing::warn!(
                            %from,
                            reason = refused.reason(),
                            "gossip datagram refused: it is not sealed under this cluster's \
                             gossip key (--gossip-key-file); a node without the key is not a \
                             member (logged once a minute per sender)"
                        );
                    }
                }
            }
        }
    }
}
