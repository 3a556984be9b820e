//! `zcomm model` (placeholder: the comm helper replaces this file with the speedup model).

use zcomm::{Error, Result};

/// Arguments of `zcomm model` (accepted verbatim until the model lands).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model options (not yet interpreted).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

/// Run `zcomm model`.
pub fn run(a: Args) -> Result<()> {
    let _ = a.rest;
    Err(Error::Unavailable(
        "`zcomm model` is not yet implemented".into(),
    ))
}
