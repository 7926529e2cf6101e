//! The training monitor's core: where its allocator figures come from (`source`) and how one
//! iteration's windows turn into categories that sum to the peak (`windows`). The torch glue
//! (saved-tensor hooks, reading parameters and gradients) is `python/memlab_rs/monitor.py`.

pub mod source;
pub mod windows;
