//! vramscope: the desktop app with no subcommand, the CLI with one.

fn main() {
    std::process::exit(vramscope::app::cli::main());
}
