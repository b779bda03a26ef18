//! Postgres: vouchers, their stock and their orders, and the one statement
//! that sells a batch of units (`sale`).
//!
//! Every query of the service is here; nothing above this module writes
//! SQL. Errors come out classified: the database being unreachable,
//! a duplicate order, or something else (a bug, logged and answered as an
//! opaque 500).

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use std::str::FromStr;
use std::time::Duration;

mod columns;
mod db;
mod events;
mod lifecycle;
mod reconcile;
mod sale;
mod users;

use crate::domain::{NewVoucher, Order, OrderId, OrderLine, StockLevel, Voucher, VoucherId};
use db::Within;
pub use db::{Db, Key};
pub use events::{Backlog, BatchEnd, BatchOf, FeedEvent, HolderChange};
pub use lifecycle::{Closed, PaymentOutcome, StockReturn, CANCEL, EXPIRE_ONE};
pub use reconcile::SaleSnapshot;
pub use sale::{BatchSale, Sale, SaleRequest, SELL_BATCH};

/// The columns of a [`Voucher`], for `s` = `seckill_vouchers` and `v` =
/// `vouchers`.
macro_rules! voucher_columns {
    () => {
        "v.id, v.title, s.initial_stock, s.stock, s.begin_time, s.end_time, s.sale_mode,
         s.price_cents, s.pay_within_seconds, s.returned, s.max_orders_per_user, s.max_units_per_user,
         s.admit_per_second, s.queue_proof_bits"
    };
}
pub(crate) use voucher_columns;

