//! `p000-fig6-analysis` (P000 §5.1, Fig 6): the analytic throughput of
//! virtual synchrony in the traditional stack, equation (2), against vsync
//! over pbcast with a k-member committee, equation (5), as the group grows,
//! for several numbers of senders s. No simulation: the curves are the
//! equations. The paper gives no constants ("the values themselves do not
//! mean much"); ours are below, so only the trends are comparable.
//!
//! Equation (2) as printed has denominator (n/s) + p_ml; redoing the
//! paper's own algebra gives (n/s) + n·p_ml (notes §1.5). Both are drawn.
//! p_ml(C) is taken as p_ml^(C·ln n): the paper's "p_ml^(-C log n)" would
//! be a probability above 1.

use shoal_plot::Series;

use super::figure::{Plot, PlotKind};
use super::{Figure, Scale};

pub const NAME: &str = "p000-fig6-analysis";

/// The constants of our curves.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    /// Bandwidth, in messages per unit time.
    pub b: f64,
    /// View changes per member per unit time.
    pub mu: f64,
    /// Multicast loss probability.
    pub p_ml: f64,
    /// Gossip rounds per message are C·ln n.
    pub c: f64,
    /// Committee size.
    pub k: f64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            b: 100_000.0,
            mu: 1.0,
            p_ml: 0.05,
            c: 1.0,
            k: 3.0,
        }
    }
}

impl Model {
    /// Equation (2) as printed.
    pub fn traditional(&self, n: f64, s: f64) -> f64 {
        ((self.b - self.mu * n * n) / (n / s + self.p_ml)).max(0.0)
    }

    /// Equation (2) with the factor n the printed version drops.
    pub fn traditional_corrected(&self, n: f64, s: f64) -> f64 {
        ((self.b - self.mu * n * n) / (n / s + n * self.p_ml)).max(0.0)
    }

    /// Equation (5); independent of s.
    pub fn vsync_pbcast(&self, n: f64) -> f64 {
        let p_ml_c = self.p_ml.powf(self.c * n.ln());
        ((self.b - self.mu * n * n / self.k) / (self.c * n.ln() + p_ml_c * n / self.k)).max(0.0)
    }
}

pub const SENDERS: [f64; 3] = [1.0, 4.0, 16.0];

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let model = Model::default();
    let step = scale.pick(2, 10);
    let sizes: Vec<usize> = (2..=500).step_by(step).collect();
    let mut series = Vec::new();
    let mut curve = |label: String, protocol: &str, s: f64, f: &dyn Fn(f64) -> f64| {
        let points: Vec<(f64, f64)> = sizes.iter().map(|&n| (n as f64, f(n as f64))).collect();
        for &(n, t) in &points {
            figure.rows.push(vec![
                ("scenario".into(), NAME.into()),
                ("protocol".into(), protocol.into()),
                ("group_size".into(), n.to_string()),
                ("seed".into(), "0".into()),
                ("senders".into(), s.to_string()),
                ("throughput".into(), format!("{t:.3}")),
            ]);
        }
        series.push(Series::new(label, points));
    };
    for s in SENDERS {
        curve(
            format!("traditional, eq (2), s={s}"),
            "traditional-eq2",
            s,
            &|n| model.traditional(n, s),
        );
        curve(
            format!("traditional, eq (2) corrected, s={s}"),
            "traditional-eq2-corrected",
            s,
            &|n| model.traditional_corrected(n, s),
        );
    }
    curve(
        "vsync/pbcast, eq (5), any s".into(),
        "vsync-pbcast-eq5",
        0.0,
        &|n| model.vsync_pbcast(n),
    );
    figure.notes.push(format!("constants: {model:?}"));
    for n in [10.0, 100.0, 300.0] {
        figure.notes.push(format!(
            "n={n:<4} traditional s=1 {:>9.0}  s=16 {:>9.0}   vsync/pbcast {:>9.0}",
            model.traditional(n, 1.0),
            model.traditional(n, 16.0),
            model.vsync_pbcast(n)
        ));
    }
    figure.plots.push(Plot {
        file: format!("{NAME}.svg"),
        title: "throughput against group size, equations (2) and (5)".into(),
        x_label: "group size n".into(),
        y_label: "throughput (model units)".into(),
        log_y: true,
        kind: PlotKind::Lines,
        series,
    });
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trends P000 reads off Fig 6: with few senders vsync/pbcast
    /// degrades more gracefully than the traditional stack; the traditional
    /// stack improves with more senders; both reach zero once μn² ≥ B.
    #[test]
    fn the_papers_trends() {
        let m = Model::default();
        let keep = |f: &dyn Fn(f64) -> f64| f(200.0) / f(10.0);
        assert!(keep(&|n| m.vsync_pbcast(n)) > keep(&|n| m.traditional(n, 1.0)));
        assert!(m.traditional(100.0, 16.0) > m.traditional(100.0, 1.0));
        let zero = (m.b / m.mu).sqrt() + 1.0;
        assert_eq!(m.traditional(zero, 1.0), 0.0);
        assert_eq!(m.traditional_corrected(zero, 1.0), 0.0);
        assert!(m.vsync_pbcast(zero) > 0.0, "the committee divides μn² by k");
        assert_eq!(m.vsync_pbcast((m.k * m.b / m.mu).sqrt() + 1.0), 0.0);
        let f = run(Scale::quick(1));
        assert!(f.rows.len() > 100 && f.complete());
    }
}
