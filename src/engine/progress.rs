//! Messages a profile run sends while it works (to the GUI's channel or the CLI's bar).

use serde::{Deserialize, Serialize};

use crate::memory::Event;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Starting,
    Loading,
    Profiling,
    Measuring,
    Verifying,
    Done,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Loading => "loading weights",
            Phase::Profiling => "profile passes",
            Phase::Measuring => "measuring",
            Phase::Verifying => "verifying budgets",
            Phase::Done => "done",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Progress {
    Phase(Phase),
    /// Loading tensor `index` of `count`.
    Load {
        index: u32,
        count: u32,
        tensor: String,
        bytes: u64,
    },
    /// A forward pass started; `verify` names the formula whose budget it checks.
    Pass {
        pass: u32,
        of: u32,
        verify: Option<String>,
    },
    Layer {
        layer: u32,
        of: u32,
    },
    /// Timeline events recorded since the previous batch.
    Events(Vec<Event>),
}

pub type ProgressSink = Box<dyn FnMut(Progress)>;
