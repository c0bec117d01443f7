//! GGUF header, metadata → config, and dequantization of every tensor it accepts.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope::model::gguf::{dequantize, GgufHeader};

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.gguf");
    if let Ok(h) = GgufHeader::parse(data, path) {
        let _ = h.config(path);
        for t in &h.tensors {
            // Ranges were validated against `data`; slicing must not panic.
            let x = dequantize(t.ggml_type, &data[t.range.clone()]);
            assert_eq!(x.len() as u64, t.numel());
        }
    }
});
