//! The [`Crdt`] laws as one check, shared by every implementation's proptests
//! (test builds only): commutative, associative, idempotent.

use std::fmt::Debug;

use proptest::prelude::*;

use super::Crdt;

fn merged<T: Crdt + Clone>(a: &T, b: &T) -> T {
    let mut out = a.clone();
    out.merge(b);
    out
}

/// Checks the laws on three states; the inflationary law is the caller's
/// (it needs the type's partial order).
pub fn check_laws<T: Crdt + Clone + PartialEq + Debug>(
    a: &T,
    b: &T,
    c: &T,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(merged(a, b), merged(b, a), "commutative");
    prop_assert_eq!(
        merged(&merged(a, b), c),
        merged(a, &merged(b, c)),
        "associative"
    );
    let mut once = merged(a, b);
    prop_assert!(
        !once.merge(b),
        "merging the same state twice must change nothing"
    );
    prop_assert_eq!(&merged(a, a), a, "idempotent");
    once.merge(&once.clone());
    prop_assert_eq!(once, merged(a, b), "idempotent with itself");
    Ok(())
}
