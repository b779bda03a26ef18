//! seckill: a flash-sale HTTP backend that never oversells.
//!
//! Layout, with dependencies pointing one way (`http` → `seckill` →
//! `store`, `lock`, `id`):
//! - [`config`]: the settings, from the environment.
//! - [`startup`]: builds the whole app from one settings value.
//! - [`telemetry`]: JSON logs.
//! - [`http`]: routes, extractors, the error-to-status mapping, metrics.
//! - [`token`]: signed user tokens.
//! - [`seckill`]: the purchase flow and the admin operations.
//! - [`store`]: Postgres, including the statement that sells one unit.
//! - [`lock`]: reentrant Redis locks (self-contained, imports nothing here).
//! - [`id`]: 64-bit order ids from Redis.

pub mod config;
pub mod http;
pub mod id;
pub mod lock;
pub mod seckill;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod token;
