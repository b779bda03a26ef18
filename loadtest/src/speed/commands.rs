//! Redis commands per purchase: counted as executed (`INFO commandstats`)
//! and as clients sent them (`MONITOR`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use super::round;
use crate::service::{redis_url, Target};

/// Calls per command name, from `INFO commandstats` of the local Redis.
pub(super) async fn commandstats() -> anyhow::Result<BTreeMap<String, u64>> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    Ok(parse_commandstats(&info))
}

/// `cmdstat_<name>:calls=<n>,...` lines.
fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Commands clients sent per purchase.
pub(super) struct Sent {
    pub per_purchase: f64,
    pub by_name: BTreeMap<String, f64>,
}

/// Sends one purchase per token while `MONITOR` watches Redis, and counts
/// the commands clients sent (not those scripts ran: MONITOR marks those
/// `[0 lua]`), per purchase made.
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
        let mut by_name = BTreeMap::<String, u64>::new();
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                line = lines.next() => match line {
                    Some(line) => {
                        if let Some(name) = client_command(&line) {
                            *by_name.entry(name).or_default() += 1;
                        }
                    }
                    None => break,
                },
            }
        }
        by_name
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
    let by_name = counter.await?;
    let purchases = (tally.count("200") + tally.count("202")).max(1) as f64;
    let per_purchase = by_name.values().sum::<u64>() as f64 / purchases;
    Ok(Sent {
        per_purchase,
        by_name: by_name
            .into_iter()
            .map(|(name, n)| (name, round(n as f64 / purchases)))
            .collect(),
    })
}

/// The command of a MONITOR line (`<time> [0 127.0.0.1:5555] "EVALSHA" ...`)
/// sent by a client, lower case; `None` for one a script ran (`[0 lua]`).
fn client_command(line: &str) -> Option<String> {
    let (_, rest) = line.split_once('[')?;
    let (source, rest) = rest.split_once(']')?;
    if source.ends_with("lua") {
        return None;
    }
    let command = rest.trim().split('"').nth(1)?;
    Some(command.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_give_calls_by_name() {
        let info = "# Commandstats\r\ncmdstat_ping:calls=12,usec=3,usec_per_call=0.25,rejected_calls=0,failed_calls=0\r\ncmdstat_client|setinfo:calls=2,usec=1\r\n";
        let stats = parse_commandstats(info);
        assert_eq!(stats.get("ping"), Some(&12));
        assert_eq!(stats.get("client|setinfo"), Some(&2));
        assert_eq!(stats.len(), 2);
    }

    #[test]
    fn monitor_lines_name_client_commands_and_skip_scripts_own() {
        assert_eq!(
            client_command(r#"1700000000.123456 [0 127.0.0.1:50000] "EVALSHA" "abc" "1" "k""#),
            Some("evalsha".to_owned())
        );
        assert_eq!(
            client_command(r#"1700000000.123456 [0 lua] "HINCRBY" "k" "f" "1""#),
            None
        );
        assert_eq!(
            client_command(r#"1700000000.1 [0 unix:/tmp/redis.sock] "PING""#),
            Some("ping".to_owned())
        );
    }
}
