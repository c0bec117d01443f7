//! Pretty-printed JSON, byte for byte as serde_json's `to_writer_pretty` writes it, written
//! faster: a report's JSON is millions of short lines (6.5 million, 143 MB, for a snapshot of
//! 150,000 passes). `Pretty` is serde_json's formatter with constant writes, into a `Pieces`
//! buffer, and a report's events and passes are written by hand (`write_report`).

use std::io::Write;

use serde::Serialize;

use super::pieces::Pieces;
use crate::memory::{Category, Event, EventKind};
use crate::profile::report::PassStats;
use crate::profile::Report;

/// Writes `value` as serde_json's pretty printer does (the same bytes), through `Pretty` and
/// a `Pieces` buffer in front of `w`.
pub fn write_pretty<T: Serialize + ?Sized>(w: &mut dyn Write, value: &T) -> serde_json::Result<()> {
    write_with(w, value, Pretty::default())
}

/// The report as `write_pretty` writes it, its events and passes written by `write_events`
/// and `write_passes` rather than by serde, which spends some 60 ns a line, and those two
/// lists are nearly all of a long run's lines: the rest of the report goes through serde,
/// with those lists left empty for `Pretty` to fill.
pub fn write_report(w: &mut dyn Write, report: &Report) -> serde_json::Result<()> {
    let pretty = Pretty {
        lists: HandWritten {
            passes: &report.passes,
            events: &report.events,
        },
        ..Pretty::default()
    };
    write_with(w, &report.without_lists(), pretty)
}

fn write_with<T: Serialize + ?Sized>(
    w: &mut dyn Write,
    value: &T,
    pretty: Pretty<'_>,
) -> serde_json::Result<()> {
    let mut out = Pieces::new(w);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, pretty);
    value.serialize(&mut ser)?;
    out.flush().map_err(serde_json::Error::io)
}

/// serde_json's `PrettyFormatter` (two spaces a level), with each line break and its
/// indentation written as one constant: a report's JSON is millions of short lines (6.5
/// million for 150,000 passes), and a write of a constant compiles to a store where one
/// of a computed length calls `memcpy`. Given `lists`, it writes them into the top level's
/// lists of those names, which it must find empty (`write_report`).
#[derive(Default)]
pub struct Pretty<'e> {
    level: usize,
    has_value: bool,
    lists: HandWritten<'e>,
    /// The top-level key being written (a Report's field names are short), or `None` past
    /// `KEY_BYTES`.
    key: Option<([u8; KEY_BYTES], usize)>,
    in_key: bool,
}

/// The longest top-level key `Pretty` tells apart.
const KEY_BYTES: usize = 16;

/// The report's lists written by hand, not by serde.
#[derive(Default)]
struct HandWritten<'e> {
    passes: &'e [PassStats],
    events: &'e [Event],
}

impl Pretty<'_> {
    /// A line break (after a comma unless `first`) and the indentation of the current level.
    #[inline(always)]
    fn line<W: ?Sized + Write>(&self, w: &mut W, first: bool) -> std::io::Result<()> {
        match (first, self.level) {
            (true, 1) => w.write_all(b"\n  "),
            (true, 2) => w.write_all(b"\n    "),
            (true, 3) => w.write_all(b"\n      "),
            (true, 4) => w.write_all(b"\n        "),
            (false, 1) => w.write_all(b",\n  "),
            (false, 2) => w.write_all(b",\n    "),
            (false, 3) => w.write_all(b",\n      "),
            (false, 4) => w.write_all(b",\n        "),
            (first, level) => {
                w.write_all(if first { b"\n" } else { b",\n" })?;
                for _ in 0..level {
                    w.write_all(b"  ")?;
                }
                Ok(())
            }
        }
    }

    /// The line break and indentation before a closing bracket, if the container held any.
    #[inline(always)]
    fn close<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value {
            match self.level {
                0 => w.write_all(b"\n")?,
                1 => w.write_all(b"\n  ")?,
                2 => w.write_all(b"\n    ")?,
                3 => w.write_all(b"\n      ")?,
                level => {
                    w.write_all(b"\n")?;
                    for _ in 0..level {
                        w.write_all(b"  ")?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for Pretty<'_> {
    #[inline]
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    #[inline]
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        if self.level == 2 && !self.has_value {
            // An empty list at the top level: one the report's lists fill?
            let key = self.key.as_ref().map(|(k, n)| &k[..*n]);
            if key == Some(b"passes") && !self.lists.passes.is_empty() {
                write_passes(w, std::mem::take(&mut self.lists.passes))?;
                self.has_value = true;
            } else if key == Some(b"events") && !self.lists.events.is_empty() {
                write_events(w, std::mem::take(&mut self.lists.events))?;
                self.has_value = true;
            }
        }
        self.close(w)?;
        w.write_all(b"]")
    }

    #[inline]
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.line(w, first)
    }

    #[inline]
    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    #[inline]
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    #[inline]
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w)?;
        w.write_all(b"}")
    }

    #[inline]
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if self.level == 1 {
            self.in_key = true;
            self.key = Some(([0; KEY_BYTES], 0));
        }
        self.line(w, first)
    }

    #[inline]
    fn end_object_key<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.in_key = false;
        Ok(())
    }

    #[inline]
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        // The top level's keys are the Report's field names, which need no escapes: their
        // text comes as fragments only.
        if self.in_key {
            self.key = self.key.and_then(|(mut k, n)| {
                let end = n + fragment.len();
                (end <= KEY_BYTES).then(|| {
                    k[n..end].copy_from_slice(fragment.as_bytes());
                    (k, end)
                })
            });
        }
        w.write_all(fragment.as_bytes())
    }

    #[inline]
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    #[inline]
    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// The events as serde_json's pretty printer writes the top level's `events` list (each
