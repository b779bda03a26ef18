//! The ids of the sale's things, each its own type: a voucher id and a
//! user id cannot be swapped without a compiler error. (Order ids, which
//! carry their creation time, are `id::OrderId`.)

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(i64);

        impl $name {
            pub const fn new(id: i64) -> Self {
                Self(id)
            }

            /// The number, for a query or a key.
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// A voucher, as Postgres numbers it.
    VoucherId
);
id_type!(
    /// A buyer, as their signed token names them.
    UserId
);
