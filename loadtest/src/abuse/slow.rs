//! Bodies sent a byte a second: how and when the server ended each one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{slow_address, AbuseArgs};
use crate::round;

/// What happened to one slow connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlowEnd {
    /// The server closed it (or reset it) without an answer.
    Closed,
    /// The server answered with this status.
    Answered(u16),
    /// Still open when the driver stopped watching.
    Open,
    /// It could not be opened.
    Failed,
}

pub(super) struct SlowConn {
    end: SlowEnd,
    /// From the request's head sent to the end.
    after: Duration,
}

/// The slow bodies of a row.
pub(super) struct Slow {
    pub conns: Vec<SlowConn>,
    pub deadline: Duration,
}

impl Slow {
    /// Ended by the server within the deadline and one second.
    pub(super) fn in_time(&self) -> usize {
        let limit = self.deadline + Duration::from_secs(1);
        self.conns
            .iter()
            .filter(|c| matches!(c.end, SlowEnd::Closed | SlowEnd::Answered(_)) && c.after <= limit)
            .count()
    }

    /// Connections by how they ended.
    pub(super) fn ends(&self) -> BTreeMap<String, u64> {
        let mut ends = BTreeMap::new();
        for c in &self.conns {
            let key = match c.end {
                SlowEnd::Closed => "closed, no answer".to_owned(),
                SlowEnd::Answered(status) => format!("answered {status}"),
                SlowEnd::Open => "still open".to_owned(),
                SlowEnd::Failed => "not opened".to_owned(),
            };
            *ends.entry(key).or_default() += 1;
        }
        ends
    }

    /// Seconds from the head sent to the server's end of the connection:
    /// first, median, last (of those the server ended).
    pub(super) fn after(&self) -> Option<(f64, f64, f64)> {
        let mut ended: Vec<f64> = self
            .conns
            .iter()
            .filter(|c| matches!(c.end, SlowEnd::Closed | SlowEnd::Answered(_)))
            .map(|c| c.after.as_secs_f64())
            .collect();
        ended.sort_by(f64::total_cmp);
        Some((*ended.first()?, ended[ended.len() / 2], *ended.last()?))
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "connections": self.conns.len(),
            "deadline_ms": self.deadline.as_millis(),
            "ended_in_time": self.in_time(),
            "ends": self.ends(),
            "ended_after_s": self.after().map(|(first, median, last)| json!({
                "first": round(first), "median": round(median), "last": round(last),
            })),
        })
    }
}

/// How long the slow connections are watched: past the deadline and the
/// second it is allowed, long enough to see a late close.
pub(super) fn slow_watch(args: &AbuseArgs) -> Duration {
    Duration::from_millis(args.body_timeout_ms) + Duration::from_secs(3)
}

/// Opens the slow connections, each from an address of its own, spread
/// over the instances; how each one ended.
pub(super) async fn slow_bodies(bases: &[String], args: &AbuseArgs) -> Slow {
    let watch = slow_watch(args);
    let tasks: Vec<_> = (0..args.slow_connections)
        .map(|i| {
            let base = bases[i % bases.len()].clone();
            let length = args.slow_length;
            tokio::spawn(async move { slow_body(&base, &slow_address(i), length, watch).await })
        })
        .collect();
    let mut conns = Vec::with_capacity(tasks.len());
    for task in tasks {
        conns.push(task.await.unwrap_or(SlowConn {
            end: SlowEnd::Failed,
            after: Duration::ZERO,
        }));
    }
    Slow {
        conns,
        deadline: Duration::from_millis(args.body_timeout_ms),
    }
}

/// One payment notification declaring `length` bytes, sent one byte a
/// second over a raw connection: how (and when after its head) the server
/// ended it, or that it was still open after `watch`.
async fn slow_body(base: &str, from: &str, length: u64, watch: Duration) -> SlowConn {
    let failed = SlowConn {
        end: SlowEnd::Failed,
        after: Duration::ZERO,
    };
    let Some(authority) = base.strip_prefix("http://") else {
        return failed;
    };
    let Ok(mut stream) = tokio::net::TcpStream::connect(authority).await else {
        return failed;
    };
    // A signature of the right shape: only the whole body can tell it is
    // wrong, so the service must wait for it.
    let head = format!(
        "POST /payments/notify HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\nX-Signature: sha256={}\r\nX-Forwarded-For: {from}\r\n\r\n",
        "0".repeat(64)
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return failed;
    }
    let started = Instant::now();
    let ended = |end| SlowConn {
        end,
        after: started.elapsed(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let give_up = tokio::time::sleep(watch);
    tokio::pin!(give_up);
    let mut sent = 0;
    let mut buffer = [0_u8; 1024];
    loop {
        tokio::select! {
            read = stream.read(&mut buffer) => {
                return match read {
                    Ok(n) if n > 0 => ended(status_of(&buffer[..n]).map_or(SlowEnd::Closed, SlowEnd::Answered)),
                    _ => ended(SlowEnd::Closed),
                };
            }
            _ = tick.tick(), if sent < length => {
                if stream.write_all(b" ").await.is_err() {
                    return ended(SlowEnd::Closed);
                }
                sent += 1;
            }
            () = &mut give_up => return ended(SlowEnd::Open),
        }
    }
}

/// The status of an HTTP/1.1 answer's first bytes (`HTTP/1.1 408 ...`).
fn status_of(bytes: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(bytes).ok()?.lines().next()?;
    let mut words = line.split(' ');
    words.next()?.starts_with("HTTP/").then_some(())?;
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_status_is_read_from_its_first_line() {
        assert_eq!(
            status_of(b"HTTP/1.1 408 Request Timeout\r\n\r\n"),
            Some(408)
        );
        assert_eq!(status_of(b"HTTP/1.1 413 Payload Too Large\r\n"), Some(413));
        assert_eq!(status_of(b"garbage"), None);
    }
}
