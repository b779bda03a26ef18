//! The HTML report of a run: one self-contained file (inline SVG charts
//! drawn with plotters, no script, nothing fetched) per run, next to the
//! table and the JSON line. Per scenario: latency over time (p50, p99),
//! latency by percentile, answers by type, and for `throughput` the orders
//! per second over time beside the ceilings measured in the same run. For
//! `lab`: its table and a chart per anomaly.

use std::fmt::Write as _;
use std::ops::Range;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::drive::Tally;

const WIDTH: u32 = 760;
const HEIGHT: u32 = 320;

/// A horizontal line on the orders-per-second chart.
pub struct Ceiling {
    pub label: String,
    pub per_sec: f64,
}

/// One scenario's part of the report.
pub struct Section<'a> {
    pub title: String,
    pub tally: &'a Tally,
    /// Facts shown as a list above the charts.
    pub facts: Vec<(String, String)>,
    /// With ceilings, an orders-per-second chart is drawn.
    pub ceilings: Option<Vec<Ceiling>>,
}

/// One bar chart: a value per labelled row.
pub struct Bars {
    pub title: String,
    pub rows: Vec<(String, f64)>,
}

/// The report as one HTML page.
/// `tables` are HTML blocks, each under its heading; `bars` charts drawn
/// after them.
pub fn html(title: &str, sections: &[Section], tables: &[(&str, String)], bars: &[Bars]) -> String {
    let mut page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:{w}px}}\
         table{{border-collapse:collapse;font-size:12px}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}\
         h2{{margin-top:2em}}</style></head><body><h1>{t}</h1>\n",
        t = escape(title),
        w = WIDTH + 40,
    );
    for section in sections {
        let _ = write!(page, "<h2>{}</h2>\n<ul>", escape(&section.title));
        for (k, v) in &section.facts {
            let _ = write!(page, "<li>{}: {}</li>", escape(k), escape(v));
        }
        page.push_str("</ul>\n");
        page.push_str(&latency_over_time(section.tally));
        page.push_str(&percentiles(section.tally));
        page.push_str(&bar_chart(&Bars {
            title: "Answers by type".into(),
            rows: section
                .tally
                .statuses
                .iter()
                .map(|(k, v)| (k.clone(), *v as f64))
                .collect(),
        }));
        if let Some(ceilings) = &section.ceilings {
            page.push_str(&orders_over_time(section.tally, ceilings));
        }
    }
    for (heading, table) in tables {
        let _ = write!(page, "<h2>{}</h2>\n{table}", escape(heading));
    }
    for chart in bars {
        page.push_str(&bar_chart(chart));
    }
    page.push_str("</body></html>\n");
    page
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Per time bucket (a sixtieth of the run, at least 100 ms): the p50 and
/// p99 latency in ms of the requests sent in it.
fn latency_buckets(tally: &Tally) -> (f64, Vec<(f64, f64, f64)>) {
    let end = tally.samples.iter().map(|s| s.at_ms).max().unwrap_or(0);
    let bucket = (end / 60).max(100);
    let mut by_bucket: Vec<Vec<u32>> = vec![Vec::new(); (end / bucket) as usize + 1];
    for s in &tally.samples {
        by_bucket[(s.at_ms / bucket) as usize].push(s.micros);
    }
    let points = by_bucket
        .into_iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(i, mut v)| {
            v.sort_unstable();
            let at = |q: f64| f64::from(v[((v.len() - 1) as f64 * q) as usize]) / 1000.0;
            (
                (i as f64 + 0.5) * f64::from(bucket) / 1000.0,
                at(0.5),
                at(0.99),
            )
        })
        .collect();
    (f64::from(end) / 1000.0, points)
}

fn latency_over_time(tally: &Tally) -> String {
    let (end, points) = latency_buckets(tally);
    let top = points.iter().map(|p| p.2).fold(1.0, f64::max) * 1.1;
    svg(|root| {
        let mut chart = line_chart(root, "Latency over time", 55, 0f64..end.max(0.1), 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("seconds into the run")
            .y_desc("ms")
            .draw()?;
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1)), &BLUE))?
            .label("p50")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.2)), &RED))?
            .label("p99")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.configure_series_labels().border_style(BLACK).draw()?;
        Ok(())
    })
}

fn percentiles(tally: &Tally) -> String {
    let qs = [0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0];
    let points: Vec<(f64, f64)> = qs
        .iter()
        .enumerate()
        .map(|(i, q)| (i as f64, tally.ms(*q)))
        .collect();
    let top = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    svg(|root| {
        let x = 0f64..(qs.len() - 1) as f64;
        let mut chart = line_chart(root, "Latency by percentile", 55, x, 0f64..top)?;
        chart
            .configure_mesh()
            .x_labels(qs.len())
            .x_label_formatter(&|x| {
                let q = qs[(*x as usize).min(qs.len() - 1)];
                if q >= 1.0 {
                    "max".into()
                } else {
                    format!("p{}", q * 100.0)
                }
            })
            .y_desc("ms")
            .draw()?;
        chart.draw_series(LineSeries::new(points.clone(), &RED))?;
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, RED.filled())))?;
        Ok(())
    })
}

