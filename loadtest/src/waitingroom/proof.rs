//! Proof of work: a room that asks for it, and what solving costs a client.

use anyhow::Context;
use seckill::domain::{UserId, VoucherId};
use seckill::seckill::proof_holds;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::lines::thousands;
use super::{side_room, WaitingRoomArgs};
use crate::api::Admin;
use crate::table::Table;

/// One difficulty of the proof-of-work table.
pub(super) struct Proof {
    pub bits: u32,
    pub solved: u64,
    pub mean_hashes: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
    /// What 2^bits hashes take at the rate this difficulty hashed: the
    /// mean a client can expect, steadier than a few solves' mean (the
    /// hashes a solve takes are geometric: their spread is their mean).
    pub expected_ms: f64,
}

/// What a client's join with proof was answered, in the room that asks
/// for it.
pub(super) struct ProofCheck {
    pub bits: u32,
    pub without: String,
    pub others: Option<String>,
    pub with: String,
}

impl ProofCheck {
    pub(super) fn ok(&self) -> bool {
        self.without == "400 bad_request"
            && self
                .others
                .as_deref()
                .is_none_or(|k| k == "400 bad_request")
            && self.with == "202"
    }
}

/// A room that asks for proof of work: a join without one, with another
/// user's nonce and with the user's own.
pub(super) async fn proof_check(
    admin: &Admin,
    base: &str,
    tokens: &[Arc<str>],
    args: &WaitingRoomArgs,
) -> anyhow::Result<ProofCheck> {
    let bits = args.proof_bits;
    let voucher = side_room(
        admin,
        "load test: proof of work",
        chrono::Duration::minutes(1),
        json!({
            "admit_per_second": args.admit_per_second,
            "proof_of_work_bits": bits,
        }),
    )
    .await?;
    let room = voucher_id(voucher)?;
    let (own, other) = tokio::task::spawn_blocking(move || {
        (solve(room, user(0), bits).0, solve(room, user(1), bits).0)
    })
    .await?;
    let http = reqwest::Client::new();
    let join = |nonce: Option<String>| {
        let mut request = http
            .post(format!("{base}/vouchers/{voucher}/queue"))
            .bearer_auth(&*tokens[0]);
        if let Some(nonce) = nonce {
            request = request.header("x-queue-proof", nonce);
        }
        async move {
            match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    if status.is_success() {
                        status.as_u16().to_string()
                    } else {
                        format!(
                            "{} {}",
                            status.as_u16(),
                            body["error"].as_str().unwrap_or("?")
                        )
                    }
                }
                Err(e) => format!("error: {e}"),
            }
        }
    };
    let without = join(None).await;
    // Another user's solution solves this user's challenge once in 2^bits:
    // only one that does not is expected to be refused.
    let others = if proof_holds(room, user(0), &other, bits) {
        None
    } else {
        Some(join(Some(other)).await)
    };
    let with = join(Some(own)).await;
    Ok(ProofCheck {
        bits,
        without,
        others,
        with,
    })
}

/// The id of the room's voucher, as the service answered it.
fn voucher_id(voucher: i64) -> anyhow::Result<VoucherId> {
    VoucherId::new(voucher).with_context(|| format!("voucher id {voucher} is not positive"))
}

/// The user after `n` others: the driver's users count from 1 (user 1
/// holds the first token).
fn user(n: u64) -> UserId {
    i64::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(1))
        .and_then(UserId::new)
        .expect("fewer users than i64::MAX")
}

/// The first nonce (counting up from 0) that solves `user`'s challenge,
/// and how many were hashed.
fn solve(voucher: VoucherId, user: UserId, bits: u32) -> (String, u64) {
    let mut nonce = String::new();
    for n in 0_u64.. {
        nonce.clear();
        nonce.push_str(&n.to_string());
        if proof_holds(voucher, user, &nonce, bits) {
            return (nonce, n + 1);
        }
    }
    unreachable!("a u64 nonce is found long before the counter wraps")
}

/// Solves per difficulty at most: enough for a mean, where one is cheap.
const MAX_SOLVES: u64 = 10_000;

/// For each difficulty, users' challenges solved one after another for
/// `seconds` (at least one): mean hashes and milliseconds per join.
pub(super) async fn proof_table(
    voucher: i64,
    bits: &[u32],
    seconds: f64,
) -> anyhow::Result<Vec<Proof>> {
    let bits = bits.to_vec();
    let voucher = voucher_id(voucher)?;
    Ok(tokio::task::spawn_blocking(move || {
        bits.iter()
            .map(|&bits| {
                let budget = Duration::from_secs_f64(seconds.max(0.0));
                let clock = Instant::now();
                let (mut solved, mut hashes, mut max_ms) = (0_u64, 0_u64, 0.0_f64);
                while solved == 0 || (clock.elapsed() < budget && solved < MAX_SOLVES) {
                    let one = Instant::now();
                    hashes += solve(voucher, user(solved), bits).1;
                    max_ms = max_ms.max(one.elapsed().as_secs_f64() * 1e3);
                    solved += 1;
                }
                let ms = clock.elapsed().as_secs_f64() * 1e3;
                Proof {
                    bits,
                    solved,
                    mean_hashes: hashes as f64 / solved as f64,
                    mean_ms: ms / solved as f64,
                    max_ms,
                    expected_ms: ms / hashes as f64 * (1_u64 << bits) as f64,
                }
            })
            .collect()
    })
    .await?)
}

pub(super) fn print_proofs(proofs: &[Proof], check: &ProofCheck) {
    let mut table = Table::new([
        "zero bits",
        "joins solved",
        "mean hashes",
        "2^bits",
        "mean ms",
        "max ms",
        "ms for 2^bits hashes",
    ]);
    let ms = |ms: f64| {
        if ms < 0.1 {
            format!("{ms:.4}")
        } else {
            format!("{ms:.1}")
        }
    };
    for p in proofs {
        table.row([
            p.bits.to_string(),
            thousands(p.solved as i64),
            thousands(p.mean_hashes.round() as i64),
            thousands(1_i64 << p.bits),
            ms(p.mean_ms),
            ms(p.max_ms),
            ms(p.expected_ms),
        ]);
    }
    println!("\nproof of work, one client's join (this machine, one core):");
    print!("{}", table.text());
    crate::table::record("waitingroom", "Proof of work: one join's cost", &table);
    println!(
        "a room asking {} bits: a join without proof {}, with another user's nonce {}, with its own {} ({})",
        check.bits,
        check.without,
        check.others.as_deref().unwrap_or("-"),
        check.with,
        if check.ok() { "ok" } else { "FAILED" }
    );
}
