//! `loadtest jwt`: what signing in with the shop's JWT costs the server,
//! beside the service's own `v1` token, in one run on one instance whose
//! JWK Set (a file) holds an RSA key (made by openssl) and a P-256 key
//! (made by ring). Each row is a crowd of distinct users buying once from
//! a voucher that cannot sell out; CPU µs per purchase by process:
//! - `v1`, then fresh RS256 and ES256 JWTs (every buyer's first: no cache
//!   helps), the goal for RS256 at most 1.3x `v1`'s server CPU (ES256 is
//!   measured beside it, with no goal set);
//! - on a second voucher, `v1` again, then the same RS256 tokens (verified
//!   already: the cache answers), the goal at most `v1`'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use testkit::jwt::{jwk_set, JwtKey};

use crate::api::SaleMode;
use crate::cpu::Usage;
use crate::service::Target;
use crate::table::Table;
use crate::{round, TargetArgs};

const ISSUER: &str = "https://id.load.test/";
const AUDIENCE: &str = "seckill";

#[derive(Args, Clone)]
pub struct JwtArgs {
    /// Buyers of each row (each buys once).
    #[arg(long, default_value_t = 10_000)]
    pub users: i64,
    /// Connections of each crowd.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
}

/// Tokens for users `first..first + count`, signed on every core.
async fn sign_all(signer: Arc<JwtKey>, first: i64, count: i64) -> anyhow::Result<Vec<Arc<str>>> {
    let exp = chrono::Utc::now().timestamp() + 3600;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as i64;
    let per = (count + cores - 1) / cores;
    let mut parts = Vec::new();
    for part in 0..cores {
        let signer = signer.clone();
        let users = (first + part * per)..(first + ((part + 1) * per).min(count));
        parts.push(tokio::task::spawn_blocking(move || {
            users
                .map(|user| {
                    let claims = json!({ "iss": ISSUER, "aud": AUDIENCE, "sub": user.to_string(), "exp": exp });
                    signer.token(&claims).map(Arc::from)
                })
                .collect::<anyhow::Result<Vec<Arc<str>>>>()
        }));
    }
    let mut tokens = Vec::new();
    for part in parts {
        tokens.extend(part.await??);
    }
    Ok(tokens)
}

/// One crowd's cost: CPU µs per purchase by process, and the purchases.
struct Row {
    name: &'static str,
    micros: BTreeMap<&'static str, f64>,
    bought: u64,
    others: u64,
}

impl Row {
    /// Service, Redis and Postgres: the server's CPU µs per purchase.
    fn server(&self) -> f64 {
        crate::cpu::server_share(&self.micros)
    }
}

async fn crowd(
    service: &Target,
    voucher: i64,
    tokens: &[Arc<str>],
    connections: usize,
    name: &'static str,
) -> Row {
    eprintln!("jwt: {name}");
    let before = Usage::now(service).await;
    let tally = service
        .buy_once(voucher, tokens, Duration::from_secs(600), connections, name)
        .await;
    let bought = tally.count("200");
    let after = Usage::now(service).await;
    Row {
        name,
        micros: after.micros_per(&before, bought.max(1)),
        bought,
        others: tally.requests - bought,
    }
}

pub async fn run(target: &TargetArgs, args: &JwtArgs) -> anyhow::Result<bool> {
    target.starts_its_own("jwt starts its own instance (with a JWK Set of its own)")?;
    let dir = std::env::temp_dir().join(format!(
        "seckill-jwt-load-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    let (rs, es) = (JwtKey::rsa("rsa", &dir)?, JwtKey::es256("p256")?);
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, jwk_set(&[&rs, &es]))?;
    let (rs, es) = (Arc::new(rs), Arc::new(es));
    let env = vec![
        ("SECKILL_JWT_JWKS".to_owned(), jwks.display().to_string()),
        ("SECKILL_JWT_ISSUER".to_owned(), ISSUER.to_owned()),
        ("SECKILL_JWT_AUDIENCE".to_owned(), AUDIENCE.to_owned()),
    ];
    let n = args.users;
    eprintln!("jwt: signing {n} RS256 and {n} ES256 tokens");
    let rs_tokens = sign_all(rs, n + 1, n).await?;
    let es_tokens = sign_all(es, 2 * n + 1, n).await?;
    let rows = target
        .launch(1, env)
        .run(async |service| {
            let admin = service.admin();
            let v1_tokens = admin.shared_tokens(1, n).await?;
            let first = admin.endless_voucher(SaleMode::Sync).await?;
            let second = admin.endless_voucher(SaleMode::Sync).await?;
            let c = args.connections;
            Ok::<_, anyhow::Error>(vec![
                crowd(service, first, &v1_tokens, c, "v1").await,
                crowd(service, first, &rs_tokens, c, "RS256, fresh").await,
                crowd(service, first, &es_tokens, c, "ES256, fresh").await,
                crowd(service, second, &v1_tokens, c, "v1, second voucher").await,
                crowd(service, second, &rs_tokens, c, "RS256, verified already").await,
            ])
        })
        .await;
    let _ = std::fs::remove_dir_all(&dir);
    let rows = rows?;
    let mut table = Table::new([
        "tokens",
        "bought",
        "other answers",
        "service µs",
        "redis µs",
        "postgres µs",
        "server µs",
        "÷ v1",
    ]);
    for (i, row) in rows.iter().enumerate() {
        let v1 = if i < 3 { &rows[0] } else { &rows[3] };
        let part = |p: &str| format!("{:.1}", row.micros.get(p).copied().unwrap_or(0.0));
        table.row([
            row.name.to_owned(),
            row.bought.to_string(),
            row.others.to_string(),
            part("service"),
            part("redis"),
            part("postgres"),
            format!("{:.1}", row.server()),
            format!("{:.2}", row.server() / v1.server().max(1e-9)),
        ]);
    }
    println!("{}", table.text());
    let ratio = |a: usize, b: usize| round(rows[a].server() / rows[b].server().max(1e-9));
    let everyone_bought = rows.iter().all(|r| r.bought == n as u64);
    let goals = json!({
        "rs256_fresh_over_v1": { "value": ratio(1, 0), "goal": 1.3 },
        "rs256_verified_over_v1": { "value": ratio(4, 3), "goal": 1.0 },
    });
    println!(
        "{}",
        json!({
            "scenario": "jwt",
            "users": n,
            "connections": args.connections,
            "ok": everyone_bought,
            "goals": goals,
            "es256_fresh_over_v1": ratio(2, 0),
            "rows": rows.iter().map(|r| json!({
                "tokens": r.name, "bought": r.bought, "server_micros": round(r.server()),
                "micros": r.micros.iter().map(|(k, v)| (k.to_string(), round(*v))).collect::<BTreeMap<_, _>>(),
            })).collect::<Vec<_>>(),
        })
    );
    Ok(everyone_bought)
}
