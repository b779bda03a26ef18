//! The plans Postgres keeps for the hot statements. A connection keeps the
//! generic plan it chose for a prepared statement, and a service's
//! connections choose theirs early: on a new database, whose tables are
//! empty and have no statistics, so that a scan and every index cost about
//! the same. Those plans must still find orders through the index that
//! names them; otherwise each statement reads every order (or every unpaid
//! one), more with every unit sold, until the table is analyzed.

use sqlx::pool::PoolConnection;
use sqlx::Postgres;

use crate::helpers::spawn_app;

/// The generic plan of `sql` (parameters of `types`) for `args`, as text.
async fn generic_plan(
    conn: &mut PoolConnection<Postgres>,
    types: &str,
    sql: &str,
    args: &str,
) -> String {
    planned(conn, types, sql, args, "EXPLAIN").await
}

/// The generic plan of `sql` for `args` as `explain` (an `EXPLAIN` with
/// its options) shows it.
async fn planned(
    conn: &mut PoolConnection<Postgres>,
    types: &str,
    sql: &str,
    args: &str,
    explain: &str,
) -> String {
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut **conn)
        .await
        .unwrap();
    sqlx::query(&format!("PREPARE planned({types}) AS {sql}"))
        .execute(&mut **conn)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(&format!("{explain} EXECUTE planned({args})"))
        .fetch_all(&mut **conn)
        .await
        .unwrap();
    for reset in ["DEALLOCATE planned", "RESET plan_cache_mode"] {
        sqlx::query(reset).execute(&mut **conn).await.unwrap();
    }
    plan.join("\n")
}

#[tokio::test]
async fn the_batch_sale_looks_orders_and_fences_up_by_index_on_a_new_database() {
    let app = spawn_app().await;
    let mut conn = app.db.acquire().await.unwrap();
    let plan = generic_plan(
        &mut conn,
        "bigint, bigint[], bigint[], bigint[], timestamptz[], bigint, int[]",
        seckill::store::SELL_BATCH,
        "1, '{1}', '{1}', '{1}', ARRAY[now()], 3, '{1}'",
    )
    .await;
    for table in ["voucher_orders", "user_fences", "seckill_vouchers"] {
        assert!(
            !plan.contains(&format!("Seq Scan on {table}")),
            "the generic plan scans {table}:\n{plan}"
        );
    }
    assert!(
        plan.contains("Index Scan using voucher_orders_pkey"),
        "{plan}"
    );
    assert!(
        plan.contains("Index Scan using voucher_orders_voucher_user"),
        "{plan}"
    );
}

/// Rows each join of `plan` (an `EXPLAIN ANALYZE`) read and threw away.
fn rows_removed_by_joins(plan: &str) -> Vec<u64> {
    plan.lines()
        .filter_map(|line| line.trim().strip_prefix("Rows Removed by Join Filter: "))
        .map(|n| n.trim().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn a_batch_sale_costs_its_length_not_its_square_whether_the_stock_covers_it_or_not() {
    let app = spawn_app().await;
    let batch = 300;
    // EXECUTE takes no subqueries: the arrays are written out.
    let array = |items: Vec<String>| format!("'{{{}}}'", items.join(","));
    let numbers = |base: i64| array((1..=batch as i64).map(|i| (base + i).to_string()).collect());
    let quantities = array((1..=batch).map(|i| (1 + i % 2).to_string()).collect());
    for (stock, case) in [(1_000, "the stock covers the batch"), (150, "it does not")] {
        let voucher = app.open_voucher(stock).await;
        let mut conn = app.db.acquire().await.unwrap();
        let args = format!(
            "{voucher}, {}, {}, array_fill(NULL::bigint, ARRAY[{batch}]), \
             array_fill(now(), ARRAY[{batch}]), 3, {quantities}",
            numbers(stock << 40),
            numbers(stock * 10_000),
        );
        let plan = planned(
            &mut conn,
            "bigint, bigint[], bigint[], bigint[], timestamptz[], bigint, int[]",
            seckill::store::SELL_BATCH,
            &args,
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)",
        )
        .await;
        // A join of two of the statement's CTEs by a nested loop compares
        // every pair: 300 x 300 rows for one batch.
        let removed = rows_removed_by_joins(&plan);
        assert!(
            removed.iter().all(|n| *n <= batch),
            "{case}: a join threw away {removed:?} rows:\n{plan}"
        );
        assert!(
            app.check_invariants(voucher).await > 0,
            "{case}: nothing sold"
        );
    }
}

#[tokio::test]
async fn a_cancel_or_an_expiry_of_one_order_finds_it_by_its_id_on_a_new_database() {
    let app = spawn_app().await;
    let mut conn = app.db.acquire().await.unwrap();
    for (name, sql) in [
        ("cancel", seckill::store::CANCEL),
        ("expire one", seckill::store::EXPIRE_ONE),
    ] {
        let plan = generic_plan(
            &mut conn,
            "text, timestamptz, bigint",
            sql,
            "'cancelled', now(), 1",
        )
        .await;
        assert!(
            plan.contains("Index Scan using voucher_orders_pkey on voucher_orders"),
            "{name}:\n{plan}"
        );
        // Neither the unpaid orders' deadline index nor the table is read
        // to find one order.
        assert!(
            !plan.contains("voucher_orders_unpaid_pay_by"),
            "{name}:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on voucher_orders"),
            "{name}:\n{plan}"
        );
    }
}
