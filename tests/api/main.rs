//! End-to-end tests against real Postgres and Redis. Every test has its
//! own database and Redis key prefix (see `helpers`).

// The lock's futures spawned in the cluster tests nest deep (as the
// service's own purchase path does: see its `recursion_limit`).
#![recursion_limit = "256"]

mod abuse;
mod async_sale;
mod batch;
mod browser;
mod cache;
mod cluster;
mod dashboard;
mod events;
mod failover;
mod fencing;
mod front;
mod ha;
mod hardening;
mod helpers;
mod holders;
mod ids;
mod jwt;
mod lab;
mod lifecycle;
mod openapi;
mod outage;
mod plans;
mod pooler;
mod proxy;
mod purchase;
mod redlock;
mod room;
mod sentinel;
mod shed;
mod storefront;
mod streams;
mod units;
mod validation;
