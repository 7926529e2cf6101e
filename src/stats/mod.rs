//! Where numbers come from. The torch caching allocator is read from Python (see
//! `python/memlab_rs/_torch.py`); torch's CPU allocator is counted by `cpu`; the driver,
//! which sees every process, is read by `driver`.

pub mod cpu;
pub mod driver;
