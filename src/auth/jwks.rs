//! The shop's JWK Set: read from a file or fetched from a URL, turned into
//! keys that each verify one algorithm, and refreshed every 10 minutes or
//! when a token names a key it does not hold, at most once per 5 s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

/// Fewest seconds between two fetches, however many tokens ask.
pub const MIN_FETCH_INTERVAL: Duration = Duration::from_secs(5);
/// How often the set is fetched when nothing asks.
pub const REFRESH_EVERY: Duration = Duration::from_secs(600);
/// The deadline of one fetch (connect, answer and body).
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest JWK Set read: a real one is a few KB.
const MAX_BYTES: usize = 1 << 20;

/// One verifying key and the one algorithm it verifies.
#[derive(Clone)]
pub struct Key {
    pub kid: Option<String>,
    pub algorithm: Algorithm,
    pub decoding: DecodingKey,
    /// The key's own numbers (its JWK parameters), to tell a key replaced
    /// under the same `kid` from the same key.
    pub(super) material: String,
}

/// Where the set comes from.
#[derive(Debug, Clone)]
pub enum Source {
    File(std::path::PathBuf),
    Url(reqwest::Url),
}

impl Source {
    /// `SECKILL_JWT_JWKS`: a URL when it starts with http:// or https://,
    /// else a file path.
    pub fn parse(text: &str) -> Result<Self, JwksError> {
        if text.starts_with("http://") || text.starts_with("https://") {
            reqwest::Url::parse(text)
                .map(Self::Url)
                .map_err(|e| JwksError::Read(format!("{text:?} is not a URL: {e}")))
        } else {
            Ok(Self::File(text.into()))
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum JwksError {
    #[error("cannot read the JWK Set: {0}")]
    Read(String),
    #[error("the JWK Set is not valid: {0}")]
    Invalid(String),
    #[error("the JWK Set has no RS256, ES256 or EdDSA key for signatures")]
    NoKeys,
}

/// The keys of the last good set, and when it was last fetched.
pub struct Jwks {
    source: Source,
    client: reqwest::Client,
    keys: RwLock<Option<Arc<Vec<Key>>>>,
    generation: AtomicU64,
    /// One fetch at a time; holds when the last one started.
    fetch: tokio::sync::Mutex<Option<Instant>>,
    /// Room for the tokens of unknown kids that wait for the next fetch.
    waiting: tokio::sync::Semaphore,
}

/// Most tokens of unknown kids that wait for the next fetch at once, per
/// instance.
const MOST_WAITING: usize = 64;

/// Whether a fetch asked within 5 s of the last one (or while another
/// runs) is skipped, or waits for its turn.
#[derive(Clone, Copy)]
enum Pace {
    SkipTooSoon,
    /// For a token that came at this instant: a fetch begun since answers
    /// it (the set it read holds what was published before the token).
    WaitTurn(Instant),
}

/// What a fetch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// A new set is in use; `removed`: a key of the old one is gone.
    Loaded { removed: bool },
    /// Too soon after the last fetch (or another fetch was running): the
    /// set is as it was.
    TooSoon,
    /// The fetch failed; the last good set stays.
    Failed,
}

impl Jwks {
    pub fn new(source: Source) -> Self {
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                // A few redirects, never from https to http: the keys
                // decide who signs in.
                let downgrade = attempt.url().scheme() != "https"
                    && attempt.previous().iter().any(|u| u.scheme() == "https");
                if downgrade {
                    attempt.error("a redirect from https to http")
                } else if attempt.previous().len() > 3 {
                    attempt.error("more than 3 redirects")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .expect("a client with rustls and no other settings builds");
        Self {
            source,
            client,
            keys: RwLock::new(None),
            generation: AtomicU64::new(0),
            fetch: tokio::sync::Mutex::new(None),
            waiting: tokio::sync::Semaphore::new(MOST_WAITING),
        }
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The keys in use; `None` until a set was loaded.
    pub fn keys(&self) -> Option<Arc<Vec<Key>>> {
        self.keys.read().expect("never poisoned").clone()
    }

    /// Fetches the set unless one was fetched less than 5 s ago or a
    /// fetch is running (`TooSoon` at once). The fetch is a task
    /// of its own: a caller that gives up (a request whose client hung up)
    /// does not cut it off half-way, which would leave the set unfetched
    /// for 5 s and the callers waiting on it refused.
    pub async fn refresh(this: &Arc<Self>) -> Fetched {
        Self::refresh_spawned(this, Pace::SkipTooSoon).await
    }

    /// Fetches the set for a token whose `kid` it lacks: as [`Self::refresh`],
    /// but within 5 s of the last fetch it waits until the next one is
    /// allowed and makes it (callers that come meanwhile wait for that one),
    /// so that a key the identity provider published just after a fetch is
    /// found within 5 s, not refused as unknown; a token that waited while
    /// another fetch ran is answered by it only if it began after the
    /// token came. A flood of made-up kids still costs one fetch per 5 s,
    /// and past [`MOST_WAITING`] tokens waiting, the others are answered at
    /// once from the set as it is.
    pub async fn refresh_for_unknown_kid(this: &Arc<Self>) -> Fetched {
        // Anyone can send a made-up kid: at most so many tokens wait, each
        // holding its connection; the others are answered at once.
        let came = Instant::now();
        match this.waiting.try_acquire() {
            Ok(_waits) => Self::refresh_spawned(this, Pace::WaitTurn(came)).await,
            Err(_) => Self::refresh_spawned(this, Pace::SkipTooSoon).await,
        }
    }

    async fn refresh_spawned(this: &Arc<Self>, pace: Pace) -> Fetched {
        let set = Arc::clone(this);
        tokio::spawn(async move { set.refresh_here(pace).await })
            .await
            .unwrap_or(Fetched::Failed)
    }

    async fn refresh_here(&self, pace: Pace) -> Fetched {
        let mut last = match pace {
            // Nothing waits here: a fetch under way (or its turn, up to
            // 5 s) is not waited for (anyone can send made-up kids).
            Pace::SkipTooSoon => match self.fetch.try_lock() {
                Ok(last) => last,
                Err(_) => return Fetched::TooSoon,
            },
            Pace::WaitTurn(_) => self.fetch.lock().await,
        };
        if let Some(at) = *last {
            if let Pace::WaitTurn(came) = pace {
                if at >= came {
                    // Fetched since this token came, while it waited.
                    return Fetched::TooSoon;
                }
            }
            let allowed = at + MIN_FETCH_INTERVAL;
            if Instant::now() < allowed {
                match pace {
                    Pace::SkipTooSoon => return Fetched::TooSoon,
                    // A fetch begun before this token came may have missed
                    // its key: the next one is this token's.
                    Pace::WaitTurn(_) => tokio::time::sleep_until(allowed.into()).await,
                }
            }
        }
        *last = Some(Instant::now());
        match self.load().await {
            Ok(removed) => Fetched::Loaded { removed },
            Err(error) => {
                tracing::warn!(%error, "JWK Set not refreshed; the last good one stays");
                Fetched::Failed
            }
        }
    }

    /// Reads the set now, whenever it was read last, and uses it if it is
    /// good; whether a key of the set before is gone.
    pub async fn load(&self) -> Result<bool, JwksError> {
        metrics::counter!("seckill_jwks_fetches_total").increment(1);
        let keys = self
            .read()
            .await
            .and_then(|body| parse(&body))
            .inspect_err(|_| {
                metrics::counter!("seckill_jwks_fetch_failures_total").increment(1);
            })?;
        let mut held = self.keys.write().expect("never poisoned");
        let removed = held.as_ref().is_some_and(|old| {
            old.iter().any(|o| {
                !keys.iter().any(|k| {
                    k.kid == o.kid && k.algorithm == o.algorithm && k.material == o.material
                })
            })
        });
        if removed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        tracing::info!(keys = keys.len(), "JWK Set loaded");
        *held = Some(Arc::new(keys));
        Ok(removed)
    }

    /// Grows each time a load drops a key (or replaces one under its
    /// `kid`): what was verified with an older generation is verified
    /// again.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    async fn read(&self) -> Result<Vec<u8>, JwksError> {
        match &self.source {
            Source::File(path) => tokio::fs::read(path)
                .await
                .map_err(|e| JwksError::Read(format!("{}: {e}", path.display()))),
            Source::Url(url) => {
                let read = |e: reqwest::Error| JwksError::Read(e.without_url().to_string());
                let mut response = self.client.get(url.clone()).send().await.map_err(read)?;
                if !response.status().is_success() {
                    return Err(JwksError::Read(format!(
                        "the server answered {}",
                        response.status()
                    )));
                }
                let mut body = Vec::new();
                while let Some(chunk) = response.chunk().await.map_err(read)? {
                    body.extend_from_slice(&chunk);
                    if body.len() > MAX_BYTES {
                        return Err(JwksError::Read("the set is over 1 MiB".into()));
                    }
                }
                Ok(body)
            }
        }
    }
}

/// The signature keys of a JWK Set. A key that says it is for encryption,
/// a symmetric key (a shared secret has no place in a published set), or
/// one of a type or curve this service does not verify is left out.
pub fn parse(body: &[u8]) -> Result<Vec<Key>, JwksError> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| JwksError::Invalid(e.to_string()))?;
    // Key by key: one of a kind this library does not know (a new
    // algorithm's name, an encryption key) leaves the others usable.
    let keys: Vec<Key> = set
        .keys
        .into_iter()
        .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
        .filter_map(|jwk| key(&jwk))
        .collect();
    if keys.is_empty() {
        return Err(JwksError::NoKeys);
    }
    Ok(keys)
}

fn key(jwk: &Jwk) -> Option<Key> {
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return None;
    }
    // The algorithm the key's type allows, and the one the set names for
    // it (if it names one): they must agree.
    let allowed = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            Algorithm::ES256
        }
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let named = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => return None,
    };
    if named.is_some_and(|named| named != allowed) {
        return None;
    }
    Some(Key {
        kid: jwk.common.key_id.clone(),
        algorithm: allowed,
        decoding: DecodingKey::from_jwk(jwk).ok()?,
        material: serde_json::to_string(&jwk.algorithm).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // An RSA public key (n, e) and an Ed25519 one, as JWKs.
    const RSA_N: &str = "u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0_IzW7yWR7QkrmBL7jTKEn5u-qKhbwKfBstIs-bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW_VDL5AaWTg0nLVkjRo9z-40RQzuVaE8AkAFmxZzow3x-VJYKdjykkJ0iT9wCS0DRTXu269V264Vf_3jvredZiKRkgwlL9xNAwxXFg0x_XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC-9aGVd-Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw";

    #[test]
    fn each_key_verifies_the_one_algorithm_of_its_type() {
        let set = format!(
            r#"{{"keys":[
                {{"kty":"RSA","kid":"r","n":"{RSA_N}","e":"AQAB"}},
                {{"kty":"RSA","kid":"r-named","alg":"RS256","use":"sig","n":"{RSA_N}","e":"AQAB"}},
                {{"kty":"OKP","kid":"ed","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}}
            ]}}"#
        );
        let keys = parse(set.as_bytes()).unwrap();
        let of = |kid: &str| {
            keys.iter()
                .find(|k| k.kid.as_deref() == Some(kid))
                .unwrap()
                .algorithm
        };
        assert_eq!(of("r"), Algorithm::RS256);
        assert_eq!(of("r-named"), Algorithm::RS256);
        assert_eq!(of("ed"), Algorithm::EdDSA);
    }

    #[tokio::test]
    async fn a_key_dropped_or_replaced_under_its_kid_is_a_new_generation() {
        let dir = std::env::temp_dir().join(format!("jwks-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jwks.json");
        let set = |n: &str, more: &str| {
            format!(r#"{{"keys":[{{"kty":"RSA","kid":"r","n":"{n}","e":"AQAB"}}{more}]}}"#)
        };
        let ed = r#",{"kty":"OKP","kid":"ed","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#;
        let other_n = format!("{}A", &RSA_N[..RSA_N.len() - 1]);
        let jwks = Jwks::new(Source::File(path.clone()));
        let mut steps = Vec::new();
        for (text, what) in [
            (set(RSA_N, ed), "first"),
            (set(RSA_N, ed), "the same set"),
            (set(RSA_N, ""), "a key dropped"),
            (set(RSA_N, ""), "the same again"),
            (set(&other_n, ""), "another key under the same kid"),
        ] {
            std::fs::write(&path, text).unwrap();
            let removed = jwks.load().await.unwrap();
            steps.push((what, removed, jwks.generation()));
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            steps,
            [
                ("first", false, 0),
                ("the same set", false, 0),
                ("a key dropped", true, 1),
                ("the same again", false, 1),
                ("another key under the same kid", true, 2),
            ]
        );
    }

    #[test]
    fn encryption_symmetric_and_mismatched_keys_are_left_out() {
        let set = format!(
            r#"{{"keys":[
                {{"kty":"RSA","kid":"enc","use":"enc","n":"{RSA_N}","e":"AQAB"}},
                {{"kty":"RSA","kid":"says-es256","alg":"ES256","n":"{RSA_N}","e":"AQAB"}},
                {{"kty":"RSA","kid":"says-hs256","alg":"HS256","n":"{RSA_N}","e":"AQAB"}},
                {{"kty":"oct","kid":"shared","k":"c2VjcmV0"}}
            ]}}"#
        );
        assert!(matches!(parse(set.as_bytes()), Err(JwksError::NoKeys)));
        assert!(matches!(
            parse(b"{\"keys\": 3}"),
            Err(JwksError::Invalid(_))
        ));
        assert!(matches!(parse(b"not json"), Err(JwksError::Invalid(_))));
    }
}
