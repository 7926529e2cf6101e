//! The leak check: memory that grows step after step. A recording of N steps (the CPU
//! trace's entries, or torch's CUDA allocation history, reduced by the Python side to one
//! record per allocation: its stack, its bytes, the step that made it and the step that freed
//! it) goes through a pure analysis (`analyse`: the live bytes of each site at the end of
//! each step; a site whose live bytes rise at every measured step grows), into a result
//! (`result`, kind `leaks`), rendered as text (`render`).

pub mod analyse;
pub mod render;
pub mod result;
