//! The Patroni cluster of a run: up in a directory of its own, down when
//! dropped.

use std::path::PathBuf;
use std::process::{Command, Output};

/// A cluster brought up by `scripts/ha.sh up` in a directory of its own in
/// the temp directory (run as root, Postgres runs as the `postgres` user,
/// which may not reach into the repository); `down` when dropped, so an
/// error anywhere still stops it.
pub(super) struct Cluster {
    dir: PathBuf,
    /// haproxy's address as a URL without a database name.
    pub server: String,
}

impl Cluster {
    pub(super) fn up() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!(
            "seckill-ha-loadtest-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        // Owned before `up` runs: a failed start is stopped by Drop too.
        let mut cluster = Self {
            dir,
            server: String::new(),
        };
        let out = cluster.script("up")?;
        if !out.status.success() {
            return Err(format!(
                "scripts/ha.sh up failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let url = stdout
            .lines()
            .find_map(|line| line.strip_prefix("DATABASE_URL="))
            .ok_or("scripts/ha.sh up printed no DATABASE_URL=")?;
        cluster.server = url
            .rsplit_once('/')
            .ok_or_else(|| format!("no database in {url}"))?
            .0
            .to_owned();
        Ok(cluster)
    }

    fn script(&self, command: &str) -> Result<Output, String> {
        Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ha.sh"))
            .arg(command)
            .env("HA_DIR", &self.dir)
            .output()
            .map_err(|e| format!("cannot run scripts/ha.sh: {e}"))
    }

    pub(super) fn run(&self, command: &str) -> Result<String, String> {
        let out = self.script(command)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("scripts/ha.sh {command} failed:\n{text}"))
        }
    }

    /// A leader and a synchronous standby running (or, in newer Patroni,
    /// streaming), as `patronictl list` shows them: until then a second kill could leave nobody to promote.
    pub(super) fn has_sync_standby(&self) -> bool {
        self.run("status").is_ok_and(|table| {
            table.lines().any(|l| {
                l.contains("Sync Standby") && (l.contains("streaming") || l.contains("running"))
            }) && table
                .lines()
                .any(|l| l.contains("Leader") && l.contains("running"))
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        say!("stopping the cluster");
        if let Err(e) = self.run("down") {
            say!("{e}");
        }
    }
}
