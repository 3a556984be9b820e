//! The agreement before data: the 48-byte descriptor every rank exchanges, and the checks that
//! turn a mismatch into the same error on every rank.

use super::*;

pub(super) const OP_SEND: u8 = 1;
pub(super) const OP_RECV: u8 = 2;
pub(super) const OP_ALLGATHER: u8 = 4;
pub(super) const OP_ALLREDUCE: u8 = 5;
pub(super) const OP_REDUCE_SCATTER: u8 = 6;
pub(super) const OP_ALLREDUCE_MEAN: u8 = 8;

pub(super) fn op_name(op: u8) -> &'static str {
    match op {
        OP_SEND => "send",
        OP_RECV => "recv",
        OP_ALLGATHER => "allgather",
        OP_ALLREDUCE => "allreduce",
        OP_REDUCE_SCATTER => "reduce_scatter",
        OP_ALLREDUCE_MEAN => "allreduce_mean",
        _ => "unknown",
    }
}

pub(super) const DESC_MAGIC: u32 = 0x4e43_435a; // "ZCCN"
pub(super) const DESC_LEN: usize = 48;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Desc {
    pub(super) op: u8,
    pub(super) dtype: u8,
    pub(super) policy: u8,
    pub(super) mode: u8,
    pub(super) decision: u8,
    pub(super) bound: f64,
    pub(super) count: u64,
    pub(super) seq: u64,
    pub(super) ratio: f64,
}

impl Desc {
    pub(super) fn to_bytes(self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[0..4].copy_from_slice(&DESC_MAGIC.to_le_bytes());
        b[4] = self.op;
        b[5] = self.dtype;
        b[6] = self.policy;
        b[7] = self.mode;
        b[8] = self.decision;
        b[16..24].copy_from_slice(&self.bound.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..40].copy_from_slice(&self.seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.ratio.to_le_bytes());
        b
    }
    pub(super) fn parse(b: &[u8]) -> Result<Self> {
        if b.len() != DESC_LEN || b[0..4] != DESC_MAGIC.to_le_bytes() {
            return Err(Error::Comm(
                "malformed NCCL descriptor from a peer: the ranks are not running the same operation".into(),
            ));
        }
        let f = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Desc {
            op: b[4],
            dtype: b[5],
            policy: b[6],
            mode: b[7],
            decision: b[8],
            bound: f64::from_bits(f(16)),
            count: f(24),
            seq: f(32),
            ratio: f64::from_bits(f(40)),
        })
    }
    /// Same operation? (`Ok` on every rank iff all descriptors agree.)
    pub(super) fn check(&self, other: &Desc, me: usize, who: usize) -> Result<()> {
        let mm = |what: &'static str, a: String, b: String| Error::Mismatch {
            what,
            expected: format!("{a} (rank {me})"),
            found: format!("{b} (rank {who})"),
        };
        if self.op != other.op || self.seq != other.seq {
            return Err(mm(
                "NCCL operation",
                format!("{} #{}", op_name(self.op), self.seq),
                format!("{} #{}", op_name(other.op), other.seq),
            ));
        }
        if self.dtype != other.dtype {
            return Err(mm("dtype", self.dtype.to_string(), other.dtype.to_string()));
        }
        if self.count != other.count {
            return Err(mm(
                "element count",
                self.count.to_string(),
                other.count.to_string(),
            ));
        }
        if self.policy != other.policy {
            return Err(mm(
                "policy/codec",
                self.policy.to_string(),
                other.policy.to_string(),
            ));
        }
        if self.mode != other.mode || self.bound.to_bits() != other.bound.to_bits() {
            return Err(mm(
                "error bound",
                format!("{}:{:e}", self.mode, self.bound),
                format!("{}:{:e}", other.mode, other.bound),
            ));
        }
        Ok(())
    }
}

/// Check a sender's descriptor against the receiver's (same verdict on both ends).
pub(super) fn check_pair(s: &Desc, r: &Desc, me: usize, peer: usize) -> Result<()> {
    let (s, r) = if s.op == OP_SEND { (s, r) } else { (r, s) };
    if s.op != OP_SEND || r.op != OP_RECV {
        return Err(Error::Mismatch {
            what: "NCCL operation",
            expected: "send matched by recv".into(),
            found: format!("{} against {} (peer {peer})", op_name(s.op), op_name(r.op)),
        });
    }
    let probe = Desc {
        op: s.op,
        seq: s.seq,
        ..*r
    };
    let probe = Desc {
        count: r.count,
        ..probe
    };
    s.check(
        &Desc {
            op: s.op,
            seq: s.seq,
            decision: s.decision,
            ratio: s.ratio,
            ..probe
        },
        me,
        peer,
    )
}
