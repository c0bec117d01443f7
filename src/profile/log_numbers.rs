//! Numbers as a vLLM log prints them, read exactly: one reader per kind (sizes, ratios,
//! counts). Each refuses what does not fit (overflow, NaN, infinities, negatives, a count
//! with a fraction) with a sentence saying why, so the caller can name the line; none rounds,
//! cuts at an exponent or saturates a number into a plausible one.

/// A number as the log printed it: its value and its text.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    pub value: f64,
    pub text: String,
}

/// The number's text at the start of `s` (a unit glued to it, "53.29GiB", stays on) and what
/// follows it in the token: `None` when `s` starts with no number at all.
fn token(s: &str) -> Option<&str> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | ',' | '+' | '-')))
        .unwrap_or(s.len());
    // A sentence's full stop or a list's comma after the number is not part of it.
    let tok = s[..end].trim_end_matches(['.', ',']);
    let lower = tok.trim_start_matches(['-', '+']).to_ascii_lowercase();
    let numeric = tok.starts_with(|c: char| c.is_ascii_digit())
        || (tok.starts_with(['-', '+'])
            && (lower.starts_with(|c: char| c.is_ascii_digit())
                || lower.starts_with("nan")
                || lower.starts_with("inf")))
        || lower.starts_with("nan")
        || lower.starts_with("inf");
    numeric.then_some(tok)
}

/// Splits a number's text into its digits (thousands commas dropped), its unit letters, and
/// whether it has a fraction or an exponent; refuses signs, NaN, infinities and stray
/// characters.
fn split(tok: &str) -> Result<(String, &str, bool), String> {
    let lower = tok.trim_start_matches(['-', '+']).to_ascii_lowercase();
    if lower.starts_with("nan") {
        return Err(format!("'{tok}' is NaN, not a number"));
    }
    if lower.starts_with("inf") {
        return Err(format!("'{tok}' is infinite"));
    }
    if tok.starts_with('-') {
        return Err(format!("'{tok}' is negative"));
    }
    if tok.starts_with('+') {
        return Err(format!("'{tok}' has a sign vLLM never prints"));
    }
    let b = tok.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize, commas: bool| {
        let from = *i;
        while *i < b.len() && (b[*i].is_ascii_digit() || (commas && b[*i] == b',')) {
            *i += 1;
        }
        *i > from
    };
    digits(&mut i, true);
    let mut inexact = false;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        digits(&mut i, false);
        inexact = true;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if digits(&mut j, false) {
            i = j;
            inexact = true;
        }
    }
    let (number, unit) = tok.split_at(i);
    if !unit.chars().all(|c| c.is_ascii_alphabetic()) || number.ends_with(',') {
        return Err(format!("'{tok}' is not a number vLLM prints"));
    }
    Ok((number.replace(',', ""), unit, inexact))
}

/// A real number of `what` ("size", "ratio"): finite, not negative, and not an exponent that
/// underflows to zero.
fn real(s: &str, what: &str) -> Result<Option<Logged>, String> {
    let Some(tok) = token(s) else {
        return Ok(None);
    };
    let (number, unit, _) = split(tok)?;
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{tok}' is not a number vLLM prints"))?;
    if !value.is_finite() {
        return Err(format!("'{tok}' is too large to be a {what} (overflow)"));
    }
    // 1e-400: a nonzero mantissa read as 0 has lost the number.
    let mantissa = number.split(['e', 'E']).next().unwrap_or("");
    if value == 0.0 && mantissa.bytes().any(|c| (b'1'..=b'9').contains(&c)) {
        return Err(format!("'{tok}' is too small to be a {what} (underflow)"));
    }
    Ok(Some(Logged {
        value,
        text: tok[..tok.len() - unit.len()].to_string(),
    }))
}

/// A size (GiB, GB, seconds: whatever unit the line prints), read exactly.
pub(super) fn size(s: &str) -> Result<Option<Logged>, String> {
    real(s, "size")
}

/// A ratio (gpu_memory_utilization, concurrency), read exactly.
pub(super) fn ratio(s: &str) -> Result<Option<Logged>, String> {
    real(s, "ratio")
}

/// A count (blocks, tokens, sequences, bytes): a whole number that fits 64 bits.
pub(super) fn count(s: &str) -> Result<Option<u64>, String> {
    let Some(tok) = token(s) else {
        return Ok(None);
    };
    let (number, _, inexact) = split(tok)?;
    if inexact {
        return Err(format!("'{tok}' is not a whole number, expected a count"));
    }
    number
        .parse::<u64>()
        .map(Some)
        .map_err(|_| format!("'{tok}' does not fit a 64-bit count (overflow)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_printed_with_their_units_and_punctuation() {
        assert_eq!(size("53.29GiB.").unwrap().unwrap().text, "53.29");
        assert_eq!(size(" 54.18 GiB").unwrap().unwrap().value, 54.18);
        assert_eq!(size("1e3GiB").unwrap().unwrap().value, 1000.0);
        assert_eq!(size("abc").unwrap(), None);
        assert_eq!(size("").unwrap(), None);
    }

    #[test]
    fn an_exponent_past_f64_is_an_overflow_not_one() {
        let e = size("1e309GiB").unwrap_err();
        assert_eq!(e, "'1e309GiB' is too large to be a size (overflow)");
        assert!(size("1e-400GiB").unwrap_err().contains("underflow"));
        assert_eq!(ratio("0e-400").unwrap().unwrap().value, 0.0);
    }

    #[test]
    fn a_ratio_keeps_its_exponent() {
        assert_eq!(ratio("1e-300,").unwrap().unwrap().value, 1e-300);
        assert_eq!(ratio("0.9}").unwrap().unwrap().value, 0.9);
    }

    #[test]
    fn nan_infinities_and_negatives_are_named() {
        assert_eq!(size("nanGiB").unwrap_err(), "'nanGiB' is NaN, not a number");
        assert_eq!(size("-inf").unwrap_err(), "'-inf' is infinite");
        assert_eq!(size("-1.5GiB").unwrap_err(), "'-1.5GiB' is negative");
        assert_eq!(count("-5").unwrap_err(), "'-5' is negative");
        assert!(size("1.2.3")
            .unwrap_err()
            .contains("not a number vLLM prints"));
    }

    #[test]
    fn counts_are_whole_and_fit_64_bits() {
        assert_eq!(count("476,016 tokens").unwrap(), Some(476_016));
        assert_eq!(count("368").unwrap(), Some(368));
        assert_eq!(
            count("99999999999999999999999").unwrap_err(),
            "'99999999999999999999999' does not fit a 64-bit count (overflow)"
        );
        assert!(count("3.5").unwrap_err().contains("not a whole number"));
        assert!(count("1e3").unwrap_err().contains("not a whole number"));
    }
}
