//! The guide's pages as a reader runs them: a page's `sh` blocks (all of
//! them, or those of one section), each with the `text` block the page
//! says it prints. Read by the tests that run pages (the race by hand, the
//! "Try it" sections).

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
}
