//! The memory categories that the training monitor's rows and the estimate's figures report,
//! in the order they are shown: the kinds of PyTorch's own trackers
//! (`torch.distributed._tools.mem_tracker`: PARAM, BUFFER, GRAD, ACT, TEMP, OPT, OTH), so a
//! figure of one tool reads next to the other's. `python/memlab_rs/_categories.py` holds the
//! same list for the Python side and says what each category holds.

/// The categories, in report order.
pub const CATEGORIES: [&str; 7] = [
    "parameter",
    "buffer",
    "gradient",
    "activation",
    "temporary",
    "optimizer_state",
    "other",
];
