//! The add path of the engine: applying adds to the core under its lock
//! (single adds and batches, in slices), then waiting until each is as
//! durable as its mode asks before answering.
//!
//! Invariant 4 of DESIGN.md is kept here: a `sync` add is answered only once
//! the durable sequence reaches its ticket, a `replicated` one only once the
//! replicated sequence does (`replicated.rs`); an `async` one at once.

use std::time::Duration;

use crate::replica::{check_key, AddAccepted, AddRefused, AddRequest, Replica};

use super::hot_keys::Op;
use super::{now_ms, Durability, Engine, EngineError, StoreHealth, BATCH_SLICE};

impl Engine {
    /// Adds to one counter and answers once the add is as durable as the
    /// node's mode asks.
    pub async fn add(
        &self,
        key: &[u8],
        delta: i64,
        idempotency_key: Option<&str>,
    ) -> Result<AddAccepted, EngineError> {
        self.add_as(key, delta, idempotency_key, self.durability, None)
            .await
    }

    /// Adds to one counter and answers once the add is as durable as
    /// `durability` asks; a replicated add waits for its copies at most
    /// `deadline` (default [`super::REPLICATED_WAIT_DEFAULT`]).
    pub async fn add_as(
        &self,
        key: &[u8],
        delta: i64,
        idempotency_key: Option<&str>,
        durability: Durability,
        deadline: Option<Duration>,
    ) -> Result<AddAccepted, EngineError> {
        let started = std::time::Instant::now();
        let replicated = durability == Durability::Replicated;
        let result = self.check_adds().and_then(|()| {
            let now = now_ms();
            let mut core = self.core();
            self.apply_add_locked(&mut core, now, key, delta, idempotency_key, replicated)
        });
        let accepted = match result {
            Ok(accepted) => accepted,
            Err(error) => {
                self.count_add_error(&error);
                return Err(error);
            }
        };
        self.commit_wakeup.notify_one();
        let waited = match durability {
            Durability::Async => Ok(()),
            Durability::Sync => self.wait_flushed(accepted.durable_at_seq).await,
            Durability::Replicated => {
                self.wait_replicated(&[key], accepted.durable_at_seq, started, deadline)
                    .await
            }
        };
        if let Err(error) = waited {
            self.count_add_error(&error);
            return Err(error);
        }
        self.metrics
            .add_duration
            .observe(started.elapsed().as_secs_f64());
        Ok(accepted)
    }

