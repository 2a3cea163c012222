//! Figures swept over group size that can run a few sizes at a time
//! (`shoal sim <figure> --sizes 500,1000`), for figures whose largest sizes
//! take longer than one sitting. A run of some sizes merges into the
//! figure already in its output directory: the rows of the sizes it ran
//! replace that directory's rows of those sizes, the rows are put in the
//! figure's own order, and the plots and notes are rebuilt from the rows
//! alone. A figure run size by size into one directory is therefore, file
//! for file, the figure run whole (but `run.csv`, which says what each
//! part cost). A directory made with other parameters (scale, seeds,
//! inputs) is refused, so a merge never mixes two ways of running.

use std::path::Path;

use super::figure::{Figure, Scale, Sizes};
use crate::report::{cpu_seconds, peak_rss_bytes};

/// One `summary.csv` row: (column, value).
pub type Row = Vec<(String, String)>;

/// A figure that runs a size at a time.
#[derive(Debug, Clone, Copy)]
pub struct Swept {
    pub name: &'static str,
    /// The figure's sizes at a scale, in the order its rows come in.
    pub sizes: fn(&Scale) -> Vec<usize>,
    /// The figure (plots, notes, incomplete runs) from its rows, exactly as
    /// its own run builds it.
    pub from_rows: fn(&Scale, Vec<Row>) -> Figure,
}

/// Why a run of some sizes was not merged; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeError {
    /// A chosen size is not one of the figure's at this scale.
    NotASize { size: usize, sizes: Vec<usize> },
    /// The directory holds a `summary.csv` but no `params.csv`, so how it
    /// was made is unknown.
    NoParams,
    /// The directory's figure was made with other parameters.
    OtherParams {
        name: String,
        theirs: String,
        ours: String,
    },
    /// A file could not be read or parsed.
    Unreadable(String),
}

impl std::fmt::Display for MergeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MergeError::NotASize { size, sizes } => {
                write!(f, "--sizes: {size} is not one of the figure's sizes at this scale ({})", Sizes::list(sizes).replace(';', ","))
            }
            MergeError::NoParams => write!(
                f,
                "the output directory has a summary.csv but no params.csv: cannot tell how it was made; use another --out"
            ),
            MergeError::OtherParams { name, theirs, ours } => write!(
                f,
                "the output directory's figure was made with {name} = {theirs}, this run has {ours}; use another --out"
            ),
            MergeError::Unreadable(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for MergeError {}

impl Swept {
    /// Checks that every size `scale` chose is one of the figure's.
    pub fn check(&self, scale: &Scale) -> Result<(), MergeError> {
        let sizes = (self.sizes)(scale);
        for &size in scale.sizes.chosen().unwrap_or(&[]) {
            if !sizes.contains(&size) {
                let mut sorted = sizes.clone();
                sorted.sort_unstable();
                return Err(MergeError::NotASize {
                    size,
                    sizes: sorted,
                });
            }
        }
        Ok(())
    }

    /// Whether a run of the sizes `scale` chose, made with `params`, can
    /// merge into `dir`: checked before anything runs.
    pub fn check_dir(
        &self,
        scale: &Scale,
        dir: &Path,
        params: &[(String, String)],
    ) -> Result<(), MergeError> {
        self.check(scale)?;
        match Old::read(dir)? {
            Some(old) => old.check_params(params),
            None => Ok(()),
        }
    }

    /// `part`, a run of the sizes `scale` chose, merged with the figure
    /// whose files are in `dir` (if any): the rows of other sizes kept, the
    /// rows in the figure's order, plots and notes rebuilt, `params.csv`
    /// naming the sizes held unless they are all of them, and `run.csv`
    /// with a row per part run (the directory's rows of sizes not rerun,
    /// then this run's). `params` is what made `part` (`params.csv`'s
    /// rows; a `sizes` row is replaced by the sizes the merge holds).
    pub fn merge(
        &self,
        scale: &Scale,
        dir: &Path,
        part: Figure,
        params: Vec<(String, String)>,
    ) -> Result<Figure, MergeError> {
        self.check(scale)?;
        let all = (self.sizes)(scale);
        let chosen = scale.sizes.pick(&all);
        let old = Old::read(dir)?;
        let mut rows = Vec::new();
        let mut runs = Vec::new();
        if let Some(old) = old {
            old.check_params(&params)?;
            for row in old.rows {
                let size = group_size(&row)?;
                if !all.contains(&size) {
                    return Err(MergeError::NotASize { size, sizes: all });
                }
                if !chosen.contains(&size) {
                    rows.push(row);
                }
            }
            for run in old.runs {
                let sizes = run.first().map_or(String::new(), |s| s.clone());
                let rerun = sizes
                    .split(';')
                    .filter_map(|s| s.parse::<usize>().ok())
                    .any(|n| chosen.contains(&n));
                if !rerun {
                    runs.push(run);
                }
            }
        }
        rows.extend(part.rows);
        // The figure's own order: by size as it runs them, each size's rows
        // as its run made them (a stable sort).
        let position = |row: &Row| group_size(row).map_or(usize::MAX, |n| rank(&all, n));
        rows.sort_by_key(position);
        let held: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&n| rows.iter().any(|r| group_size(r).ok() == Some(n)))
            .collect();
        let mut figure = (self.from_rows)(scale, rows);
        figure.wall = part.wall;
        figure.params = params.into_iter().filter(|(n, _)| n != "sizes").collect();
        if held.len() < all.len() {
            let mut ascending = held.clone();
            ascending.sort_unstable();
            figure
                .params
                .push(("sizes".into(), Sizes::list(&ascending)));
        }
        let mut ran = chosen.clone();
        ran.sort_unstable();
        runs.push(run_row(&ran, &part.wall));
        figure.run_csv = Some(runs_csv(&runs));
        Ok(figure)
    }
}

