//! The reads of [`DurableState`](crate::replica::DurableState) that depend
//! on this storage's key layout (like-set members and counts, uniques
//! registers, the set keys, idempotency segments, the delta log), as one
//! macro that a store expands inside its `impl DurableState`, after the four
//! raw reads (`load_counter`, `changes_after`, `get_record`, `scan_records`)
//! it writes itself.
//!
//! Why a macro: the replica defines the trait and must not call into
//! `storage` (that would close the circle replica -> storage -> replica),
//! so the trait cannot carry these bodies as defaults; every store of this
//! layout (the in-memory one here, the sled one and its fault-injecting
//! wrapper in `tally-node`) answers them the same way, through its own raw
//! reads.

/// Expands to the layout-dependent methods of
/// [`DurableState`](crate::replica::DurableState), each reading through the
/// store's own `get_record` and `scan_records` (see the module header).
#[macro_export]
macro_rules! durable_layout_reads {
    () => {
        fn load_member(
            &self,
            key: &str,
            member: &str,
        ) -> Result<u64, $crate::replica::StorageError> {
            $crate::storage::sets::load_member(self, key, member)
        }

        fn load_like_count(&self, key: &str) -> Result<u64, $crate::replica::StorageError> {
            $crate::storage::sets::load_like_count(self, key).map(|(count, _)| count)
        }

        fn load_uniques(
            &self,
            key: &str,
        ) -> Result<Option<$crate::crdt::HyperLogLog>, $crate::replica::StorageError> {
            $crate::storage::sets::load_uniques(self, key)
        }

        fn set_keys_after(
            &self,
            kind: $crate::replica::SetKind,
            after: Option<&str>,
            limit: usize,
        ) -> Result<Vec<String>, $crate::replica::StorageError> {
            $crate::storage::sets::set_keys_after(self, kind, after, limit)
        }

        fn like_members_after(
            &self,
            key: &str,
            after: Option<&str>,
            limit: usize,
        ) -> Result<Vec<(String, u64)>, $crate::replica::StorageError> {
            $crate::storage::sets::scan_members(self, key, after, limit)
        }

        fn idempotency_segments_after(
            &self,
            after: u64,
            limit: usize,
        ) -> Result<
            Vec<(u64, Vec<$crate::replica::IdempotencyRecord>)>,
            $crate::replica::StorageError,
        > {
            $crate::storage::idempotency_segments_after(self, after, limit)
        }

        fn deltas_after(
            &self,
            after: &$crate::replica::DeltaCursor,
            limit: usize,
        ) -> Result<
            Vec<($crate::replica::DeltaCursor, $crate::replica::SetDelta)>,
            $crate::replica::StorageError,
        > {
            $crate::storage::sets::deltas_after(self, after, limit)
        }
    };
}
