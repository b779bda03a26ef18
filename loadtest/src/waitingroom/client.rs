//! One client's run: its joins and polls until admitted, its purchase,
//! its probes without an admission, and a bot's repeated joins.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::room::{Client, End, Kind, Queue, Reply, Room, Seen};

/// One client from its join to its purchase (or the sell-out, or the cap),
/// asking again when `Retry-After` says.
pub(super) async fn live(room: Arc<Room>, client: Client) -> Seen {
    let mut seen = Seen::new(&client);
    let token = &*client.token;
    let mut sent: u64 = 0;
    let mut ticket: Option<String> = None;
    let mut failures = 0;
    let mut next = client.join_at;
    let mut hammer = None;
    let (mut probed_before, mut probed_after) = (!client.probe, !client.probe);
    loop {
        if next >= room.deadline {
            seen.end = End::Capped;
            break;
        }
        tokio::time::sleep_until(next.into()).await;
        let base = room.base(client.user, sent);
        sent += 1;
        let reply = ask(&room, &mut seen, base, token, ticket.as_deref()).await;
        let Some(queue) = reply.ok().then(|| Queue::read(&reply.body)).flatten() else {
            failures += 1;
            if failures >= 10 {
                seen.end = End::Failed(reply.key());
                break;
            }
            next = Instant::now() + reply.wait();
            continue;
        };
        if ticket.is_none() {
            seen.placed_at_join = queue.place.is_some();
            if client.kind == Kind::Bot {
                hammer = Some(tokio::spawn(hammer_joins(
                    room.clone(),
                    client.token.clone(),
                )));
            }
        }
        seen.placed(queue.place);
        ticket = Some(queue.ticket.clone());
        if let Some(end) = ending(&room, &client, &mut seen, &queue, &mut sent).await {
            seen.end = end;
            break;
        }
        // Waiting: a purchase now must be refused, whatever it carries.
        let now_placed = queue.place.is_some();
        if (!probed_before && !now_placed) || (!probed_after && now_placed) {
            let base = room.base(client.user, sent);
            sent += 1;
            probe_waiting(&room, client.user, base, token, &queue.ticket, now_placed).await;
            if now_placed {
                probed_after = true;
            } else {
                probed_before = true;
            }
        }
        next = Instant::now() + reply.wait();
    }
    if let Some(hammer) = hammer {
        if let Ok((joins, places)) = hammer.await {
            seen.joins += joins;
            seen.places.extend(places);
        }
    }
    room.progress.inc(1);
    seen
}

/// A join while the client has no ticket (its first one's time kept), else a poll with it.
async fn ask(room: &Room, seen: &mut Seen, base: &str, token: &str, ticket: Option<&str>) -> Reply {
    match ticket {
        None => {
            seen.joins += 1;
            let reply = room.join(base, token).await;
            if seen.joined.is_none() {
                seen.joined = Some(reply.sent);
            }
            reply
        }
        Some(ticket) => {
            seen.polls += 1;
            room.poll(base, token, ticket).await
        }
    }
}

/// How an answer ends the client's run: admitted, its purchase; sold out; None while it waits.
async fn ending(
    room: &Room,
    client: &Client,
    seen: &mut Seen,
    queue: &Queue,
    sent: &mut u64,
) -> Option<End> {
    match queue.status.as_str() {
        "admitted" => {
            seen.admitted = true;
            *room.admitted_ticket.lock().expect("no client panicked") =
                Some((client.user, queue.ticket.clone()));
            Some(buy(room, client.user, &client.token, &queue.ticket, sent).await)
        }
        "sold_out" => Some(End::SoldOut),
        _ => None,
    }
}

/// A waiting client's purchases that must be refused: with no ticket,
/// with its own waiting ticket, and once placed with another user's
/// admitted ticket.
async fn probe_waiting(
    room: &Room,
    user: i64,
    base: &str,
    token: &str,
    ticket: &str,
    placed: bool,
) {
    room.probe(base, token, None).await;
    room.probe(base, token, Some(ticket)).await;
    if placed {
        let other = room
            .admitted_ticket
            .lock()
            .expect("no client panicked")
            .clone();
        if let Some((_, other)) = other.filter(|(holder, _)| *holder != user) {
            room.probe(base, token, Some(&other)).await;
        }
    }
}

/// An admitted client buys, once; what the service could not answer is
/// asked again, as told.
pub(super) async fn buy(room: &Room, user: i64, token: &str, ticket: &str, sent: &mut u64) -> End {
    for _ in 0..5 {
        let base = room.base(user, *sent);
        *sent += 1;
        let reply = room.buy(base, token, Some(ticket)).await;
        match reply.key().as_str() {
            "200" => return End::Bought,
            "409 sold_out" => return End::SoldOutAdmitted,
            key if key.starts_with("error") || key.starts_with("503") || key.starts_with("429") => {
                tokio::time::sleep(reply.wait()).await;
            }
            key => return End::Refused(key.to_owned()),
        }
    }
    End::Failed("purchase unanswered".into())
}

/// A bot's joins after its first: ten at once, in bursts spread until two
/// seconds past the start, so that some land before the room places
/// anyone and some after. Its joins and the places they gave.
async fn hammer_joins(room: Arc<Room>, token: Arc<str>) -> (u64, BTreeSet<i64>) {
    const AT_ONCE: usize = 10;
    let bursts = room.bot_repeats.div_ceil(AT_ONCE).max(1);
    let from = Instant::now();
    let until = (room.start + Duration::from_secs(2)).max(from);
    let step = until.duration_since(from) / bursts as u32;
    let mut places = BTreeSet::new();
    let mut joins = 0;
    let mut left = room.bot_repeats;
    for burst in 0..bursts {
        tokio::time::sleep_until((from + step * burst as u32).into()).await;
        let size = left.min(AT_ONCE);
        left -= size;
        let replies = futures_util::future::join_all((0..size).map(|j| {
            let base = room.base(j as i64, burst as u64);
            room.join(base, &token)
        }))
        .await;
        joins += size as u64;
        places.extend(
            replies
                .iter()
                .filter(|r| r.ok())
                .filter_map(|r| r.body["place"].as_i64()),
        );
    }
    (joins, places)
}
