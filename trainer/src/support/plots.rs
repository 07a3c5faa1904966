//! Line plots of the training curves as standalone SVG files (no plotting library, no fonts to
//! install): one file per series, step on the x axis.

use std::fmt::Write;
use std::path::Path;

use grove_rundir::StepMetrics;

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
    multi_line_chart(title, x_label, &[("", points.to_vec())])
}

const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/// An SVG chart of several named series on shared axes, with a legend when there is more than
/// one series.
pub fn multi_line_chart(title: &str, x_label: &str, series: &[(&str, Vec<(f64, f64)>)]) -> String {
    let (w, h, pad) = (640.0, 360.0, 48.0);
    let all = || series.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1) =
        (all().map(|p| p.0).fold(f64::INFINITY, f64::min), all().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max));
    let (mut y0, mut y1) =
        (all().map(|p| p.1).fold(f64::INFINITY, f64::min), all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max));
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
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = points.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for (x, y) in points {
            let _ = write!(svg, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{colour}\"/>", sx(*x), sy(*y));
        }
        if series.len() > 1 {
            let ly = pad + 16.0 * i as f64;
            let _ = write!(
                svg,
                "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\">{}</text>",
                w - pad - 150.0,
                ly - 4.0,
                w - pad - 134.0,
                ly,
                escape(name)
            );
        }
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
        // Several series share the axes and get a legend.
        let two = multi_line_chart(
            "em",
            "step",
            &[("chain", vec![(0.0, 0.0), (2.0, 0.5)]), ("tree", vec![(0.0, 0.25), (2.0, 1.0)])],
        );
        assert_eq!(two.matches("<polyline").count(), 2);
        assert!(two.contains(">chain</text>") && two.contains(">tree</text>"));
        assert!(two.contains("points=\"48.0,312.0 592.0,180.0\""), "{two}");
    }
}
