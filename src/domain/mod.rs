//! The words of the sale that every layer speaks: the ids of vouchers and
//! users ([`VoucherId`], [`UserId`]) and how a purchase ended
//! ([`Outcome`]). `http` maps them to paths, statuses and JSON; this module
//! depends on nothing of the crate.

mod ids;
mod outcome;

pub use ids::{UserId, VoucherId};
pub use outcome::Outcome;
