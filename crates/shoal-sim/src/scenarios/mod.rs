//! Named experiments, one per file (`shoal sim <name>`).

pub mod figure;
pub mod inputs;
pub mod p000;
pub mod p000_fig10_scale;
pub mod p000_fig10_scale_10x;
pub mod p000_fig11_large;
pub mod p000_fig12_perturbed;
pub mod p000_fig13_waves;
pub mod p000_fig14_load;
pub mod p000_fig1_traditional;
pub mod p000_fig6_analysis;
pub mod p000_table2_committee;
pub mod p001;
pub mod p001_fig1_star;
pub mod p001_fig1_tree;
pub mod p001_fig2_sparse;
pub mod p001_fig2_sparse_10x;
pub mod p001_fig3_histograms;
pub mod p001_fig4_chain;
pub mod p001_fig5_lan;
pub mod p001_fig7_two_cluster;
pub mod p001_fig8_bottleneck;
pub mod p001_fig9_hierarchical;
pub mod pbcast_star;
pub mod pbcast_tree;
pub mod protocol;
pub mod qsm_cover_sets;
pub mod qsm_crash;
pub mod qsm_groups;
pub mod qsm_perturbed;
pub mod qsm_rate;
pub mod qsm_receivers;
pub mod qsm_replication;
pub mod qsm_sim;
pub mod qsm_token_rate;
pub mod spread_fig10_size;
pub mod spread_fig11_load;
pub mod spread_fig6_chain;
pub mod spread_fig8_chain;
pub mod spread_sim;
pub mod spread_sites;
pub mod spread_table1_overlay;
pub mod spread_table2_link;
pub mod spread_table3_link_loss;
pub mod spread_table4_tree_loss;
pub mod swept;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

#[cfg(test)]
use crate::{Sim, Topology};
pub use figure::{Figure, Scale, Sizes};
pub use inputs::{InputError, Inputs};
pub use protocol::{AnyEngine, Hierarchy, Protocol};
pub use swept::{MergeError, Swept};

/// Single-run scenarios with their own options.
pub const NAMES: [&str; 2] = ["pbcast-star", "pbcast-tree"];

/// A paper figure: runs at a scale and returns its files.
pub type FigureFn = fn(Scale) -> Figure;

/// The paper figures, in the order `shoal sim all` runs them.
pub const FIGURES: &[(&str, FigureFn)] = &[
    (p001_fig1_tree::NAME, p001_fig1_tree::run),
    (p001_fig1_star::NAME, p001_fig1_star::run),
    (p001_fig2_sparse::NAME, p001_fig2_sparse::run),
    (p001_fig2_sparse_10x::NAME, p001_fig2_sparse_10x::run),
    (p001_fig3_histograms::NAME, p001_fig3_histograms::run),
    (p001_fig4_chain::NAME, p001_fig4_chain::run),
    (p001_fig5_lan::NAME, p001_fig5_lan::run),
    (p001_fig7_two_cluster::NAME, p001_fig7_two_cluster::run),
    (p001_fig8_bottleneck::NAME, p001_fig8_bottleneck::run),
    (p001_fig9_hierarchical::NAME, p001_fig9_hierarchical::run),
    (p000_fig6_analysis::NAME, p000_fig6_analysis::run),
    (p000_fig1_traditional::NAME, p000_fig1_traditional::run),
    (p000_fig12_perturbed::NAME, p000_fig12_perturbed::run),
    (p000_table2_committee::NAME, p000_table2_committee::run),
    (p000_fig14_load::NAME, p000_fig14_load::run),
    (p000_fig10_scale::NAME, p000_fig10_scale::run),
    (p000_fig10_scale_10x::NAME, p000_fig10_scale_10x::run),
    (p000_fig11_large::NAME, p000_fig11_large::run),
    (p000_fig13_waves::NAME, p000_fig13_waves::run),
    (spread_table1_overlay::NAME, spread_table1_overlay::run),
    (spread_table2_link::NAME, spread_table2_link::run),
    (spread_fig6_chain::NAME, spread_fig6_chain::run),
    (spread_fig8_chain::NAME, spread_fig8_chain::run),
    (spread_fig10_size::NAME, spread_fig10_size::run),
    (spread_fig11_load::NAME, spread_fig11_load::run),
    (spread_table3_link_loss::NAME, spread_table3_link_loss::run),
    (spread_table4_tree_loss::NAME, spread_table4_tree_loss::run),
    (spread_sites::NAME, spread_sites::run),
    (qsm_cover_sets::NAME, qsm_cover_sets::run),
    (qsm_receivers::NAME, qsm_receivers::run_fig),
    (qsm_groups::NAME, qsm_groups::run),
    (qsm_perturbed::NAME, qsm_perturbed::run),
    (qsm_crash::NAME, qsm_crash::run),
    (qsm_token_rate::NAME, qsm_token_rate::run),
    (qsm_replication::NAME, qsm_replication::run),
    (qsm_rate::NAME, qsm_rate::run),
];

