//! `shoal sim <scenario>`: runs a simulator scenario and writes its CSV files.

use std::path::PathBuf;

use anyhow::{bail, Context};
use shoal_sim::scenarios::{
    figure, pbcast_star, pbcast_tree, swept, Figure, Inputs, Protocol, Scale, Sizes, FIGURES,
    NAMES, SWEPT,
};
use shoal_sim::Report;

/// Arguments of `shoal sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Scenario: a paper figure (p001-fig1-tree, ...), `all` (every
    /// figure), pbcast-star / pbcast-tree, or `swarm` (whole clusters of
    /// daemons and clients under faults, judged by the history checker;
    /// see --range).
    pub scenario: String,
    /// Paper figures: reduced sizes and durations (minutes for all).
    #[arg(long)]
    pub quick: bool,
    /// Paper figures: seeds per configuration [default: 5, quick: 2].
    #[arg(long)]
    pub seeds: Option<u64>,
    /// Seed of every random choice; the same seed gives the same files.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for summary.csv, nodes.csv, links.csv and latency.csv, and
    /// run.csv (wall time, events/s and peak memory of the run).
    #[arg(long, default_value = "out/sim")]
    pub out: PathBuf,
    /// pbcast-star: members around the router [default: 50].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Drop probability on every link [star: 0.05, tree: 0.001].
    #[arg(long)]
    pub loss: Option<f64>,
    /// pbcast-star: messages to send [default: 1000].
    #[arg(long)]
    pub messages: Option<u64>,
    /// pbcast-tree: levels below the root [default: 4].
    #[arg(long)]
    pub depth: Option<u32>,
    /// pbcast-tree: children per node [default: 3].
    #[arg(long)]
    pub branching: Option<usize>,
    /// Messages per second [default: 100].
    #[arg(long)]
    pub rate: Option<f64>,
    /// pbcast-tree: seconds of sending [default: 100].
    #[arg(long)]
    pub duration: Option<f64>,
    /// pbcast-tree: link bandwidth in Mbit/s [default: 1.5, as in P001].
    #[arg(long)]
    pub bandwidth_mbps: Option<f64>,
    /// pbcast-tree: the pbcast variant, e.g. `pbcast-hier` (gossip weighted
    /// 1/k^d by hop distance, P001 §D) [default: pbcast].
    #[arg(long)]
    pub protocol: Option<String>,
    /// swarm: the seeds to run, `A..B` (B excluded) [default: 1..101].
    #[arg(long)]
    pub range: Option<String>,
    /// Size-swept paper figures (p000-fig10-scale, p000-fig10-scale-10x):
    /// run only these group sizes, e.g. `--sizes 500,1000`, and merge them
    /// into the figure already in `--out` (its rows of other sizes kept,
    /// plots rebuilt from the rows; `--out` made with other parameters is
    /// refused). Run every size this way and the files are the figure's.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// swarm: threads to run seeds on [default: 2]; paper figures: threads
    /// for a figure's independent runs [default: one per core]. The files
    /// do not depend on it.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Paper figures: print diagnostics to stderr (each member's packet
    /// counts; Fig 8's root-link packets per kind). Files are unchanged.
    #[arg(long)]
    pub debug: bool,
    /// P001 figures, a probe: let pbcast's solicitation retry stretch to
    /// the measured repair round trip, up to this many ms (at least the
    /// 20 ms retry) [default: pbcast's, the retry fixed at 20 ms].
    #[arg(long)]
    pub solicit_retry_max_ms: Option<u64>,
    /// P001 figures, a probe: pbcast's push_hold_max in ms (0: every
    /// digest invites every gap) [default: pbcast's, 200 ms].
    #[arg(long)]
    pub push_hold_max_ms: Option<u64>,
    /// p001-fig3-histograms: link speed of the large tree, bits/s (P001
    /// gives none) [default: 10e6].
    #[arg(long)]
    pub large_tree_bps: Option<f64>,
    /// p001-fig8-bottleneck: the loss probability, at the receivers in one
    /// reading and on every link in the other [default: 0.01, P001's].
    #[arg(long)]
    pub bottleneck_loss: Option<f64>,
    /// swarm: daemons per cluster instead of the seed's draw (2 to 9).
    #[arg(long)]
    pub daemons: Option<usize>,
    /// swarm: clients per daemon instead of the seed's draw.
    #[arg(long)]
    pub clients_per_daemon: Option<usize>,
    /// swarm: no faults (a cluster under load only, for speed figures).
    #[arg(long)]
    pub no_faults: bool,
    /// swarm: daemons carry `reliable` and `fifo` over QSM regions
    /// (`[qsm] enabled = true`).
    #[arg(long)]
    pub qsm: bool,
    /// swarm: with --qsm, group `g0` is a `[qsm] hybrid` group (carried
    /// by an instance of its own).
    #[arg(long, requires = "qsm")]
    pub qsm_hybrid: bool,
    /// swarm: seconds of faults instead of the seed's draw (10 to 25),
    /// with proportionally more faults: long runs find what builds up.
    #[arg(long)]
    pub fault_phase: Option<u64>,
    /// swarm: loss on every datagram all run long, under the drawn
    /// network faults (as a daemon's `[faults] loss`) [default: 0].
    #[arg(long)]
    pub floor_loss: Option<f64>,
    /// swarm: datagrams travel as fragments of this many bytes, each lost
    /// on its own (the transport beyond loopback: 1472) [default: whole].
    #[arg(long)]
    pub fragment_bytes: Option<usize>,
    /// swarm: the daemons' periodic view change in milliseconds
    /// (`[cluster.vsync] view_period`; the long schedule across hosts
    /// runs 2000) [default: the daemon's, 20000].
    #[arg(long)]
    pub view_period_ms: Option<u64>,
    /// swarm: a repair answer's end in a datagram of its own
    /// (`[cluster.vsync] repair_done_apart`) even without fragments; with
    /// `--fragment-bytes` it is on anyway, as in the daemon.
    #[arg(long)]
    pub repair_done_apart: bool,
}

