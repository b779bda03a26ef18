//! The words of the sale that every layer speaks: the ids of vouchers,
//! users and orders ([`VoucherId`], [`UserId`], [`OrderId`]), a voucher
//! and an order ([`Voucher`], [`Order`]), how a voucher sells and where an
//! order stands ([`SaleMode`], [`OrderStatus`]), and how a purchase ended
//! ([`Outcome`]), the events of an order's changes ([`OrderEvent`]), and
//! the fencing token a purchase's lock hands to the sale ([`FencingToken`]),
//! and the units a purchase asks for ([`Quantity`]).
//! `store` maps rows to them, `http` maps them to paths, statuses and
//! JSON; this module depends on nothing of the crate.

mod events;
mod fence;
mod ids;
mod outcome;
mod quantity;
mod records;
mod states;

pub use events::{EventId, EventType, NotAnEventId, OrderEvent, RefundDue};
pub use fence::FencingToken;
pub use ids::{
    day_range, day_start, parse_positive, NotAnId, NotAnOrderId, OrderId, UserId, VoucherId,
    EPOCH_UNIX,
};
pub use outcome::Outcome;
pub use quantity::Quantity;
pub use records::{NewVoucher, Order, OrderLine, Payment, StockLevel, Voucher, VoucherTerms};
pub use states::{OrderStatus, SaleMode, UnknownState};
