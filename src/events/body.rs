//! An order and an order event as JSON: one shape for `GET /orders/{id}`,
//! the feed `GET /admin/events` and the webhooks' bodies.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{Order, OrderEvent, OrderStatus};

/// An order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OrderBody {
    #[schema(pattern = "^[1-9][0-9]{0,18}$")]
    order_id: String,
    user_id: i64,
    voucher_id: i64,
    /// Units it holds (1 to the voucher's `max_units_per_user`).
    #[schema(minimum = 1, maximum = 100)]
    quantity: i32,
    #[schema(value_type = String, format = DateTime)]
    created_at: DateTime<Utc>,
    /// `pending` (async: accepted, not yet stored), `unpaid`, `paid`,
    /// `cancelled` or `expired`.
    status: OrderStatus,
    /// The payment deadline; null while `pending`.
    #[schema(value_type = Option<String>, format = DateTime)]
    pay_by: Option<DateTime<Utc>>,
    /// When it was paid; null until then.
    #[schema(value_type = Option<String>, format = DateTime)]
    paid_at: Option<DateTime<Utc>>,
    /// The `sub` of the shop's JWT its user signed in with; null for the
    /// service's own tokens (and while `pending`).
    user_ref: Option<String>,
}

impl From<Order> for OrderBody {
    fn from(o: Order) -> Self {
        Self {
            order_id: o.id.to_string(),
            user_id: o.user_id.get(),
            voucher_id: o.voucher_id.get(),
            quantity: o.quantity,
            created_at: o.created_at,
            status: o.status,
            pay_by: o.pay_by,
            paid_at: o.paid_at,
            user_ref: o.user_ref,
        }
    }
}

/// One committed change of an order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventBody {
    /// Unique, and increasing in the feed's order: give the last one seen
    /// as `after` to read on.
    #[schema(pattern = "^[0-9a-f]{32}$")]
    id: String,
    /// `order.created`, `order.paid`, `order.cancelled`, `order.expired` or
    /// `payment.refund_due`.
    #[serde(rename = "type")]
    kind: &'static str,
    #[schema(value_type = String, format = DateTime)]
    created_at: DateTime<Utc>,
    /// 1, 2, ... within its order.
    #[schema(minimum = 1)]
    sequence: i32,
    /// The order as it stood right after the change.
    order: OrderBody,
    /// With `payment.refund_due`: the payment whose money goes back.
    #[serde(skip_serializing_if = "Option::is_none")]
    payment: Option<PaymentBody>,
}

/// A payment to refund.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PaymentBody {
    payment_id: String,
    amount_cents: i64,
}

impl From<OrderEvent> for EventBody {
    fn from(e: OrderEvent) -> Self {
        Self {
            id: e.id.to_string(),
            kind: e.kind.as_str(),
            created_at: e.created_at,
            sequence: e.sequence,
            order: e.order.into(),
            payment: e.refund.map(|r| PaymentBody {
                payment_id: r.payment_id,
                amount_cents: r.amount_cents,
            }),
        }
    }
}

/// A list of events: a webhook's body, the failed list.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventsBody {
    pub events: Vec<EventBody>,
}

impl EventsBody {
    pub fn of(events: Vec<OrderEvent>) -> Self {
        Self {
            events: events.into_iter().map(EventBody::from).collect(),
        }
    }
}
