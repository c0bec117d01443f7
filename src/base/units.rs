//! Byte sizes: parsing what users type (`512MiB`, `1GiB`, `1.5GB`, plain bytes) and printing
//! in the unit a reader wants (GiB/MiB).

use crate::base::error::{Error, Result};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Parses a size; binary (KiB, MiB, GiB) and decimal (KB, MB, GB) units, case-insensitive.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    if t.is_empty() {
        return Err(Error::Request(
            "size is empty: expected e.g. 512MiB, 1GiB or a byte count".into(),
        ));
    }
    let cfg = parse_size::Config::new();
    let bytes = cfg.parse_size(t).map_err(|e| {
        Error::Request(format!(
            "size '{s}' is not understood ({e}): expected e.g. 512MiB, 1GiB or a byte count"
        ))
    })?;
    // Anything above the bound is refused rather than left to wrap in later rounding
    // (2^64 - 1 used to become 0 once rounded up to driver pages).
    if bytes > crate::base::limits::MAX_BYTES {
        return Err(Error::Request(format!(
            "size '{s}' is {bytes} bytes, more than the {} (1 PiB) any device holds",
            crate::base::limits::MAX_BYTES
        )));
    }
    Ok(bytes)
}

/// `12.34 GiB`, `512.0 MiB`, `1.5 KiB`, `100 B`; negative values keep their sign.
pub fn fmt_bytes(bytes: i128) -> String {
    let sign = if bytes < 0 { "-" } else { "" };
    let b = bytes.unsigned_abs() as f64;
    if b >= GIB as f64 {
        format!("{sign}{:.2} GiB", b / GIB as f64)
    } else if b >= MIB as f64 {
        format!("{sign}{:.1} MiB", b / MIB as f64)
    } else if b >= 1024.0 {
        format!("{sign}{:.1} KiB", b / 1024.0)
    } else {
        format!("{sign}{b} B")
    }
}

/// A count with a comma every three digits, as Python's `{:,}` writes it (`476,016`).
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

pub fn fmt_u(bytes: u64) -> String {
    fmt_bytes(bytes as i128)
}

pub fn fmt_i(bytes: i64) -> String {
    fmt_bytes(bytes as i128)
}

/// Relative L2 error ‖a − b‖ / ‖b‖.
pub fn relative_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped_as_python_does() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(476_016), "476,016");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 * MIB);
        assert_eq!(parse_bytes("1GiB").unwrap(), GIB);
        assert_eq!(parse_bytes("1 gib").unwrap(), GIB);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("1GB").unwrap(), 1_000_000_000);
    }

    #[test]
    fn nonsense_sizes_are_errors() {
        for s in ["", "abc", "12XB", "-5MiB", "1.2.3GiB"] {
            assert!(parse_bytes(s).is_err(), "{s}");
        }
    }

    #[test]
    fn sizes_near_two_to_the_64_are_refused_not_wrapped() {
        for s in ["18446744073709551615", "2PiB"] {
            let e = parse_bytes(s).unwrap_err().to_string();
            assert!(
                e.contains("more than the 1125899906842624 (1 PiB)"),
                "{s}: {e}"
            );
        }
        assert_eq!(parse_bytes("1PiB").unwrap(), crate::base::limits::MAX_BYTES);
    }

    #[test]
    fn formatting_picks_the_unit() {
        assert_eq!(fmt_bytes(GIB as i128 * 3 / 2), "1.50 GiB");
        assert_eq!(fmt_bytes(-(256 * MIB as i128)), "-256.0 MiB");
        assert_eq!(fmt_bytes(100), "100 B");
    }
}
