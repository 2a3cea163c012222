//! A paper figure as files: `summary.csv` (one row per protocol, group size
//! and seed), extra CSVs (histograms), and SVG plots. Shared helpers build
//! the two kinds of plot the papers use: a metric against group size with
//! min/max bars over seeds, and latency histograms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use shoal_plot::{histogram, line_chart, Chart, Series};

use super::inputs::Inputs;
use crate::metrics::AddTo;
use crate::report::{Report, Wall};

/// How big a run (the paper's size, or reduced for CI and a first look),
/// and the inputs the papers leave open.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    pub quick: bool,
    /// Seeds per configuration (the paper: 5).
    pub seeds: u64,
    /// First seed.
    pub seed: u64,
    /// The open inputs (their defaults are the figures' readings).
    pub inputs: Inputs,
    /// Which group sizes a size-swept figure runs (`shoal sim --sizes`):
    /// all of them unless chosen. Other figures ignore it.
    pub sizes: Sizes,
}

impl Scale {
    pub fn full(seed: u64) -> Scale {
        Scale {
            quick: false,
            seeds: 5,
            seed,
            inputs: Inputs::default(),
            sizes: Sizes::ALL,
        }
    }

    pub fn quick(seed: u64) -> Scale {
        Scale {
            quick: true,
            seeds: 2,
            seed,
            inputs: Inputs::default(),
            sizes: Sizes::ALL,
        }
    }

    pub fn seeds(&self) -> impl Iterator<Item = u64> {
        self.seed..self.seed + self.seeds
    }

    /// What made a figure at this scale, as (name, value): the scale and
    /// every input (`params.csv`), and the sizes run when only some were
    /// chosen.
    pub fn params(&self) -> Vec<(String, String)> {
        let mut params = vec![
            ("quick".into(), self.quick.to_string()),
            ("seeds".into(), self.seeds.to_string()),
            ("seed".into(), self.seed.to_string()),
        ];
        params.extend(self.inputs.params());
        if let Some(chosen) = self.sizes.chosen() {
            params.push(("sizes".into(), Sizes::list(chosen)));
        }
        params
    }

    /// `full` at paper scale, `quick` otherwise.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }
}

/// The group sizes a size-swept figure runs: all of its own, or a chosen
/// few of them (`shoal sim <figure> --sizes 500,1000`), so that a figure too
/// long for one sitting runs a size at a time. Fixed capacity, so that
/// [`Scale`] stays `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    chosen: [usize; Sizes::MAX],
    /// 0: every size of the figure.
    len: usize,
}

impl Sizes {
    /// The most sizes that can be chosen at once.
    pub const MAX: usize = 16;

    /// Every size of the figure.
    pub const ALL: Sizes = Sizes {
        chosen: [0; Sizes::MAX],
        len: 0,
    };

    /// Only `sizes` (sorted, duplicates dropped); `None` if there are none
    /// or more than [`Sizes::MAX`].
    pub fn only(sizes: &[usize]) -> Option<Sizes> {
        let mut sorted = sizes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() || sorted.len() > Sizes::MAX {
            return None;
        }
        let mut chosen = [0; Sizes::MAX];
        chosen[..sorted.len()].copy_from_slice(&sorted);
        Some(Sizes {
            chosen,
            len: sorted.len(),
        })
    }

    /// The chosen sizes, ascending; `None` for all.
    pub fn chosen(&self) -> Option<&[usize]> {
        (self.len > 0).then(|| &self.chosen[..self.len])
    }

    /// The sizes of `all` (a figure's own, in its order) to run.
    pub fn pick(&self, all: &[usize]) -> Vec<usize> {
        match self.chosen() {
            None => all.to_vec(),
            Some(chosen) => all.iter().copied().filter(|n| chosen.contains(n)).collect(),
        }
    }

