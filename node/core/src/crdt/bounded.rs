//! The bounded counter (issue 44, DESIGN.md "Bounded counters"): stock that
//! must never be oversold, taken without a round trip. Escrow, as
//! AntidoteDB's bounded counter: each writer holds **rights** to take, and a
//! take is checked against the taking writer's rights alone.
//!
//! Each writer owns one row and is the only one to raise it (invariant 1,
//! as for a PN-counter slot): what it `put` (the initial stock included),
//! what it `took`, and what it `sent` to each other writer (a transfer of
//! rights, cumulative per receiver). A writer's rights are
//! `put - took + received - sent`, where `received` sums the other rows'
//! `sent` to it; the counter's value is `bound + Σ put - Σ took`, and the
//! rights of all writers sum to `value - bound`.
//!
//! Invariants:
//! - **Invariant 10.** A writer takes or sends only what its rights cover as
//!   it sees them, and it takes only on its own replica. There its own row
//!   is exact (only it raises it), and what it has not yet seen of others'
//!   rows only *adds* to its rights (a transfer to it), so its view of its
//!   own rights is at most the truth, and no writer's true rights go below
//!   zero: the acknowledged takes never exceed the stock plus the
//!   acknowledged puts, at any moment. (Another replica's view of a
//!   writer's rights may be stale and higher; nobody takes by it.)
//! - **Transfers are states, not messages.** A transfer is the sender's
//!   cumulative `sent` to the receiver, merged by max like the rest of the
//!   row, so a transfer lost, repeated or delivered out of order neither
//!   creates nor destroys rights: the receiver holds it once it has merged
//!   the sender's row, however that row reached it.
//! - **Merge is the row-wise, field-wise max**, so it obeys the [`Crdt`]
//!   laws; two states of one counter always have the same bound (it is fixed
//!   when the counter is created; [`BoundedCounter::check_merge`] refuses
//!   states of another).
//!
//! A retired writer's rights go to an heir, exactly ([`super::bounded_fold`]):
//! the state also maps each retired writer to its heir, and a writer's
//! rights count those of the retired writers whose heirs lead to it.
//! Deciding when to fold and moving rights with partitions are the
//! protocol's part, not here.

use std::collections::BTreeMap;

use super::bounded_fold::BoundedFoldRefused;
use super::{Crdt, ReplicaId};

/// One writer's row (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RightsRow {
    /// Stock this writer added (the initial stock, refunds).
    pub put: u64,
    /// Stock this writer took.
    pub took: u64,
    /// Rights this writer sent, cumulative, per receiver.
    pub sent: BTreeMap<ReplicaId, u64>,
}

/// Why a take, a put or a transfer was refused; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoundedRefused {
    /// The writer's rights do not cover it; other writers may hold more.
    #[error("this writer holds rights to {rights} and was asked for {asked}; rights are elsewhere (the counter's value is {value}, its bound {bound})")]
    NoRights {
        /// What was asked for.
        asked: u64,
        /// The writer's rights.
        rights: u64,
        /// The counter's value as this replica sees it.
        value: i128,
        /// The bound.
        bound: i64,
    },
    /// A total would pass 2^64 - 1.
    #[error("the amount would overflow this writer's total of 2^64 - 1")]
    Overflow,
    /// Zero is not an amount.
    #[error("the amount must be at least 1")]
    Zero,
    /// A writer cannot send rights to itself.
    #[error("a writer cannot transfer rights to itself")]
    ToItself,
    /// The writer is retired: it writes no more, and its heir holds its
    /// rights.
    #[error("writer {writer} is retired; its rights are its heir's")]
    Retired {
        /// The retired writer.
        writer: ReplicaId,
    },
}

/// Why two states of one bounded counter may not be merged; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MergeRefused {
    /// States of a counter created with another bound.
    #[error(
        "two states of one bounded counter disagree on its bound ({ours} here, {theirs} there)"
    )]
    Bound {
        /// Our bound.
        ours: i64,
        /// Theirs.
        theirs: i64,
    },
    /// The states' folds of retired writers disagree.
    #[error(transparent)]
    Fold(#[from] BoundedFoldRefused),
}

/// A bounded counter (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BoundedCounter {
    bound: i64,
    pub(super) rows: BTreeMap<ReplicaId, RightsRow>,
    /// Each retired writer's heir ([`super::bounded_fold`]).
    pub(super) heirs: BTreeMap<ReplicaId, ReplicaId>,
}

impl BoundedCounter {
    /// A counter at `bound` with no stock; the creator then `put`s it.
    pub fn new(bound: i64) -> Self {
        BoundedCounter {
            bound,
            rows: BTreeMap::new(),
            heirs: BTreeMap::new(),
        }
    }

    /// A counter of these parts as they were stored or sent (a decoder's
    /// constructor: it checks nothing, the decoder does).
    pub(crate) fn from_parts(
        bound: i64,
        rows: BTreeMap<ReplicaId, RightsRow>,
        heirs: BTreeMap<ReplicaId, ReplicaId>,
    ) -> Self {
        BoundedCounter { bound, rows, heirs }
    }

    /// The lower bound.
    pub fn bound(&self) -> i64 {
        self.bound
    }

    /// The rows, by writer.
    pub fn rows(&self) -> &BTreeMap<ReplicaId, RightsRow> {
        &self.rows
    }

    /// The value: the bound plus every put less every take.
    pub fn value(&self) -> i128 {
        let (put, took) = self.rows.values().fold((0i128, 0i128), |(put, took), row| {
            (put + i128::from(row.put), took + i128::from(row.took))
        });
        i128::from(self.bound) + put - took
    }

