//! What the store examples share: the size of a data directory on disk.

use std::path::Path;

/// The bytes of every file under `path`, recursively.
pub fn dir_bytes(path: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(path).unwrap().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        total += if meta.is_dir() {
            dir_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}
