//! A Patroni cluster of a test's or a run's own (`scripts/ha.sh`): three
//! Postgres nodes, etcd and haproxy, up in a directory of its own, down
//! when dropped; clusters of processes that died before stopping theirs
//! are stopped first.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Names of the clusters in the temp directory: `<prefix><id>` holds one,
/// `<prefix><id>.pid` the id of the process that owns it.
const PREFIX: &str = "seckill-ha-";

/// A cluster brought up by `scripts/ha.sh up`. Its directory is in the
/// temp directory, not the repository: run as root, Postgres runs as the
/// `postgres` user, which may not reach into where the repository was
/// cloned.
pub struct Cluster {
    dir: PathBuf,
    /// haproxy's address as a URL without a database name: it leads to
    /// the primary, whichever node that is.
    pub server: String,
}

impl Cluster {
    /// A new cluster (Patroni, etcd-server and haproxy must be installed:
    /// `scripts/deps.sh` with `SECKILL_TEST_TOOLS=1` installs them).
    pub fn up() -> anyhow::Result<Self> {
        stop_abandoned();
        static CLUSTERS: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(&name);
        std::fs::write(dir.with_extension("pid"), std::process::id().to_string())
            .context("cannot write the cluster's pid file")?;
        // Owned before `up` runs: a failed start is stopped by Drop too.
        let mut cluster = Self {
            dir,
            server: String::new(),
        };
        let stdout = cluster.run("up")?;
        let url = stdout
            .lines()
            .find_map(|line| line.strip_prefix("DATABASE_URL="))
            .context("scripts/ha.sh up printed no DATABASE_URL=")?;
        cluster.server = url
            .rsplit_once('/')
            .with_context(|| format!("no database in {url}"))?
            .0
            .to_owned();
        Ok(cluster)
    }

    /// `scripts/ha.sh <command>` (`kill-primary`, `switchover`, `status`,
    /// ...): what it printed, or why it failed with what it printed.
    pub fn run(&self, command: &str) -> anyhow::Result<String> {
        let out = script(&self.dir, command)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(anyhow::anyhow!("scripts/ha.sh {command} failed:\n{text}"))
        }
    }

    /// The cluster's directory: `HA_DIR` for `scripts/ha.sh` commands run
    /// by hand on it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `patronictl list`, for the messages of failures.
    pub fn status(&self) -> String {
        self.run("status")
            .unwrap_or_else(|failed| format!("{failed:#}"))
    }

    /// `scripts/ha.sh logs`: the end of each process's log (etcd's,
    /// haproxy's, each node's Patroni), for the messages of failures that
    /// need Patroni's own story.
    pub fn logs(&self) -> String {
        self.run("logs")
            .unwrap_or_else(|failed| format!("{failed:#}"))
    }

    /// A leader and a synchronous standby running (or, in newer Patroni,
    /// streaming), as `patronictl list` shows them: until then a second
    /// kill could leave nobody to promote.
    pub fn has_sync_standby(&self) -> bool {
        self.run("status").is_ok_and(|table| {
            table.lines().any(|l| {
                l.contains("Sync Standby") && (l.contains("streaming") || l.contains("running"))
            }) && table
                .lines()
                .any(|l| l.contains("Leader") && l.contains("running"))
        })
    }

    /// A leader running with no standby, as `patronictl list` shows the
    /// cluster: no member is the synchronous standby, and no other member
    /// runs or streams (a stopped one stays listed, `stopped`, until its
    /// key expires).
    pub fn leads_alone(&self) -> bool {
        self.run("status").is_ok_and(|table| {
            let members: Vec<&str> = table.lines().filter(|l| l.contains("127.0.0.1:")).collect();
            let up = |l: &&str| l.contains("running") || l.contains("streaming");
            members
                .iter()
                .any(|l| l.contains("Leader") && l.contains("running"))
                && !members.iter().any(|l| l.contains("Sync Standby"))
                && !members.iter().any(|l| !l.contains("Leader") && up(l))
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match self.run("down") {
            Ok(_) => {
                let _ = std::fs::remove_file(self.dir.with_extension("pid"));
            }
            Err(failed) => eprintln!("{failed:#}"),
        }
    }
}

/// `scripts/ha.sh <command>` with `HA_DIR=dir`.
fn script(dir: &Path, command: &str) -> anyhow::Result<Output> {
    Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ha.sh"))
        .arg(command)
        .env("HA_DIR", dir)
        .output()
        .context("cannot run scripts/ha.sh")
}

/// Stops the clusters of processes that died before their `Drop` ran
/// (killed, interrupted): left alone, each would keep three Patroni loops
/// and Postgres servers running on the machine.
fn stop_abandoned() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(PREFIX) || !name.ends_with(".pid") {
            continue;
        }
        let owner = std::fs::read_to_string(&path).unwrap_or_default();
        if Path::new("/proc").join(owner.trim()).exists() {
            continue;
        }
        if script(&path.with_extension(""), "down").is_ok_and(|out| out.status.success()) {
            let _ = std::fs::remove_file(&path);
        }
    }
}
