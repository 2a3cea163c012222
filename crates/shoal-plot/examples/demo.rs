//! Writes a sample chart: `cargo run -p shoal-plot --example demo -- out.svg`.
use shoal_plot::{line_chart, Chart, Series};

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| "demo.svg".into());
    let series = [
        Series::new(
            "srm",
            vec![(20.0, 1.5), (40.0, 3.0), (60.0, 4.6), (80.0, 6.1)],
        )
        .with_bars(vec![
            (20.0, 1.0, 2.0),
            (40.0, 2.5, 3.4),
            (60.0, 4.0, 5.0),
            (80.0, 5.5, 6.8),
        ]),
        Series::new(
            "pbcast",
            vec![(20.0, 0.3), (40.0, 0.32), (60.0, 0.33), (80.0, 0.35)],
        ),
    ];
    let chart = Chart {
        title: "requests received per member per second",
        x_label: "group size",
        y_label: "requests/s",
        log_y: false,
    };
    line_chart(std::path::Path::new(&path), &chart, &series).expect("chart written");
}
