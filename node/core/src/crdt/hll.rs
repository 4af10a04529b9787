//! HyperLogLog for "seen by N people" uniques: 2^14 registers (precision 14,
//! standard error 1.04/√16384 ≈ 0.81%), sparse while few registers are set,
//! dense (one byte each in memory, 6 bits each on disk: 12 KB) after.
//!
//! Invariants kept here: a member always lands in the same register with the
//! same rank on every build and platform ([`hash_member`] is SipHash-1-3 with
//! fixed keys, pinned by a test); merge is register-wise max; the sparse or
//! dense form is a function of the registers alone (sparse exactly while at
//! most [`SPARSE_LIMIT`] registers are set), so two replicas holding the same
//! registers hold equal values. The estimate is Ertl's improved estimator
//! ("New cardinality estimation algorithms for HyperLogLog sketches", 2017,
//! as in Redis 5+): no empirical bias tables, and accurate from 0 up.

use std::hash::Hasher;

use super::Crdt;

/// Index bits.
pub const PRECISION: u32 = 14;
/// Number of registers.
pub const REGISTERS: usize = 1 << PRECISION;
/// Hash bits left for the rank.
const RANK_BITS: u32 = 64 - PRECISION;
/// The highest rank a register can hold (all rank bits zero).
pub const MAX_RANK: u8 = RANK_BITS as u8 + 1;
/// Registers set at most in the sparse form (3 bytes each on disk, so the
/// sparse form is at most half the dense one's 12 KB).
pub const SPARSE_LIMIT: usize = 2048;
/// Bytes of the dense registers packed 6 bits each.
pub const DENSE_BYTES: usize = REGISTERS * 6 / 8;

/// The fixed SipHash keys of [`hash_member`]: never change them (every
/// register ever stored depends on them).
const HASH_KEYS: (u64, u64) = (0x7461_6c6c_7968_6c6c, 0x756e_6971_7565_7331);

/// The 64-bit hash that places a member: the same on every build and platform.
pub fn hash_member(member: &[u8]) -> u64 {
    let mut hasher = siphasher::sip::SipHasher13::new_with_keys(HASH_KEYS.0, HASH_KEYS.1);
    hasher.write(member);
    hasher.finish()
}

/// The register and rank of a hash: the top 14 bits pick the register, the
/// rank is one more than the leading zeros of the other 50 (51 when all zero).
pub fn position(hash: u64) -> (u16, u8) {
    let index = (hash >> RANK_BITS) as u16;
    let rest = hash & ((1u64 << RANK_BITS) - 1);
    let rank = if rest == 0 {
        MAX_RANK
    } else {
        (rest.leading_zeros() - PRECISION + 1) as u8
    };
    (index, rank)
}

#[derive(Clone, PartialEq, Eq, Debug)]
enum Registers {
    /// Set registers only, sorted by index.
    Sparse(Vec<(u16, u8)>),
    /// Every register, one byte each.
    Dense(Box<[u8]>),
}

/// Why stored or received registers were refused.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum RegisterError {
    /// A register index past 16383.
    #[error("register index {0} is out of range (0..{REGISTERS})")]
    Index(u32),
    /// A rank past 51.
    #[error("register rank {0} is out of range (1..={MAX_RANK})")]
    Rank(u32),
    /// Bytes that are not an encoding of registers.
    #[error("malformed HyperLogLog bytes: {0}")]
    Malformed(&'static str),
}

/// Checks one register as it arrives from a peer or the disk.
pub fn check_register(index: u32, rank: u32) -> Result<(u16, u8), RegisterError> {
    if index as usize >= REGISTERS {
        return Err(RegisterError::Index(index));
    }
    if rank == 0 || rank > u32::from(MAX_RANK) {
        return Err(RegisterError::Rank(rank));
    }
    Ok((index as u16, rank as u8))
}

/// A HyperLogLog sketch. See the module documentation.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HyperLogLog {
    registers: Registers,
}