/// Runs this command again, the same arguments and environment, with
/// glibc's malloc asking the kernel for transparent huge pages
/// (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, read only when a process
/// starts), unless `GLIBC_TUNABLES` is set already: the user's choice
/// stands, and the run started here goes on. Returns only when it does
/// not rerun (or cannot: it then goes on with small pages).
///
/// A simulation of 10^4 members holds hundreds of MiB, and every event
/// first touches some member's state, last touched thousands of events
/// ago: with 4 KiB pages that is a TLB miss and a page walk (two levels of
/// them in a virtual machine) besides the cache miss; with 2 MiB pages the
/// whole heap stays within the TLB's reach. The results do not depend on
/// it (they depend on no address); the depth-8 `pbcast-tree` run takes
/// 15-20% less time. Under a tool that does not follow `exec` (valgrind
/// without `--trace-children=yes`), set `GLIBC_TUNABLES` to keep the run
/// in the process the tool watches.
pub fn rerun_with_huge_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("GLIBC_TUNABLES").is_some() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        // `exec` returns only when it failed.
        let _failed = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
            .exec();
    }
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    check_ranges(&args)?;
    if args.scenario == "swarm" {
        let mut figure_only = input_options(&args).to_vec();
        figure_only.push(("--debug", args.debug));
        figure_only.push(("--sizes", args.sizes.is_some()));
        figure_only.push(("--protocol", args.protocol.is_some()));
        refuse(&args, &figure_only)?;
        return run_swarm(&args);
    }
    if args.scenario == "all" || figure(&args.scenario).is_some() {
        return run_figures(&args);
    }
    let mut figure_only = vec![("--quick", args.quick), ("--seeds", args.seeds.is_some())];
    figure_only.extend(input_options(&args));
    figure_only.push(("--debug", args.debug));
    figure_only.push(("--threads", args.threads.is_some()));
    figure_only.push(("--sizes", args.sizes.is_some()));
    refuse(&args, &figure_only)?;
    let report = match args.scenario.as_str() {
        "pbcast-star" => {
            refuse(
                &args,
                &[
                    ("--depth", args.depth.is_some()),
                    ("--branching", args.branching.is_some()),
                    ("--duration", args.duration.is_some()),
                    ("--protocol", args.protocol.is_some()),
                ],
            )?;
            let d = pbcast_star::Options::default();
            pbcast_star::run(&pbcast_star::Options {
                nodes: args.nodes.unwrap_or(d.nodes),
                loss: args.loss.unwrap_or(d.loss),
                messages: args.messages.unwrap_or(d.messages),
                rate: args.rate.unwrap_or(d.rate),
                seed: args.seed,
                ..d
            })
        }
        "pbcast-tree" => {
            refuse(
                &args,
                &[
                    ("--nodes", args.nodes.is_some()),
                    ("--messages", args.messages.is_some()),
                ],
            )?;
            let d = pbcast_tree::Options::default();
            let protocol = match &args.protocol {
                None => d.protocol,
                Some(name) => {
                    let p: Protocol = name.parse().map_err(anyhow::Error::msg)?;
                    if p.is_srm() {
                        bail!("--protocol: pbcast-tree runs the pbcast variants, not {name}");
                    }
                    p
                }
            };
            pbcast_tree::run(&pbcast_tree::Options {
                protocol,
                depth: args.depth.unwrap_or(d.depth),
                branching: args.branching.unwrap_or(d.branching),
                loss: args.loss.unwrap_or(d.loss),
                rate: args.rate.unwrap_or(d.rate),
                duration: args.duration.unwrap_or(d.duration),
                bandwidth_bps: args.bandwidth_mbps.map_or(d.bandwidth_bps, |m| m * 1e6),
                seed: args.seed,
                ..d
            })
        }
        other => {
            let figures: Vec<&str> = FIGURES.iter().map(|(n, _)| *n).collect();
            bail!(
                "unknown scenario {other:?}; scenarios: all, {}, {}",
                figures.join(", "),
                NAMES.join(", ")
            )
        }
    };
    report
        .write(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    print_summary(&report, &args);
    if !report.complete {
        bail!(
            "not every member delivered every message (see {})",
            args.out.display()
        );
    }
    Ok(())
}

