//! Reference limits measured in the same run, on the same machine: what
//! Postgres can commit of the service's own sale statement (pgbench), what
//! Redis can run of the lock's acquire script (redis-benchmark), and what
//! the HTTP stack can answer at all (`GET /healthz`, in `main`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use sqlx::{Connection, PgConnection};

/// Client counts pgbench is run at; the best one is the ceiling.
const PGBENCH_CLIENTS: [u32; 6] = [1, 2, 4, 8, 16, 32];

#[derive(Debug, Clone, Copy)]
pub struct Best {
    pub tps: f64,
    pub clients: u32,
}

/// Orders per transaction of the batched ceiling.
pub const CEILING_BATCH: u32 = 100;

/// pgbench results for the service's sale statement selling one order per
/// transaction and [`CEILING_BATCH`] per transaction (its `tps` counts
/// orders), and for the naive BEGIN / UPDATE / INSERT / COMMIT of one.
#[derive(Debug, Clone, Copy)]
pub struct PgCeiling {
    pub single: Best,
    pub batch: Best,
    pub naive: Best,
}

/// The sale exactly as the service sends it (`seckill::store::SELL_BATCH`)
/// for `size` orders, with pgbench variables for its parameters. Each
/// order is a new random user (so its fencing token is always accepted);
/// random 63-bit ids cannot collide within a run in practice.
fn batch_sale(size: u32) -> String {
    let array =
        |base: &str| format!("(SELECT array_agg({base} + g) FROM generate_series(1, {size}) g)");
    let sale = seckill::store::SELL_BATCH
        .replace("$1", ":vid")
        .replace("$2", &array(":oid"))
        .replace("$3", &array(":uid"))
        .replace("$4", &array(":oid"))
        .replace(
            "$5",
            &format!("(SELECT array_agg(now()) FROM generate_series(1, {size}))"),
        )
        // The voucher's max_orders_per_user, as the service passes it.
        .replace("$6", "3")
        // One unit each.
        .replace(
            "$7",
            &format!("(SELECT array_agg(1) FROM generate_series(1, {size}))"),
        );
    format!("\\set uid random(1, 9000000000000000000)\n\\set oid random(1, 9000000000000000000)\n{sale};\n")
}

/// The naive transaction of the same sale (without the fence): three
/// round trips with the voucher's row locked.
const NAIVE: &str = r"\set uid random(1, 9000000000000000000)
\set oid random(1, 9000000000000000000)
BEGIN;
UPDATE seckill_vouchers SET stock = stock - 1 WHERE voucher_id = :vid AND stock > 0;
INSERT INTO voucher_orders (id, user_id, voucher_id, pay_by) VALUES (:oid, :uid, :vid, now() + interval '15 minutes');
COMMIT;
";

