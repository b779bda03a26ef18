//! Where a run's CPU went, on this machine: the service instances this
//! driver started, the driver itself, every `postgres` process, and Redis
//! (its own `INFO cpu`). Read from `/proc` (Linux); a part that cannot be
//! read is left out, never guessed.

use std::collections::BTreeMap;

use crate::service::Target;

/// CPU seconds (user + system) spent so far, per part.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub parts: BTreeMap<&'static str, f64>,
    /// Per `postgres` process: backends come and go, and one that exited
    /// takes its CPU time with it, so a difference is taken per process
    /// (a new one counts from zero).
    postgres: BTreeMap<u32, f64>,
}

impl Usage {
    /// The CPU seconds spent now, per part.
    pub async fn now(target: &Target) -> Self {
        let tick = clock_ticks();
        let mut parts = BTreeMap::new();
        let service: Option<f64> = (0..target.bases.len())
            .map(|i| target.pid(i).and_then(|pid| process_seconds(pid, tick)))
            .sum();
        if let Some(seconds) = service {
            parts.insert("service", seconds);
        }
        if let Some(seconds) = process_seconds(std::process::id(), tick) {
            parts.insert("driver", seconds);
        }
        let postgres = postgres_seconds(tick);
        if !postgres.is_empty() {
            parts.insert("postgres", postgres.values().sum());
        }
        if let Some(seconds) = redis_seconds().await {
            parts.insert("redis", seconds);
        }
        Self { parts, postgres }
    }

    /// The CPU spent between `earlier` and this reading, per part, in
    /// microseconds per unit of work (`units` requests, say).
    pub fn micros_per(&self, earlier: &Usage, units: u64) -> BTreeMap<&'static str, f64> {
        self.parts
            .iter()
            .filter_map(|(part, now)| {
                let spent = if *part == "postgres" {
                    self.postgres
                        .iter()
                        .map(|(pid, now)| now - earlier.postgres.get(pid).copied().unwrap_or(0.0))
                        .sum()
                } else {
                    now - earlier.parts.get(part)?
                };
                let per = spent * 1e6 / units.max(1) as f64;
                Some((*part, (per * 10.0).round() / 10.0))
            })
            .collect()
    }
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process, from `/proc/<pid>/stat`.
fn process_seconds(pid: u32, tick: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_seconds(&stat, tick)
}

/// The fields after the command name (which may hold spaces) are
/// space-separated; utime and stime are the 14th and 15th of the line.
fn stat_seconds(stat: &str, tick: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / tick)
}

/// Every process named `postgres` (the server and its backends), by pid.
fn postgres_seconds(tick: f64) -> BTreeMap<u32, f64> {
    let mut by_pid = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return by_pid;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let is_postgres = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "postgres");
        if is_postgres {
            if let Some(seconds) = process_seconds(pid, tick) {
                by_pid.insert(pid, seconds);
            }
        }
    }
    by_pid
}

/// `used_cpu_sys + used_cpu_user` of the Redis at `REDIS_URL`.
async fn redis_seconds() -> Option<f64> {
    let client = redis::Client::open(crate::service::redis_url()).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .ok()?;
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(':')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    Some(field("used_cpu_sys")? + field("used_cpu_user")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_read_past_a_name_with_spaces() {
        let stat =
            "42 (tokio rt (x)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 0 0";
        assert_eq!(stat_seconds(stat, 100.0), Some(3.0));
    }
}
