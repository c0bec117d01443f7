//! The user's side: the command line (`cli`), the desktop app (`gui`) and the `bench`
//! subcommand. Parses what the user asked, runs a profile, and shows or writes the report.
//!
//! May import: every other layer.

pub mod bench;
pub mod cli;
pub mod explain;
pub mod gui;
