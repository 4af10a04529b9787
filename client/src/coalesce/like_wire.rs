//! The bytes of a coalesced `LikeBatch` call: one like or unlike encoded as
//! an element of `LikeBatchRequest.items`, and the decoding of one item's
//! `LikeResponse`. The batch and its answers are laid out as an `AddBatch`'s
//! (see `wire.rs`), so the same batcher and codec carry both.
//!
//! Invariant: the bytes are exactly what prost encodes for the same
//! `LikeItem`, and an answer decodes as prost decodes it (tested below).

use prost::bytes::BufMut;
use prost::encoding::{decode_key, encode_key, encode_varint, WireType};

use super::wire::{delimited_len, skip, varint, BatchRpc, EncodedItem};
use crate::LikeOutcome;

/// `LikeBatchRequest.items`.
const ITEMS_FIELD: u32 = 1;
/// `LikeItem.key` (bytes).
const KEY_FIELD: u32 = 1;
/// `LikeItem.member` (bytes).
const MEMBER_FIELD: u32 = 2;
/// `LikeItem.idempotency_key` (string).
const IDEMPOTENCY_KEY_FIELD: u32 = 3;
/// `LikeItem.unlike` (bool).
const UNLIKE_FIELD: u32 = 4;

/// `Likes.LikeBatch`.
#[derive(Debug)]
pub(crate) struct LikeBatch;

impl BatchRpc for LikeBatch {
    type Outcome = LikeOutcome;
    const SERVICE: &'static str = "tally.v1.Likes";
    const METHOD: &'static str = "LikeBatch";
    const PATH: &'static str = "/tally.v1.Likes/LikeBatch";

    fn decode_ok(mut inner: &[u8]) -> Result<LikeOutcome, String> {
        let mut outcome = LikeOutcome {
            changed: false,
            liked: false,
            count: 0,
            duplicate: false,
            length: 0,
        };
        while !inner.is_empty() {
            let (tag, wire_type) = decode_key(&mut inner).map_err(|error| error.to_string())?;
            match (tag, wire_type) {
                (1, WireType::Varint) => outcome.changed = varint(&mut inner)? != 0,
                (2, WireType::Varint) => outcome.liked = varint(&mut inner)? != 0,
                (3, WireType::Varint) => outcome.count = varint(&mut inner)?,
                (4, WireType::Varint) => outcome.duplicate = varint(&mut inner)? != 0,
                (5, WireType::Varint) => outcome.length = varint(&mut inner)?,
                _ => skip(wire_type, tag, &mut inner)?,
            }
        }
        Ok(outcome)
    }
}

/// Encodes a like (or, with `unlike`, an unlike) of `member` in `key` as one
/// element of `LikeBatchRequest.items`. Key, member and idempotency key are
/// non-empty (validated before); `unlike` is written only when true, as
/// prost does.
pub(crate) fn encode_like(
    key: &[u8],
    member: &[u8],
    idempotency_key: &[u8],
    unlike: bool,
) -> EncodedItem {
    let body_len = delimited_len(key.len())
        + delimited_len(member.len())
        + delimited_len(idempotency_key.len())
        + if unlike { 2 } else { 0 };
    EncodedItem::build(delimited_len(body_len), |buf| {
        encode_key(ITEMS_FIELD, WireType::LengthDelimited, buf);
        encode_varint(body_len as u64, buf);
        for (field, bytes) in [
            (KEY_FIELD, key),
            (MEMBER_FIELD, member),
            (IDEMPOTENCY_KEY_FIELD, idempotency_key),
        ] {
            encode_key(field, WireType::LengthDelimited, buf);
            encode_varint(bytes.len() as u64, buf);
            buf.put_slice(bytes);
        }
        if unlike {
            encode_key(UNLIKE_FIELD, WireType::Varint, buf);
            encode_varint(1, buf);
        }
    })
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use tally_proto::v1::{
        like_result, LikeBatchRequest, LikeBatchResponse, LikeItem, LikeResponse, LikeResult,
    };

    use super::super::wire::{decode_answers, Answer};
    use super::*;

    #[test]
    fn encoded_likes_are_byte_for_byte_what_prost_encodes() {
        let items = [
            (
                "post:42",
                "user:sam",
                "0190a6e4-7c1e-7000-8000-000000000001",
                false,
            ),
            ("p", "m", "k", true),
            (
                &*"x".repeat(256),
                &*"m".repeat(128),
                &*"i".repeat(128),
                true,
            ),
        ];
        let ours: Vec<u8> = items
            .iter()
            .flat_map(|(key, member, idempotency_key, unlike)| {
                encode_like(
                    key.as_bytes(),
                    member.as_bytes(),
                    idempotency_key.as_bytes(),
                    *unlike,
                )
                .as_bytes()
                .to_vec()
            })
            .collect();
        let prost = LikeBatchRequest {
            items: items
                .iter()
                .map(|(key, member, idempotency_key, unlike)| LikeItem {
                    key: key.as_bytes().to_vec().into(),
                    member: member.as_bytes().to_vec().into(),
                    idempotency_key: (*idempotency_key).to_owned(),
                    unlike: *unlike,
                })
                .collect(),
        }
        .encode_to_vec();
        assert_eq!(ours, prost);
        assert!(matches!(
            encode_like(b"post:42", b"user:sam", &[b'k'; 36], false),
            EncodedItem::Inline { .. }
        ));
    }

    #[test]
    fn answers_decode_as_prost_decodes_them() {
        let ok = |changed, liked, count, duplicate, length| LikeResult {
            outcome: Some(like_result::Outcome::Ok(LikeResponse {
                changed,
                liked,
                count,
                duplicate,
                length,
            })),
        };
        let response = LikeBatchResponse {
            results: vec![
                ok(true, true, 1, false, 3),
                ok(false, false, u64::MAX, true, 0),
                ok(false, false, 0, false, u64::MAX),
                LikeResult {
                    outcome: Some(like_result::Outcome::Error(tally_proto::v1::Error {
                        code: 3,
                        message: "the member is empty".to_owned(),
                    })),
                },
                LikeResult { outcome: None },
            ],
        };
        let answers = decode_answers::<LikeBatch>(&response.encode_to_vec()).unwrap();
        let outcome = |changed, liked, count, duplicate, length| {
            Answer::Ok(LikeOutcome {
                changed,
                liked,
                count,
                duplicate,
                length,
            })
        };
        assert_eq!(
            answers,
            [
                outcome(true, true, 1, false, 3),
                outcome(false, false, u64::MAX, true, 0),
                outcome(false, false, 0, false, u64::MAX),
                Answer::Error {
                    code: 3,
                    message: "the member is empty".to_owned()
                },
                Answer::Empty,
            ]
        );
    }
}
