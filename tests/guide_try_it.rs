//! The guide's "Try it" sections, run as a reader runs them: each page's
//! `sh` blocks under its `## Try it` heading (the reference page
//! `http-api.md`: under `## Examples`), exactly as written and in order, in
//! one `bash` from the repository's root, against a `seckill` started for
//! the page as `scripts/run.sh` starts it (`serve --demo`, the
//! default limits) on a free port, with a database and a Redis key prefix
//! of its own, and `ADMIN` and `BASE` exported, as the page tells the
//! reader to set them (the page's `ADMIN=<...>` line is the one line not
//! run). Two settings differ from `scripts/run.sh`: the shedder is off
//! (`SECKILL_SHED_DELAY_MS=0`), so that a busy machine does not turn an
//! answer into `503`, and the logs say only warnings. A page whose "Try
//! it" tells the reader to start the service with variables (a line
//! `NAME=value ... scripts/run.sh` in a block that is not `sh`, so not
//! run) gets its service started with them. The failover page's runs on a Patroni
//! cluster of the test's own, as the page has the reader bring one up.
//!
//! Every block runs under `set -e`: a command that fails fails the test,
//! with the command. Where a `text` block follows a `sh` block (nothing
//! but blank lines between), what the block printed (stdout and stderr)
//! must be that text, where `...` stands for anything that changes from run
//! to run (ids, tickets, times, headers). A wait of the page (`until_has`
//! of `scripts/try.sh`) is bounded, and so is every block here.
//!
//! The tests need `bash`, `curl` and `python3` (the helpers pick fields out
//! of the JSON with it); where one is missing they fail, naming it.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::guide::{shell_blocks, Session};
use testkit::{drop_database_on, ServiceProcess};

/// Longest a block may take: the longest wait of a page is `until_has`'s
/// 20 s, on a machine busy with other builds.
const BLOCK_LIMIT: Duration = Duration::from_secs(45);
/// Longest the service may take to answer `/readyz` (it creates and
/// migrates its database first).
const READY_LIMIT: Duration = Duration::from_secs(60);
/// The line of the page's first block that the test sets for the reader.
const ADMIN_LINE: &str = "ADMIN=<the admin token run.sh printed>";

/// Carriage returns (of the headers `curl -i` shows) and trailing blanks go.
fn normalized(text: &str) -> String {
    text.replace('\r', "")
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}

