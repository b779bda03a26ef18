//! The guide's "Try one race by hand" page, run as a reader runs it: its
//! `sh` blocks, exactly as written and in order, in one `bash` from the
//! repository's root. Where a `text` block follows a `sh` block (nothing
//! but blank lines between), what the block printed must be that text,
//! order ids aside (they count up from wherever the database is).
//!
//! Every failure fails the test, the build of the lab binary (the page's
//! first block) too: a wait of the page that gives up, an answer that is
//! not the page's, a block that never ends.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use testkit::guide::{shell_blocks, Session};

const PAGE: &str = "docs/guide/src/lab-by-hand.md";
/// Longest a block may take: the build compiles every dependency the first
/// time (and may wait for another build's lock); the rest are seconds.
const BUILD_LIMIT: Duration = Duration::from_secs(60 * 60);
const BLOCK_LIMIT: Duration = Duration::from_secs(180);

/// `"order_id":"123"` becomes `"order_id":"N"`; trailing blanks go.
fn normalized(text: &str) -> String {
    const KEY: &str = "\"order_id\":\"";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(KEY) {
        out.push_str(&rest[..at + KEY.len()]);
        rest = &rest[at + KEY.len()..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            out.push('N');
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}

#[test]
fn the_race_by_hand_runs_as_written_and_prints_what_the_page_says() {
    // The repository's root, where the reader stands.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the lab crate sits in the repository")
        .to_path_buf();
    let page = std::fs::read_to_string(root.join(PAGE)).expect("the page is there");
    let blocks = shell_blocks(PAGE, &page, None);
    assert!(
        blocks.len() >= 5,
        "{PAGE}: {} sh blocks; the page was rewritten?",
        blocks.len()
    );
    assert!(
        blocks[0].shell.contains("cargo build") && blocks[0].shell.contains("seckill-lab"),
        "{PAGE}: its first sh block is to build the lab binary:\n{}",
        blocks[0].shell
    );
    assert!(
        blocks.iter().filter(|b| b.expected.is_some()).count() >= 4,
        "{PAGE}: the page states what its races print"
    );

    // One shell, as the page asks.
    let session = Session::start(&root, "by-hand", "", &blocks, &[]);
    let mut failures = Vec::new();
    let mut timings = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let limit = if i == 0 { BUILD_LIMIT } else { BLOCK_LIMIT };
        eprintln!("block at line {}:", block.line);
        let started = Instant::now();
        let Ok((printed, status)) = session.next_block(limit) else {
            panic!(
                "{PAGE}: the block at line {} did not end within {limit:?}; stderr ends:\n{}",
                block.line,
                session.stderr_tail()
            );
        };
        timings.push((block.line, started.elapsed()));
        if i == 0 && status != Some(0) {
            panic!(
                "{PAGE}, line {}: the lab binary's build failed (exit status {status:?}), so \
                 the page cannot run; stderr ends:\n{}",
                block.line,
                session.stderr_tail()
            );
        }
        if let Some(expected) = &block.expected {
            let (got, want) = (normalized(&printed), normalized(expected));
            if got != want {
                failures.push(format!(
                    "the block at line {} printed\n{printed}\nwhere the page says\n{expected}",
                    block.line
                ));
            }
        }
    }
    for (line, took) in &timings {
        eprintln!("block at line {line}: {:.2} s", took.as_secs_f64());
    }
    assert!(
        failures.is_empty(),
        "{PAGE} does not run as written:\n{}\nstderr ends:\n{}",
        failures.join("\n"),
        session.stderr_tail()
    );
}

#[test]
fn blocks_and_their_outputs_are_read_as_the_page_lays_them_out() {
    let page = "intro\n```sh\necho a\n```\n\n```text\na\n```\n\n```sh\necho b\n```\nprose\n```text\nnot b's\n```\n";
    let found = shell_blocks(PAGE, page, None);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].shell, "echo a\n");
    assert_eq!(found[0].expected.as_deref(), Some("a\n"));
    assert_eq!(found[1].expected, None, "prose between: not its output");
    assert_eq!(
        normalized("B: {\"order_id\":\"7396\"}  \nA: {\"order_id\":\"12\"}\n"),
        "B: {\"order_id\":\"N\"}\nA: {\"order_id\":\"N\"}"
    );
}
