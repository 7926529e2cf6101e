//! The sources' lock: one lock that every start, stop and sample of a memory source runs
//! under, whichever capability asks (the line profiler's engine, the CPU trace). It sits on
//! this floor so that those capabilities share it without using each other.
//!
//! Its rules:
//! - It is taken with the GIL held. If another thread holds it, that thread may need the GIL
//!   to finish (a source calls into torch, and a garbage collection there can run any
//!   finaliser), so a caller waits with the GIL released (`take`'s `wait` runs `wait_free`
//!   that way), never holding it.
//! - It is never taken twice on one thread: code run under it (a finaliser during a
//!   collection, profiled code) that asks again is refused (`Busy`), never deadlocked.
//! - The at-fork handlers hold it across `fork()` (`hold_across_fork`), so a child never
//!   inherits it locked by a thread the child does not have.
//!
//! What it guards belongs to whoever holds it: a capability keeps its own state behind a
//! leaf lock of its own, taken only while this one is held (so that one is never waited for
//! and never held at a fork).

use std::cell::{Cell, RefCell};
use std::sync::{Mutex, MutexGuard, TryLockError};

static LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    /// Whether the calling thread holds the lock (it must not take it again).
    static HELD: Cell<bool> = const { Cell::new(false) };
    /// The lock, held by this thread across a fork (see `hold_across_fork`).
    static FORK_GUARD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// The lock, held by the calling thread until this is dropped (also on a panic).
pub struct Held {
    _guard: MutexGuard<'static, ()>,
}

impl Held {
    fn mark(guard: MutexGuard<'static, ()>) -> Self {
        HELD.with(|held| held.set(true));
        Held { _guard: guard }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|held| held.set(false));
    }
}

/// The lock is held on this thread already: the caller runs inside code run under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

/// Whether the calling thread holds the lock now.
pub fn held_here() -> bool {
    HELD.with(Cell::get)
}

/// The lock if it is free now; None when it is held (here or by another thread). Never
/// waits. A lock poisoned by a panic is taken all the same: what it guards is plain data
/// that each holder leaves consistent between statements.
pub fn try_take() -> Option<Held> {
    if held_here() {
        return None;
    }
    match LOCK.try_lock() {
        Ok(guard) => Some(Held::mark(guard)),
        Err(TryLockError::Poisoned(poisoned)) => Some(Held::mark(poisoned.into_inner())),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Block until the lock is free, then let it go: what `take`'s `wait` runs with the GIL
/// released (the lock is then taken for real with the GIL held).
pub fn wait_free() {
    drop(LOCK.lock());
}

/// The lock, waiting while another thread holds it: each time it is busy, `wait` runs
/// (a binding passes `|| py.detach(wait_free)`, so the holder can take the GIL). `Busy`
/// when this thread holds it already.
pub fn take(mut wait: impl FnMut()) -> Result<Held, Busy> {
    if held_here() {
        return Err(Busy);
    }
    loop {
        if let Some(held) = try_take() {
            return Ok(held);
        }
        wait();
    }
}

/// Before `fork()`: take the lock (waiting through `wait` as `take` does) and keep it
/// across the fork, so that no other thread holds it at that moment. Nothing when this
/// thread holds it already (forked from code run under it: it stays as it is). True when
/// it was taken here.
pub fn hold_across_fork(wait: impl FnMut()) -> bool {
    match take(wait) {
        Ok(held) => {
            FORK_GUARD.with(|slot| *slot.borrow_mut() = Some(held));
            true
        }
        Err(Busy) => false,
    }
}

/// Whether this thread holds the lock that `hold_across_fork` took (after `fork()`, in the
/// child: what it guards is the child's to reset before `release_after_fork`).
pub fn held_across_fork() -> bool {
    FORK_GUARD.with(|slot| slot.borrow().is_some())
}

/// After `fork()`, in the parent or the child: let go of the lock `hold_across_fork` took.
/// True when there was one.
pub fn release_after_fork() -> bool {
    let held = FORK_GUARD.with(|slot| slot.borrow_mut().take());
    held.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test: the lock is process-wide, and tests run on parallel threads.
    #[test]
    fn one_holder_waiters_wait_and_a_fork_keeps_it() {
        let held = take(wait_free).expect("not held here");
        assert!(held_here());
        assert_eq!(take(|| panic!("busy here: no wait")).err(), Some(Busy));
        assert!(try_take().is_none());
        // Another thread sees it taken and does not wait in try_take.
        assert!(std::thread::spawn(|| try_take().is_none()).join().unwrap());
        let waiter = std::thread::spawn(|| {
            let mut waits = 0;
            let held = take(|| {
                waits += 1;
                wait_free();
            })
            .expect("another thread");
            drop(held);
            waits
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(held);
        assert!(!held_here());
        assert!(waiter.join().unwrap() >= 1);

        assert!(hold_across_fork(wait_free));
        assert!(held_here() && held_across_fork());
        assert!(!hold_across_fork(|| {}), "held here: nothing more to take");
        assert!(release_after_fork());
        assert!(!held_here() && !held_across_fork());
        assert!(!release_after_fork());
    }
}
