//! A JWT's `sub` as a user id: a positive decimal integer up to 2^53 - 1
//! is the id itself; any other subject gets the id Postgres keeps for its
//! (issuer, subject), cached here. Numeric subjects are recorded too, so
//! that orders can show them: a user's first request waits for its
//! subject's row, written in one statement with those of every request
//! that came meanwhile.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::AuthError;
use crate::domain::{parse_positive, UserId};
use crate::store::Store;
use crate::telemetry::Chain;

/// The largest numeric subject taken as an id: JavaScript clients read
/// ids as doubles, exact up to here.
pub const MAX_NUMERIC_SUBJECT: i64 = (1 << 53) - 1;
/// Most subjects kept in memory, per kind.
const CAPACITY: u64 = 1_000_000;
/// Most numeric subjects waiting to be recorded; past it they are
/// dropped (only what orders show of them is lost) and recorded at their
/// user's next sign-in.
const BACKLOG: usize = 50_000;
/// Most subjects recorded in one statement.
const RECORD_BATCH: usize = 1_000;
/// Longest a request waits for its subject's row; past it (a backlog, a
/// Postgres away) it goes on, and what it orders shows no `user_ref` until
/// the row is written.
const RECORD_WAIT: Duration = Duration::from_secs(1);

/// A numeric user to record, and who waits for its row.
type ToRecord = (UserId, oneshot::Sender<()>);

pub(super) struct Subjects {
    store: Store,
    issuer: String,
    /// Non-numeric subjects and their ids (which never change).
    mapped: moka::sync::Cache<String, UserId>,
    /// Numeric ids whose subject is recorded (or on its way).
    recorded: moka::sync::Cache<UserId, ()>,
    to_record: mpsc::Sender<ToRecord>,
}

impl Subjects {
    /// Starts the recorder of numeric subjects; it ends with this value.
    pub(super) fn start(store: Store, issuer: String) -> Self {
        let (to_record, queue) = mpsc::channel(BACKLOG);
        let recorded = moka::sync::Cache::new(CAPACITY);
        tokio::spawn(record(
            store.clone(),
            issuer.clone(),
            queue,
            recorded.clone(),
        ));
        Self {
            store,
            issuer,
            mapped: moka::sync::Cache::new(CAPACITY),
            recorded,
            to_record,
        }
    }

    /// The user `subject` (of the configured issuer) is.
    pub(super) async fn user(&self, subject: &str) -> Result<UserId, AuthError> {
        if let Some(user) = numeric(subject) {
            if !self.recorded.contains_key(&user) {
                let (done, written) = oneshot::channel();
                // Marked first: a batch that fails forgets the mark, which
                // it could not do before the mark was made.
                self.recorded.insert(user, ());
                if self.to_record.try_send((user, done)).is_ok() {
                    // So that the order this request may make shows its
                    // subject from its first read on.
                    let _ = tokio::time::timeout(RECORD_WAIT, written).await;
                } else {
                    self.recorded.invalidate(&user);
                }
            }
            return Ok(user);
        }
        if let Some(user) = self.mapped.get(subject) {
            return Ok(user);
        }
        let user = self
            .store
            .user_for_subject(&self.issuer, subject)
            .await
            .map_err(|e| AuthError::Unavailable {
                dependency: "Postgres",
                detail: e.to_string(),
            })?;
        self.mapped.insert(subject.to_owned(), user);
        Ok(user)
    }
}

/// A subject that is its own user id.
fn numeric(subject: &str) -> Option<UserId> {
    parse_positive(subject)
        .filter(|id| *id <= MAX_NUMERIC_SUBJECT)
        .and_then(UserId::new)
}

/// Writes queued numeric subjects in batches until the sender is dropped,
/// each batch what came while the last was written (one statement for a
/// crowd's burst), and tells their requests; a batch that fails is
/// forgotten as recorded, to be queued again at its users' next sign-in.
async fn record(
    store: Store,
    issuer: String,
    mut queue: mpsc::Receiver<ToRecord>,
    recorded: moka::sync::Cache<UserId, ()>,
) {
    let mut batch = Vec::with_capacity(RECORD_BATCH);
    while queue.recv_many(&mut batch, RECORD_BATCH).await > 0 {
        let rows = batch
            .iter()
            .map(|(user, _)| (*user, issuer.clone(), user.get().to_string()))
            .collect();
        match store.record_subjects(rows).await {
            Ok(()) => {
                for (_, done) in batch.drain(..) {
                    let _ = done.send(());
                }
            }
            Err(error) => {
                tracing::warn!(error = %Chain(&error), users = batch.len(), "cannot record the JWT subjects of numeric users yet");
                for (user, _) in batch.drain(..) {
                    recorded.invalidate(&user);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_positive_integers_up_to_2_53_are_their_own_ids() {
        assert_eq!(numeric("42"), UserId::new(42));
        assert_eq!(
            numeric("9007199254740991"),
            UserId::new(MAX_NUMERIC_SUBJECT)
        );
        for other in [
            "9007199254740992",
            "0",
            "-1",
            "042",
            "+42",
            "42 ",
            "4.2",
            "auth0|5f7c8ec7c33c6c004bbafe82",
            "",
        ] {
            assert_eq!(numeric(other), None, "{other:?}");
        }
    }
}
