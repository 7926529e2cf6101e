//! Where numbers come from. The torch caching allocator is read from Python (see
//! `python/memlab_rs/_torch.py`); the driver, which sees every process, is read here.

pub mod driver;
