//! The text form of a member's fold report ([`FoldReport`]) in its chitchat
//! state under the key `folds`: retired writers, digests of the retired and
//! unfolded ones, committed fold records and the candidate. A value that
//! does not parse is treated as no report (the fold waits for that member),
//! never as an empty one.
//!
//! `1|retired|digests|records|candidate`, where `retired` is hex ids joined
//! by `,`; `digests` is `id:counters:hash` joined by `,`; a record is
//! `epoch/id:counters:hash+id:counters:hash`, and `records` joins them by `;`.
//!
//! A report by partition (cluster version 10, `replica/fold_partitions.rs`)
//! is `2|retired|digests|records|candidate|kept|by_partition|shared`:
//! `kept` is `*` (every partition) or `count:hex`
//! ([`PartitionSet::to_hex`]); `by_partition` is `id=` then
//! `partition.counters.hash` entries joined by `_`, writers joined by `+`;
//! `shared` is `id:hash` joined by `,`; and a record with digests per
//! partition appends `@` and its own `by_partition`. Version 1 is written whenever
//! there is nothing by partition, so older builds read it.
//!
//! Folds of live writers in some partitions (cluster version 12,
//! `replica/fold_scoped.rs`) need version 3, written only when a report
//! holds one: version 2's fields, then `retired_scoped` (`id.partition.phase`
//! joined by `,`) and `scoped_digests` (`id.partition.phase:counters:hash`
//! joined by `,`); a record folding writers in some partitions appends `#`
//! and those writers' digests in the `by_partition` form (a partition folded
//! with no slot is `partition.0.0`). Older builds read no report from it, so
//! the cluster version keeps such reports away until every member reads them.

use crate::crdt::{FoldRecord, PartitionDigests, ReplicaId, WriterDigest};
use crate::partition::{PartitionCount, PartitionSet};
use crate::replica::fold_partitions::PartitionReport;
use crate::replica::folds::{FoldReport, ScopedRetirement};

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
    let text = match &record.by_partition {
        None => format!("{}/{}", record.epoch, writers.join("+")),
        Some(parts) => format!(
            "{}/{}@{}",
            record.epoch,
            writers.join("+"),
            by_partition_text(parts)
        ),
    };
    match record.scoped.is_empty() {
        true => text,
        false => format!("{text}#{}", by_partition_text(&record.scoped)),
    }
}

fn scoped_text(retirement: &ScopedRetirement) -> String {
    format!(
        "{:x}.{}.{}",
        retirement.writer.0, retirement.partition, retirement.phase
    )
}

fn parse_scoped(text: &str) -> Option<ScopedRetirement> {
    let mut fields = text.split('.');
    let writer = ReplicaId(u64::from_str_radix(fields.next()?, 16).ok()?);
    let partition = fields.next()?.parse().ok()?;
    let phase = fields.next()?.parse().ok()?;
    fields.next().is_none().then_some(ScopedRetirement {
        writer,
        partition,
        phase,
    })
}

fn by_partition_text(parts: &[(ReplicaId, PartitionDigests)]) -> String {
    let writers: Vec<String> = parts
        .iter()
        .map(|(writer, digests)| {
            let entries: Vec<String> = digests
                .iter()
                .map(|(partition, d)| format!("{partition}.{}.{:x}", d.counters, d.hash))
                .collect();
            format!("{:x}={}", writer.0, entries.join("_"))
        })
        .collect();
    writers.join("+")
}

fn parse_by_partition(text: &str) -> Option<Vec<(ReplicaId, PartitionDigests)>> {
    list(text, '+', |part| {
        let (writer, entries) = part.split_once('=')?;
        let writer = ReplicaId(u64::from_str_radix(writer, 16).ok()?);
        let digests = list(entries, '_', |entry| {
            let mut fields = entry.split('.');
            let partition = fields.next()?.parse().ok()?;
            let counters = fields.next()?.parse().ok()?;
            let hash = u64::from_str_radix(fields.next()?, 16).ok()?;
            fields
                .next()
                .is_none()
                .then_some((partition, WriterDigest { counters, hash }))
        })?;
        Some((writer, digests))
    })
}

fn shared_text(shared: &[(ReplicaId, u64)]) -> String {
    let entries: Vec<String> = shared
        .iter()
        .map(|(peer, digest)| format!("{:x}:{digest:x}", peer.0))
        .collect();
    entries.join(",")
}

fn kept_text(kept: Option<&PartitionSet>) -> String {
    match kept {
        None => "*".to_string(),
        Some(set) => format!("{}:{}", set.count().get(), set.to_hex()),
    }
}

