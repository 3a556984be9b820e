//! CUDA device-buffer detection through the driver's pointer attributes.
//!
//! The library never loads the CUDA driver itself: a program that has device buffers has loaded
//! `libcuda.so.1` already, so [`is_device`] looks it up with `dlopen(RTLD_NOLOAD)` (until found)
//! and asks `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)`. Device and managed
//! (unified) buffers are reported as device buffers, with their device ordinal; the collectives
//! compress them on that GPU (see [`crate::gpu`]).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

/// `cuPointerGetAttribute`, once found (0: not yet).
static FN: AtomicUsize = AtomicUsize::new(0);

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
const CU_MEMORYTYPE_DEVICE: c_uint = 2;
const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

fn lookup() -> Option<PointerGetAttribute> {
    let f = FN.load(Ordering::Relaxed);
    if f != 0 {
        // SAFETY: FN only ever holds the address of `cuPointerGetAttribute` (stored below).
        return Some(unsafe { std::mem::transmute::<usize, PointerGetAttribute>(f) });
    }
    // SAFETY: dlopen with RTLD_NOLOAD never loads anything: it returns the handle of an already
    // loaded libcuda or null; dlsym on a valid handle with a NUL-terminated name is sound. The
    // handle is intentionally never closed (the driver stays loaded for the process anyway).
    unsafe {
        let h = libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        );
        if h.is_null() {
            return None;
        }
        let s = libc::dlsym(h, c"cuPointerGetAttribute".as_ptr());
        if s.is_null() {
            return None;
        }
        FN.store(s as usize, Ordering::Relaxed);
        Some(std::mem::transmute::<*mut c_void, PointerGetAttribute>(s))
    }
}

/// Whether `p` points into CUDA device (or managed) memory. `false` when no CUDA driver is loaded.
pub fn is_device(p: *const c_void) -> bool {
    if p.is_null() {
        return false;
    }
    let Some(f) = lookup() else {
        return false;
    };
    let mut ty: c_uint = 0;
    let mut managed: c_int = 0;
    // SAFETY: `f` is cuPointerGetAttribute; both attributes write one 32-bit value into the
    // given storage; any pointer value may be queried (unknown host pointers return an error).
    unsafe {
        let r = f(
            (&mut ty as *mut c_uint).cast(),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            p as u64,
        );
        if r != 0 {
            return false;
        }
        if ty == CU_MEMORYTYPE_DEVICE || ty == CU_MEMORYTYPE_UNIFIED {
            return true;
        }
        let r = f(
            (&mut managed as *mut c_int).cast(),
            CU_POINTER_ATTRIBUTE_IS_MANAGED,
            p as u64,
        );
        r == 0 && managed != 0
    }
}

/// The device ordinal of a device (or managed) buffer: `None` for host memory or without a
/// loaded CUDA driver.
pub fn ordinal(p: *const c_void) -> Option<usize> {
    if !is_device(p) {
        return None;
    }
    let f = lookup()?;
    let mut ord: c_int = -1;
    // SAFETY: as in `is_device`; the attribute writes one 32-bit int.
    let r = unsafe {
        f(
            (&mut ord as *mut c_int).cast(),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            p as u64,
        )
    };
    (r == 0 && ord >= 0).then_some(ord as usize)
}
