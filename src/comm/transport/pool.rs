//! Recycled large message buffers.
//!
//! A send needs an owned copy of its payload (the transfer outlives the call) and a receive of
//! unknown length a fresh vector. Above glibc's mmap threshold (at most 32 MiB) every such
//! allocation is a new mapping whose pages the kernel faults in and zeroes on first touch, and
//! freeing it unmaps them again: for large messages that costs more than the copy itself and
//! several times the transfer over shared memory. The pool keeps a few freed buffers of at least
//! [`MIN_POOLED`] bytes (at most [`MAX_KEPT`], [`MAX_KEPT_BYTES`] in all) and hands them out
//! again, so a loop of equal messages touches the same pages every time.

use std::sync::Mutex;

/// Smaller buffers come from malloc's own free lists: not pooled.
pub const MIN_POOLED: usize = 1 << 20;
/// Buffers kept at most.
pub const MAX_KEPT: usize = 4;
/// Bytes kept at most (a larger buffer is freed).
pub const MAX_KEPT_BYTES: usize = 1 << 31;

/// A free list of buffers (one per process: [`take`], [`give`] use it).
struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
}

static POOL: Pool = Pool::new();

impl Pool {
    const fn new() -> Self {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }

    fn free_list(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        // a panic while holding the lock leaves a valid list of buffers
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take(&self, len: usize) -> Vec<u8> {
        if len >= MIN_POOLED {
            let mut free = self.free_list();
            // the smallest kept buffer that fits
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= len)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut v = free.swap_remove(i);
                v.clear();
                return v;
            }
        }
        Vec::with_capacity(len)
    }

    fn give(&self, v: Vec<u8>) {
        let cap = v.capacity();
        if !(MIN_POOLED..=MAX_KEPT_BYTES).contains(&cap) {
            return;
        }
        let mut free = self.free_list();
        free.push(v);
        // keep the largest buffers within both limits
        free.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
        let mut total = 0usize;
        let mut keep = 0usize;
        for b in free.iter() {
            if keep == MAX_KEPT || total + b.capacity() > MAX_KEPT_BYTES {
                break;
            }
            total += b.capacity();
            keep += 1;
        }
        free.truncate(keep);
    }
}

/// An empty vector with room for `len` bytes (a recycled one when the pool has one).
pub fn take(len: usize) -> Vec<u8> {
    POOL.take(len)
}

/// An owned copy of `bytes` in a (possibly recycled) buffer.
pub fn copy_of(bytes: &[u8]) -> Vec<u8> {
    let mut v = take(bytes.len());
    v.extend_from_slice(bytes);
    v
}

/// A buffer of `len` zero bytes (to receive into), recycled when possible.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))] // (the MPI transport's receives)
pub fn zeroed(len: usize) -> Vec<u8> {
    let mut v = take(len);
    v.resize(len, 0);
    v
}

/// Return a buffer that is no longer needed.
pub fn give(v: Vec<u8>) {
    POOL.give(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycles_large_buffers_only() {
        // a pool of its own (the process's pool is shared with tests running in parallel)
        let pool = Pool::new();
        let v = vec![7u8; MIN_POOLED + 5];
        let p = v.as_ptr();
        pool.give(v);
        // the same allocation comes back, empty, for a message that fits
        let w = pool.take(MIN_POOLED);
        assert!(w.is_empty() && w.capacity() >= MIN_POOLED + 5);
        assert_eq!(w.as_ptr(), p);
        // nothing fits: a new buffer
        pool.give(w);
        assert!(pool.take(4 * MIN_POOLED).capacity() >= 4 * MIN_POOLED);
        // small buffers are left to malloc; at most MAX_KEPT are kept, the largest
        pool.give(vec![1u8; 16]);
        for k in 1..=MAX_KEPT + 2 {
            pool.give(Vec::with_capacity(k * MIN_POOLED));
        }
        let caps: Vec<usize> = pool.free_list().iter().map(|b| b.capacity()).collect();
        assert_eq!(caps.len(), MAX_KEPT);
        assert!(caps.iter().all(|&c| c >= 3 * MIN_POOLED), "{caps:?}");
    }

    #[test]
    fn copies_and_zeroes() {
        let src: Vec<u8> = (0..MIN_POOLED + 3).map(|i| i as u8).collect();
        assert_eq!(copy_of(&src), src);
        assert!(zeroed(MIN_POOLED + 1).iter().all(|&b| b == 0));
    }
}
