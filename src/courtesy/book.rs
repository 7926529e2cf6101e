//! Courtesy's bookkeeping: which storages live on the host, where in the pinned buffers,
//! and what is left to bring back. Plain Rust; `py.rs` is its Python face
//! (`_core.courtesy.HostBook`).
//!
//! A yield moves every CUDA storage it found into pinned host buffers that are kept and
//! reused by later yields (pinning memory is slow; a buffer big enough for the state is
//! pinned once). Each storage gets an aligned place in one buffer; a buffer is free again
//! once every storage placed in it is back on its device (or died meanwhile).

/// Host placements are aligned so any dtype's elements can start there.
const ALIGN: u64 = 512;
/// New buffers are a multiple of this (and an eighth larger than needed).
const SLACK_UNIT: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Host,
    Device,
    /// Its tensors all died while it was on the host: nothing to bring back.
    Gone,
}

#[derive(Clone, Debug)]
struct Record {
    device: i64,
    nbytes: u64,
    buffer: usize,
    offset: u64,
    place: Where,
}

/// Where a yield's storages go: (buffer, bytes to allocate for it first or 0, and per
/// storage its record index and byte offset).
pub type Placement = (usize, u64, Vec<(usize, u64)>);

/// A record still on the host: (record, device, nbytes, buffer, offset).
pub type Pending = (usize, i64, u64, usize, u64);

/// The host side of a `Courtesy`: buffers and storage records (see the module doc).
#[derive(Default)]
pub struct HostBook {
    /// Capacity of each pinned buffer, in bytes.
    buffers: Vec<u64>,
    records: Vec<Record>,
}

fn aligned(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

impl HostBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// Place storages of `(device, nbytes)` on the host. Returns the index of the buffer
    /// they go to, the size of a buffer to allocate first (0 to reuse a free one), and for
    /// each storage its record index and byte offset in that buffer.
    pub fn place(&mut self, storages: Vec<(i64, u64)>) -> Result<Placement, String> {
        if storages.is_empty() {
            return Err("nothing to place".into());
        }
        let total: u64 = storages.iter().map(|&(_, n)| aligned(n)).sum();
        let free = (0..self.buffers.len())
            .filter(|&b| self.buffers[b] >= total && !self.in_use(b))
            .min_by_key(|&b| self.buffers[b]);
        let (buffer, allocate) = match free {
            Some(b) => (b, 0),
            None => {
                // Room to spare, so that the next yield of about the same state (plus a
                // few new tensors) reuses this buffer instead of pinning another.
                let capacity = (total + total / 8).div_ceil(SLACK_UNIT) * SLACK_UNIT;
                self.buffers.push(capacity);
                (self.buffers.len() - 1, capacity)
            }
        };
        let mut offset = 0;
        let mut placed = Vec::with_capacity(storages.len());
        for (device, nbytes) in storages {
            self.records.push(Record {
                device,
                nbytes,
                buffer,
                offset,
                place: Where::Host,
            });
            placed.push((self.records.len() - 1, offset));
            offset += aligned(nbytes);
        }
        Ok((buffer, allocate, placed))
    }

    /// Records still on the host, as (record, device, nbytes, buffer, offset), largest
    /// first (when memory is short, the big ones are the ones that must fit).
    pub fn pending(&self) -> Vec<Pending> {
        let mut out: Vec<_> = self
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.place == Where::Host)
            .map(|(i, r)| (i, r.device, r.nbytes, r.buffer, r.offset))
            .collect();
        out.sort_by_key(|&(i, _, n, _, _)| (std::cmp::Reverse(n), i));
        out
    }

    /// These records are back on their device.
    pub fn restored(&mut self, records: Vec<usize>) -> Result<(), String> {
        self.set(records, Where::Device)
    }

    /// Every tensor of these records died while they were on the host.
    pub fn gone(&mut self, records: Vec<usize>) -> Result<(), String> {
        self.set(records, Where::Gone)
    }

    /// (storages, bytes) on the host now.
    pub fn on_host(&self) -> (usize, u64) {
        let host = self.records.iter().filter(|r| r.place == Where::Host);
        host.fold((0, 0), |(n, b), r| (n + 1, b + r.nbytes))
    }

    /// Capacities of the pinned buffers (kept for the next yield).
    pub fn buffers(&self) -> Vec<u64> {
        self.buffers.clone()
    }

    /// Which buffers hold nothing that still has to come back.
    pub fn free_buffers(&self) -> Vec<usize> {
        (0..self.buffers.len())
            .filter(|&b| !self.in_use(b))
            .collect()
    }

    /// Drop the free buffers (their pinned memory goes back to the system) and the
    /// records of storages already back. Returns the indexes of the buffers dropped, in
    /// descending order, so the caller can drop them from its list too.
    pub fn release_free(&mut self) -> Vec<usize> {
        let mut dropped: Vec<usize> = self.free_buffers();
        dropped.sort_unstable_by(|a, b| b.cmp(a));
        self.records.retain(|r| r.place == Where::Host);
        for &b in &dropped {
            self.buffers.remove(b);
            for r in &mut self.records {
                if r.buffer > b {
                    r.buffer -= 1;
                }
            }
        }
        dropped
    }

    fn in_use(&self, buffer: usize) -> bool {
        self.records
            .iter()
            .any(|r| r.buffer == buffer && r.place == Where::Host)
    }

    fn set(&mut self, records: Vec<usize>, place: Where) -> Result<(), String> {
        for i in records {
            let record = self
                .records
                .get_mut(i)
                .ok_or_else(|| format!("no storage record {i}"))?;
            record.place = place;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_reused_once_everything_in_it_is_back() {
        let mut book = HostBook::new();
        let (b0, alloc, placed) = book.place(vec![(0, 1000), (0, 10)]).unwrap();
        assert_eq!((b0, alloc), (0, 1 << 20));
        assert_eq!(placed, vec![(0, 0), (1, 1024)]);
        // still on the host: a second yield needs a new buffer
        let (b1, alloc, _) = book.place(vec![(0, 100)]).unwrap();
        assert_eq!((b1, alloc), (1, 1 << 20));
        book.restored(vec![0, 1]).unwrap();
        let (b, alloc, _) = book.place(vec![(0, 1200)]).unwrap();
        assert_eq!((b, alloc), (0, 0)); // buffer 0 is free and big enough
        assert_eq!(book.on_host(), (2, 1300));
    }

    #[test]
    fn pending_is_largest_first_and_release_keeps_what_is_in_use() {
        let mut book = HostBook::new();
        book.place(vec![(0, 10), (1, 5000), (0, 700)]).unwrap();
        let order: Vec<u64> = book.pending().iter().map(|p| p.2).collect();
        assert_eq!(order, vec![5000, 700, 10]);
        book.place(vec![(0, 1)]).unwrap();
        book.restored(vec![0, 1, 2]).unwrap();
        assert_eq!(book.release_free(), vec![0]);
        assert_eq!(book.buffers(), vec![1 << 20]);
        assert_eq!(book.pending()[0].3, 0); // the remaining record now points at buffer 0
    }
}
