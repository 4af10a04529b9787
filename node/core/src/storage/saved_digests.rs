//! The store's side of the replica's digests by partition: decoding the
//! digests a clean stop saved, computing them from the stored counters and
//! sets when those are not current, and encoding them for the next start.
//! The replica keeps and checks them
//! ([`Replica::set_partition_count_with`]); it never reads the store's
//! encodings itself, so these wrappers live here, on the storage side.

use crate::partition::PartitionCount;
use crate::replica::{DurableState, Replica, StorageError};

use super::{compute_partition_digests, encoding, sets};

/// Sets `replica`'s partition count and starts keeping its fold state by
/// partition: from `saved` (what [`saved_partition_digests`] gave at the
/// last clean stop) when it decodes and is current, else computed by
/// reading every counter and set of `store` once. Returns whether `saved`
/// was used.
pub fn set_partition_count(
    replica: &mut Replica,
    count: PartitionCount,
    store: &(impl DurableState + ?Sized),
    saved: Option<&[u8]>,
) -> Result<bool, StorageError> {
    let saved = saved.and_then(|bytes| encoding::decode_partition_digests(bytes).ok());
    replica.set_partition_count_with(count, saved, |book| {
        Ok((
            compute_partition_digests(store, count, book)?,
            sets::compute_digests_by_partition(store, count)?,
        ))
    })
}

/// `replica`'s digests by partition of its durable state, encoded for the
/// next start (`None` when partitions are not tracked or a commit is in
/// flight: see [`Replica::saved_partition_digests`]).
pub fn saved_partition_digests(replica: &Replica) -> Option<Vec<u8>> {
    replica
        .saved_partition_digests()
        .map(|saved| encoding::encode_partition_digests(&saved))
}
