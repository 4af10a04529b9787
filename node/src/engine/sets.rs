//! The engine's like-set and uniques operations: validation, the cluster
//! version gate, the core's lock, durability waits, listing pages and the
//! recount. The gRPC `Likes` service and any other front end (HTTP) call
//! these; they hold no wire types.
//!
//! A like set or uniques key belongs to its key's partition: a node that
//! does not serve it refuses every request of it (`NotServed`, which the
//! gRPC service turns into a forward to an owner).
//!
//! Invariants kept here: writes (like, unlike, observe) wait for cluster
//! version 3 (an older member could not replicate them, and a rollback would
//! not read them), and are answered, in `sync` durability, only once every
//! state they report is durable; a refused request changes nothing; a
//! request never names more than [`MAX_MEMBERS_PER_CALL`] members; a page
//! token only resumes the key it was made for; a recount reports a
//! difference only when no commit touched the set while it counted.

use crate::crdt::causal_length::is_liked;
use crate::crdt::{check_member, stable_hash, MemberError};
use crate::replica::{
    check_key, AddRefused, LikeRefused, ObserveAccepted, MAX_KEYS_PER_CALL, MAX_MEMBERS_PER_CALL,
};
use crate::store::sets::{load_like_count, scan_members};

use super::{now_ms, Engine, EngineError};

/// Liked members per listing page, at most (and by default).
pub const MAX_PAGE: usize = 1_000;
/// Members (liked or not) one page scans at most: a set of mostly unliked
/// members still answers in bounded time, with a token to go on.
const PAGE_SCAN: usize = 10 * MAX_PAGE;

/// Why a like-set or uniques request was refused. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// A bad member.
    #[error(transparent)]
    Member(#[from] MemberError),
    /// Too many members (or keys) in one request.
    #[error("{given} {what} in one call; the limit is {limit}: split the call")]
    TooMany {
        /// `members` or `keys`.
        what: &'static str,
        /// How many were given.
        given: usize,
        /// The limit.
        limit: usize,
    },
    /// No key at all.
    #[error("name at least one key")]
    NoKeys,
    /// A page token that is not one of ours for this key.
    #[error("the page token {0}; start again without a token")]
    PageToken(&'static str),
    /// A member's length would pass `u64::MAX`.
    #[error(transparent)]
    Like(#[from] LikeRefused),
}

/// A page of liked members.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LikesPage {
    /// Liked members, in member order.
    pub members: Vec<String>,
    /// The token of the next page; `None` after the last.
    pub next_token: Option<Vec<u8>>,
}

/// The outcome of a recount.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Recount {
    /// The count kept on disk.
    pub stored: u64,
    /// The count recomputed from the members on disk.
    pub recounted: u64,
    /// Members scanned (liked or not).
    pub scanned: u64,
}

impl Recount {
    /// True when both agree.
    pub fn is_consistent(&self) -> bool {
        self.stored == self.recounted
    }
}

fn check_members<'a>(members: &[&'a [u8]]) -> Result<Vec<&'a str>, EngineError> {
    if members.len() > MAX_MEMBERS_PER_CALL {
        return Err(SetError::TooMany {
            what: "members",
            given: members.len(),
            limit: MAX_MEMBERS_PER_CALL,
        }
        .into());
    }
    members
        .iter()
        .map(|member| check_member(member).map_err(|e| EngineError::from(SetError::from(e))))
        .collect()
}

/// Checks the keys of a `Distinct` call: 1 to [`MAX_KEYS_PER_CALL`] valid
/// keys.
pub fn check_distinct_keys<'a>(keys: &[&'a [u8]]) -> Result<Vec<&'a str>, EngineError> {
    if keys.is_empty() {
        return Err(SetError::NoKeys.into());
    }
    if keys.len() > MAX_KEYS_PER_CALL {
        return Err(SetError::TooMany {
            what: "keys",
            given: keys.len(),
            limit: MAX_KEYS_PER_CALL,
        }
        .into());
    }
    Ok(keys
        .iter()
        .map(|key| check_key(key))
        .collect::<Result<Vec<_>, _>>()?)
}

