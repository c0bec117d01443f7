//! NVIDIA ModelOpt's `quant_algo: FP8` checkpoints: which linear layers vLLM leaves 16-bit
//! (`exclude_modules` / `ignore`). The tensors and the forward are AutoFP8's static scheme
//! (`quant::fp8`); only the after-loading step differs (`Fp8Linear::requantize_stored_modelopt`).

/// vLLM's `ModelOptFp8Config.is_layer_excluded(prefix)` for a linear layer named as vLLM
/// names it (`model.layers.0.self_attn.qkv_proj`), `shards` its checkpoint names when it is
/// stacked (`packed_modules_mapping`): `is_layer_skipped` (an exact name; every shard of a
/// stacked layer, 0.19.0 utils/quant_utils.py), then an entry found inside the prefix (0.11.0
/// modelopt.py L160-185), then, from 0.15.1, an entry as an `fnmatch` wildcard (0.15.1
/// L144-180, 0.19.0 L145-181). The wildcards are matched whatever the release, so that what
/// is excluded under any of them is seen.
pub fn excluded(prefix: &str, shards: &[String], entries: &[String]) -> bool {
    let exact = if shards.is_empty() {
        entries.iter().any(|e| e == prefix)
    } else {
        shards.iter().any(|s| entries.iter().any(|e| e == s))
    };
    exact
        || entries.iter().any(|e| {
            e != prefix
                && (prefix.contains(e.as_str())
                    || prefix
                        .strip_prefix("language_model.")
                        .is_some_and(|p| p.contains(e.as_str())))
        })
        || entries.iter().any(|e| fnmatch(prefix, e))
}

/// Python's `fnmatch.fnmatch` on POSIX (case-sensitive): `*` any run, `?` one character,
/// `[seq]` / `[!seq]` a set (ranges `a-z`); an unclosed `[` is a literal.
pub fn fnmatch(name: &str, pattern: &str) -> bool {
    let (n, p): (Vec<char>, Vec<char>) = (name.chars().collect(), pattern.chars().collect());
    glob(&n, &p)
}

fn glob(n: &[char], p: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => (0..=n.len()).any(|i| glob(&n[i..], &p[1..])),
        Some('?') => !n.is_empty() && glob(&n[1..], &p[1..]),
        Some('[') => match set(p) {
            Some((hit, len)) => !n.is_empty() && hit(n[0]) && glob(&n[1..], &p[len..]),
            None => n.first() == Some(&'[') && glob(&n[1..], &p[1..]),
        },
        Some(c) => n.first() == Some(c) && glob(&n[1..], &p[1..]),
    }
}

/// A `[...]` set at the start of `p`: its test and its length in characters.
#[allow(clippy::type_complexity)]
fn set(p: &[char]) -> Option<(Box<dyn Fn(char) -> bool>, usize)> {
    let mut i = 1;
    let negate = p.get(i) == Some(&'!');
    if negate {
        i += 1;
    }
    // A `]` first in the set is a member.
    let start = i;
    if p.get(i) == Some(&']') {
        i += 1;
    }
    while i < p.len() && p[i] != ']' {
        i += 1;
    }
    if i >= p.len() {
        return None;
    }
    let body: Vec<char> = p[start..i].to_vec();
    let test = move |c: char| {
        let mut j = 0;
        let mut hit = false;
        while j < body.len() {
            if j + 2 < body.len() && body[j + 1] == '-' {
                hit |= body[j] <= c && c <= body[j + 2];
                j += 3;
            } else {
                hit |= body[j] == c;
                j += 1;
            }
        }
        hit != negate
    };
    Some((Box::new(test), i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn lm_head_excludes_no_decoder_linear() {
        let e = v(&["lm_head"]);
        assert!(!excluded("model.layers.0.mlp.down_proj", &[], &e));
        assert!(excluded("lm_head", &[], &e));
    }

    #[test]
    fn a_stacked_layer_is_excluded_by_its_shards_names() {
        let shards = v(&[
            "model.layers.3.self_attn.q_proj",
            "model.layers.3.self_attn.k_proj",
            "model.layers.3.self_attn.v_proj",
        ]);
        let e = v(&["model.layers.3.self_attn.q_proj"]);
        assert!(excluded("model.layers.3.self_attn.qkv_proj", &shards, &e));
    }

    #[test]
    fn an_entry_inside_the_prefix_excludes_it_so_layer_1_reaches_layer_10() {
        let e = v(&["model.layers.1."]);
        assert!(excluded("model.layers.1.mlp.down_proj", &[], &e));
        assert!(!excluded("model.layers.10.mlp.down_proj", &[], &e));
        let e = v(&["model.layers.1"]);
        assert!(excluded("model.layers.10.mlp.down_proj", &[], &e));
    }

    #[test]
    fn wildcards_match_as_python_fnmatch() {
        assert!(fnmatch("model.layers.0.mlp.down_proj", "*down_proj"));
        assert!(fnmatch(
            "model.layers.7.self_attn.o_proj",
            "model.layers.?.self_attn.*"
        ));
        assert!(!fnmatch(
            "model.layers.17.self_attn.o_proj",
            "model.layers.?.self_attn.*"
        ));
        assert!(fnmatch("model.layers.3.mlp", "model.layers.[0-4].mlp"));
        assert!(!fnmatch("model.layers.5.mlp", "model.layers.[0-4].mlp"));
        assert!(fnmatch("model.layers.5.mlp", "model.layers.[!0-4].mlp"));
        assert!(!fnmatch("lm_head", "*proj"));
    }
}