/// event at level 2, its fields at level 3), from its first line break to its last event's
/// closing brace. The fields are named as `Event` has them, so a new field stops the build
/// here; the enums' names are serde's own.
fn write_events<W: ?Sized + Write>(w: &mut W, events: &[Event]) -> std::io::Result<()> {
    let mut digits = itoa::Buffer::new();
    let mut kinds: Vec<(EventKind, String)> = Vec::new();
    let mut categories: Vec<(Category, String)> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let Event {
            seq,
            time_us,
            pass,
            kind,
            op,
            layer,
            tensor,
            category,
            bytes,
            allocated,
            reserved,
            device_used,
            process_used,
            addr,
        } = e;
        w.write_all(if i == 0 {
            b"\n    {\n      \"seq\": "
        } else {
            b",\n    {\n      \"seq\": "
        })?;
        w.write_all(digits.format(*seq).as_bytes())?;
        w.write_all(b",\n      \"time_us\": ")?;
        w.write_all(digits.format(*time_us).as_bytes())?;
        w.write_all(b",\n      \"pass\": ")?;
        w.write_all(digits.format(*pass).as_bytes())?;
        w.write_all(b",\n      \"kind\": ")?;
        w.write_all(serde_name(&mut kinds, *kind)?.as_bytes())?;
        w.write_all(b",\n      \"op\": ")?;
        serde_json::to_writer(&mut *w, op).map_err(std::io::Error::other)?;
        w.write_all(b",\n      \"layer\": ")?;
        match layer {
            Some(l) => w.write_all(digits.format(*l).as_bytes())?,
            None => w.write_all(b"null")?,
        }
        w.write_all(b",\n      \"tensor\": ")?;
        serde_json::to_writer(&mut *w, tensor).map_err(std::io::Error::other)?;
        w.write_all(b",\n      \"category\": ")?;
        w.write_all(serde_name(&mut categories, *category)?.as_bytes())?;
        w.write_all(b",\n      \"bytes\": ")?;
        w.write_all(digits.format(*bytes).as_bytes())?;
        w.write_all(b",\n      \"allocated\": ")?;
        w.write_all(digits.format(*allocated).as_bytes())?;
        w.write_all(b",\n      \"reserved\": ")?;
        w.write_all(digits.format(*reserved).as_bytes())?;
        w.write_all(b",\n      \"device_used\": ")?;
        w.write_all(digits.format(*device_used).as_bytes())?;
        w.write_all(b",\n      \"process_used\": ")?;
        w.write_all(digits.format(*process_used).as_bytes())?;
        // `skip_serializing_if = "Option::is_none"`.
        if let Some(a) = addr {
            w.write_all(b",\n      \"addr\": ")?;
            w.write_all(digits.format(*a).as_bytes())?;
        }
        w.write_all(b"\n    }")?;
    }
    Ok(())
}

