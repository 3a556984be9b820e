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

static FREE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn free_list() -> std::sync::MutexGuard<'static, Vec<Vec<u8>>> {
    // a panic while holding the lock leaves a valid list of buffers
    FREE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An empty vector with room for `len` bytes (a recycled one when the pool has one).
pub fn take(len: usize) -> Vec<u8> {
    if len >= MIN_POOLED {
        let mut free = free_list();
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

/// An owned copy of `bytes` in a (possibly recycled) buffer.
pub fn copy_of(bytes: &[u8]) -> Vec<u8> {
    let mut v = take(bytes.len());
    v.extend_from_slice(bytes);
    v
}

/// A buffer of `len` zero bytes (to receive into), recycled when possible.
pub fn zeroed(len: usize) -> Vec<u8> {
    let mut v = take(len);
    v.resize(len, 0);
    v
}

/// Return a buffer that is no longer needed.
pub fn give(v: Vec<u8>) {
    let cap = v.capacity();
    if !(MIN_POOLED..=MAX_KEPT_BYTES).contains(&cap) {
        return;
    }
    let mut free = free_list();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycles_large_buffers_only() {
        let v = copy_of(&vec![7u8; MIN_POOLED + 5]);
        assert_eq!(v.len(), MIN_POOLED + 5);
        let p = v.as_ptr();
        give(v);
        // the same allocation comes back for a message that fits, empty
        let w = take(MIN_POOLED);
        assert!(w.is_empty() && w.capacity() >= MIN_POOLED + 5);
        assert_eq!(w.as_ptr(), p);
        give(w);
        let z = zeroed(MIN_POOLED);
        assert!(z.iter().all(|&b| b == 0));
        give(z);
        // small buffers are left to malloc
        give(vec![1u8; 16]);
        assert!(free_list().iter().all(|b| b.capacity() >= MIN_POOLED));
        assert!(free_list().len() <= MAX_KEPT);
    }
}
