//! The free-space floor (`--min-free-disk`): below it the node refuses new
//! adds with a clear error, while it still serves reads and replication, and
//! takes adds again by itself once space returns.
//!
//! sled 0.34 keeps the first IO error it meets (e.g. `ENOSPC`) and fails
//! every later write with it, even after space returns; only a restart helps.
//! So sled must never meet a full disk in normal operation: the floor stops
//! adds well before. The committer samples the free space (statvfs) at every
//! housekeeping tick; an add only reads the last sample (two atomics).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::metrics::Metrics;

/// The default floor's share of the filesystem, in percent.
pub const DEFAULT_FLOOR_PERCENT: f64 = 5.0;
/// The default floor's cap, in bytes (1 GiB).
pub const DEFAULT_FLOOR_CAP_BYTES: u64 = 1 << 30;

/// How much free space the data directory's filesystem must keep.
#[derive(Clone, Copy, PartialEq, Debug, Default)]
pub enum FreeSpaceFloor {
    /// 5% of the filesystem, at most 1 GiB (the default).
    #[default]
    Default,
    /// A number of bytes (0 turns the floor off).
    Bytes(u64),
    /// A share of the filesystem's size, in percent.
    Percent(f64),
}

impl FreeSpaceFloor {
    /// Parses `1GiB`, `512MiB`, `500MB`, `10000000` (bytes), `5%`, or `0` (off).
    pub fn parse(text: &str) -> Result<FreeSpaceFloor, String> {
        let text = text.trim();
        let bad = || {
            format!("{text:?} is not a size: use bytes (e.g. 1GiB, 512MiB, 500MB, 0 to turn the floor off) or a percentage of the filesystem (e.g. 5%)")
        };
        if let Some(percent) = text.strip_suffix('%') {
            let percent: f64 = percent.trim().parse().map_err(|_| bad())?;
            if !(0.0..=100.0).contains(&percent) {
                return Err(format!("{text:?} is not a percentage from 0% to 100%"));
            }
            return Ok(FreeSpaceFloor::Percent(percent));
        }
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: u64 = number.parse().map_err(|_| bad())?;
        let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        number
            .checked_mul(scale)
            .map(FreeSpaceFloor::Bytes)
            .ok_or_else(bad)
    }

    /// The floor in bytes on a filesystem of `total` bytes.
    pub fn bytes(&self, total: u64) -> u64 {
        let share = |percent: f64| (total as f64 * percent / 100.0) as u64;
        match *self {
            FreeSpaceFloor::Default => share(DEFAULT_FLOOR_PERCENT).min(DEFAULT_FLOOR_CAP_BYTES),
            FreeSpaceFloor::Bytes(bytes) => bytes,
            FreeSpaceFloor::Percent(percent) => share(percent),
        }
    }
}

/// Free and total bytes of the filesystem that holds `path` (free as an
/// unprivileged process may use it: root's reserve is not counted).
pub fn disk_space(path: &Path) -> std::io::Result<(u64, u64)> {
    let stat = rustix::fs::statvfs(path)?;
    let unit = stat.f_frsize;
    Ok((
        stat.f_bavail.saturating_mul(unit),
        stat.f_blocks.saturating_mul(unit),
    ))
}

/// The floor of one node, with the last sample of its free space.
#[derive(Debug)]
pub(super) struct DiskGuard {
    dir: PathBuf,
    floor: FreeSpaceFloor,
    node: String,
    free: AtomicU64,
    floor_bytes: AtomicU64,
    below: AtomicBool,
}

/// Adds are refused: the free space is below the floor.
#[derive(Clone, Debug)]
pub(super) struct BelowFloor {
    pub node: String,
    pub free: u64,
    pub floor: u64,
}

impl DiskGuard {
    pub(super) fn new(dir: PathBuf, floor: FreeSpaceFloor, node: String) -> DiskGuard {
        DiskGuard {
            dir,
            floor,
            node,
            free: AtomicU64::new(u64::MAX),
            floor_bytes: AtomicU64::new(0),
            below: AtomicBool::new(false),
        }
    }

    /// Reads the free space again and updates the metrics; logs each crossing.
    pub(super) fn sample(&self, metrics: &Metrics) {
        let (free, total) = match disk_space(&self.dir) {
            Ok(space) => space,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "cannot read the free disk space; the --min-free-disk floor is not checked");
                return;
            }
        };
        let floor = self.floor.bytes(total);
        self.free.store(free, Ordering::Relaxed);
        self.floor_bytes.store(floor, Ordering::Relaxed);
        metrics
            .disk_free_bytes
            .set(free.min(i64::MAX as u64) as i64);
        metrics
            .disk_free_floor_bytes
            .set(floor.min(i64::MAX as u64) as i64);
        let below = free < floor;
        if self.below.swap(below, Ordering::Relaxed) != below {
            if below {
                tracing::error!(
                    free,
                    floor,
                    dir = %self.dir.display(),
                    "disk nearly full: refusing adds until space is freed (reads and replication go on); free space or raise the disk, or lower --min-free-disk"
                );
            } else {
                tracing::info!(
                    free,
                    floor,
                    "disk space is back above the floor: taking adds again"
                );
            }
        }
    }

    /// Err while the last sample was below the floor.
    pub(super) fn check(&self) -> Result<(), BelowFloor> {
        if !self.below.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(BelowFloor {
            node: self.node.clone(),
            free: self.free.load(Ordering::Relaxed),
            floor: self.floor_bytes.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_parse_as_sizes_or_shares() {
        let parse = |text| FreeSpaceFloor::parse(text).unwrap();
        assert_eq!(parse("1GiB"), FreeSpaceFloor::Bytes(1 << 30));
        assert_eq!(parse("512 MiB"), FreeSpaceFloor::Bytes(512 << 20));
        assert_eq!(parse("500MB"), FreeSpaceFloor::Bytes(500_000_000));
        assert_eq!(parse("4096"), FreeSpaceFloor::Bytes(4096));
        assert_eq!(parse("0"), FreeSpaceFloor::Bytes(0));
        assert_eq!(parse("5%"), FreeSpaceFloor::Percent(5.0));
        for bad in ["lots", "5 parsecs", "-1", "150%", ""] {
            let error = FreeSpaceFloor::parse(bad).unwrap_err();
            assert!(error.contains("1GiB") || error.contains("0%"), "{error}");
        }
    }

    #[test]
    fn the_default_floor_is_five_percent_capped_at_one_gib() {
        assert_eq!(FreeSpaceFloor::Default.bytes(10 << 30), 512 << 20);
        assert_eq!(FreeSpaceFloor::Default.bytes(1 << 40), 1 << 30);
        assert_eq!(FreeSpaceFloor::Percent(50.0).bytes(1000), 500);
        assert_eq!(FreeSpaceFloor::Bytes(7).bytes(1000), 7);
    }

    #[test]
    fn the_guard_refuses_below_the_floor_and_resumes_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let (free, _) = disk_space(dir.path()).unwrap();
        let guard = DiskGuard::new(
            dir.path().into(),
            FreeSpaceFloor::Bytes(free.saturating_mul(2)),
            "n1".into(),
        );
        assert!(guard.check().is_ok(), "no sample yet: no refusal");
        guard.sample(&metrics);
        let refused = guard.check().unwrap_err();
        assert_eq!(refused.node, "n1");
        assert!(refused.free < refused.floor);
        let guard = DiskGuard::new(dir.path().into(), FreeSpaceFloor::Bytes(0), "n1".into());
        guard.sample(&metrics);
        assert!(guard.check().is_ok());
    }
}