    /// `writer`'s rights as this state sees them: on `writer`'s own replica,
    /// at most its true rights (transfers to it may not have arrived yet);
    /// elsewhere possibly stale. They include the rights of the retired
    /// writers it is the heir of (directly or by a chain of folds); a
    /// retired writer holds none.
    pub fn rights(&self, writer: ReplicaId) -> i128 {
        if self.heirs.contains_key(&writer) {
            return 0;
        }
        let inherited: i128 = self
            .heirs
            .keys()
            .filter(|retired| self.holder_of(**retired) == Some(writer))
            .map(|retired| self.row_rights(*retired))
            .sum();
        self.row_rights(writer) + inherited
    }

    /// The rights that `writer`'s row and the transfers to it make, without
    /// folds: `put - took + received - sent`.
    fn row_rights(&self, writer: ReplicaId) -> i128 {
        let received: i128 = self
            .rows
            .iter()
            .filter(|(sender, _)| **sender != writer)
            .filter_map(|(_, row)| row.sent.get(&writer))
            .map(|sent| i128::from(*sent))
            .sum();
        match self.rows.get(&writer) {
            Some(row) => {
                let sent: i128 = row.sent.values().map(|sent| i128::from(*sent)).sum();
                i128::from(row.put) - i128::from(row.took) + received - sent
            }
            None => received,
        }
    }

    /// `writer` takes `amount`, if its rights cover it.
    pub fn take(&mut self, writer: ReplicaId, amount: u64) -> Result<(), BoundedRefused> {
        self.live(writer)?;
        self.covered(writer, amount)?;
        let row = self.rows.entry(writer).or_default();
        row.took = row
            .took
            .checked_add(amount)
            .ok_or(BoundedRefused::Overflow)?;
        Ok(())
    }

    /// `writer` adds `amount` of stock (a refund, a released hold, the
    /// initial stock), which become its rights.
    pub fn put(&mut self, writer: ReplicaId, amount: u64) -> Result<(), BoundedRefused> {
        if amount == 0 {
            return Err(BoundedRefused::Zero);
        }
        self.live(writer)?;
        let row = self.rows.entry(writer).or_default();
        row.put = row
            .put
            .checked_add(amount)
            .ok_or(BoundedRefused::Overflow)?;
        Ok(())
    }

    /// `from` sends `amount` of its rights to `to`, if they cover it. `to`
    /// holds them once it has merged `from`'s row. Neither may be retired
    /// (send to the heir instead; a transfer to a writer retired meanwhile
    /// reaches its heir).
    pub fn transfer(
        &mut self,
        from: ReplicaId,
        to: ReplicaId,
        amount: u64,
    ) -> Result<(), BoundedRefused> {
        if from == to {
            return Err(BoundedRefused::ToItself);
        }
        self.live(from)?;
        self.live(to)?;
        self.covered(from, amount)?;
        let row = self.rows.entry(from).or_default();
        let sent = row.sent.entry(to).or_default();
        *sent = sent.checked_add(amount).ok_or(BoundedRefused::Overflow)?;
        Ok(())
    }

    fn live(&self, writer: ReplicaId) -> Result<(), BoundedRefused> {
        match self.heirs.contains_key(&writer) {
            true => Err(BoundedRefused::Retired { writer }),
            false => Ok(()),
        }
    }

    fn covered(&self, writer: ReplicaId, amount: u64) -> Result<(), BoundedRefused> {
        if amount == 0 {
            return Err(BoundedRefused::Zero);
        }
        let rights = self.rights(writer);
        if rights < i128::from(amount) {
            return Err(BoundedRefused::NoRights {
                asked: amount,
                rights: u64::try_from(rights.max(0)).unwrap_or(u64::MAX),
                value: self.value(),
                bound: self.bound,
            });
        }
        Ok(())
    }

    /// Whether `other` may be merged into this state: the same bound, and
    /// folds that agree (each retired writer has one heir, and no chain of
    /// heirs is a circle).
    pub fn check_merge(&self, other: &BoundedCounter) -> Result<(), MergeRefused> {
        if self.bound != other.bound {
            return Err(MergeRefused::Bound {
                ours: self.bound,
                theirs: other.bound,
            });
        }
        self.check_fold_merge(other)?;
        Ok(())
    }
}

impl Crdt for BoundedCounter {
    /// Row-wise, field-wise max, and the union of the heirs, for two states
    /// with one bound and agreeing folds ([`BoundedCounter::check_merge`]
    /// first where they may differ).
    fn merge(&mut self, other: &Self) -> bool {
        debug_assert_eq!(self.bound, other.bound);
        let mut changed = self.merge_heirs(other);
        for (writer, theirs) in &other.rows {
            changed |= self.merge_row(*writer, theirs);
        }
        changed
    }
}

impl BoundedCounter {
    /// Raises `writer`'s row to the field-wise max of it and `theirs`.
    pub(super) fn merge_row(&mut self, writer: ReplicaId, theirs: &RightsRow) -> bool {
        if *theirs == RightsRow::default() {
            return false;
        }
        let row = self.rows.entry(writer).or_default();
        let mut changed = false;
        for (mine, theirs) in [(&mut row.put, theirs.put), (&mut row.took, theirs.took)] {
            if theirs > *mine {
                *mine = theirs;
                changed = true;
            }
        }
        for (to, sent) in theirs.sent.iter().filter(|(_, sent)| **sent > 0) {
            let mine = row.sent.entry(*to).or_default();
            if *sent > *mine {
                *mine = *sent;
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
#[path = "bounded_tests.rs"]
mod tests;
