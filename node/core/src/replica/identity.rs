//! A replica's identity: a random id created with its data directory, and its
//! region, both fixed for the directory's life.
//!
//! Invariant 3 of DESIGN.md: a fresh or wiped directory gets a new id; an
//! existing one keeps the id it stores and refuses to serve another region.

use crate::crdt::ReplicaId;

use super::types::Identity;

/// The longest region or node name.
pub const MAX_NAME_BYTES: usize = 64;

/// Why an identity could not be established.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum IdentityError {
    /// The data directory belongs to another region.
    #[error(
        "the data directory belongs to region {stored:?} but the node was started with region \
         {configured:?}; a replica's region never changes: start it with --region {stored}, \
         or give the new region a fresh --data-dir"
    )]
    RegionMismatch {
        /// What the directory says.
        stored: String,
        /// What the configuration says.
        configured: String,
    },
    /// A region or node name that is empty, too long or has odd characters.
    #[error("{setting} {value:?} is not valid: use 1 to {MAX_NAME_BYTES} characters from a-z, A-Z, 0-9, '-', '_' and '.'")]
    BadName {
        /// The setting's name, and where its value came from.
        setting: String,
        /// The value given.
        value: String,
    },
}

/// Checks a region or node name.
pub fn check_name(setting: &str, value: &str) -> Result<(), IdentityError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_NAME_BYTES
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(IdentityError::BadName {
            setting: setting.to_string(),
            value: value.to_string(),
        })
    }
}

/// Returns the stored identity, or a new one built from `fresh_id` (random,
/// from the caller) when the directory has none.
pub fn establish(
    stored: Option<Identity>,
    region: &str,
    fresh_id: u64,
) -> Result<Identity, IdentityError> {
    check_name("region", region)?;
    match stored {
        Some(identity) if identity.region != region => Err(IdentityError::RegionMismatch {
            stored: identity.region,
            configured: region.to_string(),
        }),
        Some(identity) => Ok(identity),
        None => Ok(Identity {
            // 0 means "no replica" on the wire; never hand it out.
            replica: ReplicaId(fresh_id.max(1)),
            region: region.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_directory_gets_the_fresh_id() {
        let identity = establish(None, "eu", 42).unwrap();
        assert_eq!(identity.replica, ReplicaId(42));
        assert_eq!(establish(None, "eu", 0).unwrap().replica, ReplicaId(1));
    }

    #[test]
    fn a_stored_identity_is_kept_and_its_region_enforced() {
        let stored = Identity {
            replica: ReplicaId(7),
            region: "eu".into(),
        };
        assert_eq!(establish(Some(stored.clone()), "eu", 99).unwrap(), stored);
        let err = establish(Some(stored), "us", 99).unwrap_err();
        assert!(err.to_string().contains("--region eu"), "{err}");
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("region", "us-east-1").is_ok());
        assert!(check_name("region", "").is_err());
        assert!(check_name("region", "a b").is_err());
        assert!(check_name("region", &"x".repeat(65)).is_err());
    }
}
