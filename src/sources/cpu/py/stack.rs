//! The calling thread's Python stack, read from inside the CPU allocator hook while a CPU
//! trace runs (see `record`), and the code objects the recorder keeps of it (`Code`).
//!
//! # When a stack is read
//! The hook runs on every thread that allocates CPU memory through torch, in whatever state
//! that thread is in. A stack is read exactly when torch's own gatherer reads one
//! (`torch/csrc/profiler/python/combined_traceback.cpp`, `canGather` and `gather`):
//! - the interpreter is initialised (`Py_IsInitialized`: it turns 0 as soon as
//!   finalisation starts, and no thread is made to take the GIL after that);
//! - this thread has a Python thread state (`PyGILState_GetThisThreadState`): torch's
//!   intra-op and inter-op workers and other C++ threads have none, and get no stack;
//! - it holds the GIL (`PyGILState_Check`), or it takes it here (`PyGILState_Ensure`). The
//!   second case is the common one: torch's Python bindings release the GIL around every
//!   operator, so `torch.empty` allocates with the GIL released. That thread's frames are
//!   frozen while it waits in the operator, and taking the GIL back is what torch's own
//!   allocation history does for every CUDA allocation.
//!
//! Allocations without a stack are still recorded; `record` counts them (`no_stack`).
//!
//! Taking the GIL back inside an allocation is torch's own choice for its CUDA history, with
//! its costs: while another Python thread runs, the allocating thread may wait up to the
//! switch interval (5 ms) for it, and a thread that holds the GIL while waiting for a lock
//! the allocating thread holds would deadlock with it (torch's bindings release the GIL
//! before taking their locks, which is what makes this workable). `PyGILState_Check`
//! answers 1 on every thread once a sub-interpreter exists (CPython turns the check off
//! then); torch does not run in sub-interpreters, and neither does this.
//!
//! # What makes it sound
//! - The stack is read before the hook takes any lock. On 3.11 reading it materialises frame
//!   objects, which allocates, which may run the garbage collector, whose finalisers may
//!   free tensors (into the free hook, which takes the table's lock) or allocate them: with
//!   a lock held here, that would deadlock.
//! - An allocation made while this thread is already reading its stack (by such a
//!   finaliser) gets no stack (`CAPTURING`), instead of reading the stack again inside the
//!   first read.
//! - Every code object read is a strong reference (`PyFrame_GetCode` returns one), held
//!   until the stack is dropped; the recorder keeps its own reference to each code object it
//!   interns, so the address it keys on stays that object's.
//! - A pending Python exception is never touched: with one set the stack is not read, and
//!   an exception raised while reading (a failed frame allocation) is cleared before the
//!   hook returns into torch.
//! - The depth is capped at `MAX_DEPTH` innermost frames.
//!
//! # The C API
//! The wheel is built for the stable ABI of 3.9 (`abi3-py39`), where pyo3-ffi leaves out
//! `PyGILState_Check` (not in the limited API), `PyFrame_GetBack` (not in the limited API)
//! and `PyFrame_GetCode` (limited API from 3.10): they are declared below. Each is exported
//! by every CPython 3.9 to 3.13 (`PyFrame_GetBack` and `PyFrame_GetCode` are new in 3.9,
//! `PyGILState_Check` in 3.4), which is what the wheel supports.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use pyo3::ffi;
use pyo3::prelude::*;

extern "C" {
    fn PyGILState_Check() -> c_int;
    fn PyFrame_GetBack(frame: *mut ffi::PyFrameObject) -> *mut ffi::PyFrameObject;
    fn PyFrame_GetCode(frame: *mut ffi::PyFrameObject) -> *mut ffi::PyObject;
    fn PyCode_Addr2Line(code: *mut ffi::PyObject, offset: c_int) -> c_int;
}

type GetLasti = unsafe extern "C" fn(*mut ffi::PyFrameObject) -> c_int;

/// `PyFrame_GetLasti` (3.11+), looked up by `prepare` (0: not there, or not looked up).
/// With it a frame is read as its instruction offset, and the line is found at the stop:
/// `PyFrame_GetLineNumber` scans the code's line table at every call, which was most of
/// the cost of a stack.
static GET_LASTI: AtomicUsize = AtomicUsize::new(0);

/// Look up what `capture` uses where the running interpreter has it (with the GIL, before a
/// trace starts: never from inside the hook, where the dynamic linker's lock may be held).
pub fn prepare() {
    static LOOKED_UP: std::sync::Once = std::sync::Once::new();
    LOOKED_UP.call_once(|| {
        #[cfg(unix)]
        {
            let this = libloading::os::unix::Library::this();
            // SAFETY: PyFrame_GetLasti has this signature in every CPython that exports it
            // (3.11+); on 3.9 and 3.10 the lookup fails and lines are read directly.
            if let Ok(get) = unsafe { this.get::<GetLasti>(b"PyFrame_GetLasti\0") } {
                GET_LASTI.store(*get as usize, Relaxed);
            }
        }
    });
}

/// Whether frames are read as instruction offsets (turned into lines by `line`).
pub fn reads_offsets() -> bool {
    GET_LASTI.load(Relaxed) != 0
}

/// The line of a frame `capture` read as `at` in `code` (GIL held, `code` alive).
///
/// # Safety
/// `code` is a live code object and the GIL is held.
pub unsafe fn line(code: *mut ffi::PyObject, at: c_int) -> c_int {
    if reads_offsets() {
        // SAFETY: per the contract; `at` is an offset PyFrame_GetLasti gave for `code`.
        unsafe { PyCode_Addr2Line(code, at) }
    } else {
        at
    }
}

/// The most frames of one stack kept, innermost first; the outer ones are cut.
pub const MAX_DEPTH: usize = 128;