/// The figures that can run a few group sizes at a time (`shoal sim
/// <figure> --sizes a,b`), merging into the figure in the output directory.
pub const SWEPT: &[Swept] = &[p000_fig10_scale::SWEPT, p000_fig10_scale_10x::SWEPT];

/// The size-swept figure called `name`.
pub fn swept(name: &str) -> Option<Swept> {
    SWEPT.iter().find(|s| s.name == name).copied()
}

/// The figure called `name`.
pub fn figure(name: &str) -> Option<FigureFn> {
    FIGURES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// The seed of member `me`'s engine in a run seeded `run_seed`: every
/// scenario and diagnostic derives it the same way, so a diagnostic that
/// rebuilds a figure's run replays it exactly.
pub(crate) fn member_seed(run_seed: u64, me: shoal_core::NodeId) -> u64 {
    run_seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(me.0)
}

/// A diagnostic's simulation of pbcast with `config` on `hosts`: each engine
/// seeded as a figure seeds it (so the diagnostic replays the figure's run),
/// unordered delivery checked where `config` asks for it.
#[cfg(test)]
pub(crate) fn pbcast_sim(
    topology: &Topology,
    hosts: &[usize],
    seed: u64,
    config: &shoal_core::pbcast::Config,
) -> Sim<shoal_core::pbcast::Pbcast> {
    use shoal_core::pbcast::{Delivery, Pbcast};
    let mut sim = Sim::new(topology, hosts, seed, |me, members| {
        let start = shoal_core::Instant::ZERO;
        Pbcast::new(me, members, config.clone(), member_seed(seed, me), start).expect("valid")
    });
    if config.delivery == Delivery::Unordered {
        sim.check_unordered();
    }
    sim
}

/// A diagnostic's setting from the environment variable `name`, or
/// `default` when unset; a value that does not parse stops the run.
#[cfg(test)]
pub(crate) fn trace_setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}: cannot parse {value:?}"))
    })
}

/// Seconds to nanoseconds.
pub(crate) fn ns(seconds: f64) -> u64 {
    (seconds * 1e9) as u64
}

/// Threads for a figure's independent runs; 0: one per core.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Runs a figure's independent runs on `threads` threads (0: one per
/// core). Results never depend on it: they are put back in job order.
pub fn set_threads(threads: usize) {
    THREADS.store(threads, Ordering::Relaxed);
}

/// Whether scenarios print their diagnostics (each member's packet
/// counts, the root link's packets per kind) to stderr.
static DEBUG: AtomicBool = AtomicBool::new(false);

/// Turns the scenarios' stderr diagnostics on or off (`shoal sim
/// --debug`); files are the same either way.
pub fn set_debug(on: bool) {
    DEBUG.store(on, Ordering::Relaxed);
}

pub(crate) fn debug() -> bool {
    DEBUG.load(Ordering::Relaxed)
}

/// Runs independent jobs on the threads [`set_threads`] chose, returning
/// results in job order, so output never depends on scheduling.
pub(crate) fn run_parallel<T: Send>(jobs: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
    let threads = match THREADS.load(Ordering::Relaxed) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                // Take from the front so long early jobs start first.
                let job = {
                    let mut q = queue.lock().expect("queue");
                    if q.is_empty() {
                        break;
                    }
                    q.remove(0)
                };
                let (i, job) = job;
                let result = job();
                results.lock().expect("results").push((i, result));
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}
