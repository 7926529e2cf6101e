//! Why a snapshot could not be read, as plain data: the readers (`parts`, `pickle_stream`)
//! say which kind of problem it is and the binding (`py`) chooses the Python exception, so
//! no reader needs the interpreter to fail.

/// A snapshot the readers refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// Not a snapshot, or a damaged one (Python's `ValueError`): the whole message.
    Invalid(String),
    /// A checked pickle the streaming reader does not read (`NotImplementedError`): the
    /// plain-data unpickler reads it instead.
    Unsupported(String),
    /// No file at the path (`FileNotFoundError`).
    Missing(String),
    /// No memory for what the file asks to hold (`MemoryError`).
    NoMemory(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Invalid(m)
            | ReadError::Unsupported(m)
            | ReadError::Missing(m)
            | ReadError::NoMemory(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ReadError {}

/// A problem with the snapshot's content, named so the user can find it.
pub fn bad(what: &str) -> ReadError {
    ReadError::Invalid(format!(
        "not a memory snapshot: {what} (expected the dict of torch.cuda.memory._snapshot(), \
         a pickle written by torch.cuda.memory._dump_snapshot, or a memlab_rs trace)"
    ))
}