fn orders_over_time(tally: &Tally, ceilings: &[Ceiling]) -> String {
    let end = tally.samples.iter().map(|s| s.at_ms).max().unwrap_or(0) / 1000;
    let mut per_second = vec![0u32; end as usize + 1];
    for s in tally.samples.iter().filter(|s| s.ok) {
        per_second[(s.at_ms / 1000) as usize] += 1;
    }
    let top = per_second
        .iter()
        .map(|n| f64::from(*n))
        .chain(ceilings.iter().map(|c| c.per_sec))
        .fold(1.0, f64::max)
        * 1.1;
    let colors = [GREEN, MAGENTA, CYAN, BLACK];
    svg(|root| {
        let mut chart = line_chart(
            root,
            "Committed orders per second, beside the ceilings",
            65,
            0f64..f64::from(end.max(1)),
            0f64..top,
        )?;
        chart
            .configure_mesh()
            .x_desc("seconds into the run")
            .y_desc("orders/s")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                per_second
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (i as f64 + 0.5, f64::from(*n))),
                &BLUE,
            ))?
            .label("orders/s")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        for (ceiling, color) in ceilings.iter().zip(colors.iter().cycle()) {
            let color = *color;
            chart
                .draw_series(LineSeries::new(
                    [
                        (0.0, ceiling.per_sec),
                        (f64::from(end.max(1)), ceiling.per_sec),
                    ],
                    color,
                ))?
                .label(ceiling.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart.configure_series_labels().border_style(BLACK).draw()?;
        Ok(())
    })
}

fn bar_chart(bars: &Bars) -> String {
    let rows = &bars.rows;
    let top = rows.iter().map(|r| r.1).fold(1.0, f64::max) * 1.1;
    let height = (60 + 22 * rows.len() as u32).max(140);
    svg_sized(WIDTH, height, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(&bars.title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(10)
            .build_cartesian_2d(0f64..top, 0f64..rows.len().max(1) as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .draw()?;
        chart.draw_series(rows.iter().enumerate().map(|(i, (_, v))| {
            let y = i as f64;
            Rectangle::new([(0.0, y + 0.15), (*v, y + 0.85)], BLUE.mix(0.35).filled())
        }))?;
        // Each row's name and value, written over its bar.
        chart.draw_series(rows.iter().enumerate().map(|(i, (label, v))| {
            Text::new(
                format!("{label}: {v}"),
                (top * 0.005, i as f64 + 0.75),
                ("sans-serif", 13),
            )
        }))?;
        Ok(())
    })
}

type Drawn = anyhow::Result<()>;

/// A chart of the report's lines: `caption` on top, `x` by `y`, with
/// `y_labels` pixels for the y axis's labels.
fn line_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    y_labels: u32,
    x: Range<f64>,
    y: Range<f64>,
) -> Result<
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    DrawingAreaErrorKind<std::io::Error>,
> {
    ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(y_labels)
        .build_cartesian_2d(x, y)
}

fn svg(draw: impl FnOnce(&DrawingArea<SVGBackend, plotters::coord::Shift>) -> Drawn) -> String {
    svg_sized(WIDTH, HEIGHT, draw)
}

fn svg_sized(
    width: u32,
    height: u32,
    draw: impl FnOnce(&DrawingArea<SVGBackend, plotters::coord::Shift>) -> Drawn,
) -> String {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        let drawn = root
            .fill(&WHITE)
            .map_err(Into::into)
            .and_then(|()| draw(&root));
        if let Err(error) = drawn.and_then(|()| root.present().map_err(Into::into)) {
            return format!("<p>chart not drawn: {}</p>", escape(&error.to_string()));
        }
    }
    out
}

/// Writes a report under `target/loadtest/` and says where.
pub fn save(name: &str, page: &str) {
    let dir = std::path::Path::new("target").join("loadtest");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
        let path = dir.join(format!("{name}-{stamp}.html"));
        std::fs::write(&path, page).map(|()| path)
    });
    match written {
        Ok(path) => eprintln!("report: {}", path.display()),
        Err(error) => eprintln!("report not written: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::Sample;

    fn tally() -> Tally {
        let mut tally = Tally::new();
        for i in 0..3_000u32 {
            let micros = 1_000 + (i % 97) * 150;
            tally.samples.push(Sample {
                at_ms: i,
                micros,
                ok: i % 3 == 0,
            });
            tally.latency.saturating_record(u64::from(micros));
            tally.requests += 1;
            *tally
                .statuses
                .entry(if i % 3 == 0 { "200" } else { "409 sold_out" }.to_owned())
                .or_default() += 1;
        }
        tally
    }

    #[test]
    fn a_report_is_self_contained_and_renders_in_chromium() {
        let tally = tally();
        let page = html(
            "test run",
            &[Section {
                title: "throughput".into(),
                tally: &tally,
                facts: vec![("orders".into(), "1000".into())],
                ceilings: Some(vec![Ceiling {
                    label: "pgbench, 1 order per transaction".into(),
                    per_sec: 800.0,
                }]),
            }],
            &[("Table", "<table><tr><td>a</td></tr></table>".to_owned())],
            &[Bars {
                title: "Oversold units".into(),
                rows: vec![
                    ("naive x1 none".into(), 113.0),
                    ("fenced x2 sale".into(), 0.0),
                ],
            }],
        );
        assert_eq!(page.matches("<svg").count(), 5, "five charts");
        for outside in ["<script", "http://", "https://", "src="] {
            // SVG's own namespace URL is the only address in the page.
            let found = page
                .match_indices(outside)
                .filter(|(i, _)| !page[*i..].starts_with("http://www.w3.org"))
                .count();
            assert_eq!(found, 0, "the report refers to {outside}");
        }
        assert!(page.contains("Latency over time") && page.contains("pgbench"));

        let dir = std::env::temp_dir().join(format!("report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("report.html");
        std::fs::write(&file, &page).unwrap();
        let shot = dir.join("report.png");
        let status = testkit::headless_chromium(&dir.join("profile"))
            .arg("--window-size=800,2400")
            .arg(format!("--screenshot={}", shot.display()))
            .arg(format!("file://{}", file.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("chromium runs");
        assert!(status.success());
        let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(size > 20_000, "the screenshot has {size} bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
