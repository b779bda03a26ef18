//! seckill: a flash-sale HTTP backend that never oversells.
//!
//! Layout, with dependencies pointing one way (`http` → `seckill` →
//! `store`, `redis_locks`, `id`, `kv`):
//! - [`config`]: the settings, from the environment.
//! - [`startup`]: builds the whole app from one settings value.
//! - [`telemetry`]: JSON logs.
//! - [`http`]: routes, extractors, the error-to-status mapping, metrics.
//! - [`token`]: signed user tokens.
//! - [`auth`]: who a bearer token signs in: a `v1` token or the shop's JWT.
//! - [`seckill`]: the purchase flow and the admin operations.
//! - [`cli`]: the binaries' command line.
//! - [`events`]: order events out to the shop: the feed and the webhooks.
//! - [`domain`]: the words every layer speaks (how a purchase ended).
//! - [`store`]: Postgres, including the statement that sells one unit.
//! - `redis_locks` (the `redis-locks` crate beside this one): reentrant,
//!   fair, read-write and RedLock locks on Redis; it imports nothing here.
//! - [`id`]: 64-bit order ids from Redis.
//! - [`kv`]: Redis for the service's own commands, each under a deadline,
//!   on the lock library's connection layer (`redis_locks::SharedConnection`).
//!
//! Beside this crate in the workspace: `redis-locks` (the lock library, its
//! own tests and doc examples), `seckill-lab` (the lab: the naive designs
//! beside the right one, mounted on this service through
//! [`startup::Application::mount`]; LAB.md), `loadtest` (the load driver
//! and the lab's runs) and `testkit` (test support: the local servers,
//! private `redis-server` processes, free ports), which their tests use.

// The maps in these docs link to the private stages of a module (the
// purchase's `batch`, `soldout`, ...): read them with
// `cargo doc --document-private-items`, where every link resolves.
#![allow(rustdoc::private_intra_doc_links)]
// The purchase path nests deep futures (gate, lock gathering, batch).
#![recursion_limit = "256"]

pub mod auth;
pub mod cli;
pub mod config;
pub mod domain;
pub mod events;
pub mod http;
pub mod id;
pub mod kv;
pub mod seckill;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod token;
