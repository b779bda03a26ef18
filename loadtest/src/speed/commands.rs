//! Redis commands per purchase: counted as executed (`INFO commandstats`)
//! and as clients sent them (`MONITOR`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use crate::round3 as round;
use crate::service::{redis_url, Target};

/// Calls per command name, from `INFO commandstats` of the local Redis.
pub(super) async fn commandstats() -> anyhow::Result<BTreeMap<String, u64>> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    Ok(testkit::commandstats(&info))
}

/// Commands clients sent per purchase, and those their scripts ran.
pub(super) struct Sent {
    pub per_purchase: f64,
    pub by_name: BTreeMap<String, f64>,
    /// Commands run inside scripts per purchase, by name: where a script
    /// call's cost goes.
    pub scripts_by_name: BTreeMap<String, f64>,
}

/// Sends one purchase per token while `MONITOR` watches Redis, and counts
/// per purchase made the commands clients sent and, apart, those scripts
/// ran (MONITOR marks them `[0 lua]`).
pub(super) async fn count_client_commands(
    target: &Target,
    voucher: i64,
    tokens: &[Arc<str>],
    connections: usize,
) -> anyhow::Result<Sent> {
    let client = redis::Client::open(redis_url())?;
    let monitor = client.get_async_monitor().await?;
    let mut lines = monitor.into_on_message::<String>();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let counter = tokio::spawn(async move {
        let (mut sent, mut scripts) = (BTreeMap::<String, u64>::new(), BTreeMap::new());
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                line = lines.next() => match line {
                    Some(line) => match monitored(&line) {
                        Some((Source::Client, name)) => *sent.entry(name).or_default() += 1,
                        Some((Source::Script, name)) => *scripts.entry(name).or_default() += 1,
                        None => {}
                    },
                    None => break,
                },
            }
        }
        (sent, scripts)
    });
    // Let MONITOR start before the purchases do.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tally = target
        .buy_once(
            voucher,
            tokens,
            Duration::from_secs(600),
            connections,
            "counted",
        )
        .await;
    // Answers a purchase got are committed (sync) or accepted (async);
    // let the last of its commands reach MONITOR.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop.send(());
    let (sent, scripts) = counter.await?;
    let purchases = (tally.count("200") + tally.count("202")).max(1) as f64;
    let per_purchase = |counts: BTreeMap<String, u64>| -> BTreeMap<String, f64> {
        counts
            .into_iter()
            .map(|(name, n)| (name, round(n as f64 / purchases)))
            .collect()
    };
    Ok(Sent {
        per_purchase: sent.values().sum::<u64>() as f64 / purchases,
        by_name: per_purchase(sent),
        scripts_by_name: per_purchase(scripts),
    })
}

/// Who ran a command MONITOR saw.
#[derive(Debug, PartialEq)]
enum Source {
    Client,
    /// A script (`[0 lua]`).
    Script,
}

/// The source and command of a MONITOR line (`<time> [0 127.0.0.1:5555]
/// "EVALSHA" ...`), the command lower case.
fn monitored(line: &str) -> Option<(Source, String)> {
    let (_, rest) = line.split_once('[')?;
    let (source, rest) = rest.split_once(']')?;
    let command = rest.trim().split('"').nth(1)?.to_ascii_lowercase();
    let source = if source.ends_with("lua") {
        Source::Script
    } else {
        Source::Client
    };
    Some((source, command))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_tell_client_commands_from_scripts_own() {
        assert_eq!(
            monitored(r#"1700000000.123456 [0 127.0.0.1:50000] "EVALSHA" "abc" "1" "k""#),
            Some((Source::Client, "evalsha".to_owned()))
        );
        assert_eq!(
            monitored(r#"1700000000.123456 [0 lua] "HINCRBY" "k" "f" "1""#),
            Some((Source::Script, "hincrby".to_owned()))
        );
        assert_eq!(
            monitored(r#"1700000000.1 [0 unix:/tmp/redis.sock] "PING""#),
            Some((Source::Client, "ping".to_owned()))
        );
        assert_eq!(monitored("OK"), None);
    }
}