fn refuse(args: &SimArgs, options: &[(&str, bool)]) -> anyhow::Result<()> {
    match options.iter().find(|(_, given)| *given) {
        Some((name, _)) => bail!("{name} does not apply to {}", args.scenario),
        None => Ok(()),
    }
}

fn check_ranges(args: &SimArgs) -> anyhow::Result<()> {
    if args.loss.is_some_and(|l| !(0.0..1.0).contains(&l)) {
        bail!("--loss must be in [0, 1)");
    }
    if args.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        bail!("--rate must be positive");
    }
    if args.duration.is_some_and(|d| !(d > 0.0 && d.is_finite())) {
        bail!("--duration must be positive");
    }
    if args
        .bandwidth_mbps
        .is_some_and(|b| !(b > 0.0 && b.is_finite()))
    {
        bail!("--bandwidth-mbps must be positive");
    }
    if args.nodes.is_some_and(|n| n < 2) {
        bail!("--nodes must be at least 2");
    }
    if args.branching == Some(0) || args.depth == Some(0) {
        bail!("--depth and --branching must be at least 1");
    }
    Ok(())
}

fn print_summary(report: &Report, args: &SimArgs) {
    for (name, value) in &report.summary {
        println!("{name:>18}  {value}");
    }
    let wall = report.wall;
    println!(
        "{:>18}  {:.2} s, {:.2} M events/s",
        "wall time",
        wall.seconds,
        wall.events_per_second() / 1e6
    );
    if let Some(peak) = shoal_sim::report::peak_rss_bytes() {
        println!("{:>18}  {:.0} MiB", "peak memory", peak as f64 / 1048576.0);
    }
    for v in report.violations.iter().take(10) {
        println!("violation: {v}");
    }
    println!("files in {}", args.out.display());
}

