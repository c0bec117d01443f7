//! config.json: the model shape and the bitsandbytes `quantization_config`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope::model::sharded::stored_quant;
use vramscope::model::ModelConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let path = std::path::Path::new("config.json");
    let _ = stored_quant(&v, path);
    if let Ok(cfg) = ModelConfig::from_hf_json(&v) {
        // The shapes a config implies must be computable without overflow or panic.
        let _ = cfg.tensor_shapes().len();
        let _ = cfg.param_count();
    }
});
