//! Guarded file access: every file the tool reads whole (config.json, index json, session
//! JSON, `--compare` logits) or maps (model weights) is first checked to be a regular file,
//! and whole-file reads stop at a stated size. A FIFO would hang a plain `read`, `/dev/zero`
//! or a sparse multi-GB file would eat all memory; here they are one-line errors that say what
//! the path is.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::base::error::{Error, Result};
use crate::base::units::{fmt_u, MIB};

/// Largest `config.json` read (real ones are a few KiB).
pub(crate) const CONFIG_LIMIT: u64 = 16 * MIB;
/// Largest `*.index.json` read (the biggest published indexes are a few MiB).
pub(crate) const INDEX_LIMIT: u64 = 64 * MIB;
/// Largest session JSON opened (a long compute run's event log is tens of MiB).
pub(crate) const SESSION_LIMIT: u64 = 512 * MIB;
/// Largest `--compare` logits file (a 256k vocabulary as JSON floats is ~6 MiB).
pub(crate) const COMPARE_LIMIT: u64 = 64 * MIB;
/// Largest Hugging Face cache `refs/main` read (it holds one 40-hex revision).
pub(crate) const REF_LIMIT: u64 = 4096;
/// Largest vLLM log `explain` opens (a startup log is tens of KiB; a server's log with
/// request lines can grow, but past 1 GiB its startup is better cut out with `head`).
pub(crate) const LOG_LIMIT: u64 = 1 << 30;

/// What a path is when it is not a regular file, in the words a user knows.
fn kind_of(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a regular file")
}

/// The error for a path that cannot be opened, saying what went wrong in plain words.
fn open_error(path: &Path, what: &str, e: std::io::Error) -> Error {
    let problem = match e.kind() {
        std::io::ErrorKind::NotFound => format!("{what} not found"),
        std::io::ErrorKind::PermissionDenied => {
            format!("{what} cannot be read (permission denied)")
        }
        // ELOOP: `kind()` has no stable variant for it yet.
        _ if e.raw_os_error() == Some(40) => {
            format!("{what} is a symlink loop (too many levels of symbolic links)")
        }
        _ => return Error::io(path, e),
    };
    Error::model(path, problem)
}

/// The metadata of `path` (symlinks followed); a missing path, a symlink loop or a path that
/// cannot be read is a model error saying which.
pub(crate) fn stat(path: &Path, what: &str) -> Result<std::fs::Metadata> {
    std::fs::metadata(path).map_err(|e| open_error(path, what, e))
}

/// Opens `path` only if it is a regular file (after following symlinks); `what` names the
/// file in messages ("config.json", "session file"). Opened non-blocking so a FIFO swapped in
/// after the check cannot hang, then checked again on the open handle.
pub(crate) fn open_regular(path: &Path, what: &str) -> Result<(File, u64)> {
    let meta = stat(path, what)?;
    if let Some(kind) = kind_of(&meta) {
        return Err(Error::model(
            path,
            format!("{what} is {kind}, expected a regular file"),
        ));
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc_o_nonblock());
    }
    let file = opts.open(path).map_err(|e| open_error(path, what, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if let Some(kind) = kind_of(&meta) {
        return Err(Error::model(
            path,
            format!("{what} is {kind}, expected a regular file"),
        ));
    }
    Ok((file, meta.len()))
}

/// Opens a regular file for streaming (a log read line by line), refusing one longer than
/// `limit` before any byte is read.
pub(crate) fn open_bounded(path: &Path, what: &str, limit: u64) -> Result<File> {
    let (file, len) = open_regular(path, what)?;
    if len > limit {
        return Err(too_big(path, what, len, limit));
    }
    Ok(file)
}

/// Checks, without opening it, that `path` is a regular file of at most `limit` bytes (a
/// file found now and read later by the guarded reads, such as a hub snapshot's config.json).
pub(crate) fn check_regular(path: &Path, what: &str, limit: u64) -> Result<()> {
    let meta = stat(path, what)?;
    if let Some(kind) = kind_of(&meta) {
        return Err(Error::model(
            path,
            format!("{what} is {kind}, expected a regular file"),
        ));
    }
    if meta.len() > limit {
        return Err(too_big(path, what, meta.len(), limit));
    }
    Ok(())
}

fn too_big(path: &Path, what: &str, n: u64, limit: u64) -> Error {
    Error::model(
        path,
        format!(
            "{what} is {} ({n} bytes), more than the {} this tool reads for it",
            fmt_u(n),
            fmt_u(limit)
        ),
    )
}

/// O_NONBLOCK on Linux (x86, ARM, RISC-V); a regular file ignores it.
#[cfg(unix)]
fn libc_o_nonblock() -> i32 {
    0o4000
}

/// Reads a whole regular file of at most `limit` bytes.
pub(crate) fn read_bounded(path: &Path, what: &str, limit: u64) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path, what)?;
    let too_big = |n: u64| too_big(path, what, n, limit);
    if len > limit {
        return Err(too_big(len));
    }
    // The length can change after the check (a file still being written): read one byte
    // past the limit to notice without holding more.
    let mut buf = Vec::with_capacity(len as usize);
    file.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, e))?;
    if buf.len() as u64 > limit {
        return Err(too_big(buf.len() as u64));
    }
    Ok(buf)
}

