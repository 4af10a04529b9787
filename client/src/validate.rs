//! Checks of keys, deltas and idempotency keys, done before a request is sent.
//!
//! The server checks the same rules; checking here too means a bad argument
//! fails at once with a message that names the rule, costs no round trip and
//! is never retried. The messages are the server's, word for word (the node's
//! `KeyError`, `AddError::ZeroDelta` and `AddRefused::IdempotencyKeyTooLong`;
//! `node/tests/cli_wording.rs` compares them). Every function here is pure.

use crate::Error;

/// The longest key a counter can have, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 256;

/// The longest idempotency key the server accepts, in bytes of UTF-8.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;

/// Checks that `key` can name a counter: 1 to [`MAX_KEY_BYTES`] bytes of UTF-8
/// (a `&str` is always UTF-8).
///
/// Returns [`Error::InvalidArgument`] with a message saying what is wrong.
///
/// ```
/// assert!(tally_client::validate_key("post:42:likes").is_ok());
/// assert!(tally_client::validate_key("").is_err());
/// ```
pub fn validate_key(key: &str) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "the counter key is empty; give a key of 1 to {MAX_KEY_BYTES} bytes"
        )));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "the counter key is {} bytes long; the limit is {MAX_KEY_BYTES} bytes",
            key.len()
        )));
    }
    Ok(())
}

/// Checks that `delta` is an amount an add can carry: anything but zero.
pub(crate) fn validate_delta(delta: i64) -> Result<(), Error> {
    if delta == 0 {
        return Err(Error::InvalidArgument(
            "the delta is 0; an add must change the counter (use a negative delta to subtract)"
                .to_owned(),
        ));
    }
    Ok(())
}

/// Checks a caller-provided idempotency key: 1 to
/// [`MAX_IDEMPOTENCY_KEY_BYTES`] bytes. Empty is refused because on the wire it
/// means "no key", which would silently turn off deduplication.
pub(crate) fn validate_idempotency_key(idempotency_key: &str) -> Result<(), Error> {
    if idempotency_key.is_empty() {
        return Err(Error::InvalidArgument(
            "the idempotency key is empty; give 1 to 128 bytes, or use `add` to get a generated one"
                .to_owned(),
        ));
    }
    if idempotency_key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "the idempotency key is {} bytes long; the limit is {MAX_IDEMPOTENCY_KEY_BYTES} bytes",
            idempotency_key.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn assert_invalid(result: Result<(), Error>, needle: &str) {
        match result {
            Err(Error::InvalidArgument(message)) => assert!(
                message.contains(needle),
                "message {message:?} does not mention {needle:?}"
            ),
            other => panic!("expected InvalidArgument mentioning {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn keys_of_one_to_256_bytes_are_accepted() {
        assert!(validate_key("a").is_ok());
        assert!(validate_key("post:42:likes").is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        // 64 four-byte characters: 256 bytes although only 64 chars.
        assert!(validate_key(&"😀".repeat(64)).is_ok());
    }

    #[test]
    fn empty_key_is_rejected() {
        assert_invalid(validate_key(""), "empty");
    }

    #[test]
    fn key_over_256_bytes_is_rejected_counting_bytes_not_chars() {
        assert_invalid(validate_key(&"k".repeat(MAX_KEY_BYTES + 1)), "257 bytes");
        assert_invalid(validate_key(&"é".repeat(129)), "258 bytes");
    }

    #[test]
    fn zero_delta_is_rejected_and_any_other_is_accepted() {
        assert_invalid(validate_delta(0), "delta is 0");
        for delta in [1, -1, i64::MAX, i64::MIN] {
            assert!(validate_delta(delta).is_ok(), "delta {delta}");
        }
    }

    #[test]
    fn idempotency_keys_must_be_1_to_128_bytes() {
        assert!(validate_idempotency_key("retry-1").is_ok());
        assert!(validate_idempotency_key(&"i".repeat(MAX_IDEMPOTENCY_KEY_BYTES)).is_ok());
        assert_invalid(validate_idempotency_key(""), "empty");
        assert_invalid(validate_idempotency_key(&"i".repeat(129)), "129 bytes");
    }
}
