//! Analysis, pure functions: facts -> per-device rows, each storage charged once; the CUDA
//! allocator's figures attached; a view (devices kept, rows sorted and cut); per-device
//! totals with the remainder of `memory_allocated` explained.

use std::collections::HashMap;

use indexmap::IndexMap;
use serde::Serialize;

use super::result::{CudaAccounting, DeviceSection, Row, TensorReport};
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

impl SortBy {
    /// `sort_by` as the public API takes it: None, "size" or "name" (and "found").
    pub fn parse(sort_by: Option<&str>) -> Result<Self, String> {
        match sort_by {
            None | Some("found") => Ok(SortBy::Found),
            Some("size") => Ok(SortBy::Size),
            Some("name") => Ok(SortBy::Name),
            Some(other) => Err(format!(
                "sort_by={other:?} is not a known order; use None (the order tensors were \
                 found), \"size\" (largest first) or \"name\""
            )),
        }
    }
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

/// The CUDA devices the report has sections for, in report order.
pub fn cuda_devices(report: &TensorReport) -> Vec<String> {
    report
        .sections
        .iter()
        .filter(|s| s.device.starts_with("cuda"))
        .map(|s| s.device.clone())
        .collect()
}

/// Attach the allocator's figures to `device`'s section, adding an empty section for a
/// device that holds allocations but no visible tensor.
pub fn with_cuda(report: &mut TensorReport, device: &str, accounting: CudaAccounting) {
    match report.sections.iter_mut().find(|s| s.device == device) {
        Some(section) => section.cuda = Some(accounting),
        None => report.sections.push(DeviceSection {
            cuda: Some(accounting),
            ..DeviceSection::empty(device)
        }),
    }
}

/// Keep the listed devices (all if None), order each one's rows and keep the first `top`.
pub fn view(
    report: &mut TensorReport,
    devices: Option<&[String]>,
    sort_by: SortBy,
    top: Option<usize>,
) {
    if let Some(devices) = devices {
        report.sections.retain(|s| devices.contains(&s.device));
    }
    sort_and_cut(&mut report.sections, sort_by, top);
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
                section.omitted_rows = cut.len() as u64;
                section.omitted_bytes = cut.iter().map(|row| row.bytes).sum();
            }
        }
    }
}

/// One device's totals, as `MemoryReport.sections()` gives them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Totals {
    pub device: String,
    /// Rows listed (not those `top` left out).
    pub rows: usize,
    pub omitted_rows: u64,
    pub omitted_bytes: u64,
    pub total_numel: u64,
    pub total_bytes: u64,
    pub total_storage_bytes: u64,
    /// On a device with the allocator's figures: them, and the remainder explained.
    #[serde(flatten)]
    pub cuda: Option<CudaTotals>,
}

/// The allocator's figures and what the listed rows do not explain of them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CudaTotals {
    pub allocated: u64,
    pub requested: Option<u64>,
    pub reserved: Option<u64>,
    pub unseen_tensors: i128,
    pub rounding: i128,
    pub driver_used_total: Option<(u64, u64)>,
}

/// Every device's totals, in report order.
pub fn totals(report: &TensorReport) -> Vec<Totals> {
    report
        .sections
        .iter()
        .map(|s| Totals {
            device: s.device.clone(),
            rows: s.rows.len(),
            omitted_rows: s.omitted_rows,
            omitted_bytes: s.omitted_bytes,
            total_numel: s.total_numel,
            total_bytes: s.total_bytes,
            total_storage_bytes: s.total_storage_bytes,
            cuda: s.cuda.zip(s.remainder()).map(|(cuda, rest)| CudaTotals {
                allocated: cuda.allocated,
                requested: cuda.requested,
                reserved: cuda.reserved,
                unseen_tensors: rest.unseen_tensors,
                rounding: rest.rounding,
                driver_used_total: cuda.driver_used_total(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gc_walk::facts::StorageFacts;
    use crate::results::to_json;
    use crate::tensor_report::result::Walk;

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

    fn report(facts: Vec<TensorFacts>) -> TensorReport {
        TensorReport {
            verbose: false,
            sections: build_sections(facts),
            incomplete: None,
            walk: Walk {
                strategy: "gc.get_objects()".into(),
                tensors: 0,
                walk_seconds: 0.0,
                facts_seconds: 0.0,
            },
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

    #[test]
    fn a_view_keeps_devices_and_an_unknown_order_is_named() {
        let mut r = report(vec![fact("a", "cpu", 1, 16), fact("b", "cuda:0", 2, 16)]);
        assert_eq!(cuda_devices(&r), ["cuda:0"]);
        view(&mut r, Some(&["cuda:0".to_string()]), SortBy::Name, None);
        assert_eq!(r.sections.len(), 1);
        assert_eq!(r.sections[0].rows[0].bytes, 512);
        let err = SortBy::parse(Some("biggest")).unwrap_err();
        assert!(
            err.starts_with("sort_by=\"biggest\" is not a known order"),
            "{err}"
        );
    }

    #[test]
    fn cuda_figures_add_a_section_and_totals_explain_the_remainder() {
        let mut r = report(vec![fact("a", "cpu", 1, 16)]);
        let figures = CudaAccounting {
            free_in_reserved: None,
            paused_in_regions: None,
            allocated: 3 << 20,
            requested: Some((3 << 20) - 4096),
            reserved: Some(8 << 20),
            driver_used: None,
            driver_total: None,
        };
        with_cuda(&mut r, "cuda:0", figures);
        let found = totals(&r);
        assert_eq!(found.len(), 2);
        let cuda = found[1].cuda.as_ref().unwrap();
        assert_eq!(
            (cuda.unseen_tensors, cuda.rounding),
            ((3 << 20) - 4096, 4096)
        );
        assert!(to_json(&found[0]).ends_with(r#""total_storage_bytes":16}"#));
        assert!(to_json(&found[1]).contains(r#""driver_used_total":null"#));
    }
}