/// A page token: a version byte, the key's hash, the last member listed.
fn page_token(key: &str, last: &str) -> Vec<u8> {
    let mut token = vec![1];
    token.extend_from_slice(&stable_hash(0x70616765, &[key.as_bytes()]).to_be_bytes());
    token.extend_from_slice(last.as_bytes());
    token
}

fn resume_after<'a>(key: &str, token: &'a [u8]) -> Result<Option<&'a str>, SetError> {
    if token.is_empty() {
        return Ok(None);
    }
    let (Some(1), Some(hash), Some(last)) = (token.first(), token.get(1..9), token.get(9..)) else {
        return Err(SetError::PageToken("is malformed"));
    };
    if hash != stable_hash(0x70616765, &[key.as_bytes()]).to_be_bytes() {
        return Err(SetError::PageToken("belongs to another key"));
    }
    let last = check_member(last).map_err(|_| SetError::PageToken("is malformed"))?;
    Ok(Some(last))
}

impl Engine {
    pub(super) fn count_set_op(&self, op: &str) {
        self.metrics
            .set_ops
            .get_or_create(&crate::metrics::SetOpLabels { op: op.into() })
            .inc();
    }

    /// Whether each member is liked.
    pub fn liked(&self, key: &[u8], members: &[&[u8]]) -> Result<Vec<bool>, EngineError> {
        let key = check_key(key)?;
        let members = check_members(members)?;
        self.check_serving()?;
        let mut core = self.core();
        core.check_served(key).map_err(EngineError::Add)?;
        Ok(core.handle_liked(now_ms(), &*self.store, key, &members)?)
    }

    /// A like set's count of liked members.
    pub fn like_count(&self, key: &[u8]) -> Result<u64, EngineError> {
        let key = check_key(key)?;
        self.check_serving()?;
        let mut core = self.core();
        core.check_served(key).map_err(EngineError::Add)?;
        Ok(core.handle_like_count(now_ms(), &*self.store, key)?)
    }

    /// A page of liked members after `token` (empty: from the start), of
    /// durable state, at most `limit` (0: the default).
    pub fn list_likes(
        &self,
        key: &[u8],
        token: &[u8],
        limit: usize,
    ) -> Result<LikesPage, EngineError> {
        let key = check_key(key)?;
        let after = resume_after(key, token)?;
        self.check_serving()?;
        self.core().check_served(key).map_err(EngineError::Add)?;
        let limit = if limit == 0 {
            MAX_PAGE
        } else {
            limit.min(MAX_PAGE)
        };
        let scanned = scan_members(&*self.store, key, after, PAGE_SCAN)?;
        let mut members = Vec::new();
        let mut last = None;
        for (member, length) in &scanned {
            last = Some(member.as_str());
            if is_liked(*length) {
                members.push(member.clone());
                if members.len() == limit {
                    break;
                }
            }
        }
        let more = members.len() == limit || scanned.len() == PAGE_SCAN;
        Ok(LikesPage {
            next_token: last.filter(|_| more).map(|last| page_token(key, last)),
            members,
        })
    }

    /// Recounts a like set from its members on disk and compares with its
    /// kept count. A difference is a bug: it is logged as an error and
    /// counted in `tally_like_count_mismatches_total`. Retried while commits
    /// land on the set during the count (then the two cannot be compared).
    pub fn verify_likes(&self, key: &[u8]) -> Result<Recount, EngineError> {
        let key = check_key(key)?;
        self.check_serving()?;
        self.core().check_served(key).map_err(EngineError::Add)?;
        for _ in 0..5 {
            let (stored, seq_before) = load_like_count(&*self.store, key)?;
            let (mut recounted, mut scanned, mut after) = (0u64, 0u64, None::<String>);
            loop {
                let page = scan_members(&*self.store, key, after.as_deref(), PAGE_SCAN)?;
                scanned += page.len() as u64;
                recounted += page.iter().filter(|(_, len)| is_liked(*len)).count() as u64;
                match page.last() {
                    Some((member, _)) if page.len() == PAGE_SCAN => after = Some(member.clone()),
                    _ => break,
                }
            }
            let (_, seq_after) = load_like_count(&*self.store, key)?;
            if seq_before != seq_after {
                continue;
            }
            self.metrics.like_recounts.inc();
            let recount = Recount {
                stored,
                recounted,
                scanned,
            };
            if !recount.is_consistent() {
                self.metrics.like_count_mismatches.inc();
                tracing::error!(
                    key,
                    stored,
                    recounted,
                    scanned,
                    "BUG: a like set's kept count differs from a recount of its members"
                );
            }
            return Ok(recount);
        }
        Err(EngineError::Storage(crate::replica::StorageError(format!(
            "the like set {key:?} changed during five recounts in a row; verify it again when it is quieter"
        ))))
    }

