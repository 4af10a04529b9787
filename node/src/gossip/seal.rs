//! Sealed gossip datagrams: each chitchat datagram is encrypted and
//! authenticated with ChaCha20-Poly1305 under a cluster key
//! (`--gossip-key-file`), so a process without the key can neither join
//! membership nor publish anything (lifecycle changes, fold reports), nor
//! read what the nodes gossip. This module is the pure part: the key file,
//! [`seal`] and [`GossipKeys::open`], with time and randomness as inputs;
//! [`super::sealed_transport`] puts it under chitchat.
//!
//! A sealed datagram is `"TG1"`, the sealing key's 4-byte id (the first
//! bytes of its SHA-256), a 12-byte nonce (the sender's clock in ms, 8
//! bytes, then 4 random bytes) and the ciphertext with its 16-byte tag;
//! the header is the AEAD's associated data. Invariants:
//! - a datagram opens only under a key of the file, unaltered;
//! - a datagram opens at most once (a replay inside the window is refused)
//!   and only while its clock stamp is within [`MAX_SKEW_MS`] of the
//!   receiver's clock (an older replay is refused by its stamp);
//! - the replay memory is bounded ([`MAX_REMEMBERED`]): it holds datagrams
//!   that opened only, so nothing without the key grows it.
//!
//! Rotation without downtime: the key file lists keys one per line, the
//! first seals and every one opens. Add the new key as the second line on
//! every node, then make it the first on every node, then remove the old.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::hex::from_hex;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

/// The first bytes of every sealed datagram.
pub const MAGIC: &[u8; 3] = b"TG1";
/// Header bytes: magic, key id, nonce.
pub const HEADER_BYTES: usize = 3 + 4 + 12;
/// Bytes a seal adds to a datagram: the header and the tag.
pub const OVERHEAD_BYTES: usize = HEADER_BYTES + 16;
/// How far a datagram's clock stamp may be from the receiver's clock.
pub const MAX_SKEW_MS: u64 = 5 * 60 * 1000;
/// The most opened datagrams remembered against replays.
pub const MAX_REMEMBERED: usize = 200_000;

/// One key of the file.
struct GossipKey {
    id: [u8; 4],
    key: LessSafeKey,
}

/// The cluster's gossip keys: the first seals, every one opens; plus the
/// memory of opened datagrams against replays.
pub struct GossipKeys {
    keys: Vec<GossipKey>,
    /// Nonces opened, by clock stamp (for expiry) and as a set.
    seen_by_stamp: BTreeMap<u64, Vec<[u8; 12]>>,
    seen: HashSet<[u8; 12]>,
}

/// Why a key file was refused; each names `--gossip-key-file`.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("--gossip-key-file {path}: cannot read the file: {error}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the system said.
        error: std::io::Error,
    },
    /// A line that is not a key.
    #[error("--gossip-key-file {path}: line {line} is not a key: give 64 hexadecimal characters (32 random bytes, e.g. `openssl rand -hex 32`)")]
    NotAKey {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
    },
    /// No key at all.
    #[error("--gossip-key-file {path}: the file holds no key: give one line of 64 hexadecimal characters (`openssl rand -hex 32`)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Why a datagram did not open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a sealed datagram (no magic, too short): a node without a key,
    /// or anything else.
    NotSealed,
    /// Sealed under a key this node does not have.
    UnknownKey,
    /// Altered, or sealed under another key with the same id.
    Forged,
    /// Its clock stamp is too far from this node's clock.
    Stale,
    /// Opened before.
    Replayed,
}

impl Refused {
    /// The `reason` label of `tally_refused_messages_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::NotSealed => "gossip_not_sealed",
            Refused::UnknownKey => "gossip_unknown_key",
            Refused::Forged => "gossip_forged",
            Refused::Stale => "gossip_stale",
            Refused::Replayed => "gossip_replayed",
        }
    }
}

