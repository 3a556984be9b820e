//! The agreement before data: the 80-byte descriptor every operation of every transport (MPI,
//! loopback, NCCL's bootstrap) exchanges first, and the deterministic checks that turn a
//! mismatch into the same error on every rank.

use super::*;

pub(super) const DESC_LEN: usize = 80;
pub(super) const DESC_MAGIC: u32 = 0x3144_435a; // "ZCD1"

/// The agreement record exchanged before every operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Desc {
    pub(super) op: u8,
    pub(super) dtype: u8,
    pub(super) policy: u8,
    pub(super) mode: u8,
    pub(super) decision: u8,
    pub(super) root: u32,
    pub(super) bound: f64,
    pub(super) count: u64,
    pub(super) payload: u64,
    pub(super) ratio: f64,
    pub(super) seq: u64,
    /// Smallest finite value of the local input (reductions), +inf if none.
    pub(super) lo: f64,
    /// Largest finite value of the local input (reductions), -inf if none.
    pub(super) hi: f64,
    /// 1 when this rank rejected its own arguments (so every rank fails together).
    pub(super) bad: u8,
    /// Bit 0: verification on (reductions then run an extra exact reduction on every rank).
    pub(super) flags: u8,
    /// Point-to-point: scalars per pipelined chunk (0: the payload is one message).
    pub(super) chunk: u64,
    /// The header tag of the codec a compressed payload was made with (0: none given), so that
    /// receivers report the sender's `Auto` choice (the broadcast's root's).
    pub(super) codec: u8,
}

impl Desc {
    /// A descriptor with every field empty (no range, no payload, nothing rejected): the base
    /// that operations needing only some fields fill in.
    pub(super) const EMPTY: Desc = Desc {
        op: 0,
        dtype: 0,
        policy: 0,
        mode: 0,
        decision: 0,
        root: 0,
        bound: 0.0,
        count: 0,
        payload: 0,
        ratio: 1.0,
        seq: 0,
        lo: f64::INFINITY,
        hi: f64::NEG_INFINITY,
        bad: 0,
        flags: 0,
        chunk: 0,
        codec: 0,
    };

    pub(super) fn to_bytes(self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[0..4].copy_from_slice(&DESC_MAGIC.to_le_bytes());
        b[4] = self.op;
        b[5] = self.dtype;
        b[6] = self.policy;
        b[7] = self.mode;
        b[8] = self.decision;
        b[12..16].copy_from_slice(&self.root.to_le_bytes());
        b[16..24].copy_from_slice(&self.bound.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..40].copy_from_slice(&self.payload.to_le_bytes());
        b[40..48].copy_from_slice(&self.ratio.to_le_bytes());
        b[48..56].copy_from_slice(&self.seq.to_le_bytes());
        b[56..64].copy_from_slice(&self.lo.to_le_bytes());
        b[64..72].copy_from_slice(&self.hi.to_le_bytes());
        b[72..80].copy_from_slice(&self.chunk.to_le_bytes());
        b[9] = self.bad;
        b[10] = self.flags;
        b[11] = self.codec;
        b
    }
    pub(super) fn parse(b: &[u8]) -> Result<Self> {
        if b.len() != DESC_LEN || b[0..4] != DESC_MAGIC.to_le_bytes() {
            return Err(Error::Comm(format!(
                "malformed descriptor from peer ({} bytes): the ranks are not running the same operation",
                b.len()
            )));
        }
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Ok(Desc {
            op: b[4],
            dtype: b[5],
            policy: b[6],
            mode: b[7],
            decision: b[8],
            root: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            bound: f64::from_bits(u64at(16)),
            count: u64at(24),
            payload: u64at(32),
            ratio: f64::from_bits(u64at(40)),
            seq: u64at(48),
            lo: f64::from_bits(u64at(56)),
            hi: f64::from_bits(u64at(64)),
            bad: b[9],
            flags: b[10],
            chunk: u64at(72),
            codec: b[11],
        })
    }
}

pub(super) fn mismatch(what: &'static str, expected: String, found: String) -> Error {
    Error::Mismatch {
        what,
        expected,
        found,
    }
}