    /// Observes members in a uniques key; returns the raised registers and
    /// the key's estimate after.
    pub async fn observe(
        &self,
        key: &[u8],
        members: &[&[u8]],
    ) -> Result<(ObserveAccepted, f64), EngineError> {
        self.check_adds()?;
        let key = check_key(key)?;
        let members = check_members(members)?;
        let (accepted, estimate) = {
            let mut core = self.core();
            core.check_served(key).map_err(EngineError::Add)?;
            let accepted = core.handle_observe(now_ms(), &*self.store, key, &members)?;
            let estimate = core.handle_uniques(now_ms(), &*self.store, key)?.estimate();
            (accepted, estimate)
        };
        self.count_set_op("observe");
        self.commit_wakeup.notify_one();
        self.wait_durable(accepted.durable_at_seq).await?;
        Ok((accepted, estimate))
    }

    /// The union of the registers of `keys`: its estimate is their
    /// distinct members, its digest tells whether two nodes agree.
    pub fn distinct(&self, keys: &[&[u8]]) -> Result<crate::crdt::HyperLogLog, EngineError> {
        let keys = check_distinct_keys(keys)?;
        self.check_serving()?;
        let mut core = self.core();
        for key in &keys {
            core.check_served(key).map_err(EngineError::Add)?;
        }
        Ok(core.handle_distinct(now_ms(), &*self.store, &keys)?)
    }
}