    /// Sizes as `params.csv` and `--sizes` write them: `250;500` (a
    /// semicolon, as a CSV field holds no comma).
    pub fn list(sizes: &[usize]) -> String {
        let parts: Vec<String> = sizes.iter().map(|n| n.to_string()).collect();
        parts.join(";")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotKind {
    Lines,
    Histogram,
}

/// One SVG file.
#[derive(Debug, Clone)]
pub struct Plot {
    pub file: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub kind: PlotKind,
    pub series: Vec<Series>,
}

impl Plot {
    /// A line chart with a linear y axis.
    pub fn lines(
        file: String,
        title: impl Into<String>,
        x_label: &str,
        y_label: &str,
        series: Vec<Series>,
    ) -> Plot {
        Plot {
            file,
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_y: false,
            kind: PlotKind::Lines,
            series,
        }
    }
}

/// Everything a figure scenario produced.
#[derive(Debug, Clone, Default)]
pub struct Figure {
    pub name: String,
    pub rows: Vec<Vec<(String, String)>>,
    pub files: Vec<(String, String)>,
    pub plots: Vec<Plot>,
    /// Runs in which some member missed a message or saw a violation.
    pub incomplete: Vec<String>,
    pub wall: Wall,
    /// Lines for the terminal: the figure's headline numbers.
    pub notes: Vec<String>,
    /// How the figure was made, as (name, value): `params.csv` when not
    /// empty (`shoal sim` sets it from [`Scale::params`]).
    pub params: Vec<(String, String)>,
    /// `run.csv` when the figure was run in parts (`shoal sim --sizes`):
    /// a row per part; otherwise `run.csv` is [`Figure::wall`]'s.
    pub run_csv: Option<String>,
}

impl Figure {
    pub fn new(name: &str) -> Figure {
        Figure {
            name: name.to_string(),
            ..Figure::default()
        }
    }

    /// Adds a run's summary row and wall time; remembers an incomplete run.
    pub fn add_run(&mut self, report: &Report) {
        self.rows.push(report.summary.clone());
        self.wall.seconds += report.wall.seconds;
        self.wall.events += report.wall.events;
        if !report.complete {
            self.incomplete.push(incomplete_line(report));
        }
    }

    /// Adds `part`, one reading of a figure that runs several: its rows
    /// with the column `column` = `value`, its extra files prefixed
    /// `value-`, its plots (which the part names itself), its incomplete
    /// runs and its notes under a heading.
    pub fn absorb(&mut self, part: Figure, column: &str, value: &str, heading: &str) {
        for mut row in part.rows {
            row.push((column.into(), value.into()));
            self.rows.push(row);
        }
        for (file, text) in part.files {
            self.files.push((format!("{value}-{file}"), text));
        }
        self.plots.extend(part.plots);
        let tagged = part
            .incomplete
            .into_iter()
            .map(|r| format!("{column}={value} {r}"));
        self.incomplete.extend(tagged);
        self.wall.seconds += part.wall.seconds;
        self.wall.events += part.wall.events;
        self.notes.push(heading.into());
        self.notes.extend(part.notes);
    }

    pub fn complete(&self) -> bool {
        self.incomplete.is_empty()
    }

    /// `summary.csv`: the union of the rows' columns, in first-seen order.
    pub fn summary_csv(&self) -> String {
        let mut columns: Vec<&str> = Vec::new();
        for row in &self.rows {
            for (k, _) in row {
                if !columns.contains(&k.as_str()) {
                    columns.push(k);
                }
            }
        }
        let mut out = columns.join(",");
        out.push('\n');
        for row in &self.rows {
            let values: Vec<&str> = columns
                .iter()
                .map(|c| {
                    row.iter()
                        .find(|(k, _)| k == c)
                        .map_or("", |(_, v)| v.as_str())
                })
                .collect();
            out.push_str(&values.join(","));
            out.push('\n');
        }
        out
    }

    /// Writes the CSVs and plots into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
        };
        write("summary.csv", &self.summary_csv())?;
        if !self.params.is_empty() {
            let mut params = String::from("name,value\n");
            for (name, value) in &self.params {
                params.push_str(&format!("{name},{value}\n"));
            }
            write("params.csv", &params)?;
        }
        // What the runs cost (their wall times summed, not deterministic).
        match &self.run_csv {
            Some(text) => write("run.csv", text)?,
            None => write("run.csv", &self.wall.run_csv())?,
        }
        for (name, text) in &self.files {
            write(name, text)?;
        }
        for plot in &self.plots {
            let chart = Chart {
                title: &plot.title,
                x_label: &plot.x_label,
                y_label: &plot.y_label,
                log_y: plot.log_y,
            };
            let path = dir.join(&plot.file);
            let drawn = match plot.kind {
                PlotKind::Lines => line_chart(&path, &chart, &plot.series),
                PlotKind::Histogram => histogram(&path, &chart, &plot.series),
            };
            drawn.map_err(|e| format!("{}: {e}", plot.file))?;
        }
        Ok(())
    }

    /// The value of `column` in every row where `filter` columns match, as f64.
    pub fn values(&self, column: &str, filter: &[(&str, &str)]) -> Vec<f64> {
        self.rows
            .iter()
            .filter(|row| {
                filter
                    .iter()
                    .all(|(k, v)| row.iter().any(|(rk, rv)| rk == k && rv == v))
            })
            .filter_map(|row| row.iter().find(|(k, _)| k == column))
            .filter_map(|(_, v)| v.parse().ok())
            .collect()
    }

