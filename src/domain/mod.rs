//! The words of the sale that every layer speaks: how a purchase ended
//! ([`Outcome`]). `store` maps rows to them, `http` maps them to statuses
//! and JSON; this module depends on nothing of the crate.

mod outcome;

pub use outcome::Outcome;
