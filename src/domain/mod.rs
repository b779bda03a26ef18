//! The words of the sale that every layer speaks: the ids of vouchers and
//! users ([`VoucherId`], [`UserId`]), how a voucher sells and where an
//! order stands ([`SaleMode`], [`OrderStatus`]), and how a purchase ended
//! ([`Outcome`]). `http` maps them to paths, statuses and JSON; this module
//! depends on nothing of the crate.

mod ids;
mod outcome;
mod states;

pub use ids::{UserId, VoucherId};
pub use outcome::Outcome;
pub use states::{OrderStatus, SaleMode, UnknownState};
