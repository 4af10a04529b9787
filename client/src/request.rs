//! How a call's request is built and its answer taken apart: generated
//! idempotency keys, per-attempt gRPC timeouts, and batch answers put back in
//! the places of the items that were sent.
//!
//! Invariant: a batch answer with a different number of results than items
//! sent is a protocol error as a whole, never matched up partially.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::bytes::Bytes;
use tally_proto::v1::{add_result, get_result, AddResult, GetResult};

use crate::{AddOutcome, Error};

/// A generated idempotency key: a UUID v7 in its 36-character text form,
/// kept on the stack.
pub(crate) struct IdempotencyKey([u8; uuid::fmt::Hyphenated::LENGTH]);

impl IdempotencyKey {
    /// The key's text.
    pub(crate) fn as_str(&self) -> &str {
        // `encode_lower` writes ASCII hex digits and hyphens only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// A fresh idempotency key: a UUID v7, ordered by its millisecond so that a
/// server can expire old keys cheaply, with 74 random bits from
/// [`crate::random`] (`uuid::Uuid::now_v7` takes a global lock and reads the
/// OS's random source for each key, which showed in the profile of busy
/// clients).
pub(crate) fn new_idempotency_key() -> IdempotencyKey {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let mut random = [0; 16];
    random[..8].copy_from_slice(&crate::random::random_u64().to_le_bytes());
    random[8..].copy_from_slice(&crate::random::random_u64().to_le_bytes());
    let random: [u8; 10] = random[..10].try_into().unwrap_or_default();
    let uuid = uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid();
    let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
    uuid.hyphenated().encode_lower(&mut text);
    IdempotencyKey(text)
}

/// A key as the bytes the protocol carries.
pub(crate) fn key_bytes(key: &str) -> Bytes {
    Bytes::copy_from_slice(key.as_bytes())
}

/// Wraps a message in a request whose gRPC timeout is what remains of the
/// call's deadline; tonic sends it to the server and enforces it here too.
pub(crate) fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// Puts a batch's answers back in the places of the items that were sent;
/// items that failed validation keep their error.
pub(crate) fn merge_batch<R, A, T>(
    items: Vec<Result<R, Error>>,
    answers: Vec<A>,
    convert: impl Fn(A) -> Result<T, Error>,
) -> Result<Vec<Result<T, Error>>, Error> {
    let sent = items.iter().filter(|item| item.is_ok()).count();
    if answers.len() != sent {
        return Err(Error::Protocol(format!(
            "sent {sent} batch items but got {} results",
            answers.len()
        )));
    }
    let mut answers = answers.into_iter();
    Ok(items
        .into_iter()
        .map(|item| {
            item.and_then(|_| match answers.next() {
                Some(answer) => convert(answer),
                None => Err(Error::Protocol("batch result missing".to_owned())),
            })
        })
        .collect())
}

/// One add of a batch answer, as the caller gets it.
pub(crate) fn add_result_outcome(result: AddResult) -> Result<AddOutcome, Error> {
    match result.outcome {
        Some(add_result::Outcome::Ok(response)) => Ok(response.into()),
        Some(add_result::Outcome::Error(error)) => Err(Error::from_item(error)),
        None => Err(Error::Protocol(
            "a batch result has neither a value nor an error".to_owned(),
        )),
    }
}

/// One read of a batch answer, as the caller gets it.
pub(crate) fn get_result_value(result: GetResult) -> Result<i64, Error> {
    match result.outcome {
        Some(get_result::Outcome::Ok(response)) => Ok(response.value),
        Some(get_result::Outcome::Error(error)) => Err(Error::from_item(error)),
        None => Err(Error::Protocol(
            "a batch result has neither a value nor an error".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_proto::v1::AddResponse;

    #[test]
    fn idempotency_keys_are_fresh_uuid_v7() {
        let first = new_idempotency_key();
        let second = new_idempotency_key();
        assert_ne!(first.as_str(), second.as_str());
        let parsed = uuid::Uuid::parse_str(first.as_str()).unwrap();
        assert_eq!(parsed.get_version_num(), 7);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(first.as_str(), parsed.hyphenated().to_string());
        assert!(first.as_str().len() <= crate::MAX_IDEMPOTENCY_KEY_BYTES);
        let millis = parsed.get_timestamp().unwrap().to_unix();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!(
            now.as_secs().abs_diff(millis.0) <= 1,
            "{millis:?} vs {now:?}"
        );
    }

    #[test]
    fn batch_answers_go_back_to_the_items_that_were_sent() {
        let items = vec![
            Ok(()),
            Err(Error::InvalidArgument("empty key".to_owned())),
            Ok(()),
        ];
        let answers = vec![
            AddResult {
                outcome: Some(add_result::Outcome::Ok(AddResponse {
                    value: 5,
                    duplicate: false,
                })),
            },
            AddResult {
                outcome: Some(add_result::Outcome::Error(tally_proto::v1::Error {
                    code: tonic::Code::OutOfRange as i32,
                    message: "overflow".to_owned(),
                })),
            },
        ];
        let merged = merge_batch(items, answers, add_result_outcome).unwrap();
        assert_eq!(merged[0].as_ref().unwrap().value, 5);
        assert!(matches!(merged[1], Err(Error::InvalidArgument(_))));
        assert!(matches!(merged[2], Err(Error::OutOfRange(_))));
    }

    #[test]
    fn batch_with_the_wrong_number_of_answers_is_a_protocol_error() {
        let items: Vec<Result<(), Error>> = vec![Ok(()), Ok(())];
        let merged = merge_batch(items, vec![AddResult { outcome: None }], add_result_outcome);
        assert!(matches!(merged, Err(Error::Protocol(_))));
    }
}
