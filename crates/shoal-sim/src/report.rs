//! A finished run as CSV files: `summary.csv` (one row per run), `nodes.csv`
//! (per member), `links.csv` (per link direction) and `latency.csv` (the
//! latency histogram over all receivers). Everything in these files is a
//! function of the scenario and seed; wall-clock figures are kept apart
//! (`Report::wall`) so two runs with one seed give byte-identical files.
//! They go to `run.csv` beside them: what the run cost this machine (wall
//! time, simulated events per second, the process's peak memory), which
//! differs from run to run.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use hdrhistogram::Histogram;
use shoal_core::Engine;
use shoal_wire::Kind;

use crate::metrics::AddTo;
use crate::sim::Sim;

/// Wall-clock cost of a run (not deterministic, never in the CSV files).
#[derive(Debug, Clone, Copy, Default)]
pub struct Wall {
    pub seconds: f64,
    pub events: u64,
}

impl Wall {
    /// The wall time since `started`, for `events` simulated events.
    pub fn since(started: std::time::Instant, events: u64) -> Wall {
        Wall {
            seconds: started.elapsed().as_secs_f64(),
            events,
        }
    }

    pub fn events_per_second(&self) -> f64 {
        self.events as f64 / self.seconds.max(1e-9)
    }

    /// `run.csv`: wall seconds, simulated events, events per wall second,
    /// and the process's peak resident memory so far in MiB (`VmHWM`; empty
    /// where `/proc` does not give it). Several runs in one process (a
    /// figure's, or `shoal sim all`) share one peak: the largest so far.
    pub fn run_csv(&self) -> String {
        let peak =
            peak_rss_bytes().map_or(String::new(), |b| format!("{:.1}", b as f64 / 1048576.0));
        format!(
            "wall_s,events,events_per_s,peak_rss_mib\n{:.3},{},{:.0},{peak}\n",
            self.seconds,
            self.events,
            self.events_per_second()
        )
    }
}

/// The process's peak resident set size (`VmHWM` in `/proc/self/status`),
/// in bytes; `None` where that file does not give it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The CPU time the process has used so far, user and system, in seconds
/// (`utime` + `stime` of `/proc/self/stat`, at Linux's fixed 100 ticks per
/// second); `None` where `/proc` does not give it.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces; the fields after it do not.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the file are the 12th and 13th after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    /// (column, value) of the summary row.
    pub summary: Vec<(String, String)>,
    pub nodes_csv: String,
    pub links_csv: String,
    pub latency_csv: String,
    pub violations: Vec<String>,
    /// Every member delivered every message once, in order, nothing lost.
    pub complete: bool,
    pub wall: Wall,
}

/// What every member must deliver: every message a sender got accepted. A
/// multicast the engine refused (flow control, a view change) was never
/// sent. Engines without refusals accept all `messages`.
pub(crate) fn owed<E: Engine<Event: crate::metrics::SimEvent>>(sim: &Sim<E>, messages: u64) -> u64 {
    let originated = originated(sim);
    if originated == 0 {
        messages
    } else {
        originated.min(messages)
    }
}

/// Messages the senders got accepted, summed over members.
fn originated<E: Engine<Event: crate::metrics::SimEvent>>(sim: &Sim<E>) -> u64 {
    sim.hosts().map(|(_, m)| m.originated).sum()
}

impl Report {
    /// Collects a finished simulation; `messages` is how many were sent and
    /// `duration_ns` the simulated time (for link utilisation).
    pub fn collect<E: Engine<Event: crate::metrics::SimEvent>>(
        sim: &Sim<E>,
        head: Vec<(String, String)>,
        messages: u64,
        duration_ns: u64,
        (send_seconds, link_bytes): (f64, &[u64]),
        sender: usize,
    ) -> Report {
        let mut all = crate::metrics::latency_histogram();
        let mut nodes = String::from(
            "member,delivered,recovered,lost,dropped_asleep,dropped_backlog,datagrams_sent,bytes_sent",
        );
        for kind in Kind::ALL {
            let _ = write!(nodes, ",{0}_sent,{0}_received", kind.name());
        }
        nodes.push_str(",latency_p50_us,latency_p99_us\n");
        let (mut delivered_min, mut lost, mut recovered) = (u64::MAX, 0, 0);
        for (i, (_, m)) in sim.hosts().enumerate() {
            delivered_min = delivered_min.min(m.delivered);
            lost += m.lost;
            recovered += m.recovered;
            m.latency_us.add_to(&mut all);
            let _ = write!(
                nodes,
                "{i},{},{},{},{},{},{},{}",
                m.delivered,
                m.recovered,
                m.lost,
                m.dropped_asleep,
                m.dropped_backlog,
                m.datagrams_sent,
                m.bytes_sent
            );
            for kind in Kind::ALL {
                let k = kind.index();
                let _ = write!(nodes, ",{},{}", m.packets_sent[k], m.packets_received[k]);
            }
            let _ = writeln!(
                nodes,
                ",{},{}",
                m.latency_us.value_at_quantile(0.5),
                m.latency_us.value_at_quantile(0.99)
            );
        }
        let violations: Vec<String> = sim
            .violations
            .iter()
            .map(|v| format!("member {} source {}: {}", v.host, v.source, v.what))
            .collect();
        let owed = owed(sim, messages);
        let complete = delivered_min == owed && lost == 0 && violations.is_empty();
        let mut summary = head;
        let mut put = |k: &str, v: String| summary.push((k.to_string(), v));
        put("members", sim.hosts().count().to_string());
        put("messages", messages.to_string());
        put("originated", originated(sim).to_string());
        put("delivered_min", delivered_min.to_string());
        put("lost", lost.to_string());
        put("recovered", recovered.to_string());
        put("violations", violations.len().to_string());
        put("complete", complete.to_string());
        put("latency_p50_ms", ms(all.value_at_quantile(0.5)));
        put("latency_p90_ms", ms(all.value_at_quantile(0.9)));
        put("latency_p99_ms", ms(all.value_at_quantile(0.99)));
        put("latency_max_ms", ms(all.max()));
        let per_member_second = |kind: Kind| {
            let total: u64 = sim
                .hosts()
                .map(|(_, m)| m.packets_received[kind.index()])
                .sum();
            total as f64 / sim.hosts().count().max(1) as f64 / send_seconds.max(1e-9)
        };
        // Requests and repairs received per member per second of sending,
        // duplicates included (P001 Figs 1, 2, 8). SRM and pbcast both use
        // SOLICIT for requests and RETRANSMIT for repairs; pbcast's pushes
        // (PUSH) are repairs too.
        put(
            "requests_per_s",
            format!("{:.4}", per_member_second(Kind::Solicit)),
        );
        put(
            "repairs_per_s",
            format!(
                "{:.4}",
                per_member_second(Kind::Retransmit) + per_member_second(Kind::Push)
            ),
        );
        put(
            "sender_link_util",
            format!(
                "{:.4}",
                sender_link_util(sim, sender, send_seconds, link_bytes)
            ),
        );
        put("events", sim.events.to_string());
        Report {
            summary,
            nodes_csv: nodes,
            links_csv: links_csv(sim, duration_ns),
            latency_csv: latency_csv(&all),
            violations,
            complete,
            wall: Wall::default(),
        }
    }

