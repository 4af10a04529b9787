//! The bytes of a coalesced batch call (`AddBatch`, and `LikeBatch` with
//! the item encoding of `like_wire.rs`), built without the generated
//! request types. [`BatchRpc`] names what differs between the two: the
//! method, and how an item's `ok` answer decodes.
//!
//! Each add is encoded once, by its caller, as the bytes it takes inside an
//! `AddBatchRequest` (field 1, length-delimited, holding an `AddRequest`);
//! a batch is those bytes laid end to end, which is exactly what prost would
//! encode for the same `AddBatchRequest`. Keeping the encoded bytes lets a
//! retry resend an add, with its idempotency key, without re-encoding or
//! cloning it; an add with a key of up to 49 bytes is kept inline, so
//! encoding it allocates nothing.
//!
//! [`BatchCodec`] sends such a payload and decodes the answer straight
//! into one [`Answer`] per item, which is all the client needs of it
//! (the same result as decoding the generated `AddBatchResponse` or
//! `LikeBatchResponse`, without building it: both are a repeated field 1
//! of results, each a oneof of `ok` (1) and `error` (2)).

use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint, skip_field,
    DecodeContext, WireType,
};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use crate::AddOutcome;

/// A batch method that the coalescing task can send: its name, and how the
/// `ok` answer of one item decodes.
pub(crate) trait BatchRpc: Send + Sync + 'static {
    /// What a caller gets for one item.
    type Outcome: Send + Sync + std::fmt::Debug + 'static;
    /// The gRPC service, as `tally.v1.Counters`.
    const SERVICE: &'static str;
    /// The method, as `AddBatch`.
    const METHOD: &'static str;
    /// `/SERVICE/METHOD`.
    const PATH: &'static str;
    /// Decodes the fields of one item's `ok` message.
    fn decode_ok(buf: &[u8]) -> Result<Self::Outcome, String>;
}

/// `Counters.AddBatch`.
#[derive(Debug)]
pub(crate) struct AddBatch;

impl BatchRpc for AddBatch {
    type Outcome = AddOutcome;
    const SERVICE: &'static str = "tally.v1.Counters";
    const METHOD: &'static str = "AddBatch";
    const PATH: &'static str = "/tally.v1.Counters/AddBatch";

    fn decode_ok(mut inner: &[u8]) -> Result<AddOutcome, String> {
        let mut outcome = AddOutcome {
            value: 0,
            duplicate: false,
        };
        while !inner.is_empty() {
            let (tag, wire_type) = decode_key(&mut inner).map_err(|error| error.to_string())?;
            match (tag, wire_type) {
                (1, WireType::Varint) => outcome.value = unzigzag(varint(&mut inner)?),
                (2, WireType::Varint) => outcome.duplicate = varint(&mut inner)? != 0,
                _ => skip(wire_type, tag, &mut inner)?,
            }
        }
        Ok(outcome)
    }
}

/// `AddBatchRequest.adds`.
const ADDS_FIELD: u32 = 1;
/// `AddRequest.key` (bytes).
const KEY_FIELD: u32 = 1;
/// `AddRequest.delta` (sint64).
const DELTA_FIELD: u32 = 2;
/// `AddRequest.idempotency_key` (string).
const IDEMPOTENCY_KEY_FIELD: u32 = 3;
/// `AddRequest.durability`.
const DURABILITY_FIELD: u32 = 4;

/// The longest encoded add kept inline: with a generated idempotency key,
/// a key of up to 49 bytes with any delta, or 58 with a delta of -64 to 63.
const INLINE_BYTES: usize = 102;

/// One item, encoded as an element of its batch request's field 1
/// (`AddBatchRequest.adds`, `LikeBatchRequest.items`).
#[derive(Clone, Debug)]
pub(crate) enum EncodedItem {
    /// Short enough to live inline.
    Inline { len: u8, bytes: [u8; INLINE_BYTES] },
    /// Longer.
    Heap(Box<[u8]>),
}

