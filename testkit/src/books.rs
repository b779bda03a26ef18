//! One balance check of a voucher's books, read in SQL, for the API tests
//! and the load driver alike: the contract's `stock + units of the live
//! orders = initial_stock`, the stock never below zero, no order id twice
//! and no user holding two live orders.

use sqlx::PgConnection;

/// A voucher's books as Postgres holds them: its stock row and its live
/// (`unpaid` or `paid`) orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Books {
    pub initial_stock: i64,
    pub stock: i64,
    pub orders: i64,
    /// Units of the live orders (one an order on a schema from before
    /// units, which the speed runs of older builds still meet).
    pub units: i64,
    pub users: i64,
    pub distinct_ids: i64,
}

impl Books {
    /// The books of `voucher` now.
    pub async fn read(conn: &mut PgConnection, voucher: i64) -> Result<Self, sqlx::Error> {
        let has_units: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                            WHERE table_name = 'voucher_orders' AND column_name = 'quantity')",
        )
        .fetch_one(&mut *conn)
        .await?;
        let units = if has_units {
            "coalesce(sum(o.quantity), 0)::bigint"
        } else {
            "count(o.id)"
        };
        let sql = format!(
            "SELECT s.initial_stock::bigint, s.stock::bigint, count(o.id), {units},
                    count(DISTINCT o.user_id), count(DISTINCT o.id)
             FROM seckill_vouchers s LEFT JOIN voucher_orders o
               ON o.voucher_id = s.voucher_id AND o.status IN ('unpaid', 'paid')
             WHERE s.voucher_id = $1 GROUP BY s.initial_stock, s.stock"
        );
        let (initial_stock, stock, orders, units, users, distinct_ids) =
            sqlx::query_as(&sql).bind(voucher).fetch_one(conn).await?;
        Ok(Self {
            initial_stock,
            stock,
            orders,
            units,
            users,
            distinct_ids,
        })
    }

    /// Every invariant these books break, in words; none when they balance.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.stock < 0 {
            problems.push(format!("stock below zero: {}", self.stock));
        }
        if self.units + self.stock != self.initial_stock {
            problems.push(format!(
                "units of live orders {} + stock {} != initial stock {}",
                self.units, self.stock, self.initial_stock
            ));
        }
        if self.users != self.orders {
            problems.push(format!(
                "{} live orders of {} users: some user holds two",
                self.orders, self.users
            ));
        }
        if self.distinct_ids != self.orders {
            problems.push(format!(
                "{} live orders, {} distinct ids: ids repeat",
                self.orders, self.distinct_ids
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::Books;

    const BALANCED: Books = Books {
        initial_stock: 10,
        stock: 4,
        orders: 3,
        units: 6,
        users: 3,
        distinct_ids: 3,
    };

    #[test]
    fn balanced_books_have_no_problem() {
        assert!(BALANCED.problems().is_empty());
    }

    #[test]
    fn an_oversell_a_second_order_and_a_repeated_id_are_each_named() {
        let oversold = Books {
            stock: -1,
            units: 11,
            ..BALANCED
        };
        assert_eq!(oversold.problems().len(), 1, "{:?}", oversold.problems());
        let lost = Books {
            units: 5,
            ..BALANCED
        };
        assert!(lost.problems()[0].contains("!= initial stock"));
        let twice = Books {
            users: 2,
            ..BALANCED
        };
        assert!(twice.problems()[0].contains("some user holds two"));
        let repeated = Books {
            distinct_ids: 2,
            ..BALANCED
        };
        assert!(repeated.problems()[0].contains("ids repeat"));
    }
}
