//! The tensor diff tracker's log, laid out as Pytorch-Memory-Utils' `gpu_mem_track.py`
//! writes it: a header line, then per `track()` the `+`/`-` rows and an `At ...` line.

use crate::tracker::diff::DiffRow;

const MIB: f64 = 1024.0 * 1024.0;

/// Python's `str(float)`: the shortest digits that round-trip, scientific below 1e-4 and
/// from 1e16, always with a decimal point or an exponent (`360.0`, `3.814697265625e-06`).
pub fn python_float_str(x: f64) -> String {
    let magnitude = x.abs();
    if x != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        let sci = format!("{x:e}");
        let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
        let exp: i32 = exponent.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let plain = format!("{x}");
    if plain.contains('.') {
        plain
    } else {
        format!("{plain}.0")
    }
}

/// The original's memory column, `str(MiB)[:6]`, except below 1e-4 MiB (about 100 bytes):
/// there `str` turns scientific and the cut kept the mantissa alone (96 bytes printed as
/// `9.1552 M`), so those are written as the decimal expansion cut the same way (`0.0000`).
fn memory_column(bytes: u64) -> String {
    let mib = bytes as f64 / MIB;
    let text = if mib != 0.0 && mib < 1e-4 {
        format!("{mib:.12}")
    } else {
        python_float_str(mib)
    };
    text.chars().take(6).collect()
}

/// One `+`/`-` row: `+ | 1 * Size:(120, 3, 512, 512)   | Memory: 360.0 M | <class 'torch.Tensor'> | torch.float32`.
/// Memory is the storages' own bytes, as the original counts a tensor (numel times the
/// element size), never the allocator's blocks: on CUDA those round each storage up to
/// 512 bytes, and `(64, 3, 3, 3)` float32 would print `0.0068` for the original's `0.0065`.
pub fn row_line(row: &DiffRow) -> String {
    format!(
        "{} | {} * Size:{:<20} | Memory: {} M | {:<20} | {}\n",
        row.sign,
        row.count,
        row.shape,
        memory_column(row.storage_bytes),
        row.kind,
        row.dtype
    )
}

/// `{:<7.1f}` of MiB, as the totals are printed.
fn total_mib(bytes: u64) -> String {
    format!("{:<7.1}", bytes as f64 / MIB)
}

/// The first line of a log: `GPU Memory Track | {stamp} | Total Tensor Used Memory:...`.
pub fn header(stamp: &str, tensor_bytes: u64, allocated_bytes: u64) -> String {
    format!(
        "GPU Memory Track | {stamp} | Total Tensor Used Memory:{}Mb Total Allocated Memory:{}Mb\n\n",
        total_mib(tensor_bytes),
        total_mib(allocated_bytes)
    )
}

/// One `track()`'s block: the rows (when `detail`), then the `At {where}` line.
pub fn block(
    rows: &[DiffRow],
    detail: bool,
    place: &str,
    tensor_bytes: u64,
    allocated_bytes: u64,
) -> String {
    let mut out = String::new();
    if detail {
        for row in rows {
            out.push_str(&row_line(row));
        }
    }
    out.push_str(&format!(
        "\nAt {place:<50} Total Tensor Used Memory:{}Mb Total Allocated Memory:{}Mb\n\n",
        total_mib(tensor_bytes),
        total_mib(allocated_bytes)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_prints_them() {
        assert_eq!(python_float_str(360.0), "360.0");
        assert_eq!(python_float_str(0.140625), "0.140625");
        assert_eq!(python_float_str(3.814697265625e-06), "3.814697265625e-06");
        assert_eq!(python_float_str(0.0), "0.0");
        assert_eq!(python_float_str(1e16), "1e+16");
        assert_eq!(memory_column(360 * 1024 * 1024), "360.0");
        assert_eq!(memory_column(4), "0.0000");
        assert_eq!(memory_column(96), "0.0000");
        assert_eq!(memory_column(1024), "0.0009");
    }

    #[test]
    fn rows_match_the_original_layout() {
        let row = DiffRow {
            sign: '+',
            count: 1,
            kind: "<class 'torch.Tensor'>".into(),
            shape: "(120, 3, 512, 512)".into(),
            dtype: "torch.float32".into(),
            bytes: 120 * 3 * 512 * 512 * 4,
            storage_bytes: 120 * 3 * 512 * 512 * 4,
            names: vec![],
        };
        assert_eq!(
            row_line(&row),
            "+ | 1 * Size:(120, 3, 512, 512)   | Memory: 360.0 M | <class 'torch.Tensor'> | torch.float32\n"
        );
        assert_eq!(total_mib(489_051_750), "466.4  ");
    }

    #[test]
    fn rows_print_storage_bytes_not_the_allocators_blocks() {
        // The original's README, VGG-19 on CUDA: rows as it prints them, the allocator's
        // 512-byte blocks beside (7168 and 2 x 512).
        let row = |shape: &str, count, storage_bytes, bytes| DiffRow {
            sign: '+',
            count,
            kind: "<class 'torch.nn.parameter.Parameter'>".into(),
            shape: shape.into(),
            dtype: "torch.float32".into(),
            bytes,
            storage_bytes,
            names: vec![],
        };
        assert_eq!(
            row_line(&row("(64, 3, 3, 3)", 1, 6912, 7168)),
            "+ | 1 * Size:(64, 3, 3, 3)        | Memory: 0.0065 M | \
             <class 'torch.nn.parameter.Parameter'> | torch.float32\n"
        );
        assert!(row_line(&row("(64,)", 2, 512, 1024)).contains("| Memory: 0.0004 M |"));
    }
}
