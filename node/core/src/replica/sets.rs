//! Like sets and uniques in the replica core: likes, unlikes, "is liked",
//! derived counts, observes and distinct estimates, and what each commit
//! writes for them. Pure, as the rest of the core: the store is read through
//! [`DurableState`], written only through [`CommitBatch`]es.
//!
//! Like sets and uniques live in their own keyspaces (a key may name a
//! counter, a like set and a uniques key at once). A like set is never held
//! or written whole: the core caches the lengths of the members it touched,
//! and a commit writes one record per changed member, the set's derived
//! count, and one delta-log record with the changed members (which is what
//! peers pull: see `sets_sync.rs`). Uniques write their registers and a
//! delta-log record of the changed ones.
//!
//! Invariants kept here: a like or unlike changes a member's length only as
//! the causal-length rules say ([`crate::crdt::causal_length`]); the derived
//! count moves with every length change by exactly the change's effect, in
//! the same commit as the member; a cached length is dropped only when no
//! commit still has to write it (so a store read never returns a length
//! older than one the core answered with); an answer's durability ticket
//! names a commit that makes everything it reported durable.
//!
//! The sets digest ([`SetsDigest`]) moves with every length or register
//! change, at the change: each entry sums its changes since the last commit
//! was handed out, and handing a commit out adds them to the running digest,
//! which is then exactly the digest of the state that commit makes durable
//! (it writes every member and register changed up to that moment). Nothing
//! is ever rescanned to compute it, except once when a store written by a
//! build that kept no sets digest opens (`storage/sets.rs`).

use std::collections::{BTreeSet, HashMap};

use crate::crdt::causal_length::{
    count_change, is_liked, length_after_like, length_after_unlike, LengthOverflow,
};
use crate::crdt::hll::{hash_member, position};
use crate::crdt::{Crdt, HyperLogLog, SetsDigest};
use crate::partition::PartitionCount;

use super::types::{DurableState, Key, StorageError};
use super::{request_fingerprint, AddRefused, Keyed, Replica};

/// The most members one request may name (like many, liked, observe).
pub const MAX_MEMBERS_PER_CALL: usize = 10_000;
/// The most keys one distinct estimate may name.
pub const MAX_KEYS_PER_CALL: usize = 1_000;
/// Member lengths cached per like set, beyond those a commit still has to write.
const MEMBER_CACHE: usize = 50_000;

/// Which keyspace a set lives in; the byte is part of stored and wire records.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum SetKind {
    /// Like sets (causal-length sets).
    Likes,
    /// Uniques (HyperLogLog).
    Uniques,
}

impl SetKind {
    /// The byte that stands for the kind in stored keys.
    pub fn byte(self) -> u8 {
        match self {
            SetKind::Likes => 1,
            SetKind::Uniques => 2,
        }
    }

    /// The kind of a stored byte.
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(SetKind::Likes),
            2 => Some(SetKind::Uniques),
            _ => None,
        }
    }
}

/// What one commit changed in one like set or uniques key: a record of the
/// delta log, and what a pull carries.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SetDelta {
    /// Changed members of a like set, with their lengths.
    Likes {
        /// The like set.
        key: Key,
        /// Members and their causal lengths.
        members: Vec<(Box<str>, u64)>,
    },
    /// Changed registers of a uniques key.
    Uniques {
        /// The uniques key.
        key: Key,
        /// (register index, rank).
        registers: Vec<(u16, u8)>,
    },
}

impl SetDelta {
    /// A like set's or a uniques key's.
    pub fn kind(&self) -> SetKind {
        match self {
            SetDelta::Likes { .. } => SetKind::Likes,
            SetDelta::Uniques { .. } => SetKind::Uniques,
        }
    }

    /// The like set's or uniques key's name.
    pub fn key(&self) -> &str {
        match self {
            SetDelta::Likes { key, .. } | SetDelta::Uniques { key, .. } => key,
        }
    }

    /// Members or registers carried.
    pub fn len(&self) -> usize {
        match self {
            SetDelta::Likes { members, .. } => members.len(),
            SetDelta::Uniques { registers, .. } => registers.len(),
        }
    }