fn parse_kept(text: &str) -> Option<Option<PartitionSet>> {
    if text == "*" {
        return Some(None);
    }
    let (count, hex) = text.split_once(':')?;
    let count = PartitionCount::new(count.parse().ok()?).ok()?;
    Some(Some(PartitionSet::from_hex(count, hex).ok()?))
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
    let by_partition = report
        .records
        .iter()
        .chain(&report.candidate)
        .any(|record| record.by_partition.is_some());
    let scoped = !report.retired_scoped.is_empty()
        || report
            .partitions
            .as_ref()
            .is_some_and(|p| !p.scoped.is_empty())
        || report
            .records
            .iter()
            .chain(&report.candidate)
            .any(|record| !record.scoped.is_empty());
    match &report.partitions {
        None if !by_partition && !scoped => format!(
            "1|{}|{}|{}|{}",
            retired.join(","),
            digests.join(","),
            records.join(";"),
            candidate
        ),
        partitions => format!(
            "{}|{}|{}|{}|{}|{}|{}|{}{}",
            if scoped { 3 } else { 2 },
            retired.join(","),
            digests.join(","),
            records.join(";"),
            candidate,
            partitions
                .as_ref()
                .map_or("-".to_string(), |p| kept_text(p.kept.as_ref())),
            partitions
                .as_ref()
                .map_or(String::new(), |p| by_partition_text(&p.digests)),
            partitions
                .as_ref()
                .map_or(String::new(), |p| shared_text(&p.shared)),
            match scoped {
                false => String::new(),
                true => format!(
                    "|{}|{}",
                    join(report.retired_scoped.iter().map(scoped_text), ","),
                    join(
                        partitions.iter().flat_map(|p| &p.scoped).map(|(r, d)| {
                            format!("{}:{}:{:x}", scoped_text(r), d.counters, d.hash)
                        }),
                        ","
                    ),
                ),
            },
        ),
    }
}