impl EncodedItem {
    /// The encoded bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            EncodedItem::Inline { len, bytes } => &bytes[..usize::from(*len)],
            EncodedItem::Heap(bytes) => bytes,
        }
    }

    /// An item of `total_len` bytes that `write` lays down: inline when it fits.
    pub(crate) fn build(total_len: usize, write: impl FnOnce(&mut &mut [u8])) -> EncodedItem {
        if total_len <= INLINE_BYTES {
            let mut bytes = [0; INLINE_BYTES];
            write(&mut &mut bytes[..total_len]);
            EncodedItem::Inline {
                len: total_len as u8,
                bytes,
            }
        } else {
            let mut buf = vec![0; total_len].into_boxed_slice();
            write(&mut &mut buf[..]);
            EncodedItem::Heap(buf)
        }
    }
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// The length of a length-delimited field with a one-byte key.
pub(crate) fn delimited_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// Encodes the add `(key, delta, idempotency_key, durability)` as one
/// element of `AddBatchRequest.adds`. Every field is written (none is at its
/// default: the key and the idempotency key are non-empty and the delta
/// non-zero, as validated before), but the durability only when it is not
/// the node's default (0), as prost does.
pub(crate) fn encode_add(
    key: &[u8],
    delta: i64,
    idempotency_key: &[u8],
    durability: i32,
) -> EncodedItem {
    let delta = zigzag(delta);
    let durability = durability as u64;
    let durability_len = match durability {
        0 => 0,
        value => 1 + encoded_len_varint(value),
    };
    let body_len = delimited_len(key.len())
        + 1
        + encoded_len_varint(delta)
        + delimited_len(idempotency_key.len())
        + durability_len;
    EncodedItem::build(delimited_len(body_len), |buf| {
        write_add(buf, body_len, key, delta, idempotency_key, durability)
    })
}

fn write_add(
    buf: &mut impl BufMut,
    body_len: usize,
    key: &[u8],
    zigzag_delta: u64,
    idempotency_key: &[u8],
    durability: u64,
) {
    encode_key(ADDS_FIELD, WireType::LengthDelimited, buf);
    encode_varint(body_len as u64, buf);
    encode_key(KEY_FIELD, WireType::LengthDelimited, buf);
    encode_varint(key.len() as u64, buf);
    buf.put_slice(key);
    encode_key(DELTA_FIELD, WireType::Varint, buf);
    encode_varint(zigzag_delta, buf);
    encode_key(IDEMPOTENCY_KEY_FIELD, WireType::LengthDelimited, buf);
    encode_varint(idempotency_key.len() as u64, buf);
    buf.put_slice(idempotency_key);
    if durability != 0 {
        encode_key(DURABILITY_FIELD, WireType::Varint, buf);
        encode_varint(durability, buf);
    }
}

/// The node's answer to one item of a batch, as decoded from an
/// `AddBatchResponse` or a `LikeBatchResponse`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer<O> {
    /// `AddResult.ok`, `LikeResult.ok`.
    Ok(O),
    /// `AddResult.error`: a gRPC code and a message.
    Error {
        /// The `google.rpc.Code` value.
        code: i32,
        /// The node's message.
        message: String,
    },
    /// Neither (a protocol error).
    Empty,
}

/// The answer to one add.
#[cfg(test)]
pub(crate) type AddAnswer = Answer<AddOutcome>;

/// Decodes a batch response of `R` into its answers, in order. Unknown
/// fields are skipped and, as protobuf wants, the last of repeated singular
/// fields (or oneof members) wins.
pub(crate) fn decode_answers<R: BatchRpc>(
    mut buf: &[u8],
) -> Result<Vec<Answer<R::Outcome>>, String> {
    let mut answers = Vec::new();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|error| error.to_string())?;
        match (tag, wire_type) {
            (1, WireType::LengthDelimited) => {
                answers.push(decode_answer::<R>(take_delimited(&mut buf)?)?);
            }
            _ => skip(wire_type, tag, &mut buf)?,
        }
    }
    Ok(answers)
}

/// Decodes one result (`AddResult`, `LikeResult`).
fn decode_answer<R: BatchRpc>(mut buf: &[u8]) -> Result<Answer<R::Outcome>, String> {
    let mut answer = Answer::Empty;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|error| error.to_string())?;
        match (tag, wire_type) {
            (1, WireType::LengthDelimited) => {
                answer = Answer::Ok(R::decode_ok(take_delimited(&mut buf)?)?);
            }
            (2, WireType::LengthDelimited) => {
                let (mut code, mut message) = (0, String::new());
                let mut inner = take_delimited(&mut buf)?;
                while !inner.is_empty() {
                    let (tag, wire_type) =
                        decode_key(&mut inner).map_err(|error| error.to_string())?;
                    match (tag, wire_type) {
                        (1, WireType::Varint) => code = varint(&mut inner)? as i32,
                        (2, WireType::LengthDelimited) => {
                            message = String::from_utf8(take_delimited(&mut inner)?.to_vec())
                                .map_err(|_| "an error message is not UTF-8".to_owned())?;
                        }
                        _ => skip(wire_type, tag, &mut inner)?,
                    }
                }
                answer = Answer::Error { code, message };
            }
            _ => skip(wire_type, tag, &mut buf)?,
        }
    }
    Ok(answer)
}

