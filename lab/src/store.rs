//! Postgres for the lab: its vouchers, orders and fences, in tables without
//! the real schema's safety constraints (see the lab migration), and the
//! variants of the sale statement that the lab's strategies compare.

use seckill::store::{Db, Result, StoreError};
use sqlx::PgConnection;

/// The condition under which a strategy's sale decrements the stock. The
/// three lock-free strategies differ in this alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decrement {
    /// Whatever the stock is now (the check was made on an earlier read).
    Always,
    /// Only if the stock still equals the value read: compare-and-set.
    IfUnchanged(i32),
    /// Only if a unit is left now: `stock > 0`, checked under the row lock.
    IfLeft,
}

/// The answer to a fenced sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabSale {
    Sold(i64),
    SoldOut,
    /// A newer lock holder of this user wrote first: nothing was written.
    Fenced,
}

/// What a lab voucher's rows say now.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct LabStats {
    pub initial_stock: i32,
    pub stock: i32,
    pub orders: i64,
    pub distinct_users: i64,
    pub foreign_releases: i32,
}

#[derive(Clone)]
pub struct LabStore {
    db: Db,
}

impl LabStore {
    /// The lab's tables, on the service's Postgres and deadline.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Creates the lab's tables, only where the lab runs. The service's
    /// own migrations are applied already and are not in this set, hence
    /// `ignore_missing`.
    pub async fn migrate(&self) -> Result<()> {
        let mut migrator = sqlx::migrate!("./migrations");
        migrator.set_ignore_missing(true);
        // On a connection of its own, without the pool's statement_timeout:
        // the wait for another instance's migration lock may be longer.
        let mut conn = self.db.pool().acquire().await?.detach();
        sqlx::query("SET statement_timeout = 0")
            .execute(&mut conn)
            .await?;
        let ran = migrator
            .run(&mut conn)
            .await
            .map_err(|e| StoreError::Other(e.into()));
        let _ = sqlx::Connection::close(conn).await;
        ran
    }

    pub async fn create_voucher(&self, stock: i32) -> Result<i64> {
        self.db
            .run(|c, persistent| {
                Box::pin(
sqlx::query_scalar(
            "INSERT INTO lab_vouchers (initial_stock, stock) VALUES ($1, $1) RETURNING id",
        )
        .bind(stock)
        .persistent(persistent)
                .fetch_one(c),
            )
            })
            .await
    }

    /// The stock as committed now; `None` for an unknown voucher.
    pub async fn stock(&self, voucher_id: i64) -> Result<Option<i32>> {
        let row: Option<(i32,)> = self
            .db
            .row_by_id("SELECT stock FROM lab_vouchers WHERE id = $1", voucher_id)
            .await?;
        Ok(row.map(|(stock,)| stock))
    }

    pub async fn has_order(&self, user_id: i64, voucher_id: i64) -> Result<bool> {
        self.db
            .run(|c, persistent| Box::pin(has_order_on(c, persistent, user_id, voucher_id)))
            .await
    }

    /// Decrements the stock under `decrement`'s condition and inserts the
    /// order, in one statement; the order id, or `None` when the condition
    /// refused (or the voucher is unknown).
    pub async fn sell(
        &self,
        strategy: &str,
        user_id: i64,
        voucher_id: i64,
        decrement: Decrement,
    ) -> Result<Option<i64>> {
        let strategy = strategy.to_owned();
        self.db
            .run(move |c, persistent| {
                Box::pin(async move {
                    sell_on(c, persistent, &strategy, user_id, voucher_id, decrement).await
                })
            })
            .await
    }

