//! The text form of a member's fold report ([`FoldReport`]) in its chitchat
//! state under the key `folds`: retired writers, digests of the retired and
//! unfolded ones, committed fold records and the candidate. A value that
//! does not parse is treated as no report (the fold waits for that member),
//! never as an empty one.
//!
//! `1|retired|digests|records|candidate`, where `retired` is hex ids joined
//! by `,`; `digests` is `id:counters:hash` joined by `,`; a record is
//! `epoch/id:counters:hash+id:counters:hash`, and `records` joins them by `;`.

use crate::crdt::{FoldRecord, ReplicaId, WriterDigest};
use crate::replica::folds::FoldReport;

/// The chitchat key of the report.
pub const KEY_FOLDS: &str = "folds";

fn digest_text(writer: ReplicaId, digest: WriterDigest) -> String {
    format!("{:x}:{}:{:x}", writer.0, digest.counters, digest.hash)
}

fn record_text(record: &FoldRecord) -> String {
    let writers: Vec<String> = record
        .writers
        .iter()
        .map(|(writer, digest)| digest_text(*writer, *digest))
        .collect();
    format!("{}/{}", record.epoch, writers.join("+"))
}

/// The report as text.
pub fn encode(report: &FoldReport) -> String {
    let retired: Vec<String> = report
        .retired
        .iter()
        .map(|w| format!("{:x}", w.0))
        .collect();
    let digests: Vec<String> = report
        .digests
        .iter()
        .map(|(writer, digest)| digest_text(*writer, *digest))
        .collect();
    let records: Vec<String> = report.records.iter().map(record_text).collect();
    let candidate = report
        .candidate
        .as_ref()
        .map(record_text)
        .unwrap_or_default();
    format!(
        "1|{}|{}|{}|{}",
        retired.join(","),
        digests.join(","),
        records.join(";"),
        candidate
    )
}

fn parse_digest(text: &str) -> Option<(ReplicaId, WriterDigest)> {
    let mut parts = text.split(':');
    let writer = u64::from_str_radix(parts.next()?, 16).ok()?;
    let counters = parts.next()?.parse().ok()?;
    let hash = u64::from_str_radix(parts.next()?, 16).ok()?;
    parts
        .next()
        .is_none()
        .then_some((ReplicaId(writer), WriterDigest { counters, hash }))
}

fn parse_record(text: &str) -> Option<FoldRecord> {
    let (epoch, writers) = text.split_once('/')?;
    let writers: Option<Vec<_>> = writers.split('+').map(parse_digest).collect();
    Some(FoldRecord::new(epoch.parse().ok()?, writers?))
}

fn list<T>(text: &str, sep: char, parse: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(sep).map(parse).collect()
}

/// A report from its text; `None` when it does not parse.
pub fn decode(text: &str) -> Option<FoldReport> {
    let mut parts = text.split('|');
    if parts.next()? != "1" {
        return None;
    }
    let retired = list(parts.next()?, ',', |id| {
        u64::from_str_radix(id, 16).ok().map(ReplicaId)
    })?;
    let digests = list(parts.next()?, ',', parse_digest)?;
    let records = list(parts.next()?, ';', parse_record)?;
    let candidate = match parts.next()? {
        "" => None,
        text => Some(parse_record(text)?),
    };
    parts.next().is_none().then_some(FoldReport {
        retired,
        digests,
        records,
        candidate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_round_trips_and_garbage_is_no_report() {
        let digest = WriterDigest {
            counters: 3,
            hash: u64::MAX,
        };
        let record = FoldRecord::new(2, [(ReplicaId(9), digest), (ReplicaId(4), digest)]);
        let report = FoldReport {
            retired: vec![ReplicaId(4), ReplicaId(9), ReplicaId(u64::MAX)],
            digests: vec![(ReplicaId(u64::MAX), digest)],
            records: vec![FoldRecord::new(1, [(ReplicaId(7), digest)]), record.clone()],
            candidate: Some(FoldRecord::new(3, [(ReplicaId(u64::MAX), digest)])),
        };
        assert_eq!(decode(&encode(&report)), Some(report));
        let empty = FoldReport::default();
        assert_eq!(decode(&encode(&empty)), Some(empty));
        for bad in [
            "",
            "2||||",
            "1|zz|||",
            "1||1:2|||",
            "1|||x/1:2:3|",
            "1|||||",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
