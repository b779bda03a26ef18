//! `loadtest lock`: the lock library against the Redis it runs on.
//! Uncontended lock + unlock pairs per second beside raw EVALSHA calls of
//! the acquire script (redis-benchmark), how soon a waiter wakes after an
//! unlock, and RedLock's latency over five nodes of its own with two of
//! them frozen against all up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use redis_locks::{Acquired, LockClient, MultiNodeLocks, Quorum};
use serde_json::{json, Value};

use crate::ceilings;
use crate::drive::Tally;
use crate::service::Launch;

#[derive(clap::Args, Clone)]
pub struct LockArgs {
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Concurrent tasks, each with its own lock (and redis-benchmark clients).
    #[arg(long, default_value_t = 50)]
    pub tasks: usize,
    /// Wake-up samples.
    #[arg(long, default_value_t = 200)]
    pub wakeups: usize,
    /// Lock cycles (acquire, then the last release) gathered
    /// `redis_locks::LOCKS_PER_CALL` a script call each way, as the
    /// service's purchases go, on a redis-server of their own: Redis's CPU
    /// per cycle (0: skip).
    #[arg(long, default_value_t = 60_000)]
    pub gathered_cycles: usize,
    /// Sequential RedLock lock+unlock rounds over five redis-server nodes
    /// of its own, all up and then two frozen (0: skip).
    #[arg(long, default_value_t = 2_000)]
    pub redlock_rounds: usize,
    /// Seconds of purchases through the service with its users' locks as
    /// RedLocks over those nodes, all up and then two frozen (0: skip).
    #[arg(long, default_value_t = 5)]
    pub redlock_purchase_seconds: u64,
}

/// Runs the benchmark, the service it buys through started as `launch`;
/// returns the JSON line (and prints a table).
pub async fn run(args: &LockArgs, launch: &Launch) -> anyhow::Result<Value> {
    let url = crate::service::redis_url();
    let prefix = format!("loadtest:{}:", uuid::Uuid::new_v4().simple());
    let client = redis::Client::open(url.as_str())?;
    let locks = LockClient::new(client, prefix.clone());
    let measured = async {
        let pairs_per_sec = uncontended(&locks, args).await?;
        let tasks = u32::try_from(args.tasks).unwrap_or(50);
        let evalsha = ceilings::redis(&url, &prefix, tasks, 200_000).await;
        let wake = wakeups(&locks, args.wakeups).await?;
        let per_cycle = match args.gathered_cycles {
            0 => None,
            cycles => Some(gathered(cycles).await?),
        };
        anyhow::Ok((pairs_per_sec, evalsha, wake, per_cycle))
    }
    .await;
    let _ = locks.shutdown(Duration::from_secs(5)).await;
    // Fencing-token keys outlive their locks on purpose; the benchmark's
    // need not, also when a step of it failed.
    crate::service::delete_keys(&url, &prefix).await;
    let (pairs_per_sec, evalsha, wake, per_cycle) = measured?;

    let ms = |q: f64| (wake.value_at_quantile(q) as f64 / 10.0).round() / 100.0;
    println!("{:<34} {:>12}", "lock", "");
    println!(
        "{:<34} {:>12.0}",
        "uncontended lock+unlock pairs/s", pairs_per_sec
    );
    match &evalsha {
        Ok(rate) => println!("{:<34} {:>12.0}", "raw EVALSHA acquire calls/s", rate),
        Err(e) => println!(
            "{:<34} {:>12}   ({e:#})",
            "raw EVALSHA acquire calls/s", "n/a"
        ),
    }
    if let Some(us) = per_cycle {
        println!("{:<34} {:>12.2}", "Redis CPU µs per gathered cycle", us);
    }
    println!(
        "{:<34} {:>9.2} ms p50, {:.2} ms p99, {:.2} ms max",
        "waiter wake-up after unlock",
        ms(0.5),
        ms(0.99),
        wake.max() as f64 / 1000.0
    );
    let mut out = json!({
        "scenario": "lock",
        "tasks": args.tasks,
        "pairs_per_sec": crate::round(pairs_per_sec),
        "wakeups": wake.len(),
        "wake_p50_ms": ms(0.5),
        "wake_p99_ms": ms(0.99),
        "wake_max_ms": wake.max() as f64 / 1000.0,
        "invariants_ok": true,
    });
    if let Some(us) = per_cycle {
        out["gathered_cycles"] = json!(args.gathered_cycles);
        out["redis_us_per_gathered_cycle"] = json!(crate::round(us));
    }
    if args.redlock_rounds > 0 || args.redlock_purchase_seconds > 0 {
        out["redlock"] = redlock(args, launch).await?;
    }
    if let Ok(rate) = evalsha {
        out["evalsha_per_sec"] = json!(crate::round(rate));
        // A pair is two script calls (acquire, release).
        out["ratios"] = json!({ "pairs_vs_evalsha": crate::round(pairs_per_sec / rate) });
    }
    Ok(out)
}

