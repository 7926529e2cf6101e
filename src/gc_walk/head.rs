//! The collector's list links (`PyGC_Head`), read in place: what both the list walk (`lists`)
//! and the threaded chain walk (`chains`) step through. See `lists` for when the layout holds.

use pyo3::ffi;

/// `PyGC_Head`: two words just before the object, `_gc_prev` carrying flags in its low bits.
#[repr(C)]
pub struct GcHead {
    pub next: usize,
    pub prev: usize,
}

pub const PREV_MASK: usize = !0b11;
pub const HEAD_SIZE: usize = std::mem::size_of::<GcHead>();

/// The node before a GC object.
pub fn node_of(object: *mut ffi::PyObject) -> usize {
    object as usize - HEAD_SIZE
}

/// The node after `node`, unchecked.
///
/// # Safety
/// `node` must be a node of a live gc list.
pub unsafe fn next_of(node: usize) -> usize {
    unsafe { (*(node as *const GcHead)).next }
}

/// The node after `node`, if the list's invariant `next.prev == node` holds there.
///
/// # Safety
/// `node` must be a node of a live gc list (and the GIL held, with no Python code running).
pub unsafe fn checked_next(node: usize) -> Option<usize> {
    let next = unsafe { next_of(node) };
    (next != 0 && unsafe { (*(next as *const GcHead)).prev } & PREV_MASK == node).then_some(next)
}
