//! Line plots of the training curves as standalone SVG files (no plotting library, no fonts to
//! install): one file per series, step on the x axis.

use std::fmt::Write;
use std::path::Path;

use crate::train::StepMetrics;

/// The series drawn by [`write_training_plots`]: (file stem, title, value).
#[allow(clippy::type_complexity)]
const SERIES: [(&str, &str, fn(&StepMetrics) -> f64); 5] = [
    ("reward", "mean reward", |m| m.reward_mean),
    ("metric", "mean EM / F1 of rollouts", |m| m.metric_mean),
    ("kl", "KL to reference", |m| m.kl),
    ("entropy", "entropy", |m| m.entropy),
    ("tool_calls", "tool calls per step", |m| m.tool_calls as f64),
];

/// An SVG line chart of `points` (x, y).
pub fn line_chart(title: &str, x_label: &str, points: &[(f64, f64)]) -> String {
    let (w, h, pad) = (640.0, 360.0, 48.0);
    let xs = points.iter().map(|p| p.0);
    let ys = points.iter().map(|p| p.1);
    let (x0, x1) = (xs.clone().fold(f64::INFINITY, f64::min), xs.fold(f64::NEG_INFINITY, f64::max));
    let (mut y0, mut y1) = (ys.clone().fold(f64::INFINITY, f64::min), ys.fold(f64::NEG_INFINITY, f64::max));
    if !y0.is_finite() || !y1.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    if (y1 - y0).abs() < 1e-12 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let x_span = if (x1 - x0).abs() < 1e-12 { 1.0 } else { x1 - x0 };
    let sx = |x: f64| pad + (x - if x0.is_finite() { x0 } else { 0.0 }) / x_span * (w - 2.0 * pad);
    let sy = |y: f64| h - pad - (y - y0) / (y1 - y0) * (h - 2.0 * pad);
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{}</text>\
         <line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\
         <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{}\" stroke=\"black\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
         <text x=\"4\" y=\"{}\">{y1:.4}</text><text x=\"4\" y=\"{}\">{y0:.4}</text>",
        w / 2.0,
        escape(title),
        h - pad,
        w - pad,
        h - pad,
        h - pad,
        w / 2.0,
        h - 10.0,
        escape(x_label),
        pad + 4.0,
        h - pad,
    );
    let path: Vec<String> = points.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
    let _ =
        write!(svg, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>", path.join(" "));
    for (x, y) in points {
        let _ = write!(svg, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"#1f77b4\"/>", sx(*x), sy(*y));
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Write `<dir>/<series>.svg` for the main curves of `metrics`.
pub fn write_training_plots(dir: &Path, metrics: &[StepMetrics]) -> std::io::Result<()> {
    for (stem, title, value) in SERIES {
        let points: Vec<(f64, f64)> = metrics.iter().map(|m| (m.step as f64, value(m))).collect();
        std::fs::write(dir.join(format!("{stem}.svg")), line_chart(title, "training step", &points))?;
    }
    Ok(())
}

/// Read `metrics.jsonl` back.
pub fn read_metrics(dir: &Path) -> std::io::Result<Vec<StepMetrics>> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl"))?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_scales_points_into_the_frame() {
        let svg = line_chart("reward <mean>", "step", &[(0.0, 0.0), (1.0, 0.5), (2.0, 1.0)]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("reward &lt;mean&gt;"));
        assert!(svg.contains("points=\"48.0,312.0 320.0,180.0 592.0,48.0\""), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 3);
        // Degenerate inputs still draw.
        assert!(line_chart("flat", "step", &[(3.0, 2.0)]).contains("<circle"));
        assert!(line_chart("empty", "step", &[]).contains("</svg>"));
    }
}