/// Whether `got` is `want`, where each `...` of `want` stands for any text
/// (none, or several lines).
fn matches(want: &str, got: &str) -> bool {
    let pieces: Vec<&str> = want.split("...").collect();
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if pieces.len() == 1 {
        return got == want;
    }
    if !got.starts_with(first) || got.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &got[first.len()..];
    for piece in &pieces[1..pieces.len() - 1] {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Fails the test, naming the tool, when `tool` is not on the PATH.
fn require(tool: &str, why: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let skip = if tool == "bash" {
        String::new()
    } else {
        format!("; `cargo test -- --skip needs_{tool}` leaves these tests out")
    };
    assert!(
        found,
        "{tool} is not on the PATH: the \"Try it\" sections need it ({why}){skip}"
    );
}

/// A `seckill` as `scripts/run.sh` starts it, with a database and a key
/// prefix of its own; on drop it is stopped, its database dropped and its
/// keys deleted.
struct Service {
    process: Option<ServiceProcess>,
    admin: String,
    /// The Postgres server of its database, as a URL without a database.
    server: String,
    db_name: String,
    prefix: String,
    log: PathBuf,
}

/// A runtime for the service's start and stop (the blocks run in `bash`).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

impl Service {
    fn start(name: &str, server: &str, environment: &[(String, String)]) -> Self {
        let tag = format!("tryit_{name}_{}", std::process::id());
        let db_name = format!("seckill_{tag}");
        let prefix = format!("{tag}:");
        let mut random = [0u8; 24];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .expect("/dev/urandom reads");
        let admin: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let log = std::env::temp_dir().join(format!("seckill-{tag}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_seckill"));
        command
            .args(["serve", "--demo"])
            .env("DATABASE_URL", format!("{server}/{db_name}"))
            .env("REDIS_URL", testkit::redis_url())
            .env("SECKILL_REDIS_PREFIX", &prefix)
            .env("SECKILL_ADMIN_TOKEN", &admin)
            .env("SECKILL_SHED_DELAY_MS", "0")
            .env("RUST_LOG", "warn")
            .envs(environment.iter().map(|(k, v)| (k, v)))
            .stdout(std::fs::File::create(&log).expect("the log is created"))
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("the log opens"),
            ));
        let mut service = Self {
            process: None,
            admin,
            server: server.to_owned(),
            db_name,
            prefix,
            log,
        };
        match runtime().block_on(ServiceProcess::start(command, READY_LIMIT)) {
            Ok(process) => service.process = Some(process),
            Err(e) => panic!("{e:#}; its log ends:\n{}", service.log_tail()),
        }
        service
    }

    /// Its address, `http://127.0.0.1:PORT`.
    fn base(&self) -> &str {
        self.process.as_ref().expect("started").base()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let process = self.process.take();
        let (server, db_name, prefix) = (&self.server, &self.db_name, &self.prefix);
        runtime().block_on(async move {
            // SIGTERM, as Ctrl-C stops scripts/run.sh; SIGKILL if it lingers.
            if let Some(process) = process {
                process.stop(Duration::from_secs(15)).await;
            }
            drop_database_on(server, &testkit::redis_url(), db_name, prefix).await;
        });
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The variables the "Try it" section of `markdown` has the reader start
/// `scripts/run.sh` with: those of a line `NAME=value ... scripts/run.sh`.
fn start_environment(markdown: &str) -> Vec<(String, String)> {
    let section = markdown
        .lines()
        .skip_while(|l| l.trim_end() != "## Try it")
        .skip(1)
        .take_while(|l| !l.starts_with("## "));
    for line in section {
        let Some(assignments) = line.trim().strip_suffix("scripts/run.sh") else {
            continue;
        };
        let pairs: Option<Vec<(String, String)>> = assignments
            .split_whitespace()
            .map(|word| {
                let (name, value) = word.split_once('=')?;
                let named = name.starts_with(|c: char| c.is_ascii_uppercase())
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
                named.then(|| (name.to_owned(), value.to_owned()))
            })
            .collect();
        if let Some(pairs) = pairs.filter(|p| !p.is_empty()) {
            return pairs;
        }
    }
    Vec::new()
}

/// Runs the "Try it" section of the guide's `page` and checks it.
fn run_try_it(page: &str) {
    run_section(page, "## Try it", None);
}

/// Runs the section of the guide's `page` under the heading `section` (a
/// `## ` line, as written) and checks it; with a Patroni `cluster`, the
/// service's database is on it and `HA_DIR` names it to the page's
/// `scripts/ha.sh` commands.
fn run_section(page: &str, section: &str, cluster: Option<&testkit::ha::Cluster>) {
    require("bash", "the blocks run in one bash");
    require("curl", "every request is a curl");
    require("python3", "scripts/try.sh's json picks fields with it");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = format!("docs/guide/src/{page}");
    let markdown = std::fs::read_to_string(root.join(&path)).expect("the page is there");
    let mut blocks = shell_blocks(&path, &markdown, Some(section));
    assert!(
        blocks.len() >= 2,
        "{path}: {} sh blocks under \"{section}\"; the section was rewritten?",
        blocks.len()
    );
    assert!(
        blocks.iter().all(|b| b.expected.is_some()),
        "{path}: every block under \"{section}\" shows what it prints (a text block under it)"
    );
    // The reader sets ADMIN to the token run.sh printed: here the
    // environment does, and that line is the one not run.
    let first = &mut blocks[0];
    assert!(
        first.shell.lines().next() == Some(ADMIN_LINE)
            && first.shell.lines().nth(1) == Some("source scripts/try.sh"),
        "{path}, line {}: the first block starts with `{ADMIN_LINE}` and \
         `source scripts/try.sh`:\n{}",
        first.line,
        first.shell
    );
    first.shell = first.shell.replacen(&format!("{ADMIN_LINE}\n"), "", 1);

    let server = cluster.map_or_else(testkit::pg_server, |c| c.server.clone());
    let service = Service::start(
        page.trim_end_matches(".md").replace('-', "_").as_str(),
        &server,
        &start_environment(&markdown),
    );
    // One script: stderr with stdout, every failing command fatal (and
    // named); ADMIN and BASE as the reader sets them.
    let prelude = "exec 2>&1\nset -e\ntrap 'echo \"failed ($?): $BASH_COMMAND\"' ERR\n";
    let mut env = vec![
        ("ADMIN".to_owned(), service.admin.clone()),
        ("BASE".to_owned(), service.base().to_owned()),
    ];
    if let Some(cluster) = cluster {
        env.push(("HA_DIR".to_owned(), cluster.dir().display().to_string()));
    }
    let name = format!("try-it-{}", page.trim_end_matches(".md"));
    let session = Session::start(&root, &name, prelude, &blocks, &env);
    let mut failures = Vec::new();
    let mut timings = Vec::new();
    for block in &blocks {
        eprintln!("{path}: the block at line {}:", block.line);
        let started = Instant::now();
        let outcome = session.next_block(BLOCK_LIMIT);
        let (printed, status) = match outcome {
            Ok(done) => done,
            Err(printed) => panic!(
                "{path}: the block at line {} did not end within {BLOCK_LIMIT:?}; it \
                 printed:\n{printed}\nthe service's log ends:\n{}",
                block.line,
                service.log_tail()
            ),
        };
        timings.push((block.line, started.elapsed()));
        assert_eq!(
            status,
            Some(0),
            "{path}: the block at line {} failed; it printed:\n{printed}\nthe service's log \
             ends:\n{}",
            block.line,
            service.log_tail()
        );
        if let Some(expected) = &block.expected {
            // The mark's printf starts with a newline: the last line of a
            // block that printed no newline of its own ends there.
            if !matches(&normalized(expected), &normalized(&printed)) {
                failures.push(format!(
                    "the block at line {} printed\n{printed}\nwhere the page says\n{expected}",
                    block.line
                ));
            }
        }
    }
    for (line, took) in &timings {
        eprintln!(
            "{path}: the block at line {line}: {:.2} s",
            took.as_secs_f64()
        );
    }
    assert!(
        failures.is_empty(),
        "{path}'s \"{section}\" does not print what the page says:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_waiting_rooms_try_it_runs_as_written_needs_curl_needs_python3() {
    run_try_it("waiting-room.md");
}

#[test]
fn the_async_sales_try_it_runs_as_written_needs_curl_needs_python3() {
    run_try_it("async.md");
}

#[test]
fn the_lifecycles_try_it_runs_as_written_needs_curl_needs_python3() {
    run_try_it("lifecycle.md");
}

#[test]
fn the_units_try_it_runs_as_written_needs_curl_needs_python3() {
    run_try_it("units.md");
}

#[test]
fn the_shop_pages_try_it_runs_as_written_needs_curl_needs_python3() {
    run_try_it("shop.md");
}

/// The failover page's, on a Patroni cluster of the test's own (the page
/// has the reader bring one up with `scripts/ha.sh up`, which installs
/// its pinned Patroni where it keeps it, off the PATH: the cluster's start
/// fails naming what is missing).
#[test]
fn the_failover_pages_try_it_runs_as_written_needs_curl_needs_python3_needs_patroni() {
    let cluster = testkit::ha::Cluster::up().expect("a Patroni cluster comes up");
    run_section("failover.md", "## Try it", Some(&cluster));
}

#[test]
fn the_abuse_pages_try_it_runs_as_written_needs_curl_needs_python3() {
    run_try_it("abuse.md");
}

/// The reference page's examples: a voucher read with its cache headers
/// and a `304`, a purchase and `already_purchased`, an order read by its
/// user and by another, and refusals of the contract's shape.
#[test]
fn the_http_api_pages_examples_run_as_written_needs_curl_needs_python3() {
    run_section("http-api.md", "## Examples", None);
}

/// How a page's output is compared (how its blocks are read is
/// `testkit::guide`'s, tested there).
#[test]
fn try_it_outputs_match_where_dots_stand_for_what_changes() {
    assert!(matches("a", "a"));
    assert!(!matches("a", "ab"));
    assert!(matches(
        "{\"id\":\"...\",\"x\":1}",
        "{\"id\":\"123\",\"x\":1}"
    ));
    assert!(!matches(
        "{\"id\":\"...\",\"x\":1}",
        "{\"id\":\"123\",\"x\":2}"
    ));
    assert!(matches(
        "HTTP/1.1 202\n...\nbody",
        "HTTP/1.1 202\ndate: x\nid: y\n\nbody"
    ));
    assert!(!matches("a...a", "a"), "the two ends do not overlap");
    assert_eq!(normalized("x\r\ny  \n\n"), "x\ny");
}

/// Which variables a page's service is started with.
#[test]
fn a_pages_start_command_gives_its_service_its_variables() {
    let page = "## Try it\n```console\nA_B2=1 C=x/y scripts/run.sh\n```\n";
    assert_eq!(
        start_environment(page),
        vec![
            ("A_B2".to_owned(), "1".to_owned()),
            ("C".to_owned(), "x/y".to_owned())
        ]
    );
    assert!(start_environment("## Try it\nrun scripts/run.sh\n").is_empty());
    assert!(
        start_environment("A=1 scripts/run.sh\n## Try it\n").is_empty(),
        "only the Try it section's"
    );
}
