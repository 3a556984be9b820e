//! Chunk pipelining of large point-to-point messages.
//!
//! A message above [`Config::pipeline_min_bytes`](super::Config) that is sent compressed is cut
//! into chunks of [`Config::chunk_bytes`](super::Config) (in scalars; the last chunk is shorter)
//! and every chunk becomes its own zcomm stream and its own MPI message on the user tag. The
//! descriptor announces the chunk length, so the receiver knows how many messages follow and
//! which scalars each one covers.
//!
//! The schedule ([`exchange_chunks`]) is generic over a [`ChunkCodec`] (encode chunk `k` to
//! bytes, decode chunk `k` from bytes): [`HostChunks`] runs any [`Compressor`] on host slices,
//! and the device path (`sendrecv_device`, feature `cuda`) plugs in GPU compression + the
//! device↔host copies. Iteration `k`:
//!
//! 1. encode chunk `k` and post its non-blocking send (chunk `k-1` may still be in flight, so
//!    the compression of `k` overlaps the transfer of `k-1`); at most two sends stay posted;
//! 2. decode chunk `k-1` (already arrived) while the peer encodes and sends its chunk `k`;
//! 3. receive chunk `k` (probe for its length, `MPI_Imrecv`, wait).
//!
//! (The receive is posted after the decode: it starts with a blocking probe, so posting it
//! first would wait for the peer's chunk `k` before decoding `k-1` and serialize both ranks.)
//!
//! Errors never stop the schedule: a failed encode sends empty chunks from then on (the peer's
//! decode fails too), a failed decode keeps draining, so both ranks always post and match the
//! same messages and report the error afterwards instead of hanging.

use std::collections::VecDeque;
use std::ops::Range;

use super::element::Real;
use super::transport::{SendHandle, Transport};
use super::Compressor;
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::quant::ErrorBound;

/// Encodes/decodes the chunks of one message (both directions of an exchange).
pub(crate) trait ChunkCodec {
    /// The bytes of outgoing chunk `k`.
    fn encode(&mut self, k: usize) -> Result<Vec<u8>>;
    /// Consume incoming chunk `k`.
    fn decode(&mut self, k: usize, bytes: Vec<u8>) -> Result<()>;

    /// The bytes of outgoing chunk `k`, or an empty message once the exchange has failed
    /// (`state` keeps the first error; a failed encode sets it). The remaining chunks still go
    /// out, empty: the peer drains them and fails too, so both ends move the same messages.
    fn encode_unless_failed(&mut self, k: usize, state: &mut Result<()>) -> Vec<u8> {
        if state.is_err() {
            return Vec::new();
        }
        self.encode(k).unwrap_or_else(|e| {
            *state = Err(e);
            Vec::new()
        })
    }
}

/// Number of chunks of `n` scalars cut `chunk` at a time (0 for an empty message).
pub(crate) fn chunk_count(n: usize, chunk: usize) -> usize {
    if chunk == 0 {
        0
    } else {
        n.div_ceil(chunk)
    }
}

/// Scalar range of chunk `k`.
pub(crate) fn chunk_range(n: usize, chunk: usize, k: usize) -> Range<usize> {
    let lo = (k * chunk).min(n);
    lo..(lo + chunk).min(n)
}

/// Chunk length in scalars for `chunk_bytes` of `size`-byte scalars (a multiple of `lanes`, so a
/// complex value is never split).
pub(crate) fn chunk_scalars(chunk_bytes: usize, size: usize, lanes: usize) -> usize {
    let c = (chunk_bytes / size.max(1)).max(1);
    (c / lanes.max(1)).max(1) * lanes.max(1)
}

