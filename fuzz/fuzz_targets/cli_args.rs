//! The command line: any argument list (NUL-separated words) is parsed and, for `profile`,
//! turned into a validated request, the way `main` does before any work. Nothing may panic,
//! and an accepted request stays inside the stated bounds.
#![no_main]
use clap::Parser;
use libfuzzer_sys::fuzz_target;
use vramscope::app::cli::{Cli, Command};
use vramscope::base::limits;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut args = vec!["vramscope"];
    args.extend(text.split('\0').take(64));
    let Ok(cli) = Cli::try_parse_from(args) else {
        return;
    };
    if let Some(Command::Profile(p)) = cli.command {
        if let Ok(req) = p.request() {
            // 0 tokens or 0 sequences: vLLM's defaults, filled in when the run resolves the
            // request; resolved, the batch holds at least one sequence and no more sequences
            // than tokens.
            assert!(req.tokens as u64 <= limits::MAX_TOKENS);
            assert!(req.tokens == 0 || req.seqs <= req.tokens);
            let r = req.resolved(8192);
            assert!(r.seqs >= 1 && r.seqs <= r.tokens, "{} seqs, {} tokens", r.seqs, r.tokens);
            assert!(req.outside_before <= limits::MAX_BYTES);
            assert!(req.outside_during <= limits::MAX_BYTES);
            if let vramscope::model::ModelSource::Synthetic {
                weights_bytes,
                spike_bytes,
            } = req.model
            {
                assert!(weights_bytes <= limits::MAX_BYTES && spike_bytes <= limits::MAX_BYTES);
            }
            // The estimate is computed before a run: it must not overflow or panic either.
            let _ = vramscope::profile::host_memory::estimate(&req, None);
        }
    }
});
