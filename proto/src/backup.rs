//! The backup file that `tally admin backup` writes and `tally-node restore`
//! reads: the `Admin.Backup` stream as it came off the wire, framed.
//!
//! Layout (format versions 1 and 2): the 8 bytes `TALLYBAK`, the format version as a
//! little-endian `u32`, then every `BackupChunk` of the stream, each prefixed
//! with its length as a protobuf varint (`encode_length_delimited`). The
//! version is also in the header message; a reader refuses a version it does
//! not know before decoding anything else, so a future format can change
//! everything after those 12 bytes. Version 2 adds `BackupSets` messages
//! (like sets and uniques) and the trailer's `set_deltas`; a version-1 file
//! (counters only) still reads.

use std::io::{self, Read, Write};

use prost::Message;

use crate::v1::BackupChunk;

/// The backup format this build writes (and the newest it reads).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest backup format this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
/// The file in a backup directory that holds the stream.
pub const DATA_FILE: &str = "backup.tally";
/// The first bytes of a backup file.
pub const MAGIC: &[u8; 8] = b"TALLYBAK";
/// The largest framed message a reader accepts (a chunk is about 32 KiB).
pub const MAX_MESSAGE_BYTES: u64 = 64 << 20;

/// Why a backup file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BackupFileError {
    /// Reading failed.
    #[error("cannot read the backup: {0}")]
    Io(#[from] io::Error),
    /// The file does not start with the magic bytes.
    #[error(
        "not a Tally backup (it does not start with {:?})",
        String::from_utf8_lossy(MAGIC)
    )]
    NotABackup,
    /// A format this build does not know.
    #[error("backup format version {found} is not supported by this build (it reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}); restore with the Tally release that took the backup, or a newer one")]
    UnsupportedVersion {
        /// The version in the file.
        found: u32,
    },
    /// The file ends in the middle of a message.
    #[error("the backup file is truncated in the middle of a message: copy it again from where it was taken")]
    Truncated,
    /// A message that does not decode.
    #[error("the backup file is damaged: message {index} does not decode ({reason})")]
    Malformed {
        /// The message's position, from 0.
        index: u64,
        /// The decoder's reason.
        reason: String,
    },
}

/// Writes a backup file.
pub struct BackupWriter<W: Write> {
    out: W,
}

impl<W: Write> BackupWriter<W> {
    /// Writes the magic bytes and the format version to `out`.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        Ok(BackupWriter { out })
    }

    /// Appends one message.
    pub fn write(&mut self, chunk: &BackupChunk) -> io::Result<()> {
        self.out.write_all(&chunk.encode_length_delimited_to_vec())
    }

    /// The underlying writer, for the caller to flush and sync.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Reads a backup file message by message.
pub struct BackupReader<R: Read> {
    input: R,
    index: u64,
    version: u32,
}

impl<R: Read> BackupReader<R> {
    /// The file's format version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Checks the magic bytes and the format version.
    pub fn new(mut input: R) -> Result<Self, BackupFileError> {
        let mut head = [0u8; 12];
        read_exact_or(&mut input, &mut head, BackupFileError::NotABackup)?;
        if &head[..8] != MAGIC {
            return Err(BackupFileError::NotABackup);
        }
        let found = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&found) {
            return Err(BackupFileError::UnsupportedVersion { found });
        }
        Ok(BackupReader {
            input,
            index: 0,
            version: found,
        })
    }

    /// The next message, or `None` at a clean end of the file.
    pub fn next_chunk(&mut self) -> Result<Option<BackupChunk>, BackupFileError> {
        let Some(len) = self.read_length()? else {
            return Ok(None);
        };
        if len > MAX_MESSAGE_BYTES {
            return Err(self.malformed(format!(
                "a length of {len} bytes, over the limit of {MAX_MESSAGE_BYTES}"
            )));
        }
        let mut bytes = vec![0u8; len as usize];
        read_exact_or(&mut self.input, &mut bytes, BackupFileError::Truncated)?;
        let chunk = BackupChunk::decode(bytes.as_slice()).map_err(|e| self.malformed(e))?;
        self.index += 1;
        Ok(Some(chunk))
    }

    fn malformed(&self, reason: impl ToString) -> BackupFileError {
        BackupFileError::Malformed {
            index: self.index,
            reason: reason.to_string(),
        }
    }

    /// A varint length, or `None` when the file ends before its first byte.
    fn read_length(&mut self) -> Result<Option<u64>, BackupFileError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let mut byte = [0u8; 1];
            if self.input.read(&mut byte)? == 0 {
                return match shift {
                    0 => Ok(None),
                    _ => Err(BackupFileError::Truncated),
                };
            }
            value |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                return Ok(Some(value));
            }
        }
        Err(self.malformed("a length varint longer than 10 bytes"))
    }
}

fn read_exact_or(
    input: &mut impl Read,
    buf: &mut [u8],
    short: BackupFileError,
) -> Result<(), BackupFileError> {
    input.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => short,
        _ => BackupFileError::Io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{backup_chunk::Part, BackupHeader, BackupTrailer};

    fn sample() -> Vec<BackupChunk> {
        vec![
            BackupChunk {
                part: Some(Part::Header(BackupHeader {
                    format_version: FORMAT_VERSION,
                    cluster_id: "c".into(),
                    replica: 7,
                    ..Default::default()
                })),
            },
            BackupChunk {
                part: Some(Part::Trailer(BackupTrailer {
                    seq: 9,
                    digest: 3,
                    ..Default::default()
                })),
            },
        ]
    }

    fn written() -> Vec<u8> {
        let mut writer = BackupWriter::new(Vec::new()).unwrap();
        for chunk in sample() {
            writer.write(&chunk).unwrap();
        }
        writer.into_inner()
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<BackupChunk>, BackupFileError> {
        let mut reader = BackupReader::new(bytes)?;
        let mut chunks = Vec::new();
        while let Some(chunk) = reader.next_chunk()? {
            chunks.push(chunk);
        }
        Ok(chunks)
    }

    #[test]
    fn a_written_file_reads_back() {
        assert_eq!(read_all(&written()).unwrap(), sample());
    }

    #[test]
    fn damage_is_named() {
        let bytes = written();
        let truncated = &bytes[..bytes.len() - 1];
        assert!(matches!(
            read_all(truncated),
            Err(BackupFileError::Truncated)
        ));
        assert!(matches!(
            read_all(b"hello world, this is not"),
            Err(BackupFileError::NotABackup)
        ));
        let mut future = bytes.clone();
        future[8] = 3;
        let error = read_all(&future).unwrap_err();
        assert!(error.to_string().contains("version 3"), "{error}");
        let mut older = bytes.clone();
        older[8] = 1;
        let reader = BackupReader::new(&older[..]).unwrap();
        assert_eq!(reader.version(), 1);
    }
}
