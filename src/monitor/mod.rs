//! The training monitor's core: where its allocator figures come from (`source`) and how one
//! iteration's windows turn into categories that sum to the peak (`windows`). The torch glue
//! (installing the hooks, listing parameters and optimizer state) is
//! `python/memlab_rs/monitor.py`; the per-step work (the saved-tensor hooks in `saved`, the
//! reads at each boundary in `live`, the intermediate gradients of a backward in
//! `gradients`) is here.

pub mod gradients;
pub mod live;
pub mod py;
pub mod render;
pub mod saved;
pub mod source;
pub mod windows;
