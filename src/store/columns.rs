//! How the domain's values are stored: ids as `BIGINT`, states as their
//! words in `TEXT` columns, and the rows that make a [`Voucher`] (its
//! [`VoucherTerms`] and [`StockLevel`]) and an [`Order`]. Each is decoded
//! where it leaves Postgres, so that an unknown word or a non-positive
//! id is an error there rather than a silent fallback anywhere above.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgRow, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, FromRow, Postgres, Row, Type};

use crate::domain::{
    NotAnOrderId, Order, OrderId, OrderLine, OrderStatus, SaleMode, StockLevel, UserId, Voucher,
    VoucherId, VoucherTerms,
};

/// An id stored as a `BIGINT` (`get`, and `$decode` back from the number).
macro_rules! id_column {
    ($($name:ty => $decode:expr),+) => {$(
        impl Type<Postgres> for $name {
            fn type_info() -> PgTypeInfo {
                <i64 as Type<Postgres>>::type_info()
            }
        }

        impl PgHasArrayType for $name {
            fn array_type_info() -> PgTypeInfo {
                <i64 as PgHasArrayType>::array_type_info()
            }
        }

        impl<'r> Decode<'r, Postgres> for $name {
            fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
                let decode: fn(i64) -> Result<Self, BoxDynError> = $decode;
                decode(<i64 as Decode<Postgres>>::decode(value)?)
            }
        }

        impl Encode<'_, Postgres> for $name {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <i64 as Encode<Postgres>>::encode_by_ref(&self.get(), buf)
            }
        }
    )+};
}

id_column!(
    VoucherId => |id| Ok(VoucherId::try_from(id)?),
    UserId => |id| Ok(UserId::try_from(id)?),
    OrderId => |id| OrderId::from_stored(id).ok_or_else(|| NotAnOrderId.into())
);

/// A state stored as its word (`as_str`, `FromStr`) in a `TEXT` column.
macro_rules! text_column {
    ($($name:ty),+) => {$(
        impl Type<Postgres> for $name {
            fn type_info() -> PgTypeInfo {
                <&str as Type<Postgres>>::type_info()
            }

            fn compatible(ty: &PgTypeInfo) -> bool {
                <&str as Type<Postgres>>::compatible(ty)
            }
        }

        impl<'r> Decode<'r, Postgres> for $name {
            fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
                Ok(<&str as Decode<Postgres>>::decode(value)?.parse()?)
            }
        }

        impl Encode<'_, Postgres> for $name {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <&str as Encode<Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }
    )+};
}

text_column!(SaleMode, OrderStatus);

/// A row as the domain value whose fields its columns are named after.
macro_rules! from_row {
    ($($name:ident { $($field:ident),+ $(,)? })+) => {$(
        impl FromRow<'_, PgRow> for $name {
            fn from_row(row: &PgRow) -> sqlx::Result<Self> {
                Ok(Self { $($field: row.try_get(stringify!($field))?),+ })
            }
        }
    )+};
}

from_row! {
    VoucherTerms {
        title, begin_time, end_time, sale_mode, price_cents, pay_within_seconds,
        max_orders_per_user, max_units_per_user, admit_per_second, queue_proof_bits,
    }
    Order { id, user_id, voucher_id, quantity, created_at, status, pay_by, paid_at, user_ref }
    OrderLine { id, user_id, status, quantity }
    StockLevel { stock, initial_stock, returned }
}

/// A voucher's row: its id, its terms and its stock level, all in the
/// columns named after their fields.
impl FromRow<'_, PgRow> for Voucher {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            terms: VoucherTerms::from_row(row)?,
            level: StockLevel::from_row(row)?,
        })
    }
}