fn have(tool: &str) -> bool {
    std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn temp_file(name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let path =
        std::env::temp_dir().join(format!("seckill-{}-{name}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, text).with_context(|| path.display().to_string())?;
    Ok(path)
}

/// Runs pgbench on a voucher of its own in the service's database.
pub async fn postgres(database_url: &str, seconds: u64) -> anyhow::Result<PgCeiling> {
    if !have("pgbench") {
        anyhow::bail!("pgbench is not installed (Debian: postgresql-client)");
    }
    let mut conn = PgConnection::connect(database_url).await?;
    let voucher: i64 = sqlx::query_scalar(
        "WITH v AS (INSERT INTO vouchers (title) VALUES ('pgbench ceiling') RETURNING id)
         INSERT INTO seckill_vouchers (voucher_id, initial_stock, stock, begin_time, end_time)
         SELECT id, 2000000000, 2000000000, now(), now() + interval '1 day' FROM v RETURNING voucher_id",
    )
    .fetch_one(&mut conn)
    .await?;
    let mut results = Vec::new();
    for (name, script, orders) in [
        ("single", batch_sale(1), 1),
        ("batch", batch_sale(CEILING_BATCH), CEILING_BATCH),
        ("naive", NAIVE.to_owned(), 1),
    ] {
        let file = temp_file(&format!("{name}.sql"), &script)?;
        let mut best = Best {
            tps: 0.0,
            clients: 0,
        };
        for clients in PGBENCH_CLIENTS {
            eprintln!("pgbench: {name} transaction, {clients} clients, {seconds} s");
            let tps =
                pgbench(database_url, &file, voucher, clients, seconds).await? * f64::from(orders);
            if tps > best.tps {
                best = Best { tps, clients };
            }
        }
        let _ = std::fs::remove_file(&file);
        results.push(best);
    }
    // Its rows would skew nothing (another voucher, users of its own), but
    // leave no trace.
    sqlx::query("DELETE FROM user_fences WHERE voucher_id = $1")
        .bind(voucher)
        .execute(&mut conn)
        .await?;
    sqlx::query("DELETE FROM voucher_orders WHERE voucher_id = $1")
        .bind(voucher)
        .execute(&mut conn)
        .await?;
    Ok(PgCeiling {
        single: results[0],
        batch: results[1],
        naive: results[2],
    })
}

async fn pgbench(
    url: &str,
    script: &PathBuf,
    voucher: i64,
    clients: u32,
    seconds: u64,
) -> anyhow::Result<f64> {
    let output = tokio::process::Command::new("pgbench")
        .args(["-n", "-f"])
        .arg(script)
        .args(["-D", &format!("vid={voucher}")])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &seconds.to_string()])
        .arg(url)
        .output()
        .await
        .context("pgbench")?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| {
            format!(
                "pgbench printed no tps: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

/// redis-benchmark running the lock's acquire script (EVALSHA, as the
/// service does) on random lock keys that expire a second later.
pub async fn redis(
    redis_url: &str,
    prefix: &str,
    clients: u32,
    requests: u64,
) -> anyhow::Result<f64> {
    if !have("redis-benchmark") {
        anyhow::bail!("redis-benchmark is not installed (Debian: redis-tools)");
    }
    let hostport = testkit::redis_addr_of(redis_url);
    let (host, port) = hostport.split_once(':').unwrap_or((&hostport, "6379"));
    let script = include_str!("../../redis-locks/lua/lock_acquire.lua");
    let sha = sha1_smol::Sha1::from(script).digest().to_string();
    // KEYS and ARGV as redis-locks/lua/lock_acquire.lua takes them: lock key,
    // fence key; lease (1 s, so the keys go away), owner, request id,
    // fence-key lifetime.
    let args = |verb: &str, script_or_sha: String| -> Vec<String> {
        let lock = format!("{prefix}bench:lock:{{__rand_int__}}");
        vec![
            verb.into(),
            script_or_sha,
            "2".into(),
            lock.clone(),
            format!("{lock}:fence"),
            "1000".into(),
            "bench".into(),
            "req:__rand_int__".into(),
            "1000".into(),
        ]
    };
    let run = |n: u64, command: Vec<String>| {
        let mut c = tokio::process::Command::new("redis-benchmark");
        c.args([
            "-h",
            host,
            "-p",
            port,
            "-c",
            &clients.to_string(),
            "-n",
            &n.to_string(),
        ])
        .args(["-r", "1000000", "--csv"])
        .args(command);
        c
    };
    // One EVAL puts the script in Redis's cache; then EVALSHA is measured.
    let load = args("EVAL", script.into());
    run(1, load).output().await.context("redis-benchmark")?;
    let bench = args("EVALSHA", sha);
    let output = tokio::time::timeout(Duration::from_secs(300), run(requests, bench).output())
        .await
        .context("redis-benchmark did not finish")?
        .context("redis-benchmark")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // --csv: a header line, then "name","rps",...
    text.lines()
        .filter_map(|l| l.split(',').nth(1))
        .find_map(|f| f.trim_matches('"').parse().ok())
        .with_context(|| format!("redis-benchmark printed no rate: {text}"))
}