fn join(items: impl Iterator<Item = String>, sep: &str) -> String {
    items.collect::<Vec<_>>().join(sep)
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
    let (text, scoped) = match text.split_once('#') {
        Some((text, scoped)) => (text, Some(parse_by_partition(scoped)?)),
        None => (text, None),
    };
    let (epoch, rest) = text.split_once('/')?;
    let epoch = epoch.parse().ok()?;
    let (writers, by_partition) = match rest.split_once('@') {
        Some((writers, parts)) => (writers, Some(parse_by_partition(parts)?)),
        None => (rest, None),
    };
    let writers: Vec<_> = match (writers, &scoped) {
        // A record of scoped writers alone names no writer whole.
        ("", Some(_)) => Vec::new(),
        _ => writers
            .split('+')
            .map(parse_digest)
            .collect::<Option<_>>()?,
    };
    let Some(parts) = by_partition else {
        return scoped.is_none().then(|| FoldRecord::new(epoch, writers));
    };
    // The whole digests are the sums of the partitions': a record whose
    // text says otherwise is not one this build wrote.
    let record = FoldRecord::by_partition(epoch, parts);
    let record = match scoped {
        Some(scoped) if !scoped.is_empty() => record.with_scoped(scoped),
        Some(_) => return None,
        None => record,
    };
    (record.writers == FoldRecord::new(epoch, writers).writers).then_some(record)
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
    let version = parts.next()?;
    if !["1", "2", "3"].contains(&version) {
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
    let partitions = match version {
        "1" => None,
        _ => match parts.next()? {
            "-" => {
                parts.next()?;
                parts.next()?;
                None
            }
            kept => Some(PartitionReport {
                kept: parse_kept(kept)?,
                digests: parse_by_partition(parts.next()?)?,
                shared: list(parts.next()?, ',', |entry| {
                    let (peer, digest) = entry.split_once(':')?;
                    Some((
                        ReplicaId(u64::from_str_radix(peer, 16).ok()?),
                        u64::from_str_radix(digest, 16).ok()?,
                    ))
                })?,
                scoped: Vec::new(),
            }),
        },
    };
    let (retired_scoped, scoped_digests) = match version {
        "3" => (
            list(parts.next()?, ',', parse_scoped)?,
            list(parts.next()?, ',', |entry| {
                let (retirement, digest) = entry.split_once(':')?;
                let (_, digest) = parse_digest(&format!("0:{digest}"))?;
                Some((parse_scoped(retirement)?, digest))
            })?,
        ),
        _ => (Vec::new(), Vec::new()),
    };
    let partitions = match partitions {
        Some(report) => Some(PartitionReport {
            scoped: scoped_digests,
            ..report
        }),
        None if scoped_digests.is_empty() => None,
        None => return None,
    };
    parts.next().is_none().then_some(FoldReport {
        retired,
        digests,
        records,
        candidate,
        partitions,
        retired_scoped,
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
            partitions: None,
            retired_scoped: vec![],
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

    #[test]
    fn a_report_by_partition_round_trips_and_a_record_whose_sums_differ_is_no_report() {
        let digest = |counters, hash| WriterDigest { counters, hash };
        let count = PartitionCount::new(16).unwrap();
        let mut kept = PartitionSet::empty(count);
        kept.insert(crate::partition::Partition(3));
        kept.insert(crate::partition::Partition(15));
        let record = FoldRecord::by_partition(
            1,
            [
                (
                    ReplicaId(9),
                    vec![(3, digest(2, 7)), (15, digest(1, u64::MAX))],
                ),
                (ReplicaId(4), vec![]),
            ],
        );
        let report = FoldReport {
            retired: vec![ReplicaId(4), ReplicaId(9), ReplicaId(11)],
            digests: vec![(ReplicaId(11), digest(3, 5))],
            records: vec![record.clone()],
            candidate: Some(FoldRecord::by_partition(
                2,
                [(ReplicaId(11), vec![(0, digest(3, 5))])],
            )),
            partitions: Some(PartitionReport {
                kept: Some(kept),
                digests: vec![(ReplicaId(11), vec![(3, digest(3, 5))])],
                shared: vec![(ReplicaId(2), u64::MAX), (ReplicaId(3), 0)],
                scoped: vec![],
            }),
            retired_scoped: vec![],
        };
        let text = encode(&report);
        assert!(text.starts_with("2|"), "{text}");
        assert_eq!(decode(&text), Some(report.clone()), "{text}");
        let every = FoldReport {
            partitions: Some(PartitionReport {
                kept: None,
                digests: vec![],
                shared: vec![],
                scoped: vec![],
            }),
            ..report.clone()
        };
        assert_eq!(decode(&encode(&every)), Some(every));
        // Records by partition alone still need version 2.
        let records_only = FoldReport {
            partitions: None,
            ..report
        };
        assert_eq!(decode(&encode(&records_only)), Some(records_only));
        // A record whose whole digest is not the sum of its partitions'.
        let forged = "2||||1/9:4:8@9=3.2.7_15.1.1|*||";
        assert_eq!(decode(forged), None);
        assert!(decode("2|||||*||").is_some(), "every field empty but kept");
        for bad in [
            "2|||||*|",
            "2|||||||",
            "2|||||7:zz||",
            "2|||||*|9=x|",
            "2|||||*||2:zz",
            "2|||||*|||",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    // The reports of scoped folds (version 3) that the replica's
    // `fold_scoped_tests.rs` produces, written out: that test lives in
    // tally-core, which has no gossip, so the text round trip is checked here.
    #[test]
    fn a_report_of_scoped_retirements_round_trips_and_damaged_scoped_fields_are_no_report() {
        let digest = WriterDigest {
            counters: 1,
            hash: 5810793394259768727,
        };
        let writer = ReplicaId(1);
        let retirement = ScopedRetirement {
            writer,
            partition: 0,
            phase: 0,
        };
        let count = PartitionCount::new(4).unwrap();
        let kept = |partitions: &[u32]| {
            let mut kept = PartitionSet::empty(count);
            for partition in partitions {
                kept.insert(crate::partition::Partition(*partition));
            }
            Some(kept)
        };
        let by_partition = |kept, scoped| {
            Some(PartitionReport {
                kept,
                digests: vec![],
                shared: vec![],
                scoped,
            })
        };
        // The retiring writer's report (it keeps 1, 2 and 3), and a
        // keeper's of partition 0, with its digest of the pair.
        let retiring = FoldReport {
            retired_scoped: vec![retirement],
            partitions: by_partition(kept(&[1, 2, 3]), vec![]),
            ..FoldReport::default()
        };
        let keeper = FoldReport {
            retired_scoped: vec![retirement],
            partitions: by_partition(kept(&[0, 1]), vec![(retirement, digest)]),
            ..FoldReport::default()
        };
        // After the fold: a committed record folding the writer in
        // partition 0.
        let folded = FoldReport {
            records: vec![
                FoldRecord::by_partition(1, []).with_scoped([(writer, vec![(0, digest)])])
            ],
            partitions: by_partition(kept(&[0, 2, 3]), vec![]),
            ..FoldReport::default()
        };
        for report in [retiring, keeper, folded] {
            let text = encode(&report);
            assert!(text.starts_with("3|"), "{text}");
            assert_eq!(decode(&text), Some(report), "{text}");
        }
        for bad in [
            "3|||||*|||1.0|",
            "3|||||*|||1.0.0|1.0.0:x:0",
            "3||||1/#1=|*|||",
            "3|||||*||",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
