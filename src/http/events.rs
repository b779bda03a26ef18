//! The order events' admin routes: the feed a shop reads to catch up
//! (`GET /admin/events`), and the deliveries that failed with their retry.

use axum::extract::{Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::ApiError;
use super::extract::NoBody;
use super::state::AppState;
use crate::domain::EventId;
use crate::events::body::{EventBody, EventsBody};
use crate::events::MAX_PAGE;
use crate::seckill::SeckillError;

/// Where the feed starts and how much of it to read.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FeedQuery {
    /// The last event id seen (absent: from the oldest kept event).
    #[param(pattern = "^[0-7][0-9a-f]{15}[0-7][0-9a-f]{15}$")]
    after: Option<String>,
    /// Most events to return: 1 to 1000 (default 100).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
}

/// A page of the feed.
#[derive(Serialize, ToSchema)]
pub struct FeedBody {
    /// In commit order.
    events: Vec<EventBody>,
    /// The id to ask after next: the last event's, or the `after` given.
    #[schema(pattern = "^[0-7][0-9a-f]{15}[0-7][0-9a-f]{15}$")]
    next: String,
}

#[utoipa::path(
    get, path = "/admin/events",
    params(FeedQuery),
    responses(
        (status = 200, description = "Order events after `after`, in commit order: a reader that keeps the last id it saw misses none and sees none twice", body = FeedBody),
    )
)]
pub async fn feed(
    State(state): State<AppState>,
    query: Result<Query<FeedQuery>, axum::extract::rejection::QueryRejection>,
    NoBody: NoBody,
) -> Result<Json<FeedBody>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let after = query
        .after
        .as_deref()
        .map(|text| {
            text.parse::<EventId>()
                .map_err(|e| ApiError::BadRequest(format!("after: {e}")))
        })
        .transpose()?;
    let limit = match query.limit.as_deref() {
        None => 100,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| ApiError::BadRequest(format!("limit must be 1 to {MAX_PAGE}")))?,
    };
    let events = state
        .events
        .feed(after, limit)
        .await
        .map_err(SeckillError::from)?;
    let next = events
        .last()
        .map(|e| e.id)
        .or(after)
        .unwrap_or_default()
        .to_string();
    Ok(Json(FeedBody {
        events: events.into_iter().map(EventBody::from).collect(),
        next,
    }))
}

#[utoipa::path(
    get, path = "/admin/webhooks/failed",
    responses(
        (status = 200, description = "Events whose webhook delivery failed after its retries (at most 1000, the oldest first)", body = EventsBody),
    )
)]
pub async fn failed(
    State(state): State<AppState>,
    NoBody: NoBody,
) -> Result<Json<EventsBody>, ApiError> {
    let events = state.events.failed().await.map_err(SeckillError::from)?;
    Ok(Json(EventsBody::of(events)))
}

/// How many failed events were put back.
#[derive(Serialize, ToSchema)]
pub struct RetriedBody {
    retried: u64,
}

#[utoipa::path(
    post, path = "/admin/webhooks/retry",
    responses(
        (status = 200, description = "The failed events are put back to be delivered now, with a new retry period", body = RetriedBody),
    )
)]
pub async fn retry(
    State(state): State<AppState>,
    NoBody: NoBody,
) -> Result<Json<RetriedBody>, ApiError> {
    let retried = state
        .events
        .retry_failed()
        .await
        .map_err(SeckillError::from)?;
    Ok(Json(RetriedBody { retried }))
}