/// The options that set [`Inputs`], and whether each was given.
fn input_options(args: &SimArgs) -> [(&'static str, bool); 4] {
    [
        (
            "--solicit-retry-max-ms",
            args.solicit_retry_max_ms.is_some(),
        ),
        ("--push-hold-max-ms", args.push_hold_max_ms.is_some()),
        ("--large-tree-bps", args.large_tree_bps.is_some()),
        ("--bottleneck-loss", args.bottleneck_loss.is_some()),
    ]
}

/// The figures' open inputs from the options, checked.
fn inputs(args: &SimArgs) -> anyhow::Result<Inputs> {
    let d = Inputs::default();
    let ms = |v: Option<u64>| v.map(std::time::Duration::from_millis);
    let inputs = Inputs {
        solicit_retry_max: ms(args.solicit_retry_max_ms),
        push_hold_max: ms(args.push_hold_max_ms),
        large_tree_bps: args.large_tree_bps.unwrap_or(d.large_tree_bps),
        bottleneck_loss: args.bottleneck_loss.unwrap_or(d.bottleneck_loss),
    };
    inputs.check()?;
    Ok(inputs)
}

/// Runs one paper figure, or all of them (each into `--out`/NAME).
fn run_figures(args: &SimArgs) -> anyhow::Result<()> {
    let single_run_options = [
        ("--nodes", args.nodes.is_some()),
        ("--loss", args.loss.is_some()),
        ("--messages", args.messages.is_some()),
        ("--depth", args.depth.is_some()),
        ("--branching", args.branching.is_some()),
        ("--rate", args.rate.is_some()),
        ("--duration", args.duration.is_some()),
        ("--bandwidth-mbps", args.bandwidth_mbps.is_some()),
        ("--protocol", args.protocol.is_some()),
    ];
    refuse(args, &single_run_options)?;
    let mut scale = if args.quick {
        Scale::quick(args.seed)
    } else {
        Scale::full(args.seed)
    };
    scale.inputs = inputs(args)?;
    shoal_sim::scenarios::set_threads(args.threads.unwrap_or(0));
    shoal_sim::scenarios::set_debug(args.debug);
    if let Some(seeds) = args.seeds {
        if seeds == 0 {
            bail!("--seeds must be at least 1");
        }
        scale.seeds = seeds;
    }
    let swept = match &args.sizes {
        None => None,
        Some(sizes) => {
            let Some(swept) = swept(&args.scenario) else {
                let names: Vec<&str> = SWEPT.iter().map(|s| s.name).collect();
                bail!(
                    "--sizes applies to one size-swept figure ({}), not {}",
                    names.join(", "),
                    args.scenario
                );
            };
            scale.sizes = Sizes::only(sizes)
                .with_context(|| format!("--sizes: between 1 and {} group sizes", Sizes::MAX))?;
            Some(swept)
        }
    };
    if let Some(swept) = &swept {
        let mut params = vec![("scenario".into(), args.scenario.clone())];
        params.extend(scale.params());
        swept.check_dir(&scale, &args.out, &params)?;
    }
    let chosen: Vec<_> = FIGURES
        .iter()
        .filter(|(name, _)| args.scenario == "all" || args.scenario == *name)
        .collect();
    let started = std::time::Instant::now();
    let mut incomplete = Vec::new();
    let mut per_figure = Vec::new();
    for (name, run) in chosen {
        let dir = if args.scenario == "all" {
            args.out.join(name)
        } else {
            args.out.clone()
        };
        let mut figure = run(scale);
        let mut params = vec![("scenario".into(), name.to_string())];
        params.extend(scale.params());
        figure.params = params.clone();
        if let Some(swept) = &swept {
            figure = swept.merge(&scale, &dir, figure, params)?;
        }
        figure
            .write(&dir)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", dir.display()))?;
        print_figure(&figure, &dir);
        if !figure.incomplete.is_empty() {
            per_figure.push(format!("{name} {}", figure.incomplete.len()));
        }
        incomplete.extend(figure.incomplete.iter().map(|r| format!("{name}: {r}")));
    }
    println!("total wall time {:.1} s", started.elapsed().as_secs_f64());
    if !incomplete.is_empty() {
        const LISTED: usize = 10;
        for r in incomplete.iter().take(LISTED) {
            println!("incomplete: {r}");
        }
        if incomplete.len() > LISTED {
            println!(
                "incomplete: {} more not listed (column `complete` of each summary.csv)",
                incomplete.len() - LISTED
            );
        }
        bail!(
            "{} runs did not deliver every message ({})",
            incomplete.len(),
            per_figure.join(", ")
        );
    }
    Ok(())
}

fn print_figure(figure: &Figure, dir: &std::path::Path) {
    println!("== {} ({} runs)", figure.name, figure.rows.len());
    for note in &figure.notes {
        println!("   {note}");
    }
    println!(
        "   {:.1} s of simulation, {:.2} M events/s; files in {}",
        figure.wall.seconds,
        figure.wall.events_per_second() / 1e6,
        dir.display()
    );
}

/// `shoal sim swarm --range A..B`: whole clusters under faults, one per
/// seed, judged by the history checker. Exits non-zero if any seed fails,
/// printing each failing seed, its faults and the end of its trace.
fn run_swarm(args: &SimArgs) -> anyhow::Result<()> {
    let range = args.range.as_deref().unwrap_or("1..101");
    let (a, b) = range
        .split_once("..")
        .with_context(|| format!("--range {range:?}: expected A..B"))?;
    let a: u64 = a
        .trim()
        .parse()
        .with_context(|| format!("--range {range:?}"))?;
    let b: u64 = b
        .trim()
        .parse()
        .with_context(|| format!("--range {range:?}"))?;
    if a >= b {
        bail!("--range {range:?} is empty");
    }
    if args.daemons.is_some_and(|d| !(2..=9).contains(&d)) {
        bail!("--daemons must be 2 to 9");
    }
    if args.clients_per_daemon == Some(0) {
        bail!("--clients-per-daemon must be at least 1");
    }
    if args.floor_loss.is_some_and(|l| !(0.0..1.0).contains(&l)) {
        bail!("--floor-loss must be in [0, 1)");
    }
    if args.fragment_bytes.is_some_and(|f| f < 64) {
        bail!("--fragment-bytes must be at least 64");
    }
    if args
        .view_period_ms
        .is_some_and(|ms| !(100..=600_000).contains(&ms))
    {
        bail!("--view-period-ms must be 100 to 600000");
    }
    if args.fault_phase.is_some_and(|s| !(1..=86_400).contains(&s)) {
        bail!("--fault-phase must be 1 to 86400 seconds");
    }
    let shape = shoal_sim::swarm::Shape {
        daemons: args.daemons,
        clients_per_daemon: args.clients_per_daemon,
        no_faults: args.no_faults,
        qsm: args.qsm,
        qsm_hybrid: args.qsm_hybrid,
        fault_phase: args.fault_phase.map(std::time::Duration::from_secs),
        floor_loss_ppm: args.floor_loss.map_or(0, |l| (l * 1e6).round() as u32),
        fragment_bytes: args.fragment_bytes,
        view_period: args.view_period_ms.map(std::time::Duration::from_millis),
        repair_done_apart: args.repair_done_apart,
    };
    let started = std::time::Instant::now();
    let outcomes = shoal_sim::swarm::run_seeds_shaped(a..b, args.threads.unwrap_or(2), shape);
    let daemon_secs: f64 = outcomes
        .iter()
        .map(|o| o.sim_time.as_secs_f64() * o.daemons as f64)
        .sum();
    let wall = started.elapsed();
    let mut failed = 0;
    let mut kinds: std::collections::BTreeMap<String, u64> = Default::default();
    let mut sim_secs = 0.0;
    for o in &outcomes {
        sim_secs += o.sim_time.as_secs_f64();
        if o.ok() {
            continue;
        }
        failed += 1;
        for k in o.report.kinds() {
            *kinds.entry(k.name().to_string()).or_default() += 1;
        }
        if !o.converged {
            *kinds.entry("not-converged".into()).or_default() += 1;
        }
        println!("seed {} FAILED", o.seed);
        if let Some(why) = &o.liveness {
            println!("  liveness: {why}");
        }
        println!("{}", o.report);
        println!("  faults: {}", o.faults_drawn.join("; "));
        println!("  trace tail:");
        for line in &o.trace_tail {
            println!("    {line}");
        }
    }
    println!(
        "swarm {range}: {} seeds, {failed} failed {kinds:?}; {:.0} simulated s in {:.1} s wall ({:.1} simulated s, {:.1} simulated daemon-s per wall s)",
        outcomes.len(),
        sim_secs,
        wall.as_secs_f64(),
        sim_secs / wall.as_secs_f64().max(1e-9),
        daemon_secs / wall.as_secs_f64().max(1e-9)
    );
    if failed > 0 {
        bail!("{failed} of {} seeds failed", outcomes.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn args(words: &[&str]) -> SimArgs {
        let mut all = vec!["shoal"];
        all.extend(words);
        Cli::try_parse_from(all).expect("parses").sim
    }

    #[test]
    fn figure_inputs_become_the_scales_inputs_and_params() {
        let a = args(&[
            "p001-fig8-bottleneck",
            "--bottleneck-loss",
            "0.0025",
            "--solicit-retry-max-ms",
            "200",
        ]);
        let inputs = inputs(&a).expect("in range");
        assert_eq!(inputs.bottleneck_loss, 0.0025);
        assert_eq!(
            inputs.solicit_retry_max,
            Some(std::time::Duration::from_millis(200))
        );
        assert_eq!(inputs.push_hold_max, None);
        let params = Scale {
            inputs,
            ..Scale::quick(1)
        }
        .params();
        let get = |name: &str| {
            params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("bottleneck_loss"), Some("0.0025"));
        assert_eq!(get("solicit_retry_max_ms"), Some("200"));
        assert_eq!(get("push_hold_max_ms"), Some("default"));
        assert_eq!(get("quick"), Some("true"));
    }

    /// A bad value or an option the scenario does not read stops the run
    /// with the option's name, before anything is simulated or written.
    #[test]
    fn bad_or_misplaced_inputs_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("shoal-sim-args-{}", std::process::id()));
        let out = dir.to_str().expect("utf-8");
        let cases: [(&[&str], &str); 4] = [
            (
                &["p001-fig8-bottleneck", "--bottleneck-loss", "1.5"],
                "--bottleneck-loss must be",
            ),
            (
                &["p001-fig1-star", "--solicit-retry-max-ms", "5"],
                "--solicit-retry-max-ms must be at least",
            ),
            (
                &["p001-fig3-histograms", "--large-tree-bps", "0"],
                "--large-tree-bps must be",
            ),
            (
                &["pbcast-star", "--push-hold-max-ms", "0"],
                "--push-hold-max-ms does not apply to pbcast-star",
            ),
        ];
        for (words, expected) in cases {
            let mut words = words.to_vec();
            words.extend(["--out", out]);
            let err = run(args(&words)).expect_err("refused");
            assert!(err.to_string().contains(expected), "{words:?}: {err}");
            assert!(!dir.exists(), "{words:?} wrote {out}");
        }
    }

    /// `--sizes` only for a size-swept figure and only its own sizes, and
    /// never into a directory whose figure was made otherwise: refused by
    /// name before anything is simulated or written.
    #[test]
    fn sizes_out_of_place_are_refused_before_running() {
        let dir = std::env::temp_dir().join(format!("shoal-sim-sizes-{}", std::process::id()));
        let out = dir.to_str().expect("utf-8");
        let cases: [(&[&str], &str); 4] = [
            (
                &["p001-fig1-tree", "--sizes", "20"],
                "--sizes applies to one size-swept figure",
            ),
            (
                &["p000-fig10-scale", "--sizes", "8,7"],
                "7 is not one of the figure's sizes",
            ),
            (
                &["p000-fig10-scale", "--quick", "--sizes", "1000"],
                "1000 is not one of the figure's sizes",
            ),
            (
                &["swarm", "--sizes", "8"],
                "--sizes does not apply to swarm",
            ),
        ];
        for (words, expected) in cases {
            let mut words = words.to_vec();
            words.extend(["--out", out]);
            let err = run(args(&words)).expect_err("refused");
            assert!(err.to_string().contains(expected), "{words:?}: {err}");
            assert!(!dir.exists(), "{words:?} wrote {out}");
        }
        // A quick figure in --out: a full-scale size is not merged into it.
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("summary.csv"), "group_size\n8\n").expect("writes");
        let params = "name,value\nscenario,p000-fig10-scale\nquick,true\n";
        std::fs::write(dir.join("params.csv"), params).expect("writes");
        let words = ["p000-fig10-scale", "--sizes", "1000", "--out", out];
        let err = run(args(&words)).expect_err("refused");
        assert!(err.to_string().contains("made with quick = true"), "{err}");
        assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