/// Run the pipelined schedule: `nsend` chunks to `dest` and `nrecv` chunks from `src`, all on
/// `tag`. Returns the bytes sent and the first codec error (transport errors return at once).
pub(crate) fn exchange_chunks(
    t: &dyn Transport,
    codec: &mut dyn ChunkCodec,
    dest: usize,
    nsend: usize,
    src: usize,
    nrecv: usize,
    tag: i32,
) -> Result<(usize, Result<()>)> {
    let mut sends: VecDeque<Box<dyn SendHandle>> = VecDeque::new();
    let mut err: Result<()> = Ok(());
    let mut sent = 0usize;
    let mut held: Option<Vec<u8>> = None;
    for k in 0..nsend.max(nrecv) {
        if k < nsend {
            let bytes = codec.encode_unless_failed(k, &mut err);
            sent += bytes.len();
            sends.push_back(t.isend(dest, tag, bytes)?);
            while sends.len() > 2 {
                sends.pop_front().expect("non-empty").wait()?;
            }
        }
        if let Some(prev) = held.take() {
            if err.is_ok() {
                err = codec.decode(k - 1, prev);
            }
        }
        if k < nrecv {
            held = Some(t.irecv(src, tag)?.wait()?.pop().unwrap_or_default());
        }
    }
    if let Some(last) = held.take() {
        if err.is_ok() {
            err = codec.decode(nrecv - 1, last);
        }
    }
    for h in sends {
        h.wait()?;
    }
    Ok((sent, err))
}

/// What [`HostChunks`] sends: nothing, one whole prepared payload, or chunks compressed on demand.
pub(crate) enum Outgoing<'a, S> {
    /// No outgoing chunks.
    None,
    /// One message with these bytes (the peer pipelines, we do not).
    Whole(Vec<u8>),
    /// `data` compressed `chunk` scalars at a time.
    Chunks {
        /// Values to send.
        data: &'a [S],
        /// Scalars per chunk.
        chunk: usize,
        /// Bound of every chunk.
        bound: ErrorBound,
        /// Codec.
        codec: CodecKind,
    },
}

/// Where [`HostChunks`] puts what arrives.
pub(crate) enum Incoming<'a, S> {
    /// Drain and discard (a mismatch is already known).
    Discard,
    /// One whole message, raw (`false`) or compressed (`true`).
    Whole(&'a mut [S], bool),
    /// Compressed chunks of `chunk` scalars.
    Chunks(&'a mut [S], usize),
}

/// A [`ChunkCodec`] over host slices and any [`Compressor`].
pub(crate) struct HostChunks<'a, S> {
    pub(crate) compressor: &'a dyn Compressor,
    pub(crate) out: Outgoing<'a, S>,
    pub(crate) inc: Incoming<'a, S>,
    /// Max |sent - decoded sent| over the chunks, when verifying.
    pub(crate) verify: Option<f64>,
}

impl<S: Real> ChunkCodec for HostChunks<'_, S> {
    fn encode(&mut self, k: usize) -> Result<Vec<u8>> {
        match &mut self.out {
            Outgoing::None => Err(Error::Comm("no outgoing chunks".into())),
            Outgoing::Whole(b) => Ok(std::mem::take(b)),
            Outgoing::Chunks {
                data,
                chunk,
                bound,
                codec,
            } => {
                let part = &data[chunk_range(data.len(), *chunk, k)];
                let s = S::compress_with(self.compressor, part, *bound, *codec)?;
                if let Some(m) = self.verify.as_mut() {
                    let mut back = vec![S::default(); part.len()];
                    S::decompress_with(self.compressor, &s, &mut back)?;
                    *m = m.max(super::max_abs_diff(part, &back));
                }
                Ok(s)
            }
        }
    }
    fn decode(&mut self, k: usize, bytes: Vec<u8>) -> Result<()> {
        match &mut self.inc {
            Incoming::Discard => Ok(()),
            Incoming::Whole(out, true) => S::decompress_with(self.compressor, &bytes, out),
            Incoming::Whole(out, false) => super::element::scalars_from_bytes(&bytes, out),
            Incoming::Chunks(out, chunk) => {
                let r = chunk_range(out.len(), *chunk, k);
                S::decompress_with(self.compressor, &bytes, &mut out[r])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_exactly() {
        for (n, c) in [
            (0usize, 4usize),
            (1, 4),
            (4, 4),
            (5, 4),
            (1000, 7),
            (7, 1000),
        ] {
            let k = chunk_count(n, c);
            let mut next = 0;
            for i in 0..k {
                let r = chunk_range(n, c, i);
                assert_eq!(r.start, next);
                assert!(!r.is_empty() && r.len() <= c);
                next = r.end;
            }
            assert_eq!(next, n);
        }
        assert_eq!(chunk_scalars(1 << 20, 4, 1), 1 << 18);
        assert_eq!(chunk_scalars(12, 8, 2), 2);
        assert_eq!(chunk_scalars(1, 8, 2), 2);
        assert_eq!(chunk_scalars(100, 4, 2) % 2, 0);
    }
}
