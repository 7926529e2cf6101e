//! Analysis: facts -> per-device rows, each storage charged once, sorted and cut as asked.

use std::collections::HashMap;

use indexmap::IndexMap;

use super::records::{DeviceSection, Row};
use crate::allocator::caching::allocated_bytes;
use crate::gc_walk::facts::TensorFacts;

/// How to order rows within a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    /// The order tensors were found: the model's names first, then gc order.
    Found,
    /// Largest charged bytes first.
    Size,
    Name,
}

/// Group facts by device and charge each storage to the first row that holds it.
pub fn build_sections(facts: Vec<TensorFacts>) -> Vec<DeviceSection> {
    let mut owners: HashMap<usize, String> = HashMap::new();
    let mut sections: IndexMap<String, DeviceSection> = IndexMap::new();
    for fact in facts {
        let empty_storage = fact.storage.is_none_or(|s| s.nbytes == 0);
        if fact.numel == 0 && empty_storage {
            continue; // nothing to see, as in pytorch_memlab
        }
        let section = sections
            .entry(fact.device.clone())
            .or_insert_with(|| DeviceSection::empty(&fact.device));
        let (mut bytes, mut storage_bytes, mut shared_with) = (0, 0, None);
        if let Some(storage) = fact.storage {
            storage_bytes = if storage.has_memory {
                storage.nbytes
            } else {
                0
            };
            match owners.get(&storage.key) {
                Some(owner) => shared_with = Some(owner.clone()),
                None => {
                    owners.insert(storage.key, fact.name.clone());
                    bytes = allocated_bytes(&fact.device, storage_bytes);
                    section.total_storage_bytes += storage_bytes;
                }
            }
        }
        section.total_numel += fact.numel;
        section.total_bytes += bytes;
        section.rows.push(Row {
            name: fact.name,
            device: fact.device,
            dims: fact.dims,
            shape_text: fact.shape_text,
            dtype: fact.dtype,
            numel: fact.numel,
            bytes,
            storage_bytes,
            shared_with,
        });
    }
    sections.into_values().collect()
}

/// Order each section's rows and keep the first `top` (totals still cover every row).
pub fn sort_and_cut(sections: &mut [DeviceSection], sort_by: SortBy, top: Option<usize>) {
    for section in sections.iter_mut() {
        match sort_by {
            SortBy::Found => {}
            // Stable sorts: ties keep the order tensors were found.
            SortBy::Size => section.rows.sort_by_key(|r| std::cmp::Reverse(r.bytes)),
            SortBy::Name => section.rows.sort_by(|a, b| a.name.cmp(&b.name)),
        }
        if let Some(top) = top {
            if section.rows.len() > top {
                let cut = section.rows.split_off(top);
                section.omitted_rows = cut.len();
                section.omitted_bytes = cut.iter().map(|row| row.bytes).sum();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gc_walk::facts::StorageFacts;

    fn fact(name: &str, device: &str, key: usize, nbytes: u64) -> TensorFacts {
        TensorFacts {
            name: name.into(),
            device: device.into(),
            dims: Some(vec![nbytes as i64 / 4]),
            shape_text: format!("({},)", nbytes / 4),
            dtype: "torch.float32".into(),
            numel: nbytes / 4,
            storage: Some(StorageFacts {
                key,
                nbytes,
                has_memory: true,
            }),
        }
    }

    #[test]
    fn shared_storage_is_charged_once() {
        let sections = build_sections(vec![
            fact("weight", "cpu", 1, 4096),
            fact("view", "cpu", 1, 4096),
            fact("bias", "cpu", 2, 16),
        ]);
        let rows = &sections[0].rows;
        assert_eq!(rows[0].bytes, 4096);
        assert_eq!(rows[1].bytes, 0);
        assert_eq!(rows[1].shared_with.as_deref(), Some("weight"));
        assert_eq!(sections[0].total_bytes, 4112);
        assert_eq!(sections[0].total_numel, 2052);
    }

    #[test]
    fn cuda_storages_round_up_to_blocks() {
        assert_eq!(allocated_bytes("cuda:0", 1), 512);
        assert_eq!(allocated_bytes("cuda:1", 513), 1024);
        assert_eq!(allocated_bytes("cuda:0", 0), 0);
        assert_eq!(allocated_bytes("cpu", 513), 513);
    }

    #[test]
    fn top_keeps_totals_of_every_row() {
        let mut sections = build_sections(vec![
            fact("a", "cpu", 1, 16),
            fact("b", "cpu", 2, 4096),
            fact("c", "cpu", 3, 64),
        ]);
        sort_and_cut(&mut sections, SortBy::Size, Some(1));
        assert_eq!(sections[0].rows.len(), 1);
        assert_eq!(sections[0].rows[0].name, "b");
        assert_eq!(
            (sections[0].omitted_rows, sections[0].omitted_bytes),
            (2, 80)
        );
        assert_eq!(sections[0].total_bytes, 4176);
    }
}
