//! `shoal sim <scenario>`: runs a simulator scenario. (Owned by the simulator work.)

/// Arguments of `shoal sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Scenario name.
    pub scenario: String,
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    anyhow::bail!("scenario {} is not built yet", args.scenario)
}