/// `read_bounded` as UTF-8 text.
pub(crate) fn read_text(path: &Path, what: &str, limit: u64) -> Result<String> {
    let bytes = read_bounded(path, what, limit)?;
    String::from_utf8(bytes).map_err(|e| {
        Error::model(
            path,
            format!(
                "{what} is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Reads a JSON file of at most `limit` bytes and checks its top level is an object, so a
/// JSON array or a string is reported as what it is rather than as a missing key.
pub(crate) fn read_json_object(path: &Path, what: &str, limit: u64) -> Result<serde_json::Value> {
    let text = read_text(path, what, limit)?;
    let v = parse_json_bounded(&text).map_err(|e| Error::model(path, format!("{what} {e}")))?;
    if !v.is_object() {
        return Err(Error::model(
            path,
            format!("{what} holds a JSON {}, expected an object", json_kind(&v)),
        ));
    }
    Ok(v)
}

/// Deepest nesting of arrays and objects read (a real config.json nests four or five).
const MAX_JSON_DEPTH: usize = 64;
/// Most arrays and objects in one JSON document read (a config.json has tens).
const MAX_JSON_CONTAINERS: u64 = 1 << 16;
/// Most values in one JSON document read (a 256k-vocabulary `--compare` file has 256k).
const MAX_JSON_VALUES: u64 = 1 << 20;

/// Parses JSON text whose parsed form stays within a bound of its size: before serde builds
/// anything, one pass counts the nesting, the arrays and objects and the values, and refuses
/// a document past the limits above. A parsed `[0]` takes a 4-element vector (128 bytes) and a
/// `{"a":0}` a B-tree node (~600 bytes), so 7 MiB of nested arrays or small objects would
/// otherwise take hundreds of MiB; within these limits it is at most ~40 MiB of containers and
/// 64 MiB of values (with the vectors' doubling), beside the text. The error is what follows
/// the file's name ("is not valid JSON: …", "nests arrays and objects 100 deep, …").
pub(crate) fn parse_json_bounded(text: &str) -> std::result::Result<serde_json::Value, String> {
    let (mut depth, mut deepest, mut containers, mut values) = (0usize, 0usize, 0u64, 1u64);
    let (mut in_string, mut escaped) = (false, false);
    for &b in text.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                containers += 1;
                values += 1;
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' | b':' => values += 1,
            _ => {}
        }
        if deepest > MAX_JSON_DEPTH {
            return Err(format!(
                "nests arrays and objects more than {MAX_JSON_DEPTH} deep: not a file this tool \
                 reads (a config.json nests a few levels)"
            ));
        }
    }
    if containers > MAX_JSON_CONTAINERS || values > MAX_JSON_VALUES {
        return Err(format!(
            "holds {containers} arrays and objects and about {values} values, more than the \
             {MAX_JSON_CONTAINERS} and {MAX_JSON_VALUES} this tool reads"
        ));
    }
    serde_json::from_str(text).map_err(|e| format!("is not valid JSON: {e}"))
}

/// The JSON type of a value, for messages ("found a string, expected a number").
pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => "whole number",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(e: Error) -> String {
        match e {
            Error::Model { problem, .. } => problem,
            other => panic!("expected a model error, got {other:?}"),
        }
    }

    #[test]
    fn deep_or_countless_json_is_refused_before_it_is_built() {
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert!(parse_json_bounded(&deep)
            .unwrap_err()
            .contains("more than 64 deep"));
        let many = format!("[{}[0]]", "[0],".repeat(1 << 16));
        assert!(parse_json_bounded(&many)
            .unwrap_err()
            .contains("arrays and objects"));
        let values = format!("[{}0]", "0,".repeat(1 << 20));
        assert!(parse_json_bounded(&values).unwrap_err().contains("values"));
        // Brackets inside strings are text.
        let v = parse_json_bounded(r#"{"a": "[[[[\\\"{{", "b": [1, 2]}"#).unwrap();
        assert_eq!(v["b"][1], 2);
        assert_eq!(v["a"], "[[[[\\\"{{");
    }

    #[test]
    fn a_directory_is_named_as_one() {
        let d = tempfile::tempdir().unwrap();
        let p = problem(read_bounded(d.path(), "config.json", 10).unwrap_err());
        assert_eq!(p, "config.json is a directory, expected a regular file");
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let d = tempfile::tempdir().unwrap();
        let p = problem(read_bounded(&d.path().join("nope"), "config.json", 10).unwrap_err());
        assert_eq!(p, "config.json not found");
    }

    #[cfg(unix)]
    #[test]
    fn dev_zero_is_a_character_device_and_is_never_read() {
        let p = problem(read_bounded(Path::new("/dev/zero"), "session file", 10).unwrap_err());
        assert_eq!(
            p,
            "session file is a character device, expected a regular file"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_loop_is_named() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        let b = d.path().join("b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let p = problem(read_bounded(&a, "config.json", 10).unwrap_err());
        assert!(p.contains("symlink loop"), "{p}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_by_its_length() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("big.json");
        let file = File::create(&f).unwrap();
        // Sparse: no disk space, and the read must not happen at all.
        file.set_len(3 << 30).unwrap();
        let p = problem(read_bounded(&f, "config.json", CONFIG_LIMIT).unwrap_err());
        assert_eq!(
            p,
            "config.json is 3.00 GiB (3221225472 bytes), more than the 16.0 MiB this tool reads for it"
        );
    }

    #[test]
    fn a_json_array_is_not_an_object() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("config.json");
        std::fs::write(&f, "[1, 2]").unwrap();
        let p = problem(read_json_object(&f, "config.json", 100).unwrap_err());
        assert_eq!(p, "config.json holds a JSON array, expected an object");
    }
}