    /// True when it carries nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its estimated size on the wire.
    pub fn estimated_bytes(&self) -> usize {
        match self {
            SetDelta::Likes { key, members } => {
                key.len() + 4 + members.iter().map(|(m, _)| m.len() + 4).sum::<usize>()
            }
            SetDelta::Uniques { key, registers } => key.len() + 4 + 5 * registers.len(),
        }
    }
}

/// What a commit writes for one like set.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LikeWrite {
    /// The like set.
    pub key: Key,
    /// Its derived count after the commit.
    pub count: u64,
    /// The members that changed, with their new lengths (never empty).
    pub members: Vec<(Box<str>, u64)>,
}

/// What a commit writes for one uniques key.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UniqueWrite {
    /// The uniques key.
    pub key: Key,
    /// Its registers after the commit (one record per key).
    pub state: HyperLogLog,
    /// The registers that changed, with their new ranks.
    pub registers: Vec<(u16, u8)>,
}

/// A like or unlike as the core takes it; key and member already validated.
#[derive(Clone, Copy, Debug)]
pub struct LikeRequest<'a> {
    /// The like set.
    pub key: &'a str,
    /// The member.
    pub member: &'a str,
    /// True to like, false to unlike.
    pub like: bool,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<&'a str>,
}

/// The answer to a like or unlike.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LikeAccepted {
    /// False when nothing changed (already liked, or unliked a member that was not liked).
    pub changed: bool,
    /// Whether the member is liked now.
    pub liked: bool,
    /// The set's count of liked members now.
    pub count: u64,
    /// True for a retry with an idempotency key already applied.
    pub duplicate: bool,
    /// The member's causal length right after the operation (odd: liked);
    /// 0 for a duplicate, whose first answer's length is not kept.
    pub length: u64,
    /// Everything answered is durable once the durable sequence reaches this.
    pub durable_at_seq: u64,
}

/// The answer to an observe.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ObserveAccepted {
    /// Registers raised (0: every member was already counted, or hid behind one).
    pub raised: usize,
    /// Everything answered is durable once the durable sequence reaches this.
    pub durable_at_seq: u64,
}

/// Why a like or unlike was refused. Nothing changed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum LikeRefused {
    /// The member's length is at `u64::MAX`.
    #[error(transparent)]
    Overflow(#[from] LengthOverflow),
    /// An idempotency key problem, or storage.
    #[error(transparent)]
    Add(#[from] AddRefused),
}

impl From<StorageError> for LikeRefused {
    fn from(error: StorageError) -> Self {
        LikeRefused::Add(AddRefused::Storage(error))
    }
}

#[derive(Debug)]
struct LikeEntry {
    /// Derived count of liked members (live).
    count: u64,
    /// Cached live lengths.
    lengths: HashMap<Box<str>, u64>,
    /// Members changed since the last commit was handed out.
    changed: BTreeSet<Box<str>>,
    /// Members in the commit in flight.
    in_flight: BTreeSet<Box<str>>,
    /// Listed in [`Sets::dirty`].
    queued: bool,
    last_used_ms: u64,
    /// The digest change of the lengths changed since the last commit was handed out.
    digest_change: u64,
}

impl LikeEntry {
    fn length(
        &mut self,
        store: &(impl DurableState + ?Sized),
        key: &str,
        member: &str,
    ) -> Result<u64, StorageError> {
        if let Some(length) = self.lengths.get(member) {
            return Ok(*length);
        }
        let length = store.load_member(key, member)?;
        self.lengths.insert(member.into(), length);
        Ok(length)
    }

    /// Raises a member's length and moves the count; true when it changed.
    fn raise(&mut self, key: &str, member: &str, old: u64, new: u64) -> bool {
        new > old && self.set(key, member, old, new)
    }

    /// Sets a member's length (only a planted bug lowers one) and moves the
    /// count and the digest.
    fn set(&mut self, key: &str, member: &str, old: u64, new: u64) -> bool {
        if new == old {
            return false;
        }
        self.lengths.insert(member.into(), new);
        self.count = self.count.saturating_add_signed(count_change(old, new));
        self.digest_change = self
            .digest_change
            .wrapping_add(SetsDigest::member_change(key, member, old, new));
        self.changed.insert(member.into());
        true
    }

    fn is_clean(&self) -> bool {
        self.changed.is_empty() && self.in_flight.is_empty()
    }
}

#[derive(Debug)]
struct UniqueEntry {
    state: HyperLogLog,
    changed: BTreeSet<u16>,
    committing: bool,
    /// Listed in [`Sets::dirty`].
    queued: bool,
    last_used_ms: u64,
    /// The digest change of the registers raised since the last commit was handed out.
    digest_change: u64,
}

impl UniqueEntry {
    /// Raises a register and moves the digest; true when it changed.
    fn raise(&mut self, key: &str, index: u16, rank: u8) -> bool {
        let old = self.state.register(index);
        if !self.state.raise(index, rank) {
            return false;
        }
        self.changed.insert(index);
        self.digest_change = self
            .digest_change
            .wrapping_add(SetsDigest::register_change(key, index, old, rank));
        true
    }
}

/// The core's like sets and uniques. See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Sets {
    likes: HashMap<Key, LikeEntry>,
    uniques: HashMap<Key, UniqueEntry>,
    /// Sets with changes since the last commit was handed out, once each.
    dirty: Vec<(SetKind, Key)>,
    /// The digest of the state the last commit handed out makes durable.
    digest: SetsDigest,
    /// The same, per partition, once tracked ([`Sets::track_partitions`]).
    by_partition: Option<(PartitionCount, Vec<u64>)>,
}

