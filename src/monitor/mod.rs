//! The training monitor's room: one iteration's windows turned into the categories at its
//! peak (`analyse`), the record growing one iteration at a time (`record`), the record as
//! saved (`result`, kind `monitor`), its block, CSV and plot (`render`), and the books of a
//! backward's intermediate gradients (`gradients`). The monitor's collector is itself
//! interpreter hooks (saved-tensor hooks, node hooks, the reads at each boundary), so its
//! Python face is a folder, `py/`; the torch glue (installing the hooks, listing parameters
//! and optimizer state) is `python/memlab_rs/monitor/`.

pub mod analyse;
pub mod gradients;
pub mod py;
pub mod record;
pub mod render;
pub mod result;
