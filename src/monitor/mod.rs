//! The training monitor's room: one iteration's windows turned into the categories at its
//! peak (`analyse`), the record growing one iteration at a time (`record`), the record as
//! saved (`result`, kind `monitor`), and its block, CSV and plot (`render`). The monitor's
//! collector is itself interpreter hooks (saved-tensor hooks, the node hooks of a backward's
//! intermediate gradients, the reads at each boundary), so it lives with its Python face in
//! a folder, `py/`; the torch glue (installing the hooks, listing parameters
//! and optimizer state) is `python/memlab_rs/monitor/`.

pub mod analyse;
pub mod py;
pub mod record;
pub mod render;
pub mod result;