fn rank(all: &[usize], n: usize) -> usize {
    all.iter().position(|&m| m == n).unwrap_or(usize::MAX)
}

/// The `run.csv` of a figure run in parts.
const RUNS_HEADER: &str = "sizes,wall_s,cpu_s,events,events_per_s,peak_rss_mib";

fn run_row(sizes: &[usize], wall: &crate::report::Wall) -> Vec<String> {
    vec![
        Sizes::list(sizes),
        format!("{:.3}", wall.seconds),
        cpu_seconds().map_or(String::new(), |s| format!("{s:.2}")),
        wall.events.to_string(),
        format!("{:.0}", wall.events_per_second()),
        peak_rss_bytes().map_or(String::new(), |b| format!("{:.1}", b as f64 / 1048576.0)),
    ]
}

fn runs_csv(runs: &[Vec<String>]) -> String {
    let mut out = format!("{RUNS_HEADER}\n");
    for run in runs {
        out.push_str(&run.join(","));
        out.push('\n');
    }
    out
}

/// The group size of a row.
fn group_size(row: &Row) -> Result<usize, MergeError> {
    row.iter()
        .find(|(k, _)| k == "group_size")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| MergeError::Unreadable("summary.csv: a row without a group_size".into()))
}

/// The figure already in the output directory.
struct Old {
    rows: Vec<Row>,
    params: Vec<(String, String)>,
    /// `run.csv`'s rows if it is a parts table (`sizes` first).
    runs: Vec<Vec<String>>,
}

