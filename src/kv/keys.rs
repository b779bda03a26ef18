//! Every Redis key the service writes, named in one place: what it holds,
//! and the hash tag (`{...}`, literal braces) that keeps the keys one
//! script touches together in one Cluster slot. The lock library adds its
//! own `lock:{<name>}` around the lock names made here. The domain's ids
//! travel to scripts as their decimal numbers.

use chrono::{DateTime, Utc};
use redis::{RedisWrite, ToRedisArgs};

use crate::domain::{OrderId, UserId, VoucherId};

macro_rules! id_arg {
    ($($name:ty),+) => {$(
        impl ToRedisArgs for $name {
            fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
                self.get().write_redis_args(out)
            }
        }
    )+};
}

id_arg!(VoucherId, UserId, OrderId);

/// The keys of one deployment: each starts with the configured prefix and
/// the database's namespace (see `startup`), so Redis state written for
/// another database is never read as this one's.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

/// Declares the keys of one voucher's feature, all under the voucher's
/// hash tag: a field `f` is the key `<prefix><kind>:{<voucher id>}:f`.
macro_rules! voucher_keys {
    ($(#[$doc:meta])* $name:ident = $kind:literal {
        $($(#[$field_doc:meta])* $field:ident,)+
    }) => {
        $(#[$doc])*
        pub struct $name {
            $($(#[$field_doc])* pub $field: String,)+
        }

        impl $name {
            fn new(prefix: &str, voucher_id: VoucherId) -> Self {
                let base = format!("{prefix}{}:{{{voucher_id}}}", $kind);
                Self { $($field: format!("{base}:{}", stringify!($field)),)+ }
            }
        }
    };
}

voucher_keys! {
    /// The keys of one voucher's async sale.
    AsyncSaleKeys = "async" {
        /// Hash {stock, begin_ms, end_ms}; missing = paused.
        sale,
        /// Hash user id -> order id.
        buyers,
        /// Stream of accepted orders not yet written.
        orders,
        /// Hash order id -> why Postgres refused an accepted order.
        unstored,
        /// The token of the reconciliation under way, if one is.
        reconciling,
        /// Hash user id -> orders of the voucher Redis accepted for the user.
        orders_per_user,
        /// Set of the order ids whose units Redis's stock holds again.
        returned,
    }
}

voucher_keys! {
    /// The keys of one voucher's waiting room.
    RoomKeys = "room" {
        /// Hash {serving, last_ms, late}.
        state,
        /// Sorted set user -> random draw: the pre-queue.
        pre,
        /// Hash user -> order of arrival after the start.
        late,
        /// Hash user -> when Redis's clock first saw them admitted (ms).
        admitted,
    }
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// What every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Written (with a short life) to tell that Redis takes writes.
    pub fn ready(&self) -> String {
        format!("{}seckill:ready", self.prefix)
    }

    /// Hash {epoch, sold_out}: the voucher's sold-out flag.
    pub fn sold_out(&self, voucher_id: VoucherId) -> String {
        format!("{}seckill:soldout:{voucher_id}", self.prefix)
    }

    /// The order-id counter of the UTC day of `at`.
    pub fn order_counter(&self, at: DateTime<Utc>) -> String {
        format!("{}icr:order:{}", self.prefix, at.format("%Y:%m:%d"))
    }

    /// The name of `user_id`'s purchase lock for `voucher_id`.
    pub fn user_lock(voucher_id: VoucherId, user_id: UserId) -> String {
        format!("order:{voucher_id}:{user_id}")
    }

    pub fn async_sale(&self, voucher_id: VoucherId) -> AsyncSaleKeys {
        AsyncSaleKeys::new(&self.prefix, voucher_id)
    }

    /// Hash order id -> lookup of the async orders drawn in one hour (and
    /// shard, on a cluster), while they are pending.
    pub fn async_pending(&self, hour: i64, shard: i64) -> String {
        format!("{}async-orders:{hour}:{shard}", self.prefix)
    }

    pub fn room(&self, voucher_id: VoucherId) -> RoomKeys {
        RoomKeys::new(&self.prefix, voucher_id)
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;
    use crate::domain::{UserId, VoucherId};

    #[test]
    fn the_keys_one_script_touches_share_a_hash_tag_and_the_prefix() {
        let keys = Keys::new("p:ns:");
        let sale = keys.async_sale(VoucherId::new(42).unwrap());
        let room = keys.room(VoucherId::new(42).unwrap());
        for key in [
            &sale.sale,
            &sale.buyers,
            &sale.orders,
            &sale.orders_per_user,
            &sale.returned,
            &room.state,
            &room.pre,
            &room.late,
            &room.admitted,
        ] {
            assert!(key.starts_with("p:ns:"), "{key}");
            assert!(key.contains("{42}"), "{key}");
        }
        // The layout the API tests and the guide name.
        assert_eq!(sale.orders_per_user, "p:ns:async:{42}:orders_per_user");
        assert_eq!(room.admitted, "p:ns:room:{42}:admitted");
        assert_eq!(
            keys.sold_out(VoucherId::new(7).unwrap()),
            "p:ns:seckill:soldout:7"
        );
        assert_eq!(
            Keys::user_lock(VoucherId::new(7).unwrap(), UserId::new(9).unwrap()),
            "order:7:9"
        );
    }
}