    /// The mean of `column` over seeds for one protocol and group size.
    pub fn mean(&self, column: &str, protocol: &str, group_size: usize) -> f64 {
        let v = self.values(
            column,
            &[
                ("protocol", protocol),
                ("group_size", &group_size.to_string()),
            ],
        );
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }

    /// One line per protocol of `column`'s mean against group size, with
    /// min/max bars over seeds (P001's error bars).
    pub fn by_group_size(&self, column: &str) -> Vec<Series> {
        let mut per: BTreeMap<String, BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();
        for row in &self.rows {
            let get = |k: &str| row.iter().find(|(rk, _)| rk == k).map(|(_, v)| v.clone());
            let (Some(p), Some(n), Some(v)) = (get("protocol"), get("group_size"), get(column))
            else {
                continue;
            };
            let (Ok(n), Ok(v)) = (n.parse::<usize>(), v.parse::<f64>()) else {
                continue;
            };
            if !order.contains(&p) {
                order.push(p.clone());
            }
            per.entry(p).or_default().entry(n).or_default().push(v);
        }
        order
            .iter()
            .map(|p| {
                let points = &per[p];
                let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
                let min = |v: &Vec<f64>| v.iter().copied().fold(f64::INFINITY, f64::min);
                let max = |v: &Vec<f64>| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                Series::new(
                    p.clone(),
                    points.iter().map(|(n, v)| (*n as f64, mean(v))).collect(),
                )
                .with_bars(
                    points
                        .iter()
                        .map(|(n, v)| (*n as f64, min(v), max(v)))
                        .collect(),
                )
            })
            .collect()
    }

    /// A line plot of `column` against group size.
    pub fn plot_by_group_size(&mut self, file: &str, title: &str, column: &str, y_label: &str) {
        let series = self.by_group_size(column);
        self.plots.push(Plot {
            file: file.into(),
            title: title.into(),
            x_label: "group size".into(),
            y_label: y_label.into(),
            log_y: false,
            kind: PlotKind::Lines,
            series,
        });
    }
}

/// An incomplete run in a line: its first five summary columns, then its
/// first violation, or else how far delivery got (`delivered_min` against
/// the messages sent, and the deliveries declared lost; an SRM run with
/// none lost stopped while a repair was still to come).
pub fn incomplete_line(report: &Report) -> String {
    let get = |column: &str| {
        report
            .summary
            .iter()
            .find(|(k, _)| k == column)
            .map_or("?", |(_, v)| v.as_str())
    };
    let id: Vec<String> = report
        .summary
        .iter()
        .take(5)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let why = match report.violations.first() {
        Some(v) => v.clone(),
        None => format!(
            "delivered_min={} messages={} originated={} lost={}",
            get("delivered_min"),
            get("messages"),
            get("originated"),
            get("lost")
        ),
    };
    format!("{} {why}", id.join(" "))
}

/// Latency histogram as fractions per `bin_ms` bin up to `last_ms`; the last
/// bin collects everything at or beyond it (as P001's plots do).
pub fn latency_fractions(h: &Histogram<u64>, bin_ms: f64, last_ms: f64) -> Vec<(f64, f64)> {
    let bins = (last_ms / bin_ms).round() as usize + 1;
    let mut counts = vec![0u64; bins];
    for v in h.iter_recorded() {
        let ms = v.value_iterated_to() as f64 / 1000.0;
        let bin = ((ms / bin_ms) as usize).min(bins - 1);
        counts[bin] += v.count_at_value();
    }
    let total = h.len().max(1) as f64;
    counts
        .iter()
        .enumerate()
        .map(|(i, c)| (i as f64 * bin_ms, *c as f64 / total))
        .collect()
}

/// A CSV of several histograms sharing bins: `bin_ms,<label>...`.
pub fn histograms_csv(series: &[Series]) -> String {
    let mut out = String::from("bin_ms");
    for s in series {
        let _ = write!(out, ",{}", s.label);
    }
    out.push('\n');
    let bins = series.iter().map(|s| s.points.len()).max().unwrap_or(0);
    for i in 0..bins {
        let x = series
            .iter()
            .find_map(|s| s.points.get(i).map(|p| p.0))
            .unwrap_or_default();
        let _ = write!(out, "{x}");
        for s in series {
            let _ = write!(out, ",{:.6}", s.points.get(i).map_or(0.0, |p| p.1));
        }
        out.push('\n');
    }
    out
}

/// Merges histograms.
pub fn merged<'a, H: AddTo + 'a>(hs: impl IntoIterator<Item = &'a H>) -> Histogram<u64> {
    let mut all = crate::metrics::latency_histogram();
    for h in hs {
        h.add_to(&mut all);
    }
    all
}