impl Old {
    /// `None` if `dir` holds no `summary.csv`.
    fn read(dir: &Path) -> Result<Option<Old>, MergeError> {
        let read = |name: &str| -> Result<Option<String>, MergeError> {
            match std::fs::read_to_string(dir.join(name)) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(MergeError::Unreadable(format!("{name}: {e}"))),
            }
        };
        let Some(summary) = read("summary.csv")? else {
            return Ok(None);
        };
        let params = read("params.csv")?.ok_or(MergeError::NoParams)?;
        let params = parse_csv(&params, "params.csv")?
            .into_iter()
            .map(|row| {
                let get = |k: &str| row.iter().find(|(c, _)| c == k).map(|(_, v)| v.clone());
                match (get("name"), get("value")) {
                    (Some(name), Some(value)) => Ok((name, value)),
                    _ => Err(MergeError::Unreadable("params.csv: not name,value".into())),
                }
            })
            .collect::<Result<_, _>>()?;
        let runs = match read("run.csv")? {
            Some(text) if text.starts_with(RUNS_HEADER) => text
                .lines()
                .skip(1)
                .filter(|l| !l.is_empty())
                .map(|l| l.split(',').map(String::from).collect())
                .collect(),
            _ => Vec::new(),
        };
        Ok(Some(Old {
            rows: parse_csv(&summary, "summary.csv")?,
            params,
            runs,
        }))
    }

    /// Every parameter but `sizes` is the same as `ours`.
    fn check_params(&self, ours: &[(String, String)]) -> Result<(), MergeError> {
        let theirs: Vec<&(String, String)> =
            self.params.iter().filter(|(n, _)| n != "sizes").collect();
        let ours: Vec<&(String, String)> = ours.iter().filter(|(n, _)| n != "sizes").collect();
        for (name, value) in &ours {
            let other = theirs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str());
            if other != Some(value.as_str()) {
                return Err(MergeError::OtherParams {
                    name: name.clone(),
                    theirs: other.unwrap_or("(none)").into(),
                    ours: value.clone(),
                });
            }
        }
        if let Some((name, value)) = theirs
            .iter()
            .find(|(n, _)| !ours.iter().any(|(o, _)| o == n))
        {
            return Err(MergeError::OtherParams {
                name: name.clone(),
                theirs: value.clone(),
                ours: "(none)".into(),
            });
        }
        Ok(())
    }
}