impl Sets {
    /// Starts keeping the digest per partition of `count`, from `digests`
    /// (the durable state's, one per partition).
    pub(super) fn track_partitions(&mut self, count: PartitionCount, digests: Vec<u64>) {
        self.by_partition = Some((count, digests));
    }

    /// The digest of each partition's sets, once tracked.
    pub(super) fn partition_digests(&self) -> Option<&[u64]> {
        self.by_partition.as_ref().map(|(_, digests)| &digests[..])
    }

    /// Moves the running digest, and `key`'s partition's, by `change`.
    fn move_digest(&mut self, key: &str, change: u64) {
        self.digest.apply(change);
        if let Some((count, digests)) = &mut self.by_partition {
            let slot = &mut digests[count.of_key(key.as_bytes()).0 as usize];
            *slot = slot.wrapping_add(change);
        }
    }

    /// The core's sets, starting from the digest of the durable state.
    pub(super) fn recovered(digest: SetsDigest) -> Self {
        Sets {
            digest,
            ..Default::default()
        }
    }

    fn like_entry(
        &mut self,
        store: &(impl DurableState + ?Sized),
        key: &str,
        now_ms: u64,
    ) -> Result<&mut LikeEntry, StorageError> {
        if !self.likes.contains_key(key) {
            let count = store.load_like_count(key)?;
            let entry = LikeEntry {
                count,
                lengths: HashMap::new(),
                changed: BTreeSet::new(),
                in_flight: BTreeSet::new(),
                queued: false,
                last_used_ms: now_ms,
                digest_change: 0,
            };
            self.likes.insert(Key::from(key), entry);
        }
        let entry = self.likes.get_mut(key).expect("inserted above");
        entry.last_used_ms = now_ms;
        Ok(entry)
    }

    fn unique_entry(
        &mut self,
        store: &(impl DurableState + ?Sized),
        key: &str,
        now_ms: u64,
    ) -> Result<&mut UniqueEntry, StorageError> {
        if !self.uniques.contains_key(key) {
            let state = store.load_uniques(key)?.unwrap_or_default();
            let entry = UniqueEntry {
                state,
                changed: BTreeSet::new(),
                committing: false,
                queued: false,
                last_used_ms: now_ms,
                digest_change: 0,
            };
            self.uniques.insert(Key::from(key), entry);
        }
        let entry = self.uniques.get_mut(key).expect("inserted above");
        entry.last_used_ms = now_ms;
        Ok(entry)
    }

