//! How writers become retired, as [`Folds`] learns it: on an operator's
//! word, or as an old incarnation of a node whose newer incarnation is up
//! once it has been down for `--retire-after` (the node names seen in
//! gossip tell incarnations of one node apart, and are persisted so that a
//! restart still knows them, as is when each was first seen down, so that a
//! restart does not start the wait over). Retirements only grow; a
//! retired writer never writes again (fenced), which is what lets its
//! final state be agreed and folded exactly (DESIGN.md, invariant 9).

use std::collections::hash_map::Entry;

use crate::crdt::ReplicaId;

use super::{FoldMember, Folds, RetireReason, RetireRefused};

impl Folds {
    /// Retires `writer` on an operator's word. Refused for this node's own
    /// id, an id this node never heard of, and a live member.
    pub fn retire(
        &mut self,
        writer: ReplicaId,
        own: ReplicaId,
        known: bool,
        members: &[FoldMember],
    ) -> Result<bool, RetireRefused> {
        if writer == own {
            return Err(RetireRefused::Own(writer));
        }
        let member = members.iter().find(|member| member.replica == writer);
        if member.is_some_and(|member| member.alive) {
            return Err(RetireRefused::Alive(writer));
        }
        if !known && member.is_none() {
            return Err(RetireRefused::Unknown(writer));
        }
        Ok(self.learn_retired(writer, RetireReason::Operator))
    }

    pub(super) fn learn_retired(&mut self, writer: ReplicaId, reason: RetireReason) -> bool {
        if self.retired.contains_key(&writer) {
            return false;
        }
        self.retired.insert(writer, reason.clone());
        self.pending_retired.push((writer, reason));
        true
    }

    /// Remembers each member's node name, so that an incarnation gone from
    /// the member list (dropped once a newer one of its name appears) is
    /// still known as its node's when [`Self::retire_replaced`] runs. Called
    /// every round, folding or not: a node wiped in a new cluster's first
    /// seconds, before its version allows folds, would otherwise be dropped
    /// before any round saw it and never retired. A name first seen goes
    /// to the next commit, so that a node that restarts after gossip dropped
    /// the old incarnation (every node may restart in a rolling upgrade) still
    /// retires it.
    pub fn note_node_names(&mut self, members: &[FoldMember]) {
        for member in members {
            // A replica's node name never changes: no new string per round.
            if self.retired.contains_key(&member.replica) {
                continue;
            }
            if let Entry::Vacant(vacant) = self.node_names.entry(member.replica) {
                vacant.insert(member.node_name.clone());
                self.pending_node_names
                    .push((member.replica, member.node_name.clone()));
            }
        }
    }

    /// The node names recovered from disk (a retired replica's was deleted
    /// with its retirement).
    pub fn recover_node_names(&mut self, names: Vec<(ReplicaId, String)>) {
        for (replica, name) in names {
            if !self.retired.contains_key(&replica) {
                self.node_names.insert(replica, name);
            }
        }
    }

    /// The node names to persist with the next commit (none of a replica
    /// retired meanwhile: its retirement deletes the name).
    pub fn take_pending_node_names(&mut self) -> Vec<(ReplicaId, String)> {
        let mut names = std::mem::take(&mut self.pending_node_names);
        names.retain(|(replica, _)| !self.retired.contains_key(replica));
        names
    }

    /// A failed commit: its node names go into the next one.
    pub fn restore_pending_node_names(&mut self, names: Vec<(ReplicaId, String)>) {
        self.pending_node_names.extend(names);
    }

    /// The times replicas were first seen down, recovered from disk: the
    /// wait of `--retire-after` goes on from them.
    pub fn recover_dead_since(&mut self, since: Vec<(ReplicaId, u64)>) {
        for (replica, since_ms) in since {
            if !self.retired.contains_key(&replica) {
                self.dead_since_ms.insert(replica, since_ms);
            }
        }
    }

    /// The dead-since times set (`Some`) or cleared (`None`) since the
    /// last commit, to persist with the next one.
    pub fn take_pending_dead_since(&mut self) -> Vec<(ReplicaId, Option<u64>)> {
        std::mem::take(&mut self.pending_dead_since)
    }

    /// A failed commit: its dead-since changes go into the next one, before
    /// any made since (which are newer).
    pub fn restore_pending_dead_since(&mut self, changes: Vec<(ReplicaId, Option<u64>)>) {
        let newer = std::mem::replace(&mut self.pending_dead_since, changes);
        self.pending_dead_since.extend(newer);
    }

    /// Retires old incarnations: a member that is down (or gone from the
    /// member list, which drops an old incarnation once a newer one of its
    /// name appears) while a newer incarnation of its node (same node name,
    /// another id) is alive, once it has been seen so for `retire_after_ms`.
    pub fn retire_replaced(
        &mut self,
        now_ms: u64,
        own: ReplicaId,
        own_node_name: &str,
        members: &[FoldMember],
        retire_after_ms: u64,
    ) -> Vec<ReplicaId> {
        self.note_node_names(members);
        let down: Vec<(ReplicaId, String)> = self
            .node_names
            .iter()
            .filter(|(replica, _)| {
                **replica != own
                    && !members
                        .iter()
                        .any(|member| member.replica == **replica && member.alive)
            })
            .map(|(replica, name)| (*replica, name.clone()))
            .collect();
        let pending = &mut self.pending_dead_since;
        self.dead_since_ms.retain(|replica, _| {
            let still = down.iter().any(|(id, _)| id == replica);
            if !still {
                pending.push((*replica, None));
            }
            still
        });
        let mut retired = Vec::new();
        for (replica, name) in down {
            let since = *self.dead_since_ms.entry(replica).or_insert_with(|| {
                self.pending_dead_since.push((replica, Some(now_ms)));
                now_ms
            });
            if self.is_retired(replica) || now_ms.saturating_sub(since) < retire_after_ms {
                continue;
            }
            let newer = if name == own_node_name {
                Some(own)
            } else {
                members
                    .iter()
                    .find(|other| {
                        other.alive && other.node_name == name && other.replica != replica
                    })
                    .map(|other| other.replica)
            };
            if let Some(by) = newer {
                if self.learn_retired(replica, RetireReason::Replaced { by }) {
                    retired.push(replica);
                }
            }
        }
        self.node_names
            .retain(|replica, _| !self.retired.contains_key(replica));
        retired
    }
}