pub(crate) fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    decode_varint(buf).map_err(|error| error.to_string())
}

pub(crate) fn skip(wire_type: WireType, tag: u32, buf: &mut &[u8]) -> Result<(), String> {
    skip_field(wire_type, tag, buf, DecodeContext::default()).map_err(|error| error.to_string())
}

/// Splits a length-delimited field's bytes off the front of `buf`.
fn take_delimited<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], String> {
    let len = varint(buf)?;
    if len > buf.len() as u64 {
        return Err(format!(
            "a field of {len} bytes overruns the {} bytes left",
            buf.len()
        ));
    }
    let (field, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(field)
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// Sends an encoded batch request of `R` (the concatenation of its encoded
/// items) and decodes its response into answers.
#[derive(Debug)]
pub(crate) struct BatchCodec<R>(std::marker::PhantomData<R>);

impl<R> Default for BatchCodec<R> {
    fn default() -> Self {
        BatchCodec(std::marker::PhantomData)
    }
}

impl<R: BatchRpc> Codec for BatchCodec<R> {
    type Encode = Vec<u8>;
    type Decode = Vec<Answer<R::Outcome>>;
    type Encoder = PayloadEncoder;
    type Decoder = ResponseDecoder<R>;

    fn encoder(&mut self) -> Self::Encoder {
        PayloadEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ResponseDecoder(std::marker::PhantomData)
    }
}

/// Copies an already encoded message into the frame.
#[derive(Debug)]
pub(crate) struct PayloadEncoder;

impl Encoder for PayloadEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

/// Decodes the answer with [`decode_answers`].
#[derive(Debug)]
pub(crate) struct ResponseDecoder<R>(std::marker::PhantomData<R>);

impl<R: BatchRpc> Decoder for ResponseDecoder<R> {
    type Item = Vec<Answer<R::Outcome>>;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<Vec<Answer<R::Outcome>>>, Status> {
        let len = src.remaining();
        let decoded = if src.chunk().len() == len {
            decode_answers::<R>(src.chunk())
        } else {
            decode_answers::<R>(&src.copy_to_bytes(len))
        };
        src.advance(src.remaining());
        decoded.map(Some).map_err(|error| {
            Status::internal(format!("cannot decode the {} response: {error}", R::METHOD))
        })
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use tally_proto::v1::{
        add_result, AddBatchRequest, AddBatchResponse, AddRequest, AddResponse, AddResult,
    };

    use super::*;

    #[track_caller]
    fn assert_same_as_prost(adds: &[(&str, i64, &str)]) {
        assert_same_as_prost_with(adds, 0);
    }

    #[track_caller]
    fn assert_same_as_prost_with(adds: &[(&str, i64, &str)], durability: i32) {
        let ours: Vec<u8> = adds
            .iter()
            .flat_map(|(key, delta, idempotency_key)| {
                encode_add(
                    key.as_bytes(),
                    *delta,
                    idempotency_key.as_bytes(),
                    durability,
                )
                .as_bytes()
                .to_vec()
            })
            .collect();
        let prost = AddBatchRequest {
            adds: adds
                .iter()
                .map(|(key, delta, idempotency_key)| AddRequest {
                    key: key.as_bytes().to_vec().into(),
                    delta: *delta,
                    idempotency_key: (*idempotency_key).to_owned(),
                    durability,
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(ours, prost, "{adds:?}");
        let decoded = AddBatchRequest::decode(ours.as_slice()).unwrap();
        assert_eq!(decoded.adds.len(), adds.len());
    }

    #[test]
    fn encoded_adds_are_byte_for_byte_what_prost_encodes() {
        assert_same_as_prost(&[("post:42:likes", 1, "0190a6e4-7c1e-7000-8000-000000000001")]);
        assert_same_as_prost(&[
            ("a", -1, "k"),
            ("b", i64::MAX, "k2"),
            ("c", i64::MIN, "k3"),
            (&"x".repeat(256), 300, &"i".repeat(128)),
        ]);
        let replicated = tally_proto::v1::Durability::Replicated as i32;
        assert_same_as_prost_with(&[("votes", 1, "k"), ("b", -3, "k2")], replicated);
    }

    #[test]
    fn short_adds_are_inline_and_long_ones_on_the_heap() {
        let uuid = "0190a6e4-7c1e-7000-8000-000000000001";
        let inline = |key_len: usize, delta: i64| {
            let add = encode_add(&vec![b'k'; key_len], delta, uuid.as_bytes(), 0);
            matches!(add, EncodedItem::Inline { .. })
        };
        assert!(inline(58, 1));
        assert!(!inline(59, 1));
        assert!(inline(49, i64::MIN));
        assert!(!inline(50, i64::MIN));
        assert_same_as_prost(&[(&"k".repeat(58), 1, uuid), (&"k".repeat(59), -7, uuid)]);
    }

    #[track_caller]
    fn assert_decodes_like_prost(response: AddBatchResponse) {
        let bytes = response.encode_to_vec();
        let ours = decode_answers::<AddBatch>(&bytes).unwrap();
        let expected: Vec<AddAnswer> = response
            .results
            .into_iter()
            .map(|result| match result.outcome {
                Some(add_result::Outcome::Ok(ok)) => AddAnswer::Ok(ok.into()),
                Some(add_result::Outcome::Error(error)) => AddAnswer::Error {
                    code: error.code,
                    message: error.message,
                },
                None => AddAnswer::Empty,
            })
            .collect();
        assert_eq!(ours, expected);
    }

    #[test]
    fn answers_decode_as_prost_decodes_them() {
        let ok = |value, duplicate| AddResult {
            outcome: Some(add_result::Outcome::Ok(AddResponse { value, duplicate })),
        };
        assert_decodes_like_prost(AddBatchResponse {
            results: vec![
                ok(1, false),
                ok(0, false),
                ok(-5, true),
                ok(i64::MAX, false),
                ok(i64::MIN, true),
                AddResult {
                    outcome: Some(add_result::Outcome::Error(tally_proto::v1::Error {
                        code: 11,
                        message: "counter would exceed i64::MAX".to_owned(),
                    })),
                },
                AddResult {
                    outcome: Some(add_result::Outcome::Error(tally_proto::v1::Error {
                        code: -1,
                        message: String::new(),
                    })),
                },
                AddResult { outcome: None },
            ],
        });
        assert_decodes_like_prost(AddBatchResponse::default());
    }

    #[test]
    fn unknown_fields_are_skipped_and_truncated_input_is_refused() {
        let mut bytes = Vec::new();
        // An unknown varint field 9, then one result, then an unknown
        // length-delimited field 7.
        encode_key(9, WireType::Varint, &mut bytes);
        encode_varint(300, &mut bytes);
        bytes.extend(
            AddBatchResponse {
                results: vec![AddResult {
                    outcome: Some(add_result::Outcome::Ok(AddResponse {
                        value: 42,
                        duplicate: false,
                    })),
                }],
            }
            .encode_to_vec(),
        );
        prost::encoding::string::encode(7, &"future".to_owned(), &mut bytes);
        let answers = decode_answers::<AddBatch>(&bytes).unwrap();
        assert_eq!(
            answers,
            [AddAnswer::Ok(AddOutcome {
                value: 42,
                duplicate: false
            })]
        );
        assert!(decode_answers::<AddBatch>(&bytes[..bytes.len() - 3]).is_err());
        assert!(decode_answers::<AddBatch>(&[0x0a, 0x05, 0x0a]).is_err());
    }

    #[test]
    fn zigzag_matches_sint64() {
        for value in [0, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            let mut buf = Vec::new();
            prost::encoding::sint64::encode(2, &value, &mut buf);
            let mut ours = Vec::new();
            encode_key(2, WireType::Varint, &mut ours);
            encode_varint(zigzag(value), &mut ours);
            assert_eq!(buf, ours, "{value}");
            assert_eq!(unzigzag(zigzag(value)), value);
        }
    }
}