    /// Lists a set for the next commit, once (call after changing it).
    fn mark(&mut self, kind: SetKind, key: &str) {
        let newly = match kind {
            SetKind::Likes => self
                .likes
                .get_mut(key)
                .is_some_and(|entry| !std::mem::replace(&mut entry.queued, true)),
            SetKind::Uniques => self
                .uniques
                .get_mut(key)
                .is_some_and(|entry| !std::mem::replace(&mut entry.queued, true)),
        };
        let shared = match kind {
            SetKind::Likes => self.likes.get_key_value(key).map(|(k, _)| k.clone()),
            SetKind::Uniques => self.uniques.get_key_value(key).map(|(k, _)| k.clone()),
        };
        if let (true, Some(key)) = (newly, shared) {
            self.dirty.push((kind, key));
        }
    }

    /// True when a set is waiting for a commit (or has one in flight).
    fn ticket_state(&self, kind: SetKind, key: &str) -> (bool, bool) {
        match kind {
            SetKind::Likes => self.likes.get(key).map_or((false, false), |e| {
                (!e.changed.is_empty(), !e.in_flight.is_empty())
            }),
            SetKind::Uniques => self
                .uniques
                .get(key)
                .map_or((false, false), |e| (!e.changed.is_empty(), e.committing)),
        }
    }

    pub(super) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Whether the set is held in memory.
    pub(super) fn cached(&self, kind: SetKind, key: &str) -> bool {
        match kind {
            SetKind::Likes => self.likes.contains_key(key),
            SetKind::Uniques => self.uniques.contains_key(key),
        }
    }

    /// Drops the set from memory unless a change of it waits for a commit
    /// or is being committed; false when it stays (for the set purge).
    pub(super) fn forget_clean(&mut self, kind: SetKind, key: &str) -> bool {
        match kind {
            SetKind::Likes => match self.likes.get(key) {
                Some(entry) if !entry.is_clean() || entry.queued => false,
                _ => {
                    self.likes.remove(key);
                    true
                }
            },
            SetKind::Uniques => match self.uniques.get(key) {
                Some(entry) if !entry.changed.is_empty() || entry.committing || entry.queued => {
                    false
                }
                _ => {
                    self.uniques.remove(key);
                    true
                }
            },
        }
    }

    /// Moves the digest of the state the next commit makes durable (a set
    /// purge's deletion of `key`'s records).
    pub(super) fn apply_digest(&mut self, key: &str, change: u64) {
        self.move_digest(key, change);
    }

    /// Whether a set of a key that `matches` waits for a commit.
    pub(super) fn has_dirty_in(&self, matches: impl Fn(&Key) -> bool) -> bool {
        self.dirty.iter().any(|(_, key)| matches(key))
    }

    /// Hands out the writes of the next commit, and the sets digest of the
    /// state it makes durable.
    pub(super) fn take_writes(&mut self) -> (Vec<LikeWrite>, Vec<UniqueWrite>, SetsDigest) {
        let (mut likes, mut uniques) = (Vec::new(), Vec::new());
        for (kind, key) in std::mem::take(&mut self.dirty) {
            match kind {
                SetKind::Likes => {
                    let Some(entry) = self.likes.get_mut(&key) else {
                        continue;
                    };
                    entry.queued = false;
                    let change = std::mem::take(&mut entry.digest_change);
                    let changed = std::mem::take(&mut entry.changed);
                    let write = (!changed.is_empty()).then(|| {
                        let members = changed
                            .iter()
                            .map(|member| (member.clone(), entry.lengths[member]))
                            .collect();
                        entry.in_flight.extend(changed);
                        LikeWrite {
                            key: key.clone(),
                            count: entry.count,
                            members,
                        }
                    });
                    self.move_digest(&key, change);
                    likes.extend(write);
                }
                SetKind::Uniques => {
                    let Some(entry) = self.uniques.get_mut(&key) else {
                        continue;
                    };
                    entry.queued = false;
                    let change = std::mem::take(&mut entry.digest_change);
                    let changed = std::mem::take(&mut entry.changed);
                    let write = (!changed.is_empty()).then(|| {
                        entry.committing = true;
                        UniqueWrite {
                            key: key.clone(),
                            state: entry.state.clone(),
                            registers: changed
                                .into_iter()
                                .map(|index| (index, entry.state.register(index)))
                                .collect(),
                        }
                    });
                    self.move_digest(&key, change);
                    uniques.extend(write);
                }
            }
        }
        (likes, uniques, self.digest)
    }

