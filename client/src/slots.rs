//! A counter's slots as the answering node holds them ([`Client::get_with_slots`]
//! and `tally get --slots`): one per live writer, and the folded base that
//! holds the sums of writers retired and folded (DESIGN.md, "Retiring
//! replicas"). The value is always the base plus every slot's `p - n`.
//!
//! [`Client::get_with_slots`]: crate::Client::get_with_slots

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};
use tally_proto::v1 as proto;

use crate::Error;

/// A counter with its live writers' slots and its folded base.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct CounterSlots {
    /// The counter's key.
    pub key: String,
    /// The counter's value: `folded.p - folded.n` plus every slot's `p - n`.
    pub value: i64,
    /// One entry per writer whose slot the counter holds, in replica id
    /// order. A folded writer has none: its sums are in `folded`.
    pub slots: Vec<WriterSlot>,
    /// The sums of the writers folded into the counter (zero when none was).
    pub folded: FoldedSums,
}

/// One live writer's slot in a counter.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct WriterSlot {
    /// The writing replica's id (JSON: 16 hex digits, as in `tally status`).
    #[cfg_attr(feature = "serde", serde(with = "crate::types::hex_u64"))]
    pub replica: u64,
    /// Its region, or `"unknown"` when the answering node has not learned it.
    pub region: String,
    /// The sum of its increments.
    pub p: u64,
    /// The sum of its decrements (a positive number).
    pub n: u64,
}

/// The sums of a counter's folded writers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct FoldedSums {
    /// The fold epoch the sums are complete up to (0: nothing folded).
    pub epoch: u64,
    /// The sum of the folded writers' increments.
    pub p: u128,
    /// The sum of the folded writers' decrements.
    pub n: u128,
}

pub(crate) fn slots_from_proto(
    key: &str,
    response: proto::GetResponse,
) -> Result<CounterSlots, Error> {
    let folded = response.folded.ok_or_else(|| {
        Error::Protocol(
            "the node answered without slots: it is older than `get --slots` (upgrade it)"
                .to_owned(),
        )
    })?;
    Ok(CounterSlots {
        key: key.to_owned(),
        value: response.value,
        slots: response
            .slots
            .into_iter()
            .map(|slot| WriterSlot {
                replica: slot.replica,
                region: slot.region,
                p: slot.p,
                n: slot.n,
            })
            .collect(),
        folded: FoldedSums {
            epoch: folded.epoch,
            p: u128::from(folded.p_high) << 64 | u128::from(folded.p_low),
            n: u128::from(folded.n_high) << 64 | u128::from(folded.n_low),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_without_slots_is_a_protocol_error() {
        let error = slots_from_proto("k", proto::GetResponse::default()).unwrap_err();
        assert!(error.to_string().contains("older than"), "{error}");
    }

    #[test]
    fn the_folded_sums_join_their_two_halves() {
        let response = proto::GetResponse {
            value: 3,
            folded: Some(proto::FoldedSums {
                epoch: 2,
                p_low: 5,
                p_high: 1,
                n_low: 2,
                n_high: 0,
            }),
            ..Default::default()
        };
        let slots = slots_from_proto("k", response).unwrap();
        assert_eq!(slots.folded.p, (1u128 << 64) + 5);
        assert_eq!(slots.folded.n, 2);
        assert_eq!(slots.folded.epoch, 2);
    }
}
