//! The what-if plan (kind `plan`): one training step estimated over the choices people make
//! (the batch size or sequence length, the precision, activation checkpointing, the
//! optimizer), each changed alone from a baseline, with the peak of each, the largest size
//! that fits a budget, and which choice saves the most. Python runs the estimates
//! (`python/memlab_rs/estimation/plan.py`); here the rows become a result (`result`), the
//! choice that saves most is found (`analyse`) and the table is rendered (`render`).

pub mod analyse;
pub mod render;
pub mod result;
