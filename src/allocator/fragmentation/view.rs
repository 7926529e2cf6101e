//! The checked snapshot as the analysis and the request's replay read it, and the page
//! arithmetic of expandable segments they share.

use super::input::{checked, Input, Placed, Segment, SegmentType, Settings};
use super::FieldError;
use crate::allocator::caching::{LARGE_BUFFER, SMALL_SEGMENT};

/// The checked snapshot, as the analysis and the request's replay read it.
pub struct View {
    pub settings: Settings,
    pub segments: Vec<Segment>,
    pub blocks: Vec<Vec<Placed>>,
    pub reserved_bytes: u64,
    pub device_free_bytes: Option<u64>,
    pub allowed_bytes: Option<u64>,
}

impl View {
    pub fn new(input: &Input) -> Result<View, FieldError> {
        let settings = Settings::parse(&input.allocator_conf, input.max_split_size)?;
        let (segments, blocks) = checked(input)?;
        let reserved_bytes = segments.iter().map(|s| s.total_size).sum();
        Ok(View {
            settings,
            segments,
            blocks,
            reserved_bytes,
            device_free_bytes: input.device_free_bytes,
            allowed_bytes: input.allowed_bytes,
        })
    }
}

pub fn pool_name(t: SegmentType) -> String {
    match t {
        SegmentType::Small => "small".into(),
        SegmentType::Large => "large".into(),
    }
}

/// The page of an expandable segment: 2 MiB in the small pool, 20 MiB in the large.
pub fn page(t: SegmentType) -> u64 {
    match t {
        SegmentType::Small => SMALL_SEGMENT,
        SegmentType::Large => LARGE_BUFFER,
    }
}

/// Bytes of `[address, address + size)` lying in whole pages counted from `base`.
pub fn whole_pages(base: u64, address: u64, size: u64, page: u64) -> u64 {
    let first = (address - base).div_ceil(page);
    let end = (address + size - base) / page;
    end.saturating_sub(first) * page
}
