//! The floor of every format helper, written once: byte sizes as text (`size`: pytorch_memlab's
//! "4.00M", a human "4.0 MiB", and sizes people write parsed exactly) and escaping for HTML
//! and JSON (`escape`). Rooms render with these; nothing here knows a room. `py` is the
//! floor's binding: `readable_size` and `parse_size` for Python.

pub mod escape;
pub mod py;
pub mod size;
