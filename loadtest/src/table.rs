//! Tables of measured figures: printed aligned on the terminal and, with
//! `--record`, written as Markdown into the guide
//! (`docs/guide/src/measured/`), so that every figure the guide shows comes
//! from a run and a rerun refreshes it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// A header and rows of cells, all text.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: ToString>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows
            .push(cells.into_iter().map(|c| c.to_string()).collect());
    }

    /// Whether every cell of column `i` reads as a number (right-aligned).
    fn numeric(&self, i: usize) -> bool {
        self.rows.iter().all(|r| {
            r.get(i).is_none_or(|c| {
                let c = c.trim_end_matches('x').replace(',', "");
                c == "-" || c.parse::<f64>().is_ok()
            })
        })
    }

    /// Aligned columns, for a terminal.
    pub fn text(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .chain([&self.header[i]])
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let numeric: Vec<bool> = (0..self.header.len()).map(|i| self.numeric(i)).collect();
        let mut out = String::new();
        for cells in std::iter::once(&self.header).chain(&self.rows) {
            let line: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let w = widths.get(i).copied().unwrap_or(0);
                    if numeric.get(i).copied().unwrap_or(false) {
                        format!("{c:>w$}")
                    } else {
                        format!("{c:<w$}")
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
        }
        out
    }

    /// A GitHub-flavoured Markdown table (numbers right-aligned).
    pub fn markdown(&self) -> String {
        let cell = |c: &str| c.replace('|', "\\|");
        let mut out = format!(
            "| {} |\n|{}|\n",
            self.header
                .iter()
                .map(|h| cell(h))
                .collect::<Vec<_>>()
                .join(" | "),
            (0..self.header.len())
                .map(|i| if self.numeric(i) { "---:" } else { "---" })
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} |",
                r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        out
    }

    /// An HTML table (for the run's report); `**bold**` and `` `code` ``
    /// in cells become `<b>` and `<code>`.
    pub fn html(&self) -> String {
        let cell = |tag: &str, text: &str| {
            let mut out = String::new();
            let (mut bold, mut code) = (false, false);
            let mut rest = text;
            while let Some(c) = rest.chars().next() {
                if let Some(after) = rest.strip_prefix("**") {
                    bold = !bold;
                    out.push_str(if bold { "<b>" } else { "</b>" });
                    rest = after;
                    continue;
                }
                match c {
                    '`' => {
                        code = !code;
                        out.push_str(if code { "<code>" } else { "</code>" });
                    }
                    '<' => out.push_str("&lt;"),
                    '>' => out.push_str("&gt;"),
                    '&' => out.push_str("&amp;"),
                    c => out.push(c),
                }
                rest = &rest[c.len_utf8()..];
            }
            format!("<{tag}>{out}</{tag}>")
        };
        let mut out = String::from("<table>\n<tr>");
        for h in &self.header {
            out.push_str(&cell("th", h));
        }
        out.push_str("</tr>\n");
        for row in &self.rows {
            out.push_str("<tr>");
            for c in row {
                out.push_str(&cell("td", c));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
        out
    }
}

/// The command line of a `--record` run; unset when not recording.
static RECORDING: OnceLock<String> = OnceLock::new();

/// Turns recording on for this run, remembering how it was started.
pub fn start_recording() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let _ = RECORDING.set(format!(
        "cargo run --release -p loadtest -- {}",
        args.join(" ")
    ));
}

/// Where the guide keeps its measured tables.
pub fn measured_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("docs/guide/src/measured")
}

/// What this run recorded so far: page name -> captioned tables.
static RECORDED: Mutex<BTreeMap<String, Vec<(String, Table)>>> = Mutex::new(BTreeMap::new());

/// With `--record`, adds `table` under `caption` to the guide's page
/// `measured/<name>.md` and writes the page anew (headed by the command and
/// the date, then every table this run gave it); otherwise nothing.
pub fn record(name: &str, caption: &str, table: &Table) {
    let Some(command) = RECORDING.get() else {
        return;
    };
    let mut recorded = RECORDED.lock().unwrap_or_else(|e| e.into_inner());
    let tables = recorded.entry(name.to_owned()).or_default();
    tables.push((caption.to_owned(), table.clone()));
    let mut page = format!(
        "<!-- Written by loadtest --record; a rerun replaces it. Do not edit. -->\n\
         *Measured {} on {} cores: `{command}`*\n",
        chrono::Utc::now().format("%Y-%m-%d"),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    for (caption, table) in tables.iter() {
        if !caption.is_empty() {
            let _ = write!(page, "\n**{caption}**\n");
        }
        let _ = write!(page, "\n{}", table.markdown());
    }
    let dir = measured_dir();
    let path = dir.join(format!("{name}.md"));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, page)) {
        Ok(()) => eprintln!("recorded: {}", path.display()),
        Err(e) => eprintln!("not recorded ({}): {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(["design", "orders/s", "p99 ms"]);
        t.row(["single", "412", "680.1"]);
        t.row(["batched | 256", "5,052", "-"]);
        t
    }

    #[test]
    fn markdown_right_aligns_numbers_and_escapes_pipes() {
        assert_eq!(
            sample().markdown(),
            "| design | orders/s | p99 ms |\n|---|---:|---:|\n\
             | single | 412 | 680.1 |\n| batched \\| 256 | 5,052 | - |\n"
        );
    }

    #[test]
    fn html_escapes_and_turns_bold_and_code_into_tags() {
        let mut t = Table::new(["strategy", "1 inst."]);
        t.row(["`naive`", "**oversold 3** <5 & more>"]);
        assert_eq!(
            t.html(),
            "<table>\n<tr><th>strategy</th><th>1 inst.</th></tr>\n\
             <tr><td><code>naive</code></td><td><b>oversold 3</b> &lt;5 &amp; more&gt;</td></tr>\n</table>\n"
        );
    }

    #[test]
    fn text_pads_every_column_to_its_widest_cell() {
        let text = sample().text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "design         orders/s  p99 ms");
        assert_eq!(lines[1], "single              412   680.1");
        assert_eq!(lines[2], "batched | 256     5,052       -");
    }
}
