//! `explain`'s log reader: any bytes read as a vLLM startup log. Nothing may panic, hang or
//! allocate past the reader's line bound; an accepted log's facts are in range (the checks
//! `read_log` promises), and the request built from them is validated or refused.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope::profile::explain::{read_log, request_of, Overrides};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = read_log("fuzz.log", data) else {
        return;
    };
    if let Some(u) = f.util {
        assert!(u > 0.0 && u <= 1.0, "util {u}");
    }
    if let Some(t) = &f.total {
        assert!(t.value.is_finite() && t.value >= 0.5 && t.value <= 4096.0);
    }
    for v in [
        &f.weights,
        &f.activation,
        &f.non_torch,
        &f.kv,
        &f.peak_torch,
    ]
    .into_iter()
    .flatten()
    {
        assert!(v.value.is_finite() && v.value >= 0.0, "{v:?}");
    }
    assert!(f.max_num_batched_tokens != Some(0) && f.max_num_seqs != Some(0));
    // The request the log describes (a preset stands in for a model not on disk).
    let o = Overrides {
        model: Some("preset:tiny".into()),
        device: None,
        vllm: None,
    };
    let _ = request_of(&f, &o);
});
