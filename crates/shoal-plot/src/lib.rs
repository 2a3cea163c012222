//! SVG charts for the reproduced paper figures (`docs/figures/`).
//!
//! Two shapes cover the papers' plots: a line chart of metric against a
//! parameter, one series per protocol, with optional min/max bars (P001
//! Figs 1, 2, 8, 9; P000 Figs 6, 10, 12); and a histogram of latencies or
//! inter-arrival times, one series per protocol or configuration (P001
//! Figs 3, 4, 7). The font is embedded (DejaVu Sans, `assets/`), so a figure
//! renders the same on a machine without fonts.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

/// One line: points (x, y) and, optionally, a (min, max) bar per point.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub bars: Vec<(f64, f64, f64)>,
}

impl Series {
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.into(),
            points,
            bars: Vec::new(),
        }
    }

    /// Adds min/max bars, one (x, min, max) per point.
    pub fn with_bars(mut self, bars: Vec<(f64, f64, f64)>) -> Series {
        self.bars = bars;
        self
    }
}

/// Titles and axes of a chart.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Log-scaled y axis (for tails spanning orders of magnitude).
    pub log_y: bool,
}

/// Why a figure could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot")]
    Empty,
    #[error("drawing failed: {0}")]
    Draw(String),
}

fn draw_err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let font = include_bytes!("../assets/DejaVuSans.ttf");
        // Registration only fails on a malformed font, which the tests rule out.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, font);
    });
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn bounds(series: &[Series]) -> Option<(f64, f64, f64, f64)> {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| {
        let points = s.points.iter().map(|p| p.1);
        points.chain(s.bars.iter().flat_map(|b| [b.1, b.2]))
    });
    let (x0, x1) = min_max(xs)?;
    let (y0, y1) = min_max(ys)?;
    Some((x0, x1, y0, y1))
}

fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// Widens a degenerate or tight range a little so every point is visible.
fn pad(lo: f64, hi: f64, from_zero: bool) -> (f64, f64) {
    let lo = if from_zero { lo.min(0.0) } else { lo };
    let span = (hi - lo).abs().max(1e-9);
    (
        lo - if from_zero { 0.0 } else { span * 0.05 },
        hi + span * 0.08,
    )
}

/// A line chart with one line per series (and min/max bars where given).
pub fn line_chart(path: &Path, chart: &Chart<'_>, series: &[Series]) -> Result<(), PlotError> {
    register_font();
    let (x0, x1, y0, y1) = bounds(series).ok_or(PlotError::Empty)?;
    let (x0, x1) = pad(x0, x1, false);
    let root = SVGBackend::new(path, (720, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(chart.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    if chart.log_y {
        let y0 = y0.max(1e-3);
        let mut ctx = builder
            .build_cartesian_2d(x0..x1, (y0..y1 * 1.5).log_scale())
            .map_err(draw_err)?;
        ctx.configure_mesh()
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .draw()
            .map_err(draw_err)?;
        draw_lines(&mut ctx, series)?;
        finish(&mut ctx)?;
    } else {
        let (y0, y1) = pad(y0, y1, true);
        let mut ctx = builder
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(draw_err)?;
        ctx.configure_mesh()
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .draw()
            .map_err(draw_err)?;
        draw_lines(&mut ctx, series)?;
        finish(&mut ctx)?;
    }
    root.present().map_err(draw_err)
}

fn draw_lines<'a, DB, CT>(
    ctx: &mut ChartContext<'a, DB, CT>,
    series: &[Series],
) -> Result<(), PlotError>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate<From = (f64, f64)>,
{
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        ctx.draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(draw_err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        ctx.draw_series(s.points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(draw_err)?;
        let bars = s
            .bars
            .iter()
            .map(|&(x, lo, hi)| PathElement::new(vec![(x, lo), (x, hi)], color));
        ctx.draw_series(bars).map_err(draw_err)?;
    }
    Ok(())
}

fn finish<'a, DB, CT>(ctx: &mut ChartContext<'a, DB, CT>) -> Result<(), PlotError>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)
}

/// A histogram drawn as one step line per series over shared bins: each
/// series is (bin lower edge, fraction or count) with equal-width bins.
pub fn histogram(path: &Path, chart: &Chart<'_>, series: &[Series]) -> Result<(), PlotError> {
    let stepped: Vec<Series> = series
        .iter()
        .map(|s| Series::new(s.label.clone(), steps(&s.points)))
        .collect();
    line_chart(path, chart, &stepped)
}

/// Turns (lower edge, value) bins into the corners of a step line.
fn steps(bins: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let width = match bins {
        [a, b, ..] => b.0 - a.0,
        _ => 1.0,
    };
    bins.iter()
        .flat_map(|&(x, y)| [(x, y), (x + width, y)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("shoal-plot-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_line_chart_has_its_title_labels_and_legend() {
        let path = temp("line.svg");
        let series = [
            Series::new("srm", vec![(20.0, 1.0), (80.0, 6.0)])
                .with_bars(vec![(20.0, 0.5, 1.5), (80.0, 5.0, 7.0)]),
            Series::new("pbcast", vec![(20.0, 0.3), (80.0, 0.35)]),
        ];
        let chart = Chart {
            title: "requests per member",
            x_label: "group size",
            y_label: "requests/s",
            log_y: false,
        };
        line_chart(&path, &chart, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in ["requests per member", "group size", "srm", "pbcast"] {
            assert!(svg.contains(text), "missing {text}");
        }
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn a_histogram_with_a_log_axis_renders() {
        let path = temp("hist.svg");
        let series = [Series::new(
            "pbcast",
            vec![(0.0, 0.9), (100.0, 0.08), (200.0, 0.02)],
        )];
        let chart = Chart {
            title: "latency",
            x_label: "ms",
            y_label: "fraction",
            log_y: true,
        };
        histogram(&path, &chart, &series).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("latency"));
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let chart = Chart {
            title: "t",
            x_label: "x",
            y_label: "y",
            log_y: false,
        };
        assert!(matches!(
            line_chart(&temp("empty.svg"), &chart, &[]),
            Err(PlotError::Empty)
        ));
    }
}
