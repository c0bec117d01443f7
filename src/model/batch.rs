//! The batch a forward pass runs on.

/// One forward batch: token ids of all sequences laid end to end.
#[derive(Clone, Debug)]
pub struct Batch {
    pub ids: Vec<u32>,
    pub seq_lens: Vec<usize>,
}

impl Batch {
    /// `tokens` split into `seqs` sequences as evenly as vLLM's dummy profile batch does, with
    /// deterministic ids.
    pub fn dummy(tokens: usize, seqs: usize, vocab: usize) -> Self {
        let base = tokens / seqs;
        let seq_lens: Vec<usize> = (0..seqs)
            .map(|i| base + usize::from(i < tokens % seqs))
            .collect();
        let ids = (0..tokens)
            .map(|i| ((i * 7919 + 13) % vocab) as u32)
            .collect();
        Batch { ids, seq_lens }
    }

    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// Refuses a token id outside a vocabulary of `vocab` rows, naming it.
    pub fn check_ids(&self, vocab: usize) -> crate::base::error::Result<()> {
        match self.ids.iter().find(|&&id| id as usize >= vocab) {
            Some(&id) => Err(crate::base::error::Error::Request(format!(
                "token id {id} out of range for vocab size {vocab}"
            ))),
            None => Ok(()),
        }
    }
}