/// The unique index that allows one order per user and voucher.
const ONE_ORDER_PER_USER: &str = "voucher_orders_user_voucher";
/// The primary key of orders: a repeated order id lands here.
const ORDER_ID_KEY: &str = "voucher_orders_pkey";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Postgres cannot be reached, or refuses connections for now.
    #[error("Postgres is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// Postgres did not answer within the deadline (frozen, overloaded,
    /// or a lock wait): unavailable too, as far as the caller can tell.
    #[error("Postgres did not answer within {0:?}")]
    TimedOut(Duration),
    /// The user already has an order for this voucher.
    #[error("the user already holds an order for this voucher")]
    DuplicateOrder,
    /// The order id is taken already (the id counter went back, as when a
    /// Redis without persistence restarts within the same second).
    #[error("the order id is already taken")]
    DuplicateOrderId,
    /// A number left the range its column allows (a restock too large).
    #[error("a value is out of its column's range")]
    OutOfRange(#[source] sqlx::Error),
    /// Two transactions waited for each other, or a serialization
    /// failure: nothing was written, the same work may run again.
    #[error("a concurrent transaction got in the way")]
    Conflict(#[source] sqlx::Error),
    #[error("Postgres failed a query")]
    Other(#[source] sqlx::Error),
    /// The database was migrated with other migrations of the same
    /// versions: made by another version of this service.
    #[error("the database's migrations differ from this build's (was it made by another version of seckill, or by another program?): point DATABASE_URL at a new database, or drop this one")]
    MigrationsDiffer(#[source] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &error {
            E::PoolTimedOut | E::PoolClosed | E::Io(_) | E::Tls(_) | E::WorkerCrashed => {
                Self::Unavailable(error)
            }
            E::Database(db) => {
                let code = db.code().unwrap_or_default();
                if code == "23505" && db.constraint() == Some(ONE_ORDER_PER_USER) {
                    Self::DuplicateOrder
                } else if code == "23505" && db.constraint() == Some(ORDER_ID_KEY) {
                    Self::DuplicateOrderId
                } else if code == "22003" {
                    Self::OutOfRange(error)
                } else if code == "40P01" || code == "40001" {
                    Self::Conflict(error)
                } else if code.starts_with("08")
                    || code.starts_with("53")
                    || code.starts_with("57")
                    || code == "55P03"
                    || code == "25P03"
                    || code == "25006"
                {
                    // connection exceptions, insufficient resources
                    // (too many connections), a statement cancelled (its
                    // `statement_timeout`, `pg_cancel_backend`), admin
                    // shutdown, cannot connect now, a lock not had within
                    // `lock_timeout`, a transaction idle past its timeout:
                    // all pass once the server is back or the lock is
                    // free. And a write refused as read-only: a failover
                    // left this connection on a standby, or on a leader
                    // still being promoted; the next connection finds the
                    // new primary.
                    Self::Unavailable(error)
                } else {
                    Self::Other(error)
                }
            }
            _ => Self::Other(error),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A voucher's books, from one snapshot: `stock + unpaid + paid =
/// initial_stock` (an async sale's pending orders are counted by the
/// caller, from Redis).
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct Stats {
    pub initial_stock: i32,
    pub stock: i32,
    pub distinct_users: i64,
    pub unpaid: i64,
    pub paid: i64,
    pub cancelled: i64,
    pub expired: i64,
    /// Units of the live orders.
    pub units: i64,
    /// How many of the orders asked about are not stored, and their units.
    pub unstored_listed: i64,
    pub unstored_units: i64,
}

/// Pool sizes, timeouts and the way to Postgres for [`Store::connect`].
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Connections of the sale's commits.
    pub max_connections: u32,
    /// Connections of everything else: a flood of reads, admin calls or
    /// payments waits for these, never for the sale's.
    pub other_connections: u32,
    /// The deadline of every query, including the wait for a connection
    /// (and of a connection attempt): past it, Postgres is unavailable.
    pub timeout: Duration,
    /// The URL reaches Postgres through a pooler in transaction mode
    /// (pgbouncer): a server connection is ours for one transaction only,
    /// so no named prepared statement may outlive it.
    pub transaction_pooler: bool,
    /// A direct connection to Postgres, for what a transaction pooler
    /// cannot carry: creating the database and the migrations (which hold
    /// a session advisory lock). `None`: the pool's own URL.
    pub direct_url: Option<String>,
    /// The longest the migrations may take, their wait for another
    /// instance's migration lock included: a session that holds that lock
    /// and never lets go (stuck, or frozen) is a clear error, not a start-up
    /// that hangs for ever.
    pub migrations_deadline: Duration,
}

/// How the pools' sessions reach Postgres. Without a pooler between, each
/// session carries bounds that Postgres keeps by itself
/// ([`server_bound`]): an instance frozen (`SIGSTOP`) or cut off inside a
/// transaction would otherwise hold its row locks, and with them every
/// instance's sales of the voucher and the event feed's horizon, until it
/// ran again; and a statement its caller gave up on would wait on for
/// ever. Behind pgbouncer no startup parameter it does not know may be
/// sent: `deploy/pgbouncer.ini` sets the same bounds there.
pub fn session_options(url: &str, settings: &PoolSettings) -> Result<PgConnectOptions> {
    let options = unbounded_options(url, settings.transaction_pooler)?;
    if settings.transaction_pooler {
        return Ok(options);
    }
    let bound = server_bound(settings.timeout).as_millis().to_string();
    Ok(options.options([
        ("idle_in_transaction_session_timeout", bound.as_str()),
        ("statement_timeout", bound.as_str()),
    ]))
}

/// The URL's options, and behind a transaction pooler unnamed statements
/// only, parsed anew each time, and no startup parameter pgbouncer does
/// not know.
fn unbounded_options(url: &str, transaction_pooler: bool) -> Result<PgConnectOptions> {
    let options = PgConnectOptions::from_str(url)?
        .log_statements(tracing::log::LevelFilter::Trace)
        .application_name("seckill");
    Ok(if transaction_pooler {
        options.statement_cache_capacity(0).extra_float_digits(None)
    } else {
        options
    })
}

/// How long Postgres lets a session sit idle inside a transaction, or run
/// one statement: twice the deadline, at least a second. Every query and
/// transaction of the store ends within the deadline on the client's side,
/// so only a session whose client is gone (frozen, cut off) or gave up
/// reaches it.
pub fn server_bound(timeout: Duration) -> Duration {
    (timeout * 2).max(Duration::from_secs(1))
}

#[derive(Clone)]
pub struct Store {
    /// Everything but the sale's commits.
    db: Db,
    /// The sale's commits (`sell_batch`) alone.
    sale: Db,
}

impl Store {
    /// Creates the database if it is missing, applies the migrations and
    /// opens a pool.
    pub async fn connect(url: &str, settings: &PoolSettings) -> Result<Self> {
        let timeout = settings.timeout;
        // The migrations without the sessions' bounds: an index built on a
        // large table may take longer than twice the deadline.
        let direct = match &settings.direct_url {
            Some(direct) => PgConnectOptions::from_str(direct)?
                .log_statements(tracing::log::LevelFilter::Trace)
                .application_name("seckill-migrate"),
            None => unbounded_options(url, settings.transaction_pooler)?,
        };
        let options = session_options(url, settings)?;
        create_database_if_missing(&direct, timeout).await?;
        migrate(&direct, timeout, settings.migrations_deadline).await?;
        let pool = |size: u32| {
            PgPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(timeout)
                // A connection comes back unknown when its query was cut off
                // by the deadline. sqlx pings it before lending it again, which
                // drains the late answer; bounded here, so that a frozen server
                // cannot hold it forever: one that does not answer is closed.
                .after_release(move |conn, _| {
                    Box::pin(async move {
                        match tokio::time::timeout(timeout, conn.ping()).await {
                            Ok(answer) => answer.map(|()| true),
                            Err(_) => Err(sqlx::Error::PoolTimedOut),
                        }
                    })
                })
        };
        let db = |pool| Db {
            pool,
            timeout,
            transaction_pooler: settings.transaction_pooler,
        };
        Ok(Self {
            sale: db(pool(settings.max_connections)
                .connect_with(options.clone())
                .await?),
            db: db(pool(settings.other_connections)
                .connect_with(options)
                .await?),
        })
    }

    /// A store on a pool whose database is migrated already; every query
    /// ends within `timeout`.
    pub fn from_pool(pool: PgPool, timeout: Duration) -> Self {
        let db = Db {
            pool,
            timeout,
            transaction_pooler: false,
        };
        Self {
            sale: db.clone(),
            db,
        }
    }

    /// Postgres under the store's deadline, for a crate built on the
    /// service that keeps tables of its own (the lab).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The identity of this database, made when it was migrated: every key
    /// the service writes in Redis lives under it, so that no Redis state
    /// of another database (or of this one before a reset) is ever read as
    /// this one's.
    pub async fn namespace(&self) -> Result<uuid::Uuid> {
        self.db.scalar("SELECT namespace FROM deployment").await
    }

    /// The sale's pool.
    pub fn pool(&self) -> &PgPool {
        &self.sale.pool
    }

    /// The pool of everything else.
    pub fn other_pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// Whether Postgres takes writes now: it answers and is not a standby
    /// (a failover may leave the URL on one).
    pub async fn check_writable(&self) -> Result<bool> {
        self.db.scalar("SELECT NOT pg_is_in_recovery()").await
    }

    pub async fn create_voucher(&self, new: &NewVoucher) -> Result<VoucherId> {
        // One statement, so a voucher never exists without its sale.
        let terms = &new.terms;
        let title = terms.title.clone();
        let id = self
            .db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_scalar(
                        "WITH v AS (INSERT INTO vouchers (title) VALUES ($1) RETURNING id)
             INSERT INTO seckill_vouchers (voucher_id, initial_stock, stock, begin_time, end_time,
                                           sale_mode, price_cents, pay_within_seconds,
                                           max_orders_per_user, max_units_per_user,
                                           admit_per_second, queue_proof_bits)
             SELECT id, $2, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM v
             RETURNING voucher_id",
                    )
                    .bind(title)
                    .bind(new.stock)
                    .bind(terms.begin_time)
                    .bind(terms.end_time)
                    .bind(terms.sale_mode)
                    .bind(terms.price_cents)
                    .bind(terms.pay_within_seconds)
                    .bind(terms.max_orders_per_user)
                    .bind(terms.max_units_per_user)
                    .bind(terms.admit_per_second)
                    .bind(terms.queue_proof_bits)
                    .persistent(persistent)
                    .fetch_one(c),
                )
            })
            .await?;
        Ok(id)
    }

    pub async fn voucher(&self, id: VoucherId) -> Result<Option<Voucher>> {
        const SQL: &str = concat!(
            "SELECT ",
            voucher_columns!(),
            " FROM vouchers v JOIN seckill_vouchers s ON s.voucher_id = v.id WHERE v.id = $1"
        );
        self.db.row_by_id(SQL, id).await
    }

    /// The highest voucher id (0 with none): ids are drawn in order, so
    /// none above it is a voucher.
    pub async fn newest_voucher_id(&self) -> Result<i64> {
        self.db
            .scalar("SELECT coalesce(max(id), 0)::bigint FROM vouchers")
            .await
    }

    /// The vouchers whose sale has not ended at `now`, on sale first, then
    /// coming, each by its start; at most `limit`: past it, of the sales on
    /// now those that began last, of those coming the first to start, each
    /// side kept to half the bound where the other fills its own (a sale
    /// that opened a minute ago is listed however many long ones run beside
    /// it, and the next to start however many run).
    pub async fn vouchers_not_ended(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<Voucher>> {
        const SQL: &str = concat!(
            "SELECT ",
            voucher_columns!(),
            " FROM vouchers v JOIN seckill_vouchers s ON s.voucher_id = v.id",
            " WHERE s.voucher_id IN (",
            "(SELECT voucher_id FROM seckill_vouchers WHERE begin_time <= $1 AND end_time > $1",
            " ORDER BY begin_time DESC, voucher_id DESC LIMIT $2)",
            " UNION ALL",
            " (SELECT voucher_id FROM seckill_vouchers WHERE begin_time > $1 AND end_time > $1",
            " ORDER BY begin_time, voucher_id LIMIT $2))",
            " ORDER BY s.begin_time > $1, s.begin_time, v.id"
        );
        let mut listed: Vec<Voucher> = self
            .db
            .run(|c, persistent| {
                Box::pin(
                    sqlx::query_as(SQL)
                        .bind(now)
                        .bind(limit)
                        .persistent(persistent)
                        .fetch_all(c),
                )
            })
            .await?;
        let on_sale = listed
            .iter()
            .take_while(|v| v.terms.begin_time <= now)
            .count();
        let (take_on_sale, take_coming) = shares(
            on_sale,
            listed.len() - on_sale,
            usize::try_from(limit).unwrap_or(0),
        );
        // On sale, by start: the last `take_on_sale` began last.
        let coming = listed.split_off(on_sale);
        let mut kept = listed.split_off(on_sale - take_on_sale);
        kept.extend(coming.into_iter().take(take_coming));
        Ok(kept)
    }

    pub async fn stock_level(&self, voucher_id: VoucherId) -> Result<Option<StockLevel>> {
        const SQL: &str =
            "SELECT stock, initial_stock, returned FROM seckill_vouchers WHERE voucher_id = $1";
        self.db.row_by_id(SQL, voucher_id).await
    }

    /// Adds `units` to both the stock and the initial stock; returns the
    /// voucher as the update left it.
    pub async fn restock(&self, voucher_id: VoucherId, units: i32) -> Result<Option<Voucher>> {
        self.db
            .run(|c, persistent| {
                Box::pin(
                    sqlx::query_as(concat!(
                        "UPDATE seckill_vouchers s
                         SET stock = s.stock + $2, initial_stock = s.initial_stock + $2
                         FROM vouchers v
                         WHERE s.voucher_id = $1 AND v.id = s.voucher_id
                         RETURNING ",
                        voucher_columns!()
                    ))
                    .bind(voucher_id)
                    .bind(units)
                    .persistent(persistent)
                    .fetch_optional(c),
                )
            })
            .await
    }

    /// The highest per-day sequence among the order ids in `ids` (one UTC
    /// day's range, see `domain::day_range`), 0 when there is none. Read once
    /// after Redis lost a day's counter; it walks that day's ids in the
    /// primary key.
    pub async fn highest_sequence(&self, ids: std::ops::Range<i64>) -> Result<u32> {
        let highest: i64 = self
            .db
            .run(|c, persistent| {
                Box::pin(
                    sqlx::query_scalar(
                        "SELECT coalesce(max(id & 4294967295), 0) FROM voucher_orders
             WHERE id >= $1 AND id < $2",
                    )
                    .bind(ids.start)
                    .bind(ids.end)
                    .persistent(persistent)
                    .fetch_one(c),
                )
            })
            .await?;
        Ok(u32::try_from(highest).unwrap_or(u32::MAX))
    }

    pub async fn order(&self, order_id: OrderId) -> Result<Option<Order>> {
        const SQL: &str =
            "SELECT o.id, o.user_id, o.voucher_id, o.quantity, o.created_at, o.status, o.pay_by, o.paid_at,
                    u.subject AS user_ref
             FROM voucher_orders o LEFT JOIN user_refs u ON u.user_id = o.user_id
             WHERE o.id = $1";
        self.db.row_by_id(SQL, order_id).await
    }

    /// Every order of a voucher, oldest first.
    pub async fn orders_for_voucher(&self, voucher_id: VoucherId) -> Result<Vec<OrderLine>> {
        const SQL: &str =
            "SELECT id, user_id, status, quantity FROM voucher_orders WHERE voucher_id = $1 ORDER BY id";
        self.db.rows_by_id(SQL, voucher_id).await
    }

    /// The voucher's books and which of `listed` (order ids, with their
    /// units) are not stored, in one statement (one snapshot).
    pub async fn stats(
        &self,
        voucher_id: VoucherId,
        listed: Vec<(OrderId, i32)>,
    ) -> Result<Option<Stats>> {
        let (ids, units): (Vec<OrderId>, Vec<i32>) = listed.into_iter().unzip();
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(
                        "SELECT s.initial_stock, s.stock,
                                l.unstored_listed, l.unstored_units,
                                coalesce(o.distinct_users, 0) AS distinct_users,
                                coalesce(o.unpaid, 0) AS unpaid, coalesce(o.paid, 0) AS paid,
                                coalesce(o.cancelled, 0) AS cancelled,
                                coalesce(o.expired, 0) AS expired,
                                coalesce(o.units, 0)::bigint AS units
                         FROM seckill_vouchers s
                         LEFT JOIN LATERAL (
                             SELECT count(DISTINCT user_id)
                                        FILTER (WHERE status IN ('unpaid', 'paid')) AS distinct_users,
                                    count(*) FILTER (WHERE status = 'unpaid') AS unpaid,
                                    count(*) FILTER (WHERE status = 'paid') AS paid,
                                    count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
                                    count(*) FILTER (WHERE status = 'expired') AS expired,
                                    sum(quantity) FILTER (WHERE status IN ('unpaid', 'paid')) AS units
                             FROM voucher_orders WHERE voucher_id = s.voucher_id
                         ) o ON true
                         CROSS JOIN LATERAL (
                             SELECT count(*) AS unstored_listed,
                                    coalesce(sum(l.units), 0)::bigint AS unstored_units
                             FROM unnest($2::bigint[], $3::int[]) AS l(id, units)
                             WHERE NOT EXISTS (SELECT 1 FROM voucher_orders WHERE id = l.id)
                         ) l
                         WHERE s.voucher_id = $1",
                    )
                    .bind(voucher_id)
                    .bind(ids.clone())
                    .bind(units.clone())
                    .persistent(persistent)
                    .fetch_optional(c),
                )
            })
            .await
    }
}

