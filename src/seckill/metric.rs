//! The names of the sale's own metrics (those `seckill` counts), each
//! written once: the code that counts an event and `http::ops`, which puts
//! every series the dashboard reads on the page at 0 from start-up, both
//! read them here. The HTTP layer's (requests, pools, rate limits) are
//! named where `http` counts them.

pub const PURCHASES: &str = "seckill_purchases_total";
/// Units taken by purchases that went through (stored, or accepted by an
/// async sale): with one unit per order, the ordered and accepted ones.
pub const UNITS_SOLD: &str = "seckill_units_sold_total";
pub const LOCK_CONTENDED: &str = "seckill_lock_contended_total";
pub const LOCK_ACQUIRE_SECONDS: &str = "seckill_lock_acquire_seconds";
pub const GATE_WAITS: &str = "seckill_gate_waits_total";
pub const ID_COUNTER_RECOVERIES: &str = "seckill_id_counter_recoveries_total";
pub const SALE_BATCH_SIZE: &str = "seckill_sale_batch_size";
pub const SALE_BATCH_RERUNS: &str = "seckill_sale_batch_reruns_total";
pub const SALE_COMMIT_SECONDS: &str = "seckill_sale_commit_seconds";
pub const ASYNC_ACCEPTED: &str = "seckill_async_accepted_total";
pub const ASYNC_ACCEPT_BATCH_SIZE: &str = "seckill_async_accept_batch_size";
pub const ASYNC_CLAIMED: &str = "seckill_async_claimed_total";
pub const ASYNC_WRITTEN: &str = "seckill_async_written_total";
pub const ASYNC_WRITE_FAILURES: &str = "seckill_async_write_failures_total";
pub const ASYNC_UNSTORED: &str = "seckill_async_unstored_total";
pub const ASYNC_IN_FLIGHT: &str = "seckill_async_in_flight";
pub const ASYNC_BATCH_SIZE: &str = "seckill_async_batch_size";
pub const ASYNC_CONFIRM_SECONDS: &str = "seckill_async_confirm_seconds";
pub const ASYNC_RECONCILIATIONS: &str = "seckill_async_reconciliations_total";
pub const ASYNC_UNITS_RETURNED: &str = "seckill_async_units_returned_total";
pub const CANCELS: &str = "seckill_cancels_total";
pub const EXPIRATIONS: &str = "seckill_expirations_total";
pub const EXPIRY_LATENESS_SECONDS: &str = "seckill_expiry_lateness_seconds";
pub const PAYMENTS: &str = "seckill_payments_total";
pub const CLOCK_OFFSET_SECONDS: &str = "seckill_clock_offset_seconds";
pub const QUEUE_REQUESTS: &str = "seckill_queue_requests_total";
pub const QUEUE_ADMITTED: &str = "seckill_queue_admitted_total";
pub const QUEUE_ADMISSIONS_USED: &str = "seckill_queue_admissions_used_total";
pub const QUEUE_WAITING: &str = "seckill_queue_waiting";

/// The `outcome` of [`PAYMENTS`]: kept, or refunded (late, or a
/// duplicate for a paid order).
pub const PAID: &str = "paid";
pub const REFUND: &str = "refund";
pub const PAYMENT_OUTCOMES: [&str; 2] = [PAID, REFUND];
/// The `kind` of [`QUEUE_REQUESTS`].
pub const JOIN: &str = "join";
pub const POLL: &str = "poll";
pub const QUEUE_REQUEST_KINDS: [&str; 2] = [JOIN, POLL];

/// The `reason` of [`ASYNC_UNSTORED`]: why Postgres refused an order Redis
/// accepted.
pub use super::async_sale::UNSTORED_REASONS;

/// Counters that count events, each at 0 from start-up: a dashboard panel
/// over a fresh instance shows 0, not "No data", until the first event.
pub const EVENT_COUNTERS: &[&str] = &[
    UNITS_SOLD,
    LOCK_CONTENDED,
    GATE_WAITS,
    ID_COUNTER_RECOVERIES,
    SALE_BATCH_RERUNS,
    ASYNC_ACCEPTED,
    ASYNC_CLAIMED,
    ASYNC_WRITTEN,
    ASYNC_WRITE_FAILURES,
    ASYNC_RECONCILIATIONS,
    ASYNC_UNITS_RETURNED,
    CANCELS,
    EXPIRATIONS,
    QUEUE_ADMITTED,
    QUEUE_ADMISSIONS_USED,
];

/// Histograms the dashboard reads, each on the page from start-up.
pub const HISTOGRAMS: &[&str] = &[
    SALE_BATCH_SIZE,
    SALE_COMMIT_SECONDS,
    LOCK_ACQUIRE_SECONDS,
    ASYNC_BATCH_SIZE,
    ASYNC_ACCEPT_BATCH_SIZE,
    ASYNC_CONFIRM_SECONDS,
    EXPIRY_LATENESS_SECONDS,
];
