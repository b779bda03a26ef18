//! The shop's users: the user id of a JWT subject that is not a number
//! (one per issuer and subject, from a sequence above 2^53), and the
//! subjects that numeric ids were signed in under.

use super::{Result, Store};
use crate::domain::UserId;

impl Store {
    /// The user id of (`issuer`, `subject`), made now if it has none: the
    /// same on every instance and after restarts (the row is the answer),
    /// and never shared, since the pair is unique and each id drawn once.
    pub async fn user_for_subject(&self, issuer: &str, subject: &str) -> Result<UserId> {
        let (issuer, subject) = (issuer.to_owned(), subject.to_owned());
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    // Read first: a subject known already (every user's
                    // first request after a restart) writes nothing. Made
                    // with DO UPDATE (of nothing that changes), not DO
                    // NOTHING: then RETURNING answers the row a concurrent
                    // first sign-in made, too.
                    sqlx::query_scalar(
                        "WITH known AS (
                             SELECT user_id FROM user_refs WHERE issuer = $1 AND subject = $2
                         ), made AS (
                             INSERT INTO user_refs (user_id, issuer, subject)
                             SELECT nextval('user_ref_ids'), $1, $2
                             WHERE NOT EXISTS (SELECT 1 FROM known)
                             ON CONFLICT (issuer, subject) DO UPDATE SET subject = EXCLUDED.subject
                             RETURNING user_id
                         )
                         SELECT user_id FROM known UNION ALL SELECT user_id FROM made",
                    )
                    .bind(issuer)
                    .bind(subject)
                    .persistent(persistent)
                    .fetch_one(c),
                )
            })
            .await
    }

    /// Records the subjects numeric user ids were signed in under (the
    /// first one per id stays).
    pub async fn record_subjects(&self, subjects: Vec<(UserId, String, String)>) -> Result<()> {
        let mut ids = Vec::with_capacity(subjects.len());
        let mut issuers = Vec::with_capacity(subjects.len());
        let mut names = Vec::with_capacity(subjects.len());
        for (id, issuer, subject) in subjects {
            ids.push(id);
            issuers.push(issuer);
            names.push(subject);
        }
        self.db
            .execute(
                sqlx::query(
                    "INSERT INTO user_refs (user_id, issuer, subject)
                     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[])
                     ORDER BY 1
                     ON CONFLICT DO NOTHING",
                )
                .bind(ids)
                .bind(issuers)
                .bind(names),
            )
            .await
            .map(drop)
    }

    /// The subject `user` was signed in under, if any (what its orders
    /// show as `user_ref`).
    pub async fn user_ref(&self, user: UserId) -> Result<Option<String>> {
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_scalar("SELECT subject FROM user_refs WHERE user_id = $1")
                        .bind(user)
                        .persistent(persistent)
                        .fetch_optional(c),
                )
            })
            .await
    }
}