/// Redis's CPU per lock cycle (an acquire and the release that frees the
/// lock) when `cycles` locks, each of its own owner as a purchase's is, are
/// taken and given back `LOCKS_PER_CALL` a script call, as the service's
/// gathered purchases do; on a redis-server of its own, so that nothing
/// else counts.
async fn gathered(cycles: usize) -> anyhow::Result<f64> {
    eprintln!("lock: {cycles} lock cycles gathered on a redis-server of their own");
    let redis = testkit::OwnRedis::try_start_with(&[])?;
    let locks = LockClient::new(redis::Client::open(redis.url())?, "bench:");
    let lease = redis_locks::Lease::Fixed(Duration::from_secs(10));
    let spent = || async {
        crate::cpu::redis_seconds_at(&redis.url())
            .await
            .context("cannot read the bench Redis's INFO cpu")
    };
    let before = spent().await?;
    for first in (0..cycles).step_by(redis_locks::LOCKS_PER_CALL) {
        let last = cycles.min(first + redis_locks::LOCKS_PER_CALL);
        let held: Vec<_> = (first..last)
            .map(|i| {
                (
                    locks.lock(&format!("user:{i}")),
                    locks.owner(format!("purchase-{i}")),
                )
            })
            .collect();
        let tries: Vec<_> = held
            .iter()
            .map(|(lock, owner)| (lock, owner, lease))
            .collect();
        let mut guards = Vec::with_capacity(tries.len());
        for answer in locks.try_acquire_all(&tries).await {
            match answer? {
                Acquired::Yes(guard) => guards.push(guard),
                Acquired::HeldByOther { .. } => anyhow::bail!("a fresh lock was held"),
            }
        }
        for released in locks.unlock_all(guards).await {
            released?;
        }
    }
    let after = spent().await?;
    let _ = locks.shutdown(Duration::from_secs(5)).await;
    Ok((after - before) / cycles as f64 * 1e6)
}