thread_local! {
    /// This thread is reading its Python stack now.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Why an allocation has no stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoStack {
    /// No trace was running when the allocation began (not read; one may have started
    /// since).
    NotTracing,
    /// The interpreter is not initialised, or is finalising.
    NoInterpreter,
    /// This thread has no Python thread state (a torch worker, a C++ thread).
    NoThreadState,
    /// The allocation was made while this thread was reading its stack (a finaliser run
    /// by a collection that reading the stack triggered).
    Reentrant,
    /// A Python exception was pending: the stack is not read, so it stays untouched.
    ExceptionSet,
}

/// A stack read by `capture`: (code object, where) pairs, innermost first, each code
/// object's address a strong reference, `where` its instruction offset or line (see
/// `line`). Dropping it releases them, then the GIL if `capture` took it; it must be
/// dropped on the thread that captured it, after the hook let go of its locks.
pub struct Stack {
    frames: Vec<(usize, c_int)>,
    acquired: Option<ffi::PyGILState_STATE>,
}

impl Stack {
    /// (code object address, instruction offset or line), innermost first.
    pub fn frames(&self) -> &[(usize, c_int)] {
        &self.frames
    }

    /// A new strong reference to `code`, one of this stack's code objects (for the
    /// recorder, which keys on its address: the address stays this object's for as long as
    /// the reference lives).
    pub fn own(&self, code: usize) -> Code {
        // SAFETY: a stack exists only while its thread holds the GIL (see `capture`), and
        // this one is not dropped yet; `code` is a live code object it holds a reference to.
        unsafe {
            let py = Python::assume_attached();
            Bound::from_borrowed_ptr(py, code as *mut ffi::PyObject).unbind()
        }
    }
}

/// A code object of a recorded stack, held strongly: dropped with the GIL held.
pub type Code = Py<PyAny>;

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the GIL is held on this thread from `capture` until here (held before, or
        // taken by `capture` and released just below); each pointer is a strong reference
        // `PyFrame_GetCode` gave us. The frames still running hold these code objects too,
        // so no count reaches zero here.
        unsafe {
            for &(code, _) in &self.frames {
                ffi::Py_DECREF(code as *mut ffi::PyObject);
            }
            if let Some(state) = self.acquired.take() {
                ffi::PyGILState_Release(state);
            }
        }
    }
}

/// Resets `CAPTURING` when the read ends, however it ends.
struct Capturing;

impl Drop for Capturing {
    fn drop(&mut self) {
        let _ = CAPTURING.try_with(|capturing| capturing.set(false));
    }
}

/// Read the calling thread's Python stack (see the module's notes for when it is read).
/// Never call it with a lock held that the free or allocation hook takes.
pub fn capture() -> Result<Stack, NoStack> {
    // A thread whose thread-locals are gone (it is exiting) reads no stack either.
    if CAPTURING.try_with(Cell::get).unwrap_or(true) {
        return Err(NoStack::Reentrant);
    }
    // SAFETY: Py_IsInitialized and PyGILState_GetThisThreadState read runtime state and
    // this thread's own TSS slot; CPython allows both from any thread, with or without the
    // GIL, before, during and after finalisation (they return 0 and NULL then).
    unsafe {
        if ffi::Py_IsInitialized() == 0 {
            return Err(NoStack::NoInterpreter);
        }
        if ffi::PyGILState_GetThisThreadState().is_null() {
            return Err(NoStack::NoThreadState);
        }
    }
    // SAFETY: this thread has a thread state, so PyGILState_Check answers for it, and
    // PyGILState_Ensure takes the GIL with that same thread state (it creates none).
    let acquired = unsafe {
        if PyGILState_Check() == 1 {
            None
        } else {
            Some(ffi::PyGILState_Ensure())
        }
    };
    let mut stack = Stack {
        frames: Vec::with_capacity(64), // one allocation for most stacks
        acquired,
    };
    // SAFETY: the GIL is held from here on.
    if unsafe { !ffi::PyErr_Occurred().is_null() } {
        return Err(NoStack::ExceptionSet); // `stack` drops: the GIL is released if taken
    }
    let _ = CAPTURING.try_with(|capturing| capturing.set(true));
    let _reading = Capturing;
    // SAFETY: GIL held. PyEval_GetFrame returns a borrowed reference to this thread's
    // innermost frame (or NULL), alive while that frame runs, which it does until we return
    // into it. PyFrame_GetBack returns a new reference (or NULL), released once its own
    // code and line are read. Materialising a frame (3.11+) may run a collection and any
    // finaliser, which may allocate (CAPTURING), free, or switch threads: no lock is held.
    unsafe {
        let lasti = GET_LASTI.load(Relaxed);
        let mut frame = ffi::PyEval_GetFrame();
        let mut owned = false;
        while !frame.is_null() && stack.frames.len() < MAX_DEPTH {
            let code = PyFrame_GetCode(frame);
            if !code.is_null() {
                let at = if lasti != 0 {
                    // SAFETY: GET_LASTI holds PyFrame_GetLasti when not 0 (`prepare`).
                    std::mem::transmute::<usize, GetLasti>(lasti)(frame)
                } else {
                    ffi::PyFrame_GetLineNumber(frame)
                };
                stack.frames.push((code as usize, at));
            }
            let back = PyFrame_GetBack(frame);
            if owned {
                ffi::Py_DECREF(frame.cast());
            }
            frame = back;
            owned = true;
        }
        if owned && !frame.is_null() {
            ffi::Py_DECREF(frame.cast());
        }
        if !ffi::PyErr_Occurred().is_null() {
            // A frame object could not be made (no memory): the stack is cut there, and
            // the error is not left for torch's caller to trip over.
            ffi::PyErr_Clear();
        }
    }
    Ok(stack)
}