/// How many of `on_sale` and of `coming` vouchers a list of at most
/// `limit` holds: each side half the bound at least where it has them,
/// what one side leaves going to the other.
fn shares(on_sale: usize, coming: usize, limit: usize) -> (usize, usize) {
    let coming_kept = coming.min(limit.saturating_sub(on_sale).max(limit / 2));
    let on_sale_kept = on_sale.min(limit - coming_kept);
    (on_sale_kept, coming_kept)
}

/// Applies the migrations over one direct connection (they take a session
/// advisory lock, so that instances starting together migrate once).
async fn migrate(options: &PgConnectOptions, timeout: Duration, deadline: Duration) -> Result<()> {
    let mut conn = options.connect().within(timeout).await?;
    let mut migrator = sqlx::migrate!("./migrations");
    // A database migrated by a version whose product held the lab (or by
    // `seckill-lab`) lists the lab's migration, which this set lacks.
    migrator.set_ignore_missing(true);
    match tokio::time::timeout(deadline, migrator.run(&mut conn)).await {
        Err(_) => return Err(StoreError::TimedOut(deadline)),
        // A table or type of the same name there already: another
        // program's schema (or one made by hand), not Postgres away.
        Ok(Err(error)) if made_by_another(&error) => {
            return Err(StoreError::MigrationsDiffer(error))
        }
        // A connection lost or refused mid-way is Postgres away (tried
        // again at start-up), not a migration's fault.
        Ok(Err(
            sqlx::migrate::MigrateError::Execute(error)
            | sqlx::migrate::MigrateError::ExecuteMigration(error, _),
        )) => return Err(StoreError::from(error)),
        Ok(Err(error @ sqlx::migrate::MigrateError::VersionMismatch(_))) => {
            return Err(StoreError::MigrationsDiffer(error))
        }
        Ok(ran) => ran.map_err(|e| StoreError::Other(e.into()))?,
    }
    conn.close().within(timeout).await?;
    Ok(())
}

