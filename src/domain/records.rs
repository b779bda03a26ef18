//! A voucher and its orders as the sale reads them: a [`Voucher`] with its
//! [`VoucherTerms`] (window, price, limits) and its [`StockLevel`], the
//! [`NewVoucher`] an admin's draft is parsed into, and an [`Order`] with
//! where it stands.

use chrono::{DateTime, Utc};

use super::{OrderId, OrderStatus, SaleMode, UserId, VoucherId};

/// What a voucher sells and on what terms: everything an admin sets but
/// its stock.
#[derive(Debug, Clone)]
pub struct VoucherTerms {
    pub title: String,
    pub begin_time: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    pub sale_mode: SaleMode,
    /// What one unit costs; a payment must bring exactly this.
    pub price_cents: i64,
    /// How long a buyer has to pay, from the order's creation.
    pub pay_within_seconds: i32,
    /// Most orders (live, cancelled or expired) one user may have of it.
    pub max_orders_per_user: i32,
    /// Most units one order may take ("limit N per customer": one live
    /// order per user, so also the most a user holds at once).
    pub max_units_per_user: i32,
    /// Its waiting room's pace, if it has one.
    pub admit_per_second: Option<i32>,
    /// Zero bits of proof of work a join of its room asks for (0: none).
    pub queue_proof_bits: i16,
}

/// A flash-sale voucher: what it sells, when, at what price, and its stock.
#[derive(Debug, Clone)]
pub struct Voucher {
    pub id: VoucherId,
    pub terms: VoucherTerms,
    pub level: StockLevel,
}

#[cfg(test)]
impl Voucher {
    /// A sync voucher `id` on sale for the next hour at `level`, one order
    /// per user: what the sale's unit tests need of a voucher.
    pub(crate) fn on_sale(id: i64, level: StockLevel) -> Self {
        let begin_time = Utc::now();
        Self {
            id: VoucherId::new(id).unwrap(),
            terms: VoucherTerms {
                title: format!("voucher {id}"),
                begin_time,
                end_time: begin_time + chrono::Duration::hours(1),
                sale_mode: SaleMode::Sync,
                price_cents: 100,
                pay_within_seconds: 900,
                max_orders_per_user: 1,
                max_units_per_user: 1,
                admit_per_second: None,
                queue_proof_bits: 0,
            },
            level,
        }
    }
}

/// A voucher to create, every field in the range its column holds.
#[derive(Debug, Clone)]
pub struct NewVoucher {
    pub terms: VoucherTerms,
    pub stock: i32,
}

/// A payment provider's notification, as verified by its signature: the
/// money it says was paid for an order.
#[derive(Debug, Clone)]
pub struct Payment {
    pub payment_id: String,
    pub order_id: OrderId,
    pub amount_cents: i64,
}

/// Units of a voucher sold to one user, all at once.
#[derive(Debug, Clone)]
pub struct Order {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    /// Units it took (1 to the voucher's `max_units_per_user`), all or
    /// nothing; a cancel or expiry gives them all back.
    pub quantity: i32,
    pub created_at: DateTime<Utc>,
    pub status: OrderStatus,
    /// `None` only while an async order is pending.
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    /// The shop's `sub` its user signed in under with a JWT; `None` for
    /// users the service's own tokens name, and while an async order is
    /// pending.
    pub user_ref: Option<String>,
}

/// Stock, initial stock and units given back, read together in one row
/// version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockLevel {
    pub stock: i32,
    pub initial_stock: i32,
    pub returned: i64,
}

impl StockLevel {
    /// The state of the voucher's stock that a sold-out flag speaks for:
    /// it grows with every restock and every unit given back.
    pub fn epoch(&self) -> i64 {
        i64::from(self.initial_stock) + self.returned
    }
}

/// One order of a voucher, as the admin listing shows it.
#[derive(Debug, Clone, Copy)]
pub struct OrderLine {
    pub id: OrderId,
    pub user_id: UserId,
    pub status: OrderStatus,
    pub quantity: i32,
}