    /// Postgres under the store's deadline, for the designs that hold a
    /// transaction open across steps of their own (`lock_before_commit`,
    /// `for_update`): the whole transaction runs within one deadline.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Stores an order a Redis-stock design accepted: once per user (a
    /// writer may store an entry twice), decrementing the stock as Redis
    /// did. `None` when the user has the order already.
    pub async fn store_accepted(
        &self,
        strategy: &str,
        user_id: i64,
        voucher_id: i64,
    ) -> Result<Option<i64>> {
        let strategy = strategy.to_owned();
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_scalar(
                        "WITH taken AS (
                             UPDATE lab_vouchers SET stock = stock - 1
                             WHERE id = $1 AND NOT EXISTS (
                                 SELECT 1 FROM lab_orders WHERE voucher_id = $1 AND user_id = $2
                             )
                             RETURNING id
                         )
                         INSERT INTO lab_orders (voucher_id, user_id, strategy)
                         SELECT id, $2, $3 FROM taken
                         RETURNING id",
                    )
                    .bind(voucher_id)
                    .bind(user_id)
                    .bind(strategy)
                    .persistent(persistent)
                    .fetch_optional(c),
                )
            })
            .await
    }

    /// The `stock > 0` sale behind a fence: refused when `token` is smaller
    /// than the last token written for this user and voucher (the shape of
    /// `store::SELL_BATCH`).
    pub async fn sell_fenced(
        &self,
        strategy: &str,
        user_id: i64,
        voucher_id: i64,
        token: i64,
    ) -> Result<LabSale> {
        let strategy = strategy.to_owned();
        let (fenced_in, order): (bool, Option<i64>) = self
            .db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(
                        "WITH fence AS (
                 INSERT INTO lab_fences (voucher_id, user_id, token) VALUES ($1, $2, $4)
                 ON CONFLICT (voucher_id, user_id) DO UPDATE SET token = EXCLUDED.token
                 WHERE lab_fences.token <= EXCLUDED.token
                 RETURNING token
             ), taken AS (
                 UPDATE lab_vouchers SET stock = stock - 1
                 WHERE id = $1 AND stock > 0 AND EXISTS (SELECT 1 FROM fence)
                 RETURNING id
             ), placed AS (
                 INSERT INTO lab_orders (voucher_id, user_id, strategy)
                 SELECT id, $2, $3 FROM taken
                 RETURNING id
             )
             SELECT EXISTS (SELECT 1 FROM fence), (SELECT id FROM placed)",
                    )
                    .bind(voucher_id)
                    .bind(user_id)
                    .bind(strategy)
                    .bind(token)
                    .persistent(persistent)
                    .fetch_one(c),
                )
            })
            .await?;
        Ok(match (fenced_in, order) {
            (false, _) => LabSale::Fenced,
            (true, Some(id)) => LabSale::Sold(id),
            (true, None) => LabSale::SoldOut,
        })
    }

    /// Presents `token` for this user and voucher without writing anything
    /// else: stored if it is not smaller than the last one. `false`: a
    /// newer holder has presented one already.
    pub async fn claim_fence(&self, user_id: i64, voucher_id: i64, token: i64) -> Result<bool> {
        Ok(self
            .db
            .run(|c, persistent| {
                Box::pin(
                    sqlx::query_scalar::<_, i64>(
                        "INSERT INTO lab_fences (voucher_id, user_id, token) VALUES ($1, $2, $3)
             ON CONFLICT (voucher_id, user_id) DO UPDATE SET token = EXCLUDED.token
             WHERE lab_fences.token <= EXCLUDED.token
             RETURNING token",
                    )
                    .bind(voucher_id)
                    .bind(user_id)
                    .bind(token)
                    .persistent(persistent)
                    .fetch_optional(c),
                )
            })
            .await?
            .is_some())
    }

    /// Counts a lock release that deleted another request's lock.
    pub async fn count_foreign_release(&self, voucher_id: i64) -> Result<()> {
        self.db
            .execute(
                sqlx::query(
                    "UPDATE lab_vouchers SET foreign_releases = foreign_releases + 1 WHERE id = $1",
                )
                .bind(voucher_id),
            )
            .await?;
        Ok(())
    }

    pub async fn stats(&self, voucher_id: i64) -> Result<Option<LabStats>> {
        self.db
            .run(|c, persistent| {
                Box::pin(
                    sqlx::query_as(
                        "SELECT v.initial_stock, v.stock,
                    (SELECT count(*) FROM lab_orders o WHERE o.voucher_id = v.id) AS orders,
                    (SELECT count(DISTINCT user_id) FROM lab_orders o WHERE o.voucher_id = v.id)
                        AS distinct_users,
                    v.foreign_releases
             FROM lab_vouchers v WHERE v.id = $1",
                    )
                    .bind(voucher_id)
                    .persistent(persistent)
                    .fetch_optional(c),
                )
            })
            .await
    }
}

/// The sale statement of [`LabStore::sell`], on a connection that may be
/// inside a transaction: decrements the stock under `decrement`'s condition
/// and inserts the order; `None` when the condition refused.
pub async fn sell_on(
    c: &mut PgConnection,
    persistent: bool,
    strategy: &str,
    user_id: i64,
    voucher_id: i64,
    decrement: Decrement,
) -> Result<Option<i64>, sqlx::Error> {
    let condition = match decrement {
        Decrement::Always => "",
        Decrement::IfUnchanged(_) => "AND stock = $4",
        Decrement::IfLeft => "AND stock > 0",
    };
    let sql = format!(
        "WITH taken AS (
             UPDATE lab_vouchers SET stock = stock - 1 WHERE id = $1 {condition} RETURNING id
         )
         INSERT INTO lab_orders (voucher_id, user_id, strategy)
         SELECT id, $2, $3 FROM taken
         RETURNING id"
    );
    let mut query = sqlx::query_scalar::<_, i64>(&sql)
        .bind(voucher_id)
        .bind(user_id)
        .bind(strategy);
    if let Decrement::IfUnchanged(seen) = decrement {
        query = query.bind(seen);
    }
    query.persistent(persistent).fetch_optional(c).await
}

/// "Already bought?" on a connection that may be inside a transaction: it
/// sees what was committed when the statement began (READ COMMITTED), and
/// the transaction's own writes.
pub async fn has_order_on(
    c: &mut PgConnection,
    persistent: bool,
    user_id: i64,
    voucher_id: i64,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM lab_orders WHERE voucher_id = $1 AND user_id = $2)",
    )
    .bind(voucher_id)
    .bind(user_id)
    .persistent(persistent)
    .fetch_one(c)
    .await
}

/// `for_update`'s first statement: the voucher's stock, read with its row
/// locked until the transaction ends (`None`: no such voucher). Every other
/// transaction that asks for the row waits here until this one ends.
pub async fn lock_stock_on(
    c: &mut PgConnection,
    persistent: bool,
    voucher_id: i64,
) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar("SELECT stock FROM lab_vouchers WHERE id = $1 FOR UPDATE")
        .bind(voucher_id)
        .persistent(persistent)
        .fetch_optional(c)
        .await
}