    /// The commit holding these writes is durable.
    pub(super) fn commit_done(&mut self, likes: &[LikeWrite], uniques: &[UniqueWrite]) {
        for write in likes {
            if let Some(entry) = self.likes.get_mut(&write.key) {
                entry.in_flight.clear();
            }
        }
        for write in uniques {
            if let Some(entry) = self.uniques.get_mut(&write.key) {
                entry.committing = false;
            }
        }
    }

    /// The commit holding these writes failed: they go into the next one.
    pub(super) fn commit_failed(&mut self, likes: Vec<LikeWrite>, uniques: Vec<UniqueWrite>) {
        for write in likes {
            if let Some(entry) = self.likes.get_mut(&write.key) {
                let in_flight = std::mem::take(&mut entry.in_flight);
                entry.changed.extend(in_flight);
                self.mark(SetKind::Likes, &write.key);
            }
        }
        for write in uniques {
            if let Some(entry) = self.uniques.get_mut(&write.key) {
                entry.committing = false;
                entry
                    .changed
                    .extend(write.registers.iter().map(|(index, _)| *index));
                self.mark(SetKind::Uniques, &write.key);
            }
        }
    }

    /// Drops clean sets past `capacity` (least recently used first) and the
    /// cached lengths of large sets that no commit still has to write.
    pub(super) fn evict(&mut self, capacity: usize) {
        for entry in self.likes.values_mut() {
            if entry.lengths.len() > MEMBER_CACHE {
                let (changed, in_flight) = (&entry.changed, &entry.in_flight);
                entry
                    .lengths
                    .retain(|member, _| changed.contains(member) || in_flight.contains(member));
            }
        }
        let excess = self.likes.len().saturating_sub(capacity);
        super::lru::evict(&mut self.likes, excess, |entry| {
            entry.is_clean().then_some(entry.last_used_ms)
        });
        let excess = self.uniques.len().saturating_sub(capacity);
        super::lru::evict(&mut self.uniques, excess, |entry| {
            (entry.changed.is_empty() && !entry.committing).then_some(entry.last_used_ms)
        });
    }

    /// Merges a pulled delta; returns the members or registers it changed.
    /// `last_writer_wins` is a planted bug: a member takes the incoming
    /// length even when it is lower.
    pub(super) fn merge_delta(
        &mut self,
        store: &(impl DurableState + ?Sized),
        delta: &SetDelta,
        now_ms: u64,
        last_writer_wins: bool,
    ) -> Result<usize, StorageError> {
        let mut changed = 0;
        match delta {
            SetDelta::Likes { key, members } => {
                let entry = self.like_entry(store, key, now_ms)?;
                for (member, length) in members {
                    let old = entry.length(store, key, member)?;
                    let applied = match last_writer_wins {
                        true => entry.set(key, member, old, *length),
                        false => entry.raise(key, member, old, *length),
                    };
                    changed += usize::from(applied);
                }
                if changed > 0 {
                    self.mark(SetKind::Likes, key);
                }
            }
            SetDelta::Uniques { key, registers } => {
                let entry = self.unique_entry(store, key, now_ms)?;
                for (index, rank) in registers {
                    changed += usize::from(entry.raise(key, *index, *rank));
                }
                if changed > 0 {
                    self.mark(SetKind::Uniques, key);
                }
            }
        }
        Ok(changed)
    }
}

impl Replica {
    /// The commit that makes a set's current state durable: the next one
    /// while it has changes waiting, the one in flight while it is being
    /// written, else the last durable one.
    fn set_ticket(&self, kind: SetKind, key: &str) -> u64 {
        match self.sets.ticket_state(kind, key) {
            (true, _) => self.last_seq + 1,
            (false, true) => self.last_seq,
            (false, false) => self.durable_seq,
        }
    }

