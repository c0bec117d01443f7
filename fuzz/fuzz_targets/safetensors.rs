//! A safetensors file's header (first byte 0) or a `model.safetensors.index.json` (first
//! byte 1), as the loader parses them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope::model::sharded::parse_index;
use vramscope::model::weights::{floats_to_f32, parse_header};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let path = std::path::Path::new("fuzz.safetensors");
    if which % 2 == 0 {
        if let Ok(index) = parse_header(rest, path) {
            for (dtype, shape, range) in index.values() {
                let bytes = &rest[range.clone()];
                if let Some(d) = dtype {
                    let numel: usize = shape.iter().product();
                    assert_eq!(floats_to_f32(*d, bytes).len(), numel);
                }
            }
        }
    } else if let Ok(text) = std::str::from_utf8(rest) {
        let _ = parse_index(text, path);
    }
});
