//! Where the numbers come from, for every room: torch's CPU allocator counted at its source
//! (`cpu`: the allocator hook, its live table and counters, and the CPU allocation history
//! with Python stacks), one CUDA device's caching-allocator statistics (`cuda`: torch's binding,
//! or the allocator's own fields read directly and checked against it), the statistics one
//! sample holds (`layout`), the source a profiler samples (`source`), and the driver's view of
//! a device, which sees every process (`driver`), the bytes torch reserves that a paused
//! Courtesy region took off the device (`paused`), and the lock every start, stop and sample
//! of a source runs under, whoever asks (`lock`).

pub mod cpu;
pub mod cuda;
pub mod driver;
pub mod layout;
pub mod lock;
pub mod paused;
pub mod py;
pub mod source;