/// The rows of a CSV that [`Figure::summary_csv`] wrote (no quoting: its
/// values hold no commas). A row keeps every column, empty values too.
fn parse_csv(text: &str, name: &str) -> Result<Vec<Row>, MergeError> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| MergeError::Unreadable(format!("{name}: empty")))?
        .split(',')
        .collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|line| {
            let values: Vec<&str> = line.split(',').collect();
            if values.len() != header.len() {
                return Err(MergeError::Unreadable(format!(
                    "{name}: a row of {} values under {} columns",
                    values.len(),
                    header.len()
                )));
            }
            Ok(header
                .iter()
                .zip(values)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A figure of sizes 30, 20, 10 (in that order) whose rows are its
    /// whole output.
    const FAKE: Swept = Swept {
        name: "fake",
        sizes: |_| vec![30, 20, 10],
        from_rows: |_, rows| {
            let mut figure = Figure::new("fake");
            figure.rows = rows;
            figure
        },
    };

    fn row(n: usize, v: &str) -> Row {
        vec![("group_size".into(), n.to_string()), ("v".into(), v.into())]
    }

    /// A run of `sizes`: one or two rows per size, tagged `tag`.
    fn part(scale: &Scale, tag: &str) -> Figure {
        let mut figure = Figure::new("fake");
        for n in scale.sizes.pick(&(FAKE.sizes)(scale)) {
            figure.rows.push(row(n, &format!("{tag}a")));
            figure.rows.push(row(n, &format!("{tag}b")));
        }
        figure
    }

    fn params(scale: &Scale) -> Vec<(String, String)> {
        let mut p = vec![("scenario".to_string(), "fake".to_string())];
        p.extend(scale.params());
        p
    }

    fn only(sizes: &[usize]) -> Scale {
        Scale {
            sizes: Sizes::only(sizes).expect("1 to 16 sizes"),
            ..Scale::quick(1)
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("shoal-swept-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn merge_into(dir: &Path, scale: &Scale, tag: &str) -> Result<Figure, MergeError> {
        let merged = FAKE.merge(scale, dir, part(scale, tag), params(scale))?;
        merged.write(dir).expect("writes");
        Ok(merged)
    }

    fn values(figure: &Figure) -> Vec<(String, String)> {
        figure
            .rows
            .iter()
            .map(|r| (r[0].1.clone(), r[1].1.clone()))
            .collect()
    }

    /// Sizes run one at a time, in any order, add up to the figure run
    /// whole: the same rows in the same order, the same params.csv; a
    /// size run again replaces its own rows only.
    #[test]
    fn parts_merge_into_the_whole_and_a_rerun_replaces_its_size() {
        let dir = temp_dir("parts");
        let first = merge_into(&dir, &only(&[20]), "x").expect("merges");
        let sizes = |f: &Figure| f.params.iter().find(|(n, _)| n == "sizes").cloned();
        assert_eq!(sizes(&first), Some(("sizes".into(), "20".into())));
        merge_into(&dir, &only(&[10, 30]), "x").expect("merges");
        let whole_scale = Scale::quick(1);
        let mut whole = (FAKE.from_rows)(&whole_scale, part(&whole_scale, "x").rows);
        whole.params = params(&whole_scale);
        let summary = std::fs::read_to_string(dir.join("summary.csv")).expect("written");
        assert_eq!(summary, whole.summary_csv());
        let params_csv = std::fs::read_to_string(dir.join("params.csv")).expect("written");
        assert!(!params_csv.contains("sizes"), "{params_csv}");
        let runs = std::fs::read_to_string(dir.join("run.csv")).expect("written");
        let ran: Vec<&str> = runs
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap_or(""))
            .collect();
        assert_eq!(ran, ["20", "10;30"], "{runs}");

        let again = merge_into(&dir, &only(&[20]), "y").expect("merges");
        let expected: Vec<(String, String)> = [
            ("30", "xa"),
            ("30", "xb"),
            ("20", "ya"),
            ("20", "yb"),
            ("10", "xa"),
            ("10", "xb"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        assert_eq!(values(&again), expected);
        let runs = std::fs::read_to_string(dir.join("run.csv")).expect("written");
        let ran: Vec<&str> = runs
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap_or(""))
            .collect();
        assert_eq!(ran, ["10;30", "20"], "{runs}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A directory made otherwise is refused before anything runs, and so
    /// are a directory of unknown making and a size the figure lacks.
    #[test]
    fn other_makings_and_foreign_sizes_are_refused() {
        let dir = temp_dir("refused");
        merge_into(&dir, &only(&[20]), "x").expect("merges");
        let full = Scale {
            sizes: Sizes::only(&[10]).expect("one size"),
            ..Scale::full(1)
        };
        let err = FAKE
            .check_dir(&full, &dir, &params(&full))
            .expect_err("refused");
        assert!(
            matches!(&err, MergeError::OtherParams { name, .. } if name == "quick"),
            "{err}"
        );
        let other_seed = Scale {
            seed: 2,
            ..only(&[10])
        };
        assert!(matches!(
            FAKE.check_dir(&other_seed, &dir, &params(&other_seed)),
            Err(MergeError::OtherParams { .. })
        ));
        assert!(matches!(
            FAKE.check_dir(&only(&[15]), &dir, &params(&only(&[15]))),
            Err(MergeError::NotASize { size: 15, .. })
        ));
        std::fs::remove_file(dir.join("params.csv")).expect("there");
        assert_eq!(
            FAKE.check_dir(&only(&[10]), &dir, &params(&only(&[10]))),
            Err(MergeError::NoParams)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn csv_rows_round_trip_through_the_summary() {
        let mut figure = Figure::new("x");
        figure.rows = vec![
            vec![("group_size".into(), "8".into()), ("a".into(), "1".into())],
            vec![("group_size".into(), "16".into()), ("a".into(), "".into())],
        ];
        let text = figure.summary_csv();
        let back = parse_csv(&text, "summary.csv").expect("parses");
        let mut again = Figure::new("x");
        again.rows = back;
        assert_eq!(again.summary_csv(), text);
    }
}