/// Whether a migration failed on an object of its name that the database
/// holds already (`duplicate_table`, `duplicate_object`, ...).
fn made_by_another(error: &sqlx::migrate::MigrateError) -> bool {
    let sqlx::migrate::MigrateError::ExecuteMigration(sqlx::Error::Database(db), _) = error else {
        return false;
    };
    matches!(
        db.code().as_deref(),
        Some("42P07" | "42710" | "42723" | "42P06" | "42701")
    )
}

/// Creates the database named in `options` when it does not exist yet.
/// Two instances starting together may race; the loser's "already exists"
/// is success too.
async fn create_database_if_missing(options: &PgConnectOptions, timeout: Duration) -> Result<()> {
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(());
    };
    let mut admin = options
        .clone()
        .database("postgres")
        .connect()
        .within(timeout)
        .await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut admin)
            .within(timeout)
            .await?;
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        // CREATE DATABASE copies a template: seconds on a busy server.
        let statement = format!("CREATE DATABASE {quoted}");
        let create = sqlx::query(&statement).execute(&mut admin);
        match tokio::time::timeout(timeout.max(Duration::from_secs(30)), create).await {
            Err(_) => return Err(StoreError::TimedOut(timeout.max(Duration::from_secs(30)))),
            Ok(Ok(_)) => tracing::info!(database = %name, "created the database"),
            // 42P04: it exists by now; 23505: a concurrent CREATE won the race.
            Ok(Err(sqlx::Error::Database(db)))
                if matches!(db.code().as_deref(), Some("42P04" | "23505")) => {}
            Ok(Err(error)) => return Err(error.into()),
        }
    }
    admin.close().within(timeout).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn a_full_list_keeps_half_for_each_side_and_gives_what_one_leaves_to_the_other() {
        // (on sale, coming, bound) -> (on sale kept, coming kept)
        for (on_sale, coming, limit, kept) in [
            (10, 5, 200, (10, 5)),
            (300, 0, 200, (200, 0)),
            (0, 300, 200, (0, 200)),
            (300, 300, 200, (100, 100)),
            (300, 10, 200, (190, 10)),
            (10, 300, 200, (10, 190)),
            (1, 1, 1, (1, 0)),
            (0, 0, 0, (0, 0)),
        ] {
            assert_eq!(
                shares(on_sale, coming, limit),
                kept,
                "{on_sale}, {coming}, {limit}"
            );
        }
    }
}
