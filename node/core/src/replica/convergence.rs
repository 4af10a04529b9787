//! Convergence in a cluster whose nodes keep different partitions (cluster
//! version 10): whole-node digests differ there by design, so every two
//! members compare their digests of the partitions both keep. Each node
//! publishes, with its fold report (`fold_partitions.rs`,
//! [`PartitionReport::shared`]), one digest per other member; `tally status`
//! calls the cluster converged when every two live members' digests of
//! each other agree. Pure: the reports come in as values.

use crate::crdt::ReplicaId;
use crate::partition::{PartitionCount, PartitionSet};

use super::fold_partitions::{keeps, PartitionReport};

/// The digest of a node's state in the partitions of `both`: per
/// partition, its counters' slots (`counters[p]`, the sum of the writers'
/// digests there) and its like sets and uniques (`sets[p]`), hashed with
/// the partition and summed (wrapping). Folded bases are not in it: two
/// nodes that differ only in whether they applied a fold yet differ here
/// until merges bring the fold.
pub fn shared_digest(both: impl Iterator<Item = u32>, counters: &[u64], sets: &[u64]) -> u64 {
    both.fold(0u64, |sum, partition| {
        let index = partition as usize;
        let (c, s) = (
            counters.get(index).copied().unwrap_or(0),
            sets.get(index).copied().unwrap_or(0),
        );
        sum.wrapping_add(crate::crdt::stable_hash(
            0x7368_6172_6564,
            &[&partition.to_le_bytes(), &c.to_le_bytes(), &s.to_le_bytes()],
        ))
    })
}

/// A member as [`shared_convergence`] sees it: its id, its name, and its
/// report by partition (none from a member that published none).
pub struct SharedView<'r> {
    /// Its replica id.
    pub replica: ReplicaId,
    /// Its node name.
    pub name: &'r str,
    /// Its last report by partition.
    pub report: Option<&'r PartitionReport>,
}

/// Convergence in a cluster whose members report by partition: every two
/// live members (`members`, the answering node first) publish equal
/// digests of the partitions both keep. Returns the number of pairs
/// compared, or why they do not agree (yet).
pub fn shared_convergence(members: &[SharedView<'_>]) -> Result<usize, String> {
    let digest_of = |from: &SharedView<'_>, to: &SharedView<'_>| {
        from.report?
            .shared
            .iter()
            .find(|(peer, _)| *peer == to.replica)
            .map(|(_, digest)| *digest)
    };
    if let Some(silent) = members.iter().find(|member| member.report.is_none()) {
        return Err(format!(
            "{} has not reported the digests of its partitions yet",
            silent.name
        ));
    }
    let mut pairs = 0;
    for (index, a) in members.iter().enumerate() {
        for b in &members[index + 1..] {
            match (digest_of(a, b), digest_of(b, a)) {
                (Some(ours), Some(theirs)) if ours == theirs => pairs += 1,
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "{} and {} hold different states of the partitions both keep",
                        a.name, b.name
                    ))
                }
                (None, _) => {
                    return Err(format!(
                        "{} has no digest of the partitions it shares with {} yet",
                        a.name, b.name
                    ))
                }
                (_, None) => {
                    return Err(format!(
                        "{} has no digest of the partitions it shares with {} yet",
                        b.name, a.name
                    ))
                }
            }
        }
    }
    Ok(pairs)
}

/// The partitions of `count` that both `a` and `b` keep (`None`: every one).
pub fn kept_by_both<'k>(
    count: PartitionCount,
    a: Option<&'k PartitionSet>,
    b: Option<&'k PartitionSet>,
) -> impl Iterator<Item = u32> + 'k {
    (0..count.get()).filter(move |p| keeps(a, *p) && keeps(b, *p))
}