pub(super) fn mode_name(m: u8) -> &'static str {
    match m {
        1 => "abs",
        2 => "noa",
        3 => "rel",
        _ => "?",
    }
}

pub(super) fn fmt_policy(tag: u8) -> String {
    let codec = CodecKind::from_tag(tag & 0xf)
        .map(|c| c.to_string())
        .unwrap_or_default();
    match tag >> 4 {
        0 => "never".into(),
        1 => format!("auto:{codec}"),
        2 => format!("always:{codec}"),
        _ => format!("?{tag}"),
    }
}

/// Check that a sender's descriptor matches the receiver's expectation (same answer on both).
pub(super) fn check_pair(s: &Desc, r: &Desc) -> Result<()> {
    let pair_ok =
        (s.op == OP_SEND && r.op == OP_RECV) || (s.op == OP_SENDRECV && r.op == OP_SENDRECV);
    if !pair_ok {
        return Err(mismatch(
            "operation",
            format!("{} matched by its counterpart", op_name(s.op)),
            format!("{} against {}", op_name(s.op), op_name(r.op)),
        ));
    }
    if s.dtype != r.dtype {
        return Err(mismatch(
            "dtype",
            dtype_name(r.dtype).into(),
            dtype_name(s.dtype).into(),
        ));
    }
    if r.count != ANY_COUNT && s.count != r.count {
        return Err(mismatch(
            "element count",
            r.count.to_string(),
            s.count.to_string(),
        ));
    }
    if s.policy != r.policy {
        return Err(mismatch(
            "policy/codec",
            fmt_policy(r.policy),
            fmt_policy(s.policy),
        ));
    }
    if s.mode != r.mode || s.bound.to_bits() != r.bound.to_bits() {
        return Err(mismatch(
            "error bound",
            format!("{}:{:e}", mode_name(r.mode), r.bound),
            format!("{}:{:e}", mode_name(s.mode), s.bound),
        ));
    }
    Ok(())
}

/// Check a gathered table of collective descriptors (identical result on every rank).
pub(super) fn check_table(all: &[Desc]) -> Result<()> {
    if let Some(r) = all.iter().position(|d| d.bad != 0) {
        return Err(Error::Comm(format!(
            "{}: rank {r} rejected its arguments",
            op_name(all[r].op)
        )));
    }
    let a = &all[0];
    for (r, d) in all.iter().enumerate().skip(1) {
        let who = |x: String, y: String| (format!("{x} (rank 0)"), format!("{y} (rank {r})"));
        if d.op != a.op || d.seq != a.seq {
            let (e, f) = who(
                format!("{} #{}", op_name(a.op), a.seq),
                format!("{} #{}", op_name(d.op), d.seq),
            );
            return Err(mismatch("collective operation", e, f));
        }
        if d.dtype != a.dtype {
            let (e, f) = who(dtype_name(a.dtype).into(), dtype_name(d.dtype).into());
            return Err(mismatch("dtype", e, f));
        }
        if d.count != a.count {
            let (e, f) = who(a.count.to_string(), d.count.to_string());
            return Err(mismatch("element count", e, f));
        }
        if d.policy != a.policy {
            let (e, f) = who(fmt_policy(a.policy), fmt_policy(d.policy));
            return Err(mismatch("policy/codec", e, f));
        }
        if d.mode != a.mode || d.bound.to_bits() != a.bound.to_bits() {
            let (e, f) = who(
                format!("{}:{:e}", mode_name(a.mode), a.bound),
                format!("{}:{:e}", mode_name(d.mode), d.bound),
            );
            return Err(mismatch("error bound", e, f));
        }
        if d.flags != a.flags {
            let (e, f) = who(
                format!("flags {:#x}", a.flags),
                format!("flags {:#x}", d.flags),
            );
            return Err(mismatch("verify setting", e, f));
        }
        if d.root != a.root {
            let (e, f) = who(a.root.to_string(), d.root.to_string());
            return Err(mismatch("root", e, f));
        }
    }
    Ok(())
}
