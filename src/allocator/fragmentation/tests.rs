//! The analysis on snapshots built by hand: the fragmentation scenario the GPU test builds
//! for real, and damaged snapshots.

use super::result::Outcome;
use super::{analyse, Input};

/// `T` from JSON, or the failing field's path and message (as the binding's from_json).
fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

const MIB: u64 = 1 << 20;

/// One 100 MiB large segment carved into 25 blocks of 4 MiB, blocks 5..10 and 15..20
/// freed (two free runs of 20 MiB, page-aligned from the segment's start).
fn carved(request: u64, free: Option<u64>, allowed: Option<u64>, conf: &str) -> Input {
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < 25 {
        if i == 5 || i == 15 {
            blocks.push(format!(
                r#"{{"size": {}, "requested_size": 0, "state": "inactive"}}"#,
                20 * MIB
            ));
            i += 5;
        } else {
            blocks.push(format!(
                r#"{{"size": {}, "requested_size": {}, "state": "active_allocated"}}"#,
                4 * MIB,
                4 * MIB
            ));
            i += 1;
        }
    }
    let json = format!(
        r#"{{"device": 0, "allocator_conf": "{conf}", "max_split_size": -1,
            "device_free_bytes": {}, "allowed_bytes": {},
            "request": {{"size": {request}}},
            "segments": [{{"address": {}, "total_size": {}, "stream": 0, "segment_type": "large",
                          "segment_pool_id": [0, 0], "is_expandable": false, "blocks": [{}]}}]}}"#,
        free.map_or("null".into(), |f| f.to_string()),
        allowed.map_or("null".into(), |f| f.to_string()),
        1u64 << 40,
        100 * MIB,
        blocks.join(",")
    );
    from_json(&json).unwrap()
}

#[test]
fn carved_segment_is_fragmentation() {
    // The device has plenty, but the process may use only 10 MiB more than it reserved.
    let f = analyse(&carved(30 * MIB, Some(10 << 30), Some(110 * MIB), "")).unwrap();
    assert_eq!(f.reserved_bytes, 100 * MIB);
    assert_eq!(f.allocated_bytes, 60 * MIB);
    assert_eq!(f.free_bytes, 40 * MIB);
    assert_eq!(f.inactive_split_bytes, 40 * MIB);
    assert_eq!(f.largest_free.as_ref().unwrap().size, 20 * MIB);
    assert_eq!(f.expandable.reclaimable_bytes, 40 * MIB);
    assert_eq!(f.expandable.packed_reserved_bytes, 60 * MIB);
    let v = f.request.unwrap();
    assert!(v.fragmented);
    assert_eq!(v.free_bytes, 40 * MIB);
    assert_eq!(v.largest_free, 20 * MIB);
    assert_eq!(v.configured.outcome, Outcome::OutOfMemory);
    assert_eq!(v.configured.device_bytes, 30 * MIB);
    assert_eq!(v.configured.released_bytes, 0);
    let e = v.expandable.unwrap();
    assert_eq!(e.outcome, Outcome::GrowsAfterRelease);
    assert_eq!(e.released_bytes, 40 * MIB);
    assert_eq!(e.device_bytes, 40 * MIB); // two 20 MiB pages
    let m = v.max_split.unwrap();
    assert_eq!(m.setting, "max_split_size_mb:100");
    assert!(m.estimate);
    assert_eq!(m.outcome, Outcome::GrowsAfterRelease);
}

#[test]
fn a_small_request_reuses_a_free_block() {
    let f = analyse(&carved(8 * MIB, None, None, "")).unwrap();
    let v = f.request.unwrap();
    assert!(!v.fragmented);
    assert_eq!(v.configured.outcome, Outcome::ReusesCachedBlock);
    assert_eq!(v.configured.block_size, Some(20 * MIB));
    assert_eq!(v.configured.block, Some((1u64 << 40) + 20 * MIB));
}

#[test]
fn unknown_device_memory_is_said_so() {
    let v = analyse(&carved(30 * MIB, None, None, ""))
        .unwrap()
        .request
        .unwrap();
    assert_eq!(v.configured.outcome, Outcome::NeedsDeviceMemory);
    assert_eq!(v.configured.headroom_bytes, None);
    // What the expandable allocator unmaps covers the pages: no device memory needed.
    assert_eq!(v.expandable.unwrap().outcome, Outcome::GrowsAfterRelease);
}

#[test]
fn expandable_on_is_the_configured_scenario() {
    let v = analyse(&carved(30 * MIB, Some(0), None, "expandable_segments:True"))
        .unwrap()
        .request
        .unwrap();
    assert!(v.expandable.is_none());
    assert!(v.max_split.is_none());
    // Not expandable segments in the snapshot: the default segment is released only
    // when wholly free, which it is not.
    assert_eq!(v.configured.outcome, Outcome::OutOfMemory);
}

#[test]
fn damaged_snapshots_name_the_field() {
    let bad = |json: &str| {
        let input: Input = match from_json(json) {
            Ok(i) => i,
            Err(e) => return e,
        };
        analyse(&input).unwrap_err().to_string()
    };
    let seg = |blocks: &str, total: u64| {
        format!(
            r#"{{"device": 0, "segments": [{{"address": 4096, "total_size": {total}, "segment_type": "large", "blocks": [{blocks}]}}]}}"#
        )
    };
    let e = bad(&seg(r#"{"size": 512, "state": "inactive"}"#, 1024));
    assert!(e.starts_with("segments[0].total_size: 1024"), "{e}");
    let e = bad(&seg(r#"{"size": 512, "state": "gone"}"#, 512));
    assert!(e.starts_with("segments[0].blocks[0].state"), "{e}");
    let e = bad(&seg(
        r#"{"size": 512, "address": 8192, "state": "inactive"}"#,
        512,
    ));
    assert!(e.starts_with("segments[0].blocks[0].address"), "{e}");
    let e = bad(&seg(r#"{"size": -5, "state": "inactive"}"#, 512));
    assert!(e.starts_with("segments[0].blocks[0].size"), "{e}");
    let e = bad(&seg("", 512));
    assert!(e.starts_with("segments[0].blocks"), "{e}");
    let e = bad(
        r#"{"device": 0, "segments": [{"address": 0, "total_size": 512, "segment_type": "huge", "blocks": []}]}"#,
    );
    assert!(e.starts_with("segments[0].segment_type"), "{e}");
}