impl Default for HyperLogLog {
    fn default() -> Self {
        HyperLogLog {
            registers: Registers::Sparse(Vec::new()),
        }
    }
}

impl HyperLogLog {
    /// An empty sketch (estimate 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Observes a member. Returns the register it raised, if any.
    pub fn observe(&mut self, member: &[u8]) -> Option<(u16, u8)> {
        let (index, rank) = position(hash_member(member));
        self.raise(index, rank).then_some((index, rank))
    }

    /// The register `index` (0 when unset).
    pub fn register(&self, index: u16) -> u8 {
        match &self.registers {
            Registers::Sparse(set) => match set.binary_search_by_key(&index, |(i, _)| *i) {
                Ok(at) => set[at].1,
                Err(_) => 0,
            },
            Registers::Dense(all) => all[usize::from(index)],
        }
    }

    /// Raises register `index` to at least `rank` (`index` < 16384 and
    /// `rank` <= 51, see [`check_register`]). Returns true when it changed.
    pub fn raise(&mut self, index: u16, rank: u8) -> bool {
        debug_assert!(usize::from(index) < REGISTERS && rank <= MAX_RANK);
        match &mut self.registers {
            Registers::Dense(all) => {
                let slot = &mut all[usize::from(index)];
                if rank <= *slot {
                    return false;
                }
                *slot = rank;
                true
            }
            Registers::Sparse(set) => {
                match set.binary_search_by_key(&index, |(i, _)| *i) {
                    Ok(at) if set[at].1 >= rank => return false,
                    Ok(at) => set[at].1 = rank,
                    Err(_) if rank == 0 => return false,
                    Err(at) => set.insert(at, (index, rank)),
                }
                if set.len() > SPARSE_LIMIT {
                    let mut all = vec![0u8; REGISTERS].into_boxed_slice();
                    for (i, r) in set.iter() {
                        all[usize::from(*i)] = *r;
                    }
                    self.registers = Registers::Dense(all);
                }
                true
            }
        }
    }

    /// The set registers, by index.
    pub fn set_registers(&self) -> Vec<(u16, u8)> {
        match &self.registers {
            Registers::Sparse(set) => set.clone(),
            Registers::Dense(all) => all
                .iter()
                .enumerate()
                .filter(|(_, r)| **r > 0)
                .map(|(i, r)| (i as u16, *r))
                .collect(),
        }
    }

    /// How many registers are set (above 0).
    pub fn set_count(&self) -> usize {
        match &self.registers {
            Registers::Sparse(set) => set.len(),
            Registers::Dense(all) => all.iter().filter(|rank| **rank > 0).count(),
        }
    }

    /// True in the dense form.
    pub fn is_dense(&self) -> bool {
        matches!(self.registers, Registers::Dense(_))
    }

    /// The estimated number of distinct members observed.
    pub fn estimate(&self) -> f64 {
        let mut histogram = [0u32; MAX_RANK as usize + 1];
        match &self.registers {
            Registers::Sparse(set) => {
                histogram[0] = (REGISTERS - set.len()) as u32;
                for (_, rank) in set {
                    histogram[usize::from(*rank)] += 1;
                }
            }
            Registers::Dense(all) => {
                for rank in all.iter() {
                    histogram[usize::from(*rank)] += 1;
                }
            }
        }
        let m = REGISTERS as f64;
        let q = RANK_BITS as usize;
        let mut z = m * tau((m - f64::from(histogram[q + 1])) / m);
        for count in histogram[1..=q].iter().rev() {
            z += f64::from(*count);
            z *= 0.5;
        }
        z += m * sigma(f64::from(histogram[0]) / m);
        let alpha_infinity = 0.5 / std::f64::consts::LN_2;
        alpha_infinity * m * m / z
    }

    /// A stable 64-bit hash of the registers (equal registers, equal digest).
    pub fn digest(&self) -> u64 {
        super::stable_hash(0x686c6c, &[&self.to_bytes()])
    }

