//! Where a run's CPU went, on this machine: the service instances (those
//! this driver started, or, for a `--url` on this machine's loopback, the
//! process listening on its port), the driver itself, every `postgres`
//! process, and Redis (its own `INFO cpu`). Read from `/proc` (Linux); a
//! part that cannot be read is left out, never guessed.

use std::collections::BTreeMap;

use crate::drive::{Request, Tally};
use crate::service::Target;

/// Sends each of `plan`'s requests once over `connections`: what they
/// were answered, and the CPU µs per request by part.
pub async fn per_request(
    target: &Target,
    plan: Vec<Request>,
    connections: usize,
    label: &str,
) -> (Tally, BTreeMap<&'static str, f64>) {
    let requests = plan.len() as u64;
    let before = Usage::now(target).await;
    let tally = target.send_each(plan, connections, label).await;
    let cpu = Usage::now(target).await.micros_per(&before, requests);
    (tally, cpu)
}

/// The service's part of a reading per request (NaN when it was not read).
pub fn service(per_part: &BTreeMap<&'static str, f64>) -> f64 {
    per_part.get("service").copied().unwrap_or(f64::NAN)
}

/// The server's share of a reading per part: the service's, Redis's and
/// Postgres's (the driver's left out), a part not read counting as none.
pub fn server_share(per_part: &BTreeMap<&'static str, f64>) -> f64 {
    ["service", "redis", "postgres"]
        .iter()
        .filter_map(|p| per_part.get(p))
        .sum()
}

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
            .map(|i| {
                target
                    .pid(i)
                    .or_else(|| listener_pid(&target.bases[i]))
                    .and_then(|pid| process_seconds(pid, tick))
            })
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
        if let Some(seconds) = redis_seconds_at(&target.redis_url).await {
            parts.insert("redis", seconds);
        }
        Self { parts, postgres }
    }

    /// The same reading with `part` added: the CPU of process `pid` and of
    /// its children (nginx's master and its workers, say).
    pub fn with_process(mut self, part: &'static str, pid: u32) -> Self {
        let tick = clock_ticks();
        let mut pids = children_of(pid);
        pids.push(pid);
        let seconds: f64 = pids.iter().filter_map(|p| process_seconds(*p, tick)).sum();
        self.parts.insert(part, seconds);
        self
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

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    processes_where(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            // After the command name: the state, then the parent's pid.
            stat.rfind(')')
                .and_then(|end| stat[end + 2..].split(' ').nth(1)?.parse::<u32>().ok())
                == Some(parent)
        })
    })
}

/// The pids under `/proc` for which `keep` holds (none when `/proc`
/// cannot be read).
fn processes_where(keep: impl Fn(&u32) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(keep)
        .collect()
}

/// The Postgres backends serving `database` (by their process titles,
/// `postgres: ... user database host(port) state`).
pub fn backends_of(database: &str) -> Vec<u32> {
    processes_where(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
            let title = String::from_utf8_lossy(&line);
            title.starts_with("postgres: ") && title.split_whitespace().any(|word| word == database)
        })
    })
}

/// Every process named `postgres` (the server and its backends), by pid.
fn postgres_seconds(tick: f64) -> BTreeMap<u32, f64> {
    processes_where(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "postgres")
    })
    .into_iter()
    .filter_map(|pid| Some((pid, process_seconds(pid, tick)?)))
    .collect()
}

/// The process listening on `base`'s port when `base` names this
/// machine's loopback (a service given by `--url` and run here): the
/// listening socket's inode from `/proc/net/tcp` (or `tcp6`), then the
/// process that holds it open. `None` for any other host: a remote
/// service's CPU cannot be read from here.
fn listener_pid(base: &str) -> Option<u32> {
    let url = reqwest::Url::parse(base).ok()?;
    let host = url.host_str()?;
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return None;
    }
    let port = url.port_or_known_default()?;
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|table| {
            table
                .lines()
                .skip(1)
                .find_map(|line| listening_inode(line, port))
        })?;
    let socket = format!("socket:[{inode}]");
    processes_where(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|mut fds| {
            fds.any(|fd| {
                fd.is_ok_and(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == &*socket)
                })
            })
        })
    })
    .first()
    .copied()
}

/// The inode of a row of `/proc/net/tcp{,6}` when it is a socket listening
/// on `port` (state `0A`): `sl local_address rem_address st ... inode`,
/// the address as hex `IP:PORT`.
fn listening_inode(row: &str, port: u16) -> Option<u64> {
    let fields: Vec<&str> = row.split_whitespace().collect();
    let local_port = u16::from_str_radix(fields.get(1)?.rsplit_once(':')?.1, 16).ok()?;
    let listening = *fields.get(3)? == "0A";
    let inode: u64 = fields.get(9)?.parse().ok()?;
    (listening && local_port == port && inode != 0).then_some(inode)
}

/// CPU seconds (user + system) the Redis at `url` has spent, from its own
/// `INFO cpu`.
pub async fn redis_seconds_at(url: &str) -> Option<f64> {
    let client = redis::Client::open(url).ok()?;
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
    fn a_listening_row_gives_its_inode_and_no_other_row_does() {
        let listening =
            "   3: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 424242 1 0000000000000000 100 0 0 10 0";
        let connected =
            "   4: 0100007F:1F90 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000     0        0 434343 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(listening_inode(listening, 8080), Some(424242));
        assert_eq!(listening_inode(listening, 8081), None);
        assert_eq!(listening_inode(connected, 8080), None);
        assert_eq!(
            listening_inode("  sl  local_address rem_address   st", 8080),
            None
        );
    }

    #[test]
    fn the_process_listening_on_a_loopback_url_is_found_and_a_remote_one_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        assert_eq!(
            listener_pid(&format!("http://127.0.0.1:{port}")),
            Some(std::process::id())
        );
        assert_eq!(
            listener_pid(&format!("http://localhost:{port}/")),
            Some(std::process::id())
        );
        drop(listener);
        assert_eq!(listener_pid(&format!("http://127.0.0.1:{port}")), None);
        assert_eq!(listener_pid(&format!("http://192.0.2.1:{port}")), None);
    }

    #[test]
    fn utime_and_stime_are_read_past_a_name_with_spaces() {
        let stat =
            "42 (tokio rt (x)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 0 0";
        assert_eq!(stat_seconds(stat, 100.0), Some(3.0));
    }
}
