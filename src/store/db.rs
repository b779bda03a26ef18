//! How every query reaches Postgres: under a deadline, and in a form that a
//! pooler in transaction mode (pgbouncer) can carry.
//!
//! A frozen or stuck Postgres costs a query at most the deadline, then the
//! store reports it unavailable. Behind a transaction pooler a server
//! connection is ours for one transaction only: sqlx parses a statement and
//! runs it in two exchanges, and between them pgbouncer may hand the server
//! to another client. There each query runs as an unnamed statement inside
//! a transaction of its own, so both exchanges reach the same server.

use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, PgPool, Postgres};

use super::{Result, StoreError};

/// The pool, the deadline, and whether a transaction pooler is in between:
/// how a query of the store, or of a crate built on it (the lab), reaches
/// Postgres.
#[derive(Clone)]
pub struct Db {
    pub(super) pool: PgPool,
    pub(super) timeout: Duration,
    pub(super) transaction_pooler: bool,
}

impl Db {
    /// The pool itself, for what runs outside a deadline (migrations).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs one query, built by `query` on the connection it is given and
    /// marked persistent (a named, cached prepared statement) or not as
    /// told, within the deadline. The connection of a query cut short is
    /// checked before the pool lends it again (see `Store::connect`), so its
    /// late answer reaches nobody.
    pub async fn run<T, F>(&self, query: F) -> Result<T>
    where
        T: Send,
        F: for<'c> FnOnce(&'c mut PgConnection, bool) -> BoxFuture<'c, Result<T, sqlx::Error>>
            + Send,
    {
        let work = async {
            if self.transaction_pooler {
                let mut tx = self.pool.begin().await?;
                let answer = query(&mut tx, false).await?;
                tx.commit().await?;
                Ok(answer)
            } else {
                let mut conn = self.pool.acquire().await?;
                query(&mut conn, true).await
            }
        };
        work.within(self.timeout).await
    }

    /// Runs `query`, a statement that returns no rows; how many rows it
    /// changed.
    pub async fn execute(&self, query: Query<'static, Postgres, PgArguments>) -> Result<u64> {
        self.run(move |c, persistent| {
            Box::pin(async move {
                let done = query.persistent(persistent).execute(c).await?;
                Ok(done.rows_affected())
            })
        })
        .await
    }

    /// The one value `sql`, which takes no parameter, selects.
    pub async fn scalar<T>(&self, sql: &'static str) -> Result<T>
    where
        T: Send + Unpin + 'static,
        (T,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        self.run(|c, persistent| {
            Box::pin(sqlx::query_scalar(sql).persistent(persistent).fetch_one(c))
        })
        .await
    }

    /// The row `sql` finds for `id`, its one parameter, if any: `sql`
    /// selects by a key, so one row at most.
    pub async fn row_by_id<T, I>(&self, sql: &'static str, id: I) -> Result<Option<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin + 'static,
        I: Key,
    {
        Ok(self.rows_by_id(sql, id).await?.into_iter().next())
    }

    /// Every row `sql` finds for `id`, its one parameter.
    pub async fn rows_by_id<T, I>(&self, sql: &'static str, id: I) -> Result<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin + 'static,
        I: Key,
    {
        self.run(|c, persistent| {
            Box::pin(
                sqlx::query_as(sql)
                    .bind(id)
                    .persistent(persistent)
                    .fetch_all(c),
            )
        })
        .await
    }
}

/// A value a row is selected by: one of the domain's ids.
pub trait Key:
    for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Copy + Send + Sync + 'static
{
}

impl<T> Key for T where
    T: for<'q> sqlx::Encode<'q, sqlx::Postgres>
        + sqlx::Type<sqlx::Postgres>
        + Copy
        + Send
        + Sync
        + 'static
{
}

/// `.within(timeout)` on any sqlx future: its answer, or
/// [`StoreError::TimedOut`] once `timeout` has passed.
pub trait Within<T>: Future<Output = Result<T, sqlx::Error>> + Sized {
    async fn within(self, timeout: Duration) -> Result<T, StoreError> {
        match tokio::time::timeout(timeout, self).await {
            Ok(answer) => answer.map_err(StoreError::from),
            Err(_) => Err(StoreError::TimedOut(timeout)),
        }
    }
}

impl<T, F: Future<Output = Result<T, sqlx::Error>>> Within<T> for F {}