    /// The estimate of the union of several sketches (as `PFCOUNT k1 k2`).
    pub fn union_estimate<'a>(sketches: impl IntoIterator<Item = &'a HyperLogLog>) -> f64 {
        let mut union = HyperLogLog::new();
        for sketch in sketches {
            union.merge(sketch);
        }
        union.estimate()
    }

    /// The registers as stored: a form byte, then (sparse) a count and
    /// (index BE u16, rank) per set register, or (dense) 16384 ranks of 6
    /// bits packed into 12,288 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.registers {
            Registers::Sparse(set) => {
                let mut out = Vec::with_capacity(3 + 3 * set.len());
                out.push(0);
                out.extend_from_slice(&(set.len() as u16).to_be_bytes());
                for (index, rank) in set {
                    out.extend_from_slice(&index.to_be_bytes());
                    out.push(*rank);
                }
                out
            }
            Registers::Dense(all) => {
                let mut out = Vec::with_capacity(1 + DENSE_BYTES);
                out.push(1);
                for four in all.chunks_exact(4) {
                    let word = u32::from(four[0]) << 18
                        | u32::from(four[1]) << 12
                        | u32::from(four[2]) << 6
                        | u32::from(four[3]);
                    out.extend_from_slice(&word.to_be_bytes()[1..]);
                }
                out
            }
        }
    }

    /// Reads [`Self::to_bytes`] back; every register is checked, and the
    /// form is chosen again from the registers (never trusted from the bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, RegisterError> {
        let (form, rest) = bytes
            .split_first()
            .ok_or(RegisterError::Malformed("empty"))?;
        let mut sketch = HyperLogLog::new();
        match form {
            0 => {
                let count = rest
                    .get(..2)
                    .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
                    .ok_or(RegisterError::Malformed("sparse count cut short"))?;
                let entries = &rest[2..];
                if entries.len() != 3 * count {
                    return Err(RegisterError::Malformed("sparse length"));
                }
                for entry in entries.chunks_exact(3) {
                    let index = u32::from(u16::from_be_bytes([entry[0], entry[1]]));
                    let (index, rank) = check_register(index, u32::from(entry[2]))?;
                    sketch.raise(index, rank);
                }
            }
            1 => {
                if rest.len() != DENSE_BYTES {
                    return Err(RegisterError::Malformed("dense length"));
                }
                for (group, three) in rest.chunks_exact(3).enumerate() {
                    let word = u32::from_be_bytes([0, three[0], three[1], three[2]]);
                    for slot in 0..4 {
                        let rank = (word >> (18 - 6 * slot)) & 0x3f;
                        if rank > 0 {
                            let index = (group * 4 + slot as usize) as u32;
                            let (index, rank) = check_register(index, rank)?;
                            sketch.raise(index, rank);
                        }
                    }
                }
            }
            _ => return Err(RegisterError::Malformed("unknown form")),
        }
        Ok(sketch)
    }
}

impl Crdt for HyperLogLog {
    fn merge(&mut self, other: &Self) -> bool {
        if let (Registers::Dense(mine), Registers::Dense(theirs)) =
            (&mut self.registers, &other.registers)
        {
            let mut changed = false;
            for (mine, theirs) in mine.iter_mut().zip(theirs.iter()) {
                if *theirs > *mine {
                    *mine = *theirs;
                    changed = true;
                }
            }
            return changed;
        }
        let mut changed = false;
        for (index, rank) in other.set_registers() {
            changed |= self.raise(index, rank);
        }
        changed
    }
}

/// Ertl's σ(x) = x + Σ_{k≥1} x^(2^k) 2^(k-1).
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if previous == z {
            return z;
        }
    }
}

/// Ertl's τ(x) = (1 - x - Σ_{k≥1} (1 - x^(2^-k))² 2^-k) / 3.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if previous == z {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
#[path = "hll_tests.rs"]
mod tests;