    /// Likes or unlikes one member. Liking a liked member or unliking one
    /// that is not liked changes nothing and says so (`changed: false`).
    pub fn handle_like(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        request: LikeRequest<'_>,
    ) -> Result<LikeAccepted, LikeRefused> {
        let direction = if request.like { 1 } else { -1 };
        let fingerprint = request_fingerprint(
            &format!("like\0{}\0{}", request.key, request.member),
            direction,
        );
        let keyed = match self.check_idempotency(now_ms, request.idempotency_key, fingerprint)? {
            Keyed::Retry(record) => {
                return Ok(LikeAccepted {
                    changed: false,
                    liked: request.like,
                    count: record.value.max(0) as u64,
                    duplicate: true,
                    length: 0,
                    durable_at_seq: record.seq,
                })
            }
            Keyed::Fresh(keyed) => keyed,
        };
        self.check_served(request.key)?;
        let entry = self.sets.like_entry(store, request.key, now_ms)?;
        let old = entry.length(store, request.key, request.member)?;
        let new = if request.like {
            length_after_like(old)?
        } else {
            length_after_unlike(old)?
        };
        let changed = entry.raise(request.key, request.member, old, new);
        let count = entry.count;
        if changed {
            self.sets.mark(SetKind::Likes, request.key);
        }
        let mut durable_at_seq = self.set_ticket(SetKind::Likes, request.key);
        if keyed.is_some() {
            // The record itself is written by the next commit.
            durable_at_seq = self.last_seq + 1;
            let partition = self.partition_of(request.key);
            self.remember_idempotent(now_ms, keyed, count as i64, durable_at_seq, partition);
        }
        Ok(LikeAccepted {
            changed,
            liked: is_liked(new),
            count,
            duplicate: false,
            length: new,
            durable_at_seq,
        })
    }

    /// Whether each member is liked, as this replica holds the set.
    pub fn handle_liked(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        key: &str,
        members: &[&str],
    ) -> Result<Vec<bool>, StorageError> {
        let entry = self.sets.like_entry(store, key, now_ms)?;
        members
            .iter()
            .map(|member| Ok(is_liked(entry.length(store, key, member)?)))
            .collect()
    }

    /// The causal length of one member (0 when never seen).
    pub fn member_length(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        key: &str,
        member: &str,
    ) -> Result<u64, StorageError> {
        let entry = self.sets.like_entry(store, key, now_ms)?;
        entry.length(store, key, member)
    }

    /// The like set's derived count (O(1): kept as members change).
    pub fn handle_like_count(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        key: &str,
    ) -> Result<u64, StorageError> {
        Ok(self.sets.like_entry(store, key, now_ms)?.count)
    }

    /// Observes members in a uniques key.
    pub fn handle_observe(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        key: &str,
        members: &[&str],
    ) -> Result<ObserveAccepted, StorageError> {
        let entry = self.sets.unique_entry(store, key, now_ms)?;
        let mut raised = 0;
        for member in members {
            let (index, rank) = position(hash_member(member.as_bytes()));
            raised += usize::from(entry.raise(key, index, rank));
        }
        if raised > 0 {
            self.sets.mark(SetKind::Uniques, key);
        }
        Ok(ObserveAccepted {
            raised,
            durable_at_seq: self.set_ticket(SetKind::Uniques, key),
        })
    }

    /// The registers of a uniques key as this replica holds them.
    pub fn handle_uniques(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        key: &str,
    ) -> Result<HyperLogLog, StorageError> {
        Ok(self.sets.unique_entry(store, key, now_ms)?.state.clone())
    }

    /// The union of the registers of `keys` (estimate it for their distinct members).
    pub fn handle_distinct(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        keys: &[&str],
    ) -> Result<HyperLogLog, StorageError> {
        let mut union = HyperLogLog::new();
        for key in keys {
            union.merge(&self.sets.unique_entry(store, key, now_ms)?.state);
        }
        Ok(union)
    }

    /// Like sets and uniques keys with changes no commit has taken yet.
    pub fn dirty_sets(&self) -> usize {
        self.sets.dirty.len()
    }

    /// Like sets and uniques keys held in memory.
    pub fn cached_sets(&self) -> usize {
        self.sets.likes.len() + self.sets.uniques.len()
    }
}
