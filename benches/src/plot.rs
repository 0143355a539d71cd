//! SVG line charts of ratios over time (plotters' SVG backend: text is
//! written as SVG `<text>`, so no font library or system package is needed).

use std::path::Path;

use plotters::prelude::*;

/// One line; `None` points leave a gap.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, Option<f64>)>,
}

/// One chart: lines plus labelled vertical markers (e.g. phase changes).
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
    pub markers: Vec<(f64, String)>,
}

#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {message}")]
pub struct PlotError {
    path: String,
    message: String,
}

/// Colours by series index: truth black, then distinct hues.
const COLORS: [RGBColor; 6] = [
    RGBColor(0, 0, 0),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// Writes `panels` as a grid of `cols` columns into one SVG file, y axis
/// 0..100 (%) labelled `y_label`, x axis labelled `x_label`.
pub fn grid(
    path: &Path,
    panels: &[Panel],
    cols: usize,
    panel_size: (u32, u32),
    x_label: &str,
    y_label: &str,
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    if panels.is_empty() || cols == 0 {
        return Err(err(&"nothing to plot"));
    }
    let rows = panels.len().div_ceil(cols);
    let cols_u32 = u32::try_from(cols).map_err(|e| err(&e))?;
    let rows_u32 = u32::try_from(rows).map_err(|e| err(&e))?;
    let size = (panel_size.0 * cols_u32, panel_size.1 * rows_u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((rows, cols));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        draw_panel(area, panel, x_label, y_label).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    x_label: &str,
    y_label: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let xs = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(panel.markers.iter().map(|m| m.0));
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = if lo <= hi {
        (lo, hi.max(lo + 1.0))
    } else {
        (0.0, 1.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(lo..hi, 0.0f64..100.0)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 11))
        // Major grid lines only: the fine ones make the file 10x larger.
        .light_line_style(TRANSPARENT)
        .draw()?;
    for (x, label) in &panel.markers {
        let grey = RGBColor(150, 150, 150);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(*x, 0.0), (*x, 100.0)],
            grey.stroke_width(1),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            label.clone(),
            (*x, 97.0),
            ("sans-serif", 10).into_font().color(&grey),
        )))?;
    }
    for (i, s) in panel.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = color.stroke_width(if i == 0 { 5 } else { 2 });
        // An empty series carries the legend entry; segments carry the data.
        chart
            .draw_series(LineSeries::new(std::iter::empty(), style))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        for seg in segments(&s.points) {
            chart.draw_series(LineSeries::new(seg, style))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    Ok(())
}

/// Runs of consecutive present points, each as y in percent.
fn segments(points: &[(f64, Option<f64>)]) -> Vec<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for (x, y) in points {
        match y {
            Some(y) => cur.push((*x, y * 100.0)),
            None if !cur.is_empty() => out.push(std::mem::take(&mut cur)),
            None => {}
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Writes labelled points `(label, x, y)` as one scatter chart; axes span
/// the points with a margin and start at 0.
pub fn scatter(
    path: &Path,
    title: &str,
    points: &[(String, f64, f64)],
    x_label: &str,
    y_label: &str,
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let finite: Vec<&(String, f64, f64)> = points
        .iter()
        .filter(|p| p.1.is_finite() && p.2.is_finite())
        .collect();
    if finite.is_empty() {
        return Err(err(&"nothing to plot"));
    }
    let top = |f: fn(&(String, f64, f64)) -> f64| {
        finite.iter().map(|p| f(p)).fold(0.0f64, f64::max) * 1.15 + 1.0
    };
    let (xmax, ymax) = (top(|p| p.1), top(|p| p.2));
    let root = SVGBackend::new(path, (640, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0f64..xmax, 0.0f64..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 11))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, x, y)) in finite.iter().map(|p| (&p.0, p.1, p.2)).enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(std::iter::once(Circle::new((x, y), 5, color.filled())))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(std::iter::once(Text::new(
                label.clone(),
                (x, y),
                ("sans-serif", 11).into_font().color(&color),
            )))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_split_at_gaps_and_scale_to_percent() {
        let p = [
            (0.0, Some(0.5)),
            (1.0, None),
            (2.0, Some(0.25)),
            (3.0, Some(1.0)),
        ];
        assert_eq!(
            segments(&p),
            vec![vec![(0.0, 50.0)], vec![(2.0, 25.0), (3.0, 100.0)]]
        );
        assert!(segments(&[(0.0, None)]).is_empty());
    }

    #[test]
    fn writes_an_svg_with_every_series_and_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.svg");
        let panel = |t: &str| Panel {
            title: t.into(),
            series: vec![
                Series {
                    name: "truth".into(),
                    points: vec![(0.0, Some(0.6)), (1.0, Some(0.7))],
                },
                Series {
                    name: "hostpte".into(),
                    points: vec![(0.0, Some(0.3)), (1.0, None)],
                },
            ],
            markers: vec![(0.5, "change".into())],
        };
        grid(
            &path,
            &[panel("a"), panel("b"), panel("c")],
            2,
            (300, 200),
            "interval",
            "%",
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        // Text elements hold their content on a line of its own.
        for text in ["truth", "hostpte", "change", "a", "c"] {
            assert!(svg.lines().any(|l| l.trim() == text), "missing {text}");
        }
        assert!(grid(&path, &[], 2, (300, 200), "x", "y").is_err());
    }
}