impl GossipKeys {
    /// Reads the key file: one key per line (64 hex characters), `#`
    /// comments and blank lines skipped.
    pub fn load(path: &Path) -> Result<GossipKeys, KeyFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| KeyFileError::Unreadable {
            path: path.to_path_buf(),
            error,
        })?;
        let mut keys = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bytes = from_hex(line)
                .filter(|bytes| bytes.len() == 32)
                .ok_or_else(|| KeyFileError::NotAKey {
                    path: path.to_path_buf(),
                    line: number + 1,
                })?;
            keys.push(bytes);
        }
        if keys.is_empty() {
            return Err(KeyFileError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(GossipKeys::new(&keys))
    }

    /// Keys from their bytes; the first seals.
    pub fn new(keys: &[Vec<u8>]) -> GossipKeys {
        let keys = keys
            .iter()
            .map(|bytes| {
                let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
                let mut id = [0; 4];
                id.copy_from_slice(&digest.as_ref()[..4]);
                GossipKey {
                    id,
                    key: LessSafeKey::new(
                        UnboundKey::new(&CHACHA20_POLY1305, bytes).expect("a 32-byte key"),
                    ),
                }
            })
            .collect();
        GossipKeys {
            keys,
            seen_by_stamp: BTreeMap::new(),
            seen: HashSet::new(),
        }
    }

    /// How many keys open datagrams.
    pub fn count(&self) -> usize {
        self.keys.len()
    }

    /// Seals `plain` under the first key, stamped `now_ms`, with `random`
    /// as the nonce's last bytes.
    pub fn seal(&self, now_ms: u64, random: [u8; 4], plain: &[u8]) -> Vec<u8> {
        let key = &self.keys[0];
        let mut nonce = [0; 12];
        nonce[..8].copy_from_slice(&now_ms.to_be_bytes());
        nonce[8..].copy_from_slice(&random);
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&key.id);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&out[..HEADER_BYTES]),
                &mut body,
            )
            .expect("sealing a datagram cannot fail");
        out.extend_from_slice(&body);
        out
    }

    /// Opens a sealed datagram received at `now_ms`, once.
    pub fn open(&mut self, now_ms: u64, datagram: &[u8]) -> Result<Vec<u8>, Refused> {
        if datagram.len() < OVERHEAD_BYTES || &datagram[..3] != MAGIC {
            return Err(Refused::NotSealed);
        }
        let (header, body) = datagram.split_at(HEADER_BYTES);
        let key = self
            .keys
            .iter()
            .find(|key| key.id == header[3..7])
            .ok_or(Refused::UnknownKey)?;
        let mut nonce = [0; 12];
        nonce.copy_from_slice(&header[7..19]);
        let mut plain = body.to_vec();
        let opened = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(header),
                &mut plain,
            )
            .map_err(|_| Refused::Forged)?
            .len();
        plain.truncate(opened);
        let stamp = u64::from_be_bytes(nonce[..8].try_into().expect("8 bytes"));
        if stamp.abs_diff(now_ms) > MAX_SKEW_MS {
            return Err(Refused::Stale);
        }
        self.forget_before(now_ms.saturating_sub(MAX_SKEW_MS));
        if self.seen.contains(&nonce) {
            return Err(Refused::Replayed);
        }
        if self.seen.len() >= MAX_REMEMBERED {
            // More datagrams in the window than it can remember: the
            // oldest stamps go first (a replay of one of them is then
            // refused by its stamp soon after).
            if let Some((_, nonces)) = self.seen_by_stamp.pop_first() {
                for old in nonces {
                    self.seen.remove(&old);
                }
            }
        }
        self.seen.insert(nonce);
        self.seen_by_stamp.entry(stamp).or_default().push(nonce);
        Ok(plain)
    }

    fn forget_before(&mut self, oldest_ms: u64) {
        while let Some(entry) = self.seen_by_stamp.first_entry() {
            if *entry.key() >= oldest_ms {
                break;
            }
            for nonce in entry.remove() {
                self.seen.remove(&nonce);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn keys(seeds: &[u8]) -> GossipKeys {
        GossipKeys::new(&seeds.iter().map(|seed| vec![*seed; 32]).collect::<Vec<_>>())
    }

    #[test]
    fn a_sealed_datagram_opens_once_under_the_same_key_and_never_otherwise() {
        let sender = keys(&[1]);
        let mut receiver = keys(&[1]);
        let sealed = sender.seal(NOW, [9, 9, 9, 9], b"syn");
        assert_eq!(sealed.len(), 3 + OVERHEAD_BYTES);
        assert!(
            !sealed.windows(3).any(|w| w == b"syn"),
            "the text is encrypted"
        );
        assert_eq!(receiver.open(NOW + 5, &sealed).unwrap(), b"syn");
        assert_eq!(receiver.open(NOW + 6, &sealed), Err(Refused::Replayed));
        let mut other = keys(&[2]);
        assert_eq!(other.open(NOW, &sealed), Err(Refused::UnknownKey));
        let mut altered = sender.seal(NOW, [1, 2, 3, 4], b"ack");
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert_eq!(receiver.open(NOW, &altered), Err(Refused::Forged));
        let mut restamped = sender.seal(NOW, [5, 5, 5, 5], b"ack");
        restamped[7] ^= 1;
        assert_eq!(receiver.open(NOW, &restamped), Err(Refused::Forged));
        assert_eq!(
            receiver.open(NOW, b"\x00\x01chitchat"),
            Err(Refused::NotSealed)
        );
        assert_eq!(receiver.open(NOW, b"TG1"), Err(Refused::NotSealed));
    }

    #[test]
    fn stamps_far_from_the_clock_are_refused_and_old_nonces_forgotten() {
        let sender = keys(&[1]);
        let mut receiver = keys(&[1]);
        let old = sender.seal(NOW - MAX_SKEW_MS - 1, [0; 4], b"x");
        assert_eq!(receiver.open(NOW, &old), Err(Refused::Stale));
        let early = sender.seal(NOW + MAX_SKEW_MS + 1, [0; 4], b"x");
        assert_eq!(receiver.open(NOW, &early), Err(Refused::Stale));
        let fresh = sender.seal(NOW, [0; 4], b"x");
        assert!(receiver.open(NOW, &fresh).is_ok());
        assert_eq!(receiver.seen.len(), 1);
        // Once its stamp leaves the window, the nonce is forgotten (the
        // stamp alone refuses a replay from then on).
        let later = sender.seal(NOW + MAX_SKEW_MS + 10, [1; 4], b"y");
        assert!(receiver.open(NOW + MAX_SKEW_MS + 10, &later).is_ok());
        assert_eq!(receiver.seen.len(), 1);
        assert_eq!(
            receiver.open(NOW + MAX_SKEW_MS + 10, &fresh),
            Err(Refused::Stale)
        );
    }

    /// Rotation: a node that seals with the new key is read by nodes that
    /// list it second, and reads their datagrams under the old key.
    #[test]
    fn two_keys_are_accepted_while_rolling() {
        let old_first = keys(&[1, 2]);
        let new_first = keys(&[2, 1]);
        let mut a = keys(&[1, 2]);
        let mut b = keys(&[2, 1]);
        assert!(a.open(NOW, &new_first.seal(NOW, [1; 4], b"n")).is_ok());
        assert!(b.open(NOW, &old_first.seal(NOW, [2; 4], b"o")).is_ok());
        let mut only_new = keys(&[2]);
        assert_eq!(
            only_new.open(NOW, &old_first.seal(NOW, [3; 4], b"o")),
            Err(Refused::UnknownKey)
        );
    }

    #[test]
    fn the_replay_memory_is_bounded() {
        let sender = keys(&[1]);
        let mut receiver = keys(&[1]);
        for n in 0..(MAX_REMEMBERED as u32 + 10) {
            let sealed = sender.seal(NOW + u64::from(n / 1000), n.to_be_bytes(), b"");
            assert!(receiver.open(NOW, &sealed).is_ok());
        }
        assert!(receiver.seen.len() <= MAX_REMEMBERED);
    }

    #[test]
    fn key_files_are_checked_and_name_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gossip.key");
        let key = "ab".repeat(32);
        std::fs::write(
            &path,
            format!("# cluster key\n{key}\n\n{}\n", "cd".repeat(32)),
        )
        .unwrap();
        assert_eq!(GossipKeys::load(&path).unwrap().count(), 2);
        std::fs::write(&path, "not hex at all\n").unwrap();
        let error = GossipKeys::load(&path).err().unwrap().to_string();
        assert!(
            error.contains("--gossip-key-file") && error.contains("line 1"),
            "{error}"
        );
        std::fs::write(&path, format!("{}\n", "ab".repeat(16))).unwrap();
        assert!(GossipKeys::load(&path).is_err());
        std::fs::write(&path, "# nothing\n").unwrap();
        let error = GossipKeys::load(&path).err().unwrap().to_string();
        assert!(error.contains("no key"), "{error}");
        let missing = GossipKeys::load(&dir.path().join("none")).err().unwrap();
        assert!(missing.to_string().contains("cannot read"), "{missing}");
    }
}
