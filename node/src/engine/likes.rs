//! The like and unlike path of the engine: single likes and batches of
//! them (`LikeBatch`, what the client's coalescing sends), applied to the
//! core under its lock in slices, then answered once durable.
//!
//! Invariants kept here: every item is validated on its own and a bad one
//! gets its own error and changes nothing, while the other items of its
//! batch are applied (as `AddBatch` does: callers coalesced into one batch
//! must not fail each other); in `sync` durability no item is answered
//! before the commit that makes its answer durable (one wait for the
//! batch's highest ticket, so a batch costs one group commit, not one per
//! item); if that wait fails, no applied item is answered as a success.

use crate::crdt::check_member;
use crate::replica::{check_key, LikeAccepted, LikeRequest, Replica, MAX_MEMBERS_PER_CALL};

use super::sets::SetError;
use super::{now_ms, Engine, EngineError, BATCH_SLICE};

/// One like or unlike as it arrives, not yet validated.
#[derive(Clone, Copy, Debug)]
pub struct LikeItem<'a> {
    /// The like set.
    pub key: &'a [u8],
    /// The member.
    pub member: &'a [u8],
    /// True to like, false to unlike.
    pub like: bool,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<&'a str>,
}

impl Engine {
    /// Likes (or, with `like` false, unlikes) one member, and answers once
    /// the answer is as durable as the mode asks.
    pub async fn like(
        &self,
        key: &[u8],
        member: &[u8],
        like: bool,
        idempotency_key: Option<&str>,
    ) -> Result<LikeAccepted, EngineError> {
        self.check_adds()?;
        let item = LikeItem {
            key,
            member,
            like,
            idempotency_key,
        };
        let accepted = self.apply_like_locked(&mut self.core(), now_ms(), item)?;
        self.commit_wakeup.notify_one();
        self.wait_durable(accepted.durable_at_seq).await?;
        Ok(accepted)
    }

    /// Likes and unlikes many members (of any like sets); each item gets
    /// its own result, in order. The outer error refuses the whole batch
    /// (too many items, cluster version, the node stopping or its disk
    /// full): then nothing changed. A batch waits for one commit.
    pub async fn like_batch(
        &self,
        items: &[LikeItem<'_>],
    ) -> Result<Vec<Result<LikeAccepted, EngineError>>, EngineError> {
        if items.len() > MAX_MEMBERS_PER_CALL {
            return Err(SetError::TooMany {
                what: "likes",
                given: items.len(),
                limit: MAX_MEMBERS_PER_CALL,
            }
            .into());
        }
        self.check_adds()?;
        let mut results = Vec::with_capacity(items.len());
        // In slices, so that a large batch lets other requests take the
        // core lock in between.
        for slice in items.chunks(BATCH_SLICE) {
            let now = now_ms();
            let mut core = self.core();
            results.extend(
                slice
                    .iter()
                    .map(|item| self.apply_like_locked(&mut core, now, *item)),
            );
        }
        let ticket = results
            .iter()
            .filter_map(|result| result.as_ref().ok())
            .map(|accepted| accepted.durable_at_seq)
            .max();
        if let Some(ticket) = ticket {
            self.commit_wakeup.notify_one();
            if let Err(error) = self.wait_durable(ticket).await {
                for result in &mut results {
                    if result.is_ok() {
                        *result = Err(error.same_again());
                    }
                }
            }
        }
        Ok(results)
    }

    fn apply_like_locked(
        &self,
        core: &mut Replica,
        now: u64,
        item: LikeItem<'_>,
    ) -> Result<LikeAccepted, EngineError> {
        let key = check_key(item.key)?;
        let member = check_member(item.member).map_err(SetError::from)?;
        let accepted = core
            .handle_like(
                now,
                &*self.store,
                LikeRequest {
                    key,
                    member,
                    like: item.like,
                    idempotency_key: item.idempotency_key,
                },
            )
            .map_err(SetError::from)?;
        self.count_set_op(match (accepted.changed, item.like) {
            (false, _) => "unchanged",
            (true, true) => "like",
            (true, false) => "unlike",
        });
        Ok(accepted)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::tests::memory_engine;
    use super::super::Durability;
    use super::*;

    fn engine() -> Arc<Engine> {
        memory_engine(Durability::Sync)
    }

    fn item<'a>(member: &'a str, like: bool, idempotency_key: Option<&'a str>) -> LikeItem<'a> {
        LikeItem {
            key: b"post",
            member: member.as_bytes(),
            like,
            idempotency_key,
        }
    }

    #[tokio::test]
    async fn a_batch_answers_each_item_and_a_bad_one_changes_nothing() {
        let engine = engine();
        let committer = engine.spawn_committer(|_, _| {});
        let results = engine
            .like_batch(&[
                item("ann", true, Some("k1")),
                item("", true, None),
                item("bob", true, None),
                item("ann", true, None),
                item("cy", false, None),
                item("bob", false, None),
            ])
            .await
            .unwrap();
        let answers: Vec<_> = results
            .iter()
            .map(|r| r.as_ref().map(|a| (a.changed, a.liked, a.count)).ok())
            .collect();
        assert_eq!(
            answers,
            [
                Some((true, true, 1)),
                None,
                Some((true, true, 2)),
                Some((false, true, 2)),
                Some((false, false, 2)),
                Some((true, false, 1)),
            ]
        );
        assert!(results[1]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("member"));
        assert_eq!(engine.like_count(b"post").unwrap(), 1);
        assert_eq!(
            engine.liked(b"post", &[b"ann", b"bob"]).unwrap(),
            [true, false]
        );
        // A retry of the first item with its key is a duplicate.
        let retry = engine
            .like_batch(&[item("ann", true, Some("k1"))])
            .await
            .unwrap();
        assert!(retry[0].as_ref().unwrap().duplicate);
        assert_eq!(engine.like_count(b"post").unwrap(), 1);
        committer.shutdown().await;
    }

    #[tokio::test]
    async fn a_batch_is_answered_only_once_its_commit_is_durable() {
        let engine = engine();
        let batch = {
            let engine = engine.clone();
            tokio::spawn(async move {
                engine
                    .like_batch(&[item("ann", true, None), item("bob", true, None)])
                    .await
            })
        };
        // With no committer running, no commit comes and no answer either.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!batch.is_finished(), "answered before any commit");
        let committer = engine.spawn_committer(|_, _| {});
        let results = tokio::time::timeout(std::time::Duration::from_secs(10), batch)
            .await
            .expect("the commit answers the batch")
            .unwrap()
            .unwrap();
        let ticket = results
            .iter()
            .map(|r| r.as_ref().unwrap().durable_at_seq)
            .max()
            .unwrap();
        assert!(*engine.synced_tx.borrow() >= ticket);
        committer.shutdown().await;
    }

    #[tokio::test]
    async fn a_batch_of_too_many_items_is_refused_whole() {
        let engine = engine();
        let items = vec![item("ann", true, None); MAX_MEMBERS_PER_CALL + 1];
        let error = engine.like_batch(&items).await.unwrap_err();
        assert!(error.to_string().contains("split the call"), "{error}");
        assert_eq!(engine.like_count(b"post").unwrap(), 0);
    }
}
