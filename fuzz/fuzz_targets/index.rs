//! `model.safetensors.index.json` as the loader reads it: `parse_index` of any text, and the
//! bound on how many tensors a weight_map may list.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope::model::sharded::parse_index;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("model.safetensors.index.json");
    if let Ok(map) = parse_index(text, path) {
        assert!(!map.is_empty());
        assert!(map.len() as u64 <= vramscope::base::limits::MAX_TENSORS);
        for (_, file) in &map {
            // Every accepted shard name stays inside the index's folder.
            assert!(!file.contains('/') && !file.contains('\\') && file.ends_with(".safetensors"));
        }
    }
});