/// The passes as serde_json's pretty printer writes the top level's `passes` list, as
/// `write_events` writes the events.
fn write_passes<W: ?Sized + Write>(w: &mut W, passes: &[PassStats]) -> std::io::Result<()> {
    let mut digits = itoa::Buffer::new();
    for (i, p) in passes.iter().enumerate() {
        let PassStats {
            index,
            verify_for,
            start_us,
            end_us,
            peak_allocated,
            allocated_bytes,
            freed_bytes,
            quant_state_allocated_bytes,
            quant_state_freed_bytes,
        } = p;
        w.write_all(if i == 0 {
            b"\n    {\n      \"index\": "
        } else {
            b",\n    {\n      \"index\": "
        })?;
        w.write_all(digits.format(*index).as_bytes())?;
        w.write_all(b",\n      \"verify_for\": ")?;
        match verify_for {
            Some(f) => serde_json::to_writer(&mut *w, f).map_err(std::io::Error::other)?,
            None => w.write_all(b"null")?,
        }
        w.write_all(b",\n      \"start_us\": ")?;
        w.write_all(digits.format(*start_us).as_bytes())?;
        w.write_all(b",\n      \"end_us\": ")?;
        w.write_all(digits.format(*end_us).as_bytes())?;
        w.write_all(b",\n      \"peak_allocated\": ")?;
        w.write_all(digits.format(*peak_allocated).as_bytes())?;
        w.write_all(b",\n      \"allocated_bytes\": ")?;
        w.write_all(digits.format(*allocated_bytes).as_bytes())?;
        w.write_all(b",\n      \"freed_bytes\": ")?;
        w.write_all(digits.format(*freed_bytes).as_bytes())?;
        w.write_all(b",\n      \"quant_state_allocated_bytes\": ")?;
        w.write_all(digits.format(*quant_state_allocated_bytes).as_bytes())?;
        w.write_all(b",\n      \"quant_state_freed_bytes\": ")?;
        w.write_all(digits.format(*quant_state_freed_bytes).as_bytes())?;
        w.write_all(b"\n    }")?;
    }
    Ok(())
}

/// A unit variant's JSON (its name, quoted) as serde writes it, made once per variant.
fn serde_name<T: Serialize + PartialEq + Copy>(
    names: &mut Vec<(T, String)>,
    v: T,
) -> std::io::Result<&str> {
    let at = match names.iter().position(|(n, _)| *n == v) {
        Some(at) => at,
        None => {
            names.push((v, serde_json::to_string(&v).map_err(std::io::Error::other)?));
            names.len() - 1
        }
    };
    Ok(&names[at].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_writes_the_bytes_of_serde_jsons_pretty_printer() {
        let report = crate::profile::tiny_dry_report(32);
        let nested = serde_json::json!({
            "empty_list": [], "empty_dict": {}, "deep": [[[[[[{"a": [1, {"b": []}]}]]]]]],
            "text": "line\nbreak \"quoted\" \u{1}", "n": -3, "x": 1.5, "t": true, "z": null
        });
        for value in [serde_json::to_value(&report).unwrap(), nested] {
            let mut ours = Vec::new();
            write_pretty(&mut ours, &value).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string_pretty(&value).unwrap()
            );
        }
        let mut ours = Vec::new();
        write_pretty(&mut ours, &report).unwrap();
        assert_eq!(ours, serde_json::to_vec_pretty(&report).unwrap());
    }

    /// Events of every kind and category, names that need escaping, with and without a
    /// layer and an address; passes with and without a budget; a report with ranks (whose
    /// own lists serde writes).
    #[test]
    fn a_reports_events_and_passes_written_by_hand_are_serde_jsons_bytes() {
        use crate::memory::{Category, EventKind};
        let mut report = crate::profile::tiny_dry_report(32);
        let kinds = [
            EventKind::Alloc,
            EventKind::Free,
            EventKind::SegmentMap,
            EventKind::SegmentUnmap,
            EventKind::OutsideAlloc,
            EventKind::OutsideFree,
            EventKind::Marker,
        ];
        let names = [
            "",
            "x",
            "a \"quoted\" name, \\ with\nbreaks\t\u{1}",
            "é ünïcode 🚀",
        ];
        for (i, e) in report.events.iter_mut().enumerate() {
            e.kind = kinds[i % kinds.len()];
            e.category = Category::ALL[i % Category::ALL.len()];
            e.op = names[i % names.len()].into();
            e.tensor = names[(i + 1) % names.len()].into();
            e.layer = (i % 3 != 0).then_some(i as u32);
            e.addr = (i % 2 == 0).then_some(u64::MAX - i as u64);
        }
        assert!(report.events.len() > 14);
        for (i, p) in report.passes.iter_mut().enumerate() {
            p.verify_for = (i % 2 == 1).then(|| names[i % names.len()].to_string());
            p.quant_state_freed_bytes = u64::MAX - i as u64;
        }
        assert!(report.passes.len() > 1);
        let mut ours = Vec::new();
        write_report(&mut ours, &report).unwrap();
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            serde_json::to_string_pretty(&report).unwrap()
        );
        report.ranks = vec![report.clone(), report.clone()];
        let mut ours = Vec::new();
        write_report(&mut ours, &report).unwrap();
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            serde_json::to_string_pretty(&report).unwrap()
        );
        report.events.clear();
        report.passes.clear();
        let mut ours = Vec::new();
        write_report(&mut ours, &report).unwrap();
        assert_eq!(ours, serde_json::to_vec_pretty(&report).unwrap());
    }
}
