//! Who is buying: a bearer token verified into a [`UserId`]. The service's
//! own `v1` tokens (`crate::token`), and the shop's JWTs (`jwt`, with keys
//! from `jwks`), whose subjects become user ids (`subjects`).
//!
//! A verified JWT is kept (by its SHA-256) until it expires, so a client
//! that sends the same token again and again costs a hash and a lookup,
//! not a signature check.

mod jwks;
mod jwt;
mod subjects;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use jwks::{Fetched, Jwks, MIN_FETCH_INTERVAL, REFRESH_EVERY};
pub use jwks::{JwksError, Source};
use jwt::{JwtError, JwtVerifier};
use subjects::Subjects;
pub use subjects::MAX_NUMERIC_SUBJECT;

use crate::domain::UserId;
use crate::store::Store;
use crate::token::TokenSigner;

/// Most verified JWTs kept at once.
const VERIFIED_CAPACITY: u64 = 200_000;

/// Why a token signs nobody in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Not accepted: `401`, with what was wrong.
    #[error("{0}")]
    Unauthorized(String),
    /// Cannot be told now (the keys are not loaded, Postgres is away):
    /// `503`.
    #[error("{dependency} is unavailable: {detail}")]
    Unavailable {
        dependency: &'static str,
        detail: String,
    },
}

/// Verifies bearer tokens.
pub struct Authenticator {
    v1: TokenSigner,
    jwt: Option<Jwt>,
}

struct Jwt {
    verifier: JwtVerifier,
    /// Tokens verified already, by their SHA-256.
    verified: moka::sync::Cache<[u8; 32], Signed>,
    leeway: i64,
    subjects: Subjects,
}

#[derive(Debug, Clone, Copy)]
struct Signed {
    user: UserId,
    expires: i64,
    generation: u64,
}

/// Keeps each verified token until its expiry (and the leeway) passes.
struct UntilExpiry {
    leeway: i64,
}

impl moka::Expiry<[u8; 32], Signed> for UntilExpiry {
    fn expire_after_create(&self, _: &[u8; 32], value: &Signed, _: Instant) -> Option<Duration> {
        let left = value
            .expires
            .saturating_add(self.leeway)
            .saturating_sub(chrono::Utc::now().timestamp());
        Some(Duration::from_secs(u64::try_from(left.max(1)).unwrap_or(1)))
    }
}

/// What JWT sign-in needs.
pub struct JwtSettings {
    pub issuer: String,
    pub audience: String,
    pub leeway_seconds: u64,
    pub hs256_secret: Option<Vec<u8>>,
    pub jwks: Option<Source>,
}

impl Authenticator {
    /// `v1` tokens only.
    pub fn v1_only(v1: TokenSigner) -> Self {
        Self { v1, jwt: None }
    }

    /// `v1` tokens and the shop's JWTs. A JWK Set from a file is read now
    /// (an unreadable one is an error); one from a URL is fetched in the
    /// background, and until it is loaded JWT users are `503`. Both are
    /// refreshed every 10 minutes while the authenticator lives.
    pub async fn with_jwt(
        v1: TokenSigner,
        settings: JwtSettings,
        store: Store,
    ) -> Result<Self, JwksError> {
        let jwks = settings.jwks.map(|source| Arc::new(Jwks::new(source)));
        if let Some(jwks) = &jwks {
            if let Source::File(_) = jwks.source() {
                jwks.load().await?;
            }
            tokio::spawn(refresh_forever(Arc::downgrade(jwks)));
        }
        let verifier = JwtVerifier::new(
            &settings.issuer,
            &settings.audience,
            settings.leeway_seconds,
            settings.hs256_secret.as_deref(),
            jwks,
        );
        let leeway = i64::try_from(settings.leeway_seconds).unwrap_or(i64::MAX);
        Ok(Self {
            v1,
            jwt: Some(Jwt {
                verifier,
                verified: moka::sync::Cache::builder()
                    .max_capacity(VERIFIED_CAPACITY)
                    .expire_after(UntilExpiry { leeway })
                    .build(),
                leeway,
                subjects: Subjects::start(store, settings.issuer),
            }),
        })
    }

    /// The service's own tokens' signer (the admin route mints with it).
    pub fn v1(&self) -> &TokenSigner {
        &self.v1
    }

    /// Whether a token can be verified now: false while a JWK Set by URL
    /// has never loaded.
    pub fn ready(&self) -> bool {
        self.jwt
            .as_ref()
            .and_then(|jwt| jwt.verifier.jwks())
            .is_none_or(|jwks| jwks.keys().is_some())
    }

    /// The user `token` signs in, at `now_unix`.
    pub async fn verify(&self, token: &str, now_unix: i64) -> Result<UserId, AuthError> {
        let Some(jwt) = self.jwt.as_ref().filter(|_| is_jwt(token)) else {
            return self
                .v1
                .verify(token, now_unix)
                .map_err(|e| AuthError::Unauthorized(e.to_string()));
        };
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let generation = jwt.verifier.jwks().map_or(0, |jwks| jwks.generation());
        if let Some(hit) = jwt.verified.get(&digest) {
            if hit.generation == generation {
                if hit.expires.saturating_add(jwt.leeway) < now_unix {
                    return Err(AuthError::Unauthorized("the token has expired".into()));
                }
                return Ok(hit.user);
            }
        }
        let verified = jwt
            .verifier
            .verify(token, now_unix)
            .await
            .map_err(|e| match e {
                JwtError::Rejected(why) => AuthError::Unauthorized(why),
                JwtError::KeysNotLoaded => AuthError::Unavailable {
                    dependency: "the identity provider's JWK Set",
                    detail: e.to_string(),
                },
            })?;
        let user = jwt.subjects.user(&verified.subject).await?;
        jwt.verified.insert(
            digest,
            Signed {
                user,
                expires: verified.expires,
                generation,
            },
        );
        Ok(user)
    }
}

/// A JWT is three base64url parts (`header.claims.signature`); a `v1`
/// token has four, its first `v1`.
fn is_jwt(token: &str) -> bool {
    !token.starts_with("v1.") && token.bytes().filter(|b| *b == b'.').count() == 2
}

/// Fetches the set every 10 minutes (every 5 s until one loads, and 30 s
/// after a failure), until the set is dropped. A load that drops a key
/// makes the tokens verified before it be verified again.
async fn refresh_forever(jwks: Weak<Jwks>) {
    let mut wait = Duration::ZERO;
    loop {
        tokio::time::sleep(wait).await;
        let Some(set) = jwks.upgrade() else { return };
        let fetched = Jwks::refresh(&set).await;
        wait = match (fetched, set.keys().is_some()) {
            (_, false) | (Fetched::TooSoon, true) => MIN_FETCH_INTERVAL,
            (Fetched::Failed, true) => Duration::from_secs(30),
            (Fetched::Loaded { .. }, true) => REFRESH_EVERY,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::is_jwt;

    #[test]
    fn jwts_and_v1_tokens_are_told_apart_by_shape() {
        assert!(is_jwt("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"));
        assert!(!is_jwt("v1.42.1800000000.c2ln"));
        assert!(!is_jwt("v1.a.b"));
        assert!(!is_jwt("a.b"));
        assert!(!is_jwt(""));
    }
}
