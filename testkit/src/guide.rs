//! The guide's pages as a reader runs them: a page's `sh` blocks (all of
//! them, or those of one section), each with the `text` block the page
//! says it prints, and the one `bash` that runs them in order. Used by the
//! tests that run pages (the race by hand, the "Try it" sections).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `sh` block and what the page says it prints.
#[derive(Debug)]
pub struct Block {
    /// The line of its opening fence in the page, from 1.
    pub line: usize,
    pub shell: String,
    /// The `text` block that follows it with nothing but blank lines
    /// between.
    pub expected: Option<String>,
}

/// The `sh` blocks of `markdown` (the page `page`, named in failures), or
/// of its section from the heading `section` (a `## ` line, as written) to
/// the next `## ` heading; lines are counted in the whole page.
pub fn shell_blocks(page: &str, markdown: &str, section: Option<&str>) -> Vec<Block> {
    let lines: Vec<&str> = markdown.lines().collect();
    let fenced = fences(page, markdown, section);
    let mut blocks = Vec::new();
    for (k, (line, info, body, end)) in fenced.iter().enumerate() {
        if info != "sh" {
            continue;
        }
        // The next fence is this block's output if only blank lines part them.
        let expected = fenced.get(k + 1).and_then(|(next, info, body, _)| {
            let between = &lines[*end..*next - 1];
            (info == "text" && between.iter().all(|l| l.trim().is_empty())).then(|| body.clone())
        });
        blocks.push(Block {
            line: *line,
            shell: body.clone(),
            expected,
        });
    }
    blocks
}

/// The fenced blocks (of `section`, or of the whole page): (line of the
/// opening fence, info string, body, line of the closing fence).
fn fences(
    page: &str,
    markdown: &str,
    section: Option<&str>,
) -> Vec<(usize, String, String, usize)> {
    let mut found = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    let mut inside = section.is_none();
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.take() {
            None => {
                if let (Some(heading), true) = (section, line.starts_with("## ")) {
                    inside = line.trim_end() == heading;
                } else if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((i, info.trim().to_owned(), String::new()));
                }
            }
            Some((start, info, mut body)) => {
                if trimmed.trim_end() == "```" {
                    if inside {
                        found.push((start + 1, info, body, i + 1));
                    }
                } else {
                    body.push_str(line);
                    body.push('\n');
                    open = Some((start, info, body));
                }
            }
        }
    }
    assert!(open.is_none(), "{page}: a fenced block is never closed");
    found
}

/// Printed after each block, with the block's exit status.
const MARK: &str = "@@guide: block done, status";

/// One `bash` running a page's blocks in order from `root`, as a reader
/// types them into one shell: in a process group of its own (whatever a
/// block leaves running goes with it when the session is dropped), its
/// output read as it comes, block by block.
pub struct Session {
    child: Child,
    lines: Receiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    script: PathBuf,
}

impl Session {
    /// Starts bash on a script of `prelude` and then `blocks`, each
    /// followed by its mark, with `env` added to the environment; `name`
    /// names the script's file.
    pub fn start(
        root: &Path,
        name: &str,
        prelude: &str,
        blocks: &[Block],
        env: &[(String, String)],
    ) -> Self {
        let mut text = String::from(prelude);
        for block in blocks {
            text.push_str(&block.shell);
            text.push_str(&format!("\nprintf '\\n%s %s\\n' '{MARK}' \"$?\"\n"));
        }
        let script =
            std::env::temp_dir().join(format!("seckill-guide-{name}-{}.sh", std::process::id()));
        std::fs::write(&script, text).expect("the script is written");
        let mut child = Command::new("bash")
            .arg("--noprofile")
            .arg("--norc")
            .arg(&script)
            .current_dir(root)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("bash runs");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let errors = child.stderr.take().expect("piped");
        let kept = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(errors).lines().map_while(Result::ok) {
                eprintln!("  | {line}");
                kept.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            lines,
            stderr,
            script,
        }
    }

    /// What the next block printed and its exit status (`None` if bash
    /// ended in it), or `Err` with what it printed if it did not end within
    /// `limit`.
    pub fn next_block(&self, limit: Duration) -> Result<(String, Option<i32>), String> {
        let deadline = Instant::now() + limit;
        let mut printed = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(status) = line.strip_prefix(MARK) {
                        return Ok((printed, status.trim().parse().ok()));
                    }
                    eprintln!("  > {line}");
                    printed.push_str(&line);
                    printed.push('\n');
                }
                Err(RecvTimeoutError::Timeout) => return Err(printed),
                Err(RecvTimeoutError::Disconnected) => return Ok((printed, None)),
            }
        }
    }

    /// The last 40 lines bash wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.script);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_read_with_their_outputs_in_the_page_or_in_one_section() {
        let page = "# P\n```sh\necho before\n```\n## Try it\n```sh\necho a\n```\n\n```text\na\n```\n\n```sh\necho b\n```\nprose\n```text\nnot b's\n```\n## Next\n```sh\necho after\n```\n";
        let all = shell_blocks("p.md", page, None);
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].shell, "echo before\n");
        let found = shell_blocks("p.md", page, Some("## Try it"));
        assert_eq!(found.len(), 2, "only the blocks under Try it: {found:?}");
        assert_eq!(found[0].line, 6);
        assert_eq!(found[0].shell, "echo a\n");
        assert_eq!(found[0].expected.as_deref(), Some("a\n"));
        assert_eq!(found[1].expected, None, "prose between: not its output");
    }

    #[test]
    fn a_session_runs_the_blocks_in_one_shell_and_tells_each_ones_output_and_status() {
        let page = "```sh\nX=1\necho one $X\n```\n```sh\necho two $X $FROM_ENV; false\n```\n```sh\nexit 3\n```\n";
        let blocks = shell_blocks("p.md", page, None);
        let env = [("FROM_ENV".to_owned(), "env".to_owned())];
        let session = Session::start(Path::new("."), "unit", "", &blocks, &env);
        let limit = Duration::from_secs(20);
        // The mark's printf starts with a newline: a blank line ends each.
        assert_eq!(session.next_block(limit), Ok(("one 1\n\n".into(), Some(0))));
        assert_eq!(
            session.next_block(limit),
            Ok(("two 1 env\n\n".into(), Some(1)))
        );
        assert_eq!(session.next_block(limit), Ok((String::new(), None)));
    }
}
