//! `plan`'s reader of a pasted `vllm serve` line: any words (NUL-separated) read as vLLM's
//! argparse reads them, then as the `profile` flags they map to and the request those make.
//! Nothing may panic; an accepted line maps each vLLM flag once (the last given wins), its
//! lengths are whole numbers, and an accepted request stays inside `limits`.
#![no_main]
use clap::Parser;
use libfuzzer_sys::fuzz_target;
use vramscope::app::cli::{plan_profile_args, Cli, Command};
use vramscope::base::limits;
use vramscope::profile::vllm_args::parse_serve;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let words: Vec<String> = text.split('\0').take(64).map(String::from).collect();
    let Ok(line) = parse_serve(&words) else {
        return;
    };
    // The profile flags: each once (the last value given wins), `--enforce-eager` alone and
    // every other with its value; the counts are whole numbers of at least 1.
    let mut seen: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < line.args.len() {
        let flag = line.args[i].as_str();
        assert!(flag.starts_with("--"), "{:?}", line.args);
        assert!(!seen.contains(&flag), "{flag} twice in {:?}", line.args);
        seen.push(flag);
        if flag == "--enforce-eager" {
            i += 1;
            continue;
        }
        let value = &line.args[i + 1];
        if matches!(
            flag,
            "--max-model-len" | "--max-num-batched-tokens" | "--max-num-seqs" | "--kv-cache-memory"
        ) {
            assert!(value.parse::<u64>().is_ok_and(|n| n >= 1), "{flag} {value}");
        }
        i += 2;
    }
    // The same words through plan's whole path (clap, the profile flags, the request), after
    // a preset as the model so that nothing is read from disk.
    let mut argv: Vec<&str> = vec!["vramscope", "plan", "--", "vllm", "serve", "preset:tiny"];
    argv.extend(words.iter().map(String::as_str));
    let Ok(cli) = Cli::try_parse_from(argv) else {
        return;
    };
    if let Some(Command::Plan(p)) = cli.command {
        if let Ok((args, _notes)) = plan_profile_args(&p) {
            if let Ok(req) = args.request() {
                assert!(req.max_model_len <= limits::MAX_MODEL_LEN);
                assert!(req.tokens as u64 <= limits::MAX_TOKENS);
            }
        }
    }
});