    /// Adds to many counters under one lock; each add gets its own result.
    /// Each add is as durable as the stronger of its own mode and the node's;
    /// replicated ones wait for their copies at most `deadline`.
    pub async fn add_batch<'a>(
        &self,
        adds: impl IntoIterator<Item = (&'a [u8], i64, Option<&'a str>, Option<Durability>)>,
        deadline: Option<Duration>,
    ) -> Vec<Result<AddAccepted, EngineError>> {
        let started = std::time::Instant::now();
        let adds: Vec<_> = adds
            .into_iter()
            .map(|(key, delta, idempotency_key, asked)| {
                let durability =
                    asked.map_or(self.durability, |asked| asked.stronger(self.durability));
                (key, delta, idempotency_key, durability)
            })
            .collect();
        let mut results: Vec<Result<AddAccepted, EngineError>> =
            if self.check_adds().is_err() {
                // Every item gets the refusal (read again: an error is not Clone).
                adds.iter()
                    .map(|_| Err(self.check_adds().err().unwrap_or(EngineError::ShuttingDown)))
                    .collect()
            } else {
                // In slices, each with its cold counters read from the store
                // before the lock is taken: a batch of thousands of cold keys
                // held the core lock through every disk read, and every other
                // request waited behind it.
                let mut results = Vec::with_capacity(adds.len());
                for slice in adds.chunks(BATCH_SLICE) {
                    self.warm_cold_counters(slice.iter().map(|(key, ..)| *key));
                    let now = now_ms();
                    let mut core = self.core();
                    results.extend(slice.iter().map(
                        |&(key, delta, idempotency_key, durability)| {
                            let replicated = durability == Durability::Replicated;
                            self.apply_add_locked(
                                &mut core,
                                now,
                                key,
                                delta,
                                idempotency_key,
                                replicated,
                            )
                        },
                    ));
                }
                results
            };
        for result in &results {
            if let Err(error) = result {
                self.count_add_error(error);
            }
        }
        let ticket = |modes: &[Durability]| {
            results
                .iter()
                .zip(&adds)
                .filter(|(_, add)| modes.contains(&add.3))
                .filter_map(|(result, _)| result.as_ref().ok())
                .map(|accepted| accepted.durable_at_seq)
                .max()
        };
        let any_ticket = ticket(&[Durability::Async, Durability::Sync, Durability::Replicated]);
        let durable_ticket = ticket(&[Durability::Sync, Durability::Replicated]);
        let replicated_ticket = ticket(&[Durability::Replicated]);
        if any_ticket.is_some() {
            self.commit_wakeup.notify_one();
        }
        if let Some(ticket) = durable_ticket {
            if let Err(error) = self.wait_flushed(ticket).await {
                let cause = match error {
                    EngineError::StoreFailed(cause) => Some(cause),
                    _ => None,
                };
                return results
                    .into_iter()
                    .zip(&adds)
                    .map(|(result, add)| {
                        if add.3 == Durability::Async {
                            return result;
                        }
                        result.and(Err(match &cause {
                            Some(cause) => EngineError::StoreFailed(cause.clone()),
                            None => EngineError::ShuttingDown,
                        }))
                    })
                    .collect();
            }
        }
        if let Some(ticket) = replicated_ticket {
            let keys: Vec<&[u8]> = results
                .iter()
                .zip(&adds)
                .filter(|(result, add)| add.3 == Durability::Replicated && result.is_ok())
                .map(|(_, add)| add.0)
                .collect();
            if let Err(error) = self.wait_replicated(&keys, ticket, started, deadline).await {
                self.count_add_error(&error);
                for (result, add) in results.iter_mut().zip(&adds) {
                    if add.3 == Durability::Replicated && result.is_ok() {
                        *result = Err(error.same_again());
                    }
                }
                return results;
            }
        }
        if durable_ticket.is_some() {
            self.metrics
                .add_duration
                .observe(started.elapsed().as_secs_f64());
        }
        results
    }

    /// Reads the counters of `keys` that the core does not hold in memory,
    /// without the core lock, so that the store's cache has them when the
    /// core asks under the lock. Only a warm-up: what the core reads under
    /// the lock is what counts (a record read here could be stale by then).
    fn warm_cold_counters<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) {
        let keys: Vec<&str> = keys.filter_map(|key| check_key(key).ok()).collect();
        let cold: Vec<&str> = {
            let core = self.core();
            keys.into_iter()
                .filter(|key| !core.is_cached(key))
                .collect()
        };
        for key in cold {
            let _ = self.store.load_counter(key);
        }
    }

    fn apply_add_locked(
        &self,
        core: &mut Replica,
        now: u64,
        key: &[u8],
        delta: i64,
        idempotency_key: Option<&str>,
        replicated: bool,
    ) -> Result<AddAccepted, EngineError> {
        let key = check_key(key)?;
        if replicated {
            self.check_region_holds_copies(core)?;
        }
        let request = AddRequest {
            key,
            delta,
            idempotency_key,
        };
        let accepted = if replicated {
            core.handle_add_replicated(now, &*self.store, request)?
        } else {
            core.handle_add(now, &*self.store, request)?
        };
        if accepted.duplicate {
            self.metrics.duplicate_adds.inc();
        } else {
            self.metrics.adds.inc();
            self.watchers.notify(key, accepted.value);
            self.record_hot(Op::Add, key);
        }
        Ok(accepted)
    }

    pub(super) fn count_add_error(&self, error: &EngineError) {
        let reason = match error {
            EngineError::Key(_) => "bad_key",
            EngineError::Add(AddRefused::Counter(_)) => "counter",
            EngineError::Add(
                AddRefused::IdempotencyKeyReused(_) | AddRefused::IdempotencyKeyTooLong(_),
            ) => "idempotency_key",
            EngineError::Add(AddRefused::Storage(_)) | EngineError::Storage(_) => "storage",
            EngineError::Add(AddRefused::Fenced(_)) => "fenced",
            EngineError::Add(AddRefused::HeldAfterRestart { .. }) => "held_after_restart",
            EngineError::Add(AddRefused::NotServed { .. }) => "not_served",
            EngineError::Add(AddRefused::WriteGated(_)) => "write_gated",
            EngineError::OutOfRange(_) => "out_of_range",
            EngineError::ShuttingDown => "shutting_down",
            EngineError::StoreFailing(_) | EngineError::StoreFailed(_) => "storage_failed",
            EngineError::DiskFull { .. } => "disk_full",
            EngineError::Set(_) => "set",
            EngineError::CopiesUnconfirmed { .. } => "copies_unconfirmed",
            EngineError::RegionTooSmall { .. } => "region_too_small",
            EngineError::TooFewOwners { .. } => "too_few_owners",
        };
        debug_assert!(
            crate::metrics::ADD_ERROR_REASONS.contains(&reason),
            "add error reason {reason:?} is missing from ADD_ERROR_REASONS"
        );
        self.metrics
            .add_errors
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Waits until the node's durability mode is satisfied for `ticket`:
    /// at once in `async` mode, else until the commit is on disk.
    pub(super) async fn wait_durable(&self, ticket: u64) -> Result<(), EngineError> {
        if self.durability == Durability::Async {
            return Ok(());
        }
        self.wait_flushed(ticket).await
    }

    /// Waits until the durable sequence reaches `ticket`, whatever the
    /// node's mode (a `sync` or `replicated` add, or a push taken as a copy).
    pub(super) async fn wait_flushed(&self, ticket: u64) -> Result<(), EngineError> {
        let mut durable = self.synced_tx.subscribe();
        let mut health = self.health.subscribe();
        tokio::select! {
            biased;
            reached = durable.wait_for(|seq| *seq >= ticket) => {
                reached.map(|_| ()).map_err(|_| EngineError::ShuttingDown)
            }
            ended = health.wait_for(|h| matches!(h, StoreHealth::Failed(_) | StoreHealth::Stopped)) => {
                match ended.as_deref() {
                    Ok(StoreHealth::Failed(cause)) => Err(EngineError::StoreFailed(cause.clone())),
                    _ => Err(EngineError::ShuttingDown),
                }
            }
        }
    }
}
