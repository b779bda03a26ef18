//! A voucher and its orders as the sale reads them: a [`Voucher`] with its
//! window, price and stock, the [`NewVoucher`] an admin's draft is parsed
//! into, its [`StockLevel`], and an [`Order`] with where it stands.

use chrono::{DateTime, Utc};

use super::{OrderId, OrderStatus, SaleMode, UserId, VoucherId};

/// A flash-sale voucher: what it sells, when, at what price, and its stock.
#[derive(Debug, Clone)]
pub struct Voucher {
    pub id: VoucherId,
    pub title: String,
    pub initial_stock: i32,
    pub stock: i32,
    pub begin_time: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    pub sale_mode: SaleMode,
    /// What one unit costs; a payment must bring exactly this.
    pub price_cents: i64,
    /// How long a buyer has to pay, from the order's creation.
    pub pay_within_seconds: i32,
    /// Units given back by cancelled and expired orders.
    pub returned: i64,
    /// Most orders (live, cancelled or expired) one user may have of it.
    pub max_orders_per_user: i32,
    /// Its waiting room's pace, if it has one.
    pub admit_per_second: Option<i32>,
    /// Zero bits of proof of work a join of its room asks for (0: none).
    pub queue_proof_bits: i16,
}

impl Voucher {
    /// The state of the voucher's stock that a sold-out flag speaks for:
    /// it grows with every restock and every unit given back.
    pub fn epoch(&self) -> i64 {
        self.level().epoch()
    }

    pub fn level(&self) -> StockLevel {
        StockLevel {
            stock: self.stock,
            initial_stock: self.initial_stock,
            returned: self.returned,
        }
    }
}

/// A voucher to create, every field in the range its column holds.
#[derive(Debug, Clone)]
pub struct NewVoucher {
    pub title: String,
    pub stock: i32,
    pub begin_time: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    pub sale_mode: SaleMode,
    pub price_cents: i64,
    pub pay_within_seconds: i32,
    pub max_orders_per_user: i32,
    pub admit_per_second: Option<i32>,
    pub queue_proof_bits: i16,
}

/// One unit sold to one user.
#[derive(Debug, Clone)]
pub struct Order {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    pub created_at: DateTime<Utc>,
    pub status: OrderStatus,
    /// `None` only while an async order is pending.
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
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
    /// See [`Voucher::epoch`].
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
}