/// Uncontended: each of `args.tasks` tasks takes and releases a lock of
/// its own for `args.seconds`; pairs per second over all of them.
async fn uncontended(locks: &LockClient, args: &LockArgs) -> anyhow::Result<f64> {
    eprintln!(
        "lock: {} tasks taking and releasing their own locks for {} s",
        args.tasks, args.seconds
    );
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let workers: Vec<_> = (0..args.tasks)
        .map(|t| {
            let (locks, pairs) = (locks.clone(), pairs.clone());
            tokio::spawn(async move {
                let lock = locks.lock(&format!("bench:{t}"));
                let owner = locks.owner(format_args!("task-{t}"));
                while Instant::now() < deadline {
                    match lock.try_acquire(&owner, Duration::from_secs(10)).await {
                        Ok(Acquired::Yes(guard)) => {
                            guard.unlock().await?;
                            pairs.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Acquired::HeldByOther { .. }) => {
                            anyhow::bail!("an uncontended lock was held")
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok(pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Wake-up: a waiter blocked on a held lock, the holder unlocks; the
/// delay from the unlock to the waiter holding the lock, `wakeups` times.
async fn wakeups(locks: &LockClient, wakeups: usize) -> anyhow::Result<Histogram<u64>> {
    eprintln!("lock: {} wake-ups", wakeups);
    let mut wake = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let lock = locks.lock("bench:wake");
    for i in 0..wakeups {
        let holder = locks.owner(format_args!("holder-{i}"));
        let Acquired::Yes(guard) = lock.try_acquire(&holder, Duration::from_secs(30)).await? else {
            anyhow::bail!("the wake-up lock was held");
        };
        let (waiting, waiter) = (lock.clone(), locks.owner(format_args!("waiter-{i}")));
        let task = tokio::spawn(async move {
            let got = waiting
                .acquire(&waiter, Duration::from_secs(30), Duration::from_secs(30))
                .await;
            (got, Instant::now())
        });
        // Let the waiter fail its attempts and go to sleep on the channel.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released = Instant::now();
        guard.unlock().await?;
        let (got, woke) = task.await?;
        let guard = got?.context("the waiter timed out")?;
        wake.saturating_record(
            u64::try_from((woke - released).as_micros())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        guard.unlock().await?;
    }
    Ok(wake)
}

/// RedLock over five nodes of its own, all up and then with two of them
/// frozen: the latency of one lock + unlock, sequential (`rounds` of
/// them; goal: p50 within 3x), and of a purchase through the service that
/// takes its users' locks there (goal: p50 within 1.5x).
async fn redlock(args: &LockArgs, launch: &Launch) -> anyhow::Result<Value> {
    let rounds = args.redlock_rounds;
    let nodes = (0..5)
        .map(|_| testkit::OwnRedis::try_start_with(&[]))
        .collect::<Result<Vec<_>, _>>()?;
    let clients = nodes
        .iter()
        .map(|n| redis::Client::open(n.url()).map(|c| LockClient::new(c, "redlock-bench:")))
        .collect::<Result<Vec<_>, _>>()?;
    // Wait for every node to answer.
    for client in &clients {
        let started = Instant::now();
        while client.check_writable().await.is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                anyhow::bail!("a RedLock node did not start");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let locks = MultiNodeLocks::new(clients, Quorum::Majority);
    let mut out = json!({ "rounds": rounds });
    if rounds > 0 {
        let all_up = lock_unlock_rounds(&locks, rounds, "all five nodes up").await?;
        nodes[3].freeze();
        nodes[4].freeze();
        let two_frozen = lock_unlock_rounds(&locks, rounds, "two of five nodes frozen").await;
        nodes[3].thaw();
        nodes[4].thaw();
        let two_frozen = two_frozen?;
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let ratio = ms(&two_frozen, 0.5) / ms(&all_up, 0.5);
        println!(
            "{:<34} {:>9.2} ms p50, {:.2} ms p99",
            "RedLock lock+unlock, 5 nodes up",
            ms(&all_up, 0.5),
            ms(&all_up, 0.99)
        );
        println!(
            "{:<34} {:>9.2} ms p50, {:.2} ms p99 ({ratio:.2}x the p50 with all up; goal <= 3x)",
            "RedLock lock+unlock, 2 frozen",
            ms(&two_frozen, 0.5),
            ms(&two_frozen, 0.99)
        );
        out["all_up_p50_ms"] = json!(ms(&all_up, 0.5));
        out["all_up_p99_ms"] = json!(ms(&all_up, 0.99));
        out["two_frozen_p50_ms"] = json!(ms(&two_frozen, 0.5));
        out["two_frozen_p99_ms"] = json!(ms(&two_frozen, 0.99));
        out["p50_ratio"] = json!(crate::round(ratio));
        out["within_3x"] = json!(ratio <= 3.0);
    }
    if args.redlock_purchase_seconds > 0 {
        let urls: Vec<String> = nodes.iter().map(|n| n.url()).collect();
        out["purchases"] = redlock_purchases(args, launch, &nodes, &urls).await?;
    }
    Ok(out)
}

/// `rounds` sequential RedLock lock + unlock pairs over `locks`; their latencies.
async fn lock_unlock_rounds(
    locks: &MultiNodeLocks,
    rounds: usize,
    label: &str,
) -> anyhow::Result<Histogram<u64>> {
    eprintln!("lock: RedLock, {rounds} lock+unlock, {label}");
    let node_timeout = Duration::from_millis(500);
    let mut took = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for i in 0..rounds {
        let started = Instant::now();
        let guard = locks
            .try_acquire(
                &format!("bench:{i}"),
                "bench",
                Duration::from_secs(10),
                node_timeout,
            )
            .await?
            .context("a free RedLock was refused")?;
        guard.unlock().await;
        took.saturating_record(
            u64::try_from(started.elapsed().as_micros())
                .unwrap_or(u64::MAX)
                .max(1),
        );
    }
    Ok(took)
}

/// Purchases through a service whose users' locks are RedLocks over
/// `nodes`: distinct users, a few connections (latency, not queueing),
/// `redlock_purchase_seconds` with all nodes up, then as long with two
/// frozen. Each state on a voucher of its own.
async fn redlock_purchases(
    args: &LockArgs,
    launch: &Launch,
    nodes: &[testkit::OwnRedis],
    urls: &[String],
) -> anyhow::Result<Value> {
    use crate::api::{NewSale, SaleMode};
    const CONNECTIONS: usize = 4;
    const USERS_PER_STATE: i64 = 60_000;
    let launch = crate::service::Launch {
        env: vec![("SECKILL_LOCK_REDIS_URLS".into(), urls.join(","))],
        ..launch.clone()
    };
    let limit = Duration::from_secs(args.redlock_purchase_seconds);
    let (all_up, two_frozen) = launch
        .run(async |target| {
            let phase = |first: i64, label: &'static str| async move {
                let admin = target.admin();
                let voucher = admin
                    .create_sale(NewSale::free(SaleMode::Sync, 1_000_000, 2))
                    .await?;
                let tokens = admin.shared_tokens(first, USERS_PER_STATE).await?;
                eprintln!("lock: purchases through the service, {label}");
                let tally = target
                    .buy_once(voucher, &tokens, limit, CONNECTIONS, label)
                    .await;
                if tally.count("200") == 0 {
                    anyhow::bail!("{label}: no purchase went through: {:?}", tally.statuses);
                }
                Ok::<_, anyhow::Error>(tally)
            };
            let all_up = phase(1, "redlock all up").await?;
            nodes[3].freeze();
            nodes[4].freeze();
            let two_frozen = phase(1 + USERS_PER_STATE, "redlock two frozen").await;
            nodes[3].thaw();
            nodes[4].thaw();
            Ok((all_up, two_frozen?))
        })
        .await?;
    Ok(purchases_report(CONNECTIONS, &all_up, &two_frozen))
}

/// Prints the purchases' latencies in both states and their p50 ratio; their JSON.
fn purchases_report(connections: usize, all_up: &Tally, two_frozen: &Tally) -> Value {
    let ratio = two_frozen.ms(0.5) / all_up.ms(0.5);
    for (label, tally) in [("all up", all_up), ("2 frozen", two_frozen)] {
        println!(
            "{:<34} {:>9.2} ms p50, {:.2} ms p99, {:.0}/s, answers {:?}",
            format!("RedLock purchase, {label}"),
            tally.ms(0.5),
            tally.ms(0.99),
            tally.rps(),
            tally.statuses
        );
    }
    println!(
        "{:<34} {ratio:>9.2}x the p50 with all up (goal <= 1.5x)",
        "RedLock purchase, 2 frozen"
    );
    let state = |t: &Tally| {
        json!({
            "p50_ms": t.ms(0.5),
            "p99_ms": t.ms(0.99),
            "per_sec": t.rps().round(),
            "answers": t.statuses,
        })
    };
    json!({
        "connections": connections,
        "all_up": state(all_up),
        "two_frozen": state(two_frozen),
        "p50_ratio": crate::round(ratio),
        "within_1_5x": ratio <= 1.5,
    })
}