    /// Appends a summary column.
    pub fn put(&mut self, column: &str, value: impl ToString) {
        self.summary.push((column.to_string(), value.to_string()));
    }

    pub fn summary_header(&self) -> String {
        let names: Vec<&str> = self.summary.iter().map(|(k, _)| k.as_str()).collect();
        names.join(",")
    }

    pub fn summary_row(&self) -> String {
        let values: Vec<&str> = self.summary.iter().map(|(_, v)| v.as_str()).collect();
        values.join(",")
    }

    /// Writes the CSV files into `dir` (created if needed).
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let summary = format!("{}\n{}\n", self.summary_header(), self.summary_row());
        std::fs::write(dir.join("summary.csv"), summary)?;
        std::fs::write(dir.join("nodes.csv"), &self.nodes_csv)?;
        std::fs::write(dir.join("links.csv"), &self.links_csv)?;
        std::fs::write(dir.join("latency.csv"), &self.latency_csv)?;
        std::fs::write(dir.join("run.csv"), self.wall.run_csv())
    }
}

fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

/// Bytes into and out of the sender's link, as a fraction of the
/// link's one-way capacity over the sending period (`link_bytes`: each
/// directed link's bytes when the sending ended) (P001 Fig 1 middle: data
/// alone is "about 10%"). A sender with several links (the root of a tree)
/// reports its busiest.
fn sender_link_util<E: Engine<Event: crate::metrics::SimEvent>>(
    sim: &Sim<E>,
    sender: usize,
    send_seconds: f64,
    link_bytes: &[u64],
) -> f64 {
    let links = &sim.network().links;
    let sender = sim.host_node(sender);
    let mut busiest: f64 = 0.0;
    for (i, out) in links.iter().enumerate().filter(|(_, l)| l.from == sender) {
        // Directed links come in pairs: 2k and 2k + 1 are the two ways.
        let bits = (link_bytes[i] + link_bytes[i ^ 1]) as f64 * 8.0;
        busiest = busiest.max(bits / (out.spec.bandwidth_bps * send_seconds).max(1e-9));
    }
    busiest
}

fn links_csv<E: Engine<Event: crate::metrics::SimEvent>>(sim: &Sim<E>, duration_ns: u64) -> String {
    let mut out = String::from("from,to,packets,bytes,utilisation,dropped_loss,dropped_queue\n");
    let seconds = duration_ns as f64 / 1e9;
    for l in &sim.network().links {
        let util = l.bytes as f64 * 8.0 / (l.spec.bandwidth_bps * seconds).max(1e-9);
        let _ = writeln!(
            out,
            "{},{},{},{},{:.5},{},{}",
            l.from, l.to, l.packets, l.bytes, util, l.dropped_loss, l.dropped_queue
        );
    }
    out
}

fn latency_csv(h: &Histogram<u64>) -> String {
    let mut out = String::from("latency_ms_upper,count\n");
    for v in h.iter_log(1_000, 2.0) {
        let _ = writeln!(
            out,
            "{},{}",
            ms(v.value_iterated_to()),
            v.count_since_last_iteration()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_seconds_reads_this_process() {
        let cpu = cpu_seconds().expect("Linux has /proc/self/stat");
        assert!(cpu >= 0.0 && cpu.is_finite(), "{cpu}");
    }

    #[test]
    fn run_csv_has_one_row_under_its_header() {
        let wall = Wall {
            seconds: 2.0,
            events: 5_000,
        };
        let csv = wall.run_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "wall_s,events,events_per_s,peak_rss_mib");
        let row: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(&row[..3], ["2.000", "5000", "2500"]);
        // Linux gives the peak; elsewhere the column is empty.
        if cfg!(target_os = "linux") {
            assert!(row[3].parse::<f64>().unwrap() > 0.0, "{csv}");
        }
    }
}