/// How often the background check recounts one like set.
pub const RECOUNT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts the background check: every `interval`, the next like set in key
/// order (wrapping around) is recounted with [`Engine::verify_likes`]; a
/// difference is logged as a bug and counted in
/// `tally_like_count_mismatches_total`. One set per interval keeps the cost
/// low. Abort the task to stop it.
pub fn spawn_recount(
    engine: std::sync::Arc<Engine>,
    interval: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut after: Option<String> = None;
        loop {
            ticker.tick().await;
            let engine = engine.clone();
            let previous = after.take();
            let next = tokio::task::spawn_blocking(move || {
                let keys =
                    crate::store::sets::like_keys_after(&*engine.store, previous.as_deref(), 1)?;
                let Some(key) = keys.into_iter().next() else {
                    return Ok::<_, EngineError>(None);
                };
                match engine.verify_likes(key.as_bytes()) {
                    // A set of a partition handed away is its owners' to check.
                    Ok(_) | Err(EngineError::Add(AddRefused::NotServed { .. })) => Ok(Some(key)),
                    Err(error) => Err(error),
                }
            })
            .await;
            match next {
                Ok(Ok(next)) => after = next,
                Ok(Err(error)) => tracing::debug!(%error, "background like recount skipped"),
                Err(error) => tracing::warn!(%error, "background like recount failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::crdt::ReplicaId;
    use crate::metrics::Metrics;
    use crate::replica::{CommitBatch, Identity, LikeWrite, ReplicaConfig};
    use crate::store::{MemoryStore, Store};

    /// An engine whose store holds the like set "post" with a count of 5
    /// but one member: what a bug in the count's upkeep would leave.
    fn engine_with_a_wrong_count() -> Arc<Engine> {
        let store = MemoryStore::new(Identity {
            replica: ReplicaId(1),
            region: "eu".into(),
        });
        store
            .write(&CommitBatch {
                seq: 1,
                likes: vec![LikeWrite {
                    key: "post".into(),
                    count: 5,
                    members: vec![("sam".into(), 1), ("ann".into(), 2)],
                }],
                ..Default::default()
            })
            .unwrap();
        store.flush().unwrap();
        Engine::open(
            Arc::new(store),
            ReplicaConfig::default(),
            super::super::Durability::Async,
            Arc::new(Metrics::new()),
        )
        .unwrap()
    }

    #[test]
    fn a_recount_reports_a_count_that_differs_from_the_members() {
        let engine = engine_with_a_wrong_count();
        let recount = engine.verify_likes(b"post").unwrap();
        assert_eq!(
            (recount.stored, recount.recounted, recount.scanned),
            (5, 1, 2)
        );
        assert!(!recount.is_consistent());
        assert_eq!(engine.metrics.like_count_mismatches.get(), 1);
        // A set kept by the engine itself recounts equal.
        let empty = engine.verify_likes(b"other").unwrap();
        assert!(empty.is_consistent());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_background_check_finds_the_difference_by_itself() {
        let engine = engine_with_a_wrong_count();
        let task = spawn_recount(engine.clone(), std::time::Duration::from_millis(10));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while engine.metrics.like_count_mismatches.get() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "never recounted");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        task.abort();
    }

    #[tokio::test]
    async fn likes_through_the_engine_keep_the_count_and_the_recount_equal() {
        let engine = engine_with_a_wrong_count();
        for member in ["a", "b", "c", "b"] {
            engine
                .like(b"fresh", member.as_bytes(), true, None)
                .await
                .unwrap();
        }
        engine.like(b"fresh", b"a", false, None).await.unwrap();
        assert_eq!(engine.like_count(b"fresh").unwrap(), 2);
        assert_eq!(
            engine.liked(b"fresh", &[b"a", b"b"]).unwrap(),
            [false, true]
        );
        let too_many: Vec<&[u8]> = vec![b"m"; MAX_MEMBERS_PER_CALL + 1];
        assert!(engine.liked(b"fresh", &too_many).is_err());
        assert!(engine.like(b"fresh", b"", true, None).await.is_err());
    }

    #[tokio::test]
    async fn every_request_of_a_set_of_a_partition_not_served_is_refused() {
        use crate::partition::{PartitionCount, PartitionSet};
        let engine = engine_with_a_wrong_count();
        let count = PartitionCount::new(16).unwrap();
        engine.core().peers_mut().set_own_partitions(16);
        let key = "post";
        let other = (0..)
            .map(|i| format!("other-{i}"))
            .find(|other| count.of_key(other.as_bytes()) != count.of_key(key.as_bytes()))
            .unwrap();
        let mut serving = PartitionSet::empty(count);
        serving.extend([count.of_key(key.as_bytes())]);
        engine.core().set_serving(Some(serving));
        let not_served = |error: EngineError| {
            let refused = match &error {
                EngineError::Add(refused) => refused,
                EngineError::Set(SetError::Like(LikeRefused::Add(refused))) => refused,
                _ => panic!("{error}"),
            };
            assert!(matches!(refused, AddRefused::NotServed { .. }), "{error}");
            // Refused UNAVAILABLE, as an add of it is.
            let status = crate::api::convert::status_of(&error);
            assert_eq!(status.code(), tonic::Code::Unavailable, "{error}");
        };
        let other = other.as_bytes();
        not_served(engine.like(other, b"sam", true, None).await.unwrap_err());
        not_served(engine.liked(other, &[b"sam"]).unwrap_err());
        not_served(engine.like_count(other).unwrap_err());
        not_served(engine.list_likes(other, b"", 0).unwrap_err());
        not_served(engine.verify_likes(other).unwrap_err());
        not_served(engine.observe(other, &[b"sam"]).await.unwrap_err());
        not_served(engine.distinct(&[key.as_bytes(), other]).unwrap_err());
        assert_eq!(engine.core().dirty_sets(), 0, "nothing changed");
        // The served key answers.
        assert_eq!(engine.like_count(key.as_bytes()).unwrap(), 5);
        engine.observe(key.as_bytes(), &[b"sam"]).await.unwrap();
    }

    #[test]
    fn a_page_token_resumes_only_its_own_key() {
        let token = page_token("post-1", "sam");
        assert_eq!(resume_after("post-1", &token).unwrap(), Some("sam"));
        assert!(matches!(
            resume_after("post-2", &token),
            Err(SetError::PageToken("belongs to another key"))
        ));
        assert!(matches!(
            resume_after("post-1", b"garbage"),
            Err(SetError::PageToken("is malformed"))
        ));
        assert_eq!(resume_after("post-1", b"").unwrap(), None);
    }
}
