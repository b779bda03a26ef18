//! Verifying the shop's JWTs with the `jsonwebtoken` crate: the key chosen
//! by `kid`, the algorithm pinned to the key, `exp` required and `nbf`
//! honoured within the leeway, `iss` and `aud` exact. Every refusal says
//! what was wrong and nothing of the keys.

use std::collections::HashMap;
use std::sync::Arc;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Header, Validation};

use super::jwks::{Fetched, Jwks, Key};

/// What the shop's identity provider vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub subject: String,
    /// Unix seconds.
    pub expires: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// The token is not accepted; the text says why.
    #[error("{0}")]
    Rejected(String),
    /// No JWK Set has been loaded yet: nobody can tell.
    #[error("the identity provider's keys are not loaded yet")]
    KeysNotLoaded,
}

/// The settings of JWT sign-in, and its keys.
pub struct JwtVerifier {
    issuer: String,
    leeway: u64,
    hs256: Option<DecodingKey>,
    jwks: Option<Arc<Jwks>>,
    /// One validation per algorithm, made once: each pins its algorithm.
    validations: HashMap<Algorithm, Validation>,
}

/// The claims read here. The library checks `iss`, `aud`, `exp` and `nbf`
/// too, but takes an `iss` list that contains the issuer and passes over an
/// `nbf` it cannot read as a time: the contract refuses both.
#[derive(serde::Deserialize)]
struct Claims {
    sub: Option<String>,
    exp: Option<f64>,
    iss: Option<serde_json::Value>,
    nbf: Option<serde_json::Value>,
}

/// Longest `sub` taken, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 255;
/// The latest `exp` taken as it is (9999-12-31T23:59:59Z): a later one
/// stands for "never" and is read as this, so that no sum overflows.
const LATEST_EXPIRY: f64 = 253_402_300_799.0;

impl JwtVerifier {
    pub fn new(
        issuer: &str,
        audience: &str,
        leeway_seconds: u64,
        hs256: Option<&[u8]>,
        jwks: Option<Arc<Jwks>>,
    ) -> Self {
        let validations = [
            Algorithm::RS256,
            Algorithm::ES256,
            Algorithm::EdDSA,
            Algorithm::HS256,
        ]
        .into_iter()
        .map(|algorithm| {
            let mut v = Validation::new(algorithm);
            v.leeway = leeway_seconds;
            v.validate_exp = true;
            v.validate_nbf = true;
            v.set_issuer(&[issuer]);
            v.set_audience(&[audience]);
            v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
            (algorithm, v)
        })
        .collect();
        Self {
            issuer: issuer.to_owned(),
            leeway: leeway_seconds,
            hs256: hs256.map(DecodingKey::from_secret),
            jwks,
            validations,
        }
    }

    pub fn jwks(&self) -> Option<&Arc<Jwks>> {
        self.jwks.as_ref()
    }

    /// The subject of `token`, if it is genuine and valid at `now` (Unix
    /// seconds).
    pub async fn verify(&self, token: &str, now: i64) -> Result<Verified, JwtError> {
        let header = decode_header(token).map_err(|e| rejected(e.kind()))?;
        let key = self.key_for(&header).await?;
        let validation = self.validations.get(&key.algorithm).ok_or_else(|| {
            JwtError::Rejected(format!("{:?} tokens are not accepted", key.algorithm))
        })?;
        let data =
            decode::<Claims>(token, &key.decoding, validation).map_err(|e| rejected(e.kind()))?;
        // The library requires both; read as options, their absence is
        // said as such rather than as malformed JSON.
        let missing = |claim: &str| JwtError::Rejected(format!("the token has no {claim} claim"));
        let claims = data.claims;
        let subject = claims.sub.ok_or_else(|| missing("sub"))?;
        let expires = claims.exp.ok_or_else(|| missing("exp"))?;
        if claims.iss.as_ref().and_then(serde_json::Value::as_str) != Some(&self.issuer) {
            return Err(rejected(&ErrorKind::InvalidIssuer));
        }
        if let Some(nbf) = claims.nbf {
            let nbf = nbf
                .as_f64()
                .filter(|nbf| *nbf >= 0.0)
                .ok_or_else(|| JwtError::Rejected("the token's nbf is not a time".into()))?;
            if nbf > now as f64 + self.leeway as f64 {
                return Err(rejected(&ErrorKind::ImmatureSignature));
            }
        }
        if subject.is_empty() || subject.len() > MAX_SUBJECT_BYTES {
            return Err(JwtError::Rejected(format!(
                "the token's sub must be 1 to {MAX_SUBJECT_BYTES} bytes"
            )));
        }
        // No text column (nor most software) keeps one.
        if subject.contains('\0') {
            return Err(JwtError::Rejected(
                "the token's sub contains a NUL character".into(),
            ));
        }
        Ok(Verified {
            subject,
            // `as` saturates; a NaN cannot come out of JSON.
            expires: expires.min(LATEST_EXPIRY) as i64,
        })
    }

    /// The key that must have signed a token with this header: by its
    /// algorithm (HS256: the shared secret) and `kid`; a `kid` the set does
    /// not hold fetches the set again (at most once per 5 s: within 5 s of
    /// the last fetch, the token waits for the next).
    async fn key_for(&self, header: &Header) -> Result<Key, JwtError> {
        if header.alg == Algorithm::HS256 {
            return self
                .hs256
                .clone()
                .map(|decoding| Key {
                    kid: None,
                    algorithm: Algorithm::HS256,
                    decoding,
                    material: String::new(),
                })
                .ok_or_else(|| JwtError::Rejected("HS256 tokens are not accepted here".into()));
        }
        let Some(jwks) = &self.jwks else {
            return Err(JwtError::Rejected(format!(
                "{:?} tokens are not accepted here (no JWK Set)",
                header.alg
            )));
        };
        let keys = jwks.keys().ok_or(JwtError::KeysNotLoaded)?;
        let key = match &header.kid {
            None if keys.len() == 1 => keys[0].clone(),
            None => {
                return Err(JwtError::Rejected(format!(
                    "the token names no key (kid), and the JWK Set holds {}",
                    keys.len()
                )))
            }
            Some(kid) => match find(&keys, kid) {
                Some(key) => key,
                None => {
                    let refreshed = match Jwks::refresh_for_unknown_kid(jwks).await {
                        Fetched::Loaded { .. } | Fetched::TooSoon => jwks.keys(),
                        Fetched::Failed => None,
                    };
                    refreshed.and_then(|keys| find(&keys, kid)).ok_or_else(|| {
                        JwtError::Rejected(format!(
                            "no key with kid {:?} in the JWK Set",
                            kid.chars().take(64).collect::<String>()
                        ))
                    })?
                }
            },
        };
        if key.algorithm != header.alg {
            return Err(JwtError::Rejected(format!(
                "the token's algorithm {:?} is not its key's ({:?})",
                header.alg, key.algorithm
            )));
        }
        Ok(key)
    }
}

fn find(keys: &[Key], kid: &str) -> Option<Key> {
    keys.iter().find(|k| k.kid.as_deref() == Some(kid)).cloned()
}

/// What the library found wrong, in words for the caller.
fn rejected(kind: &ErrorKind) -> JwtError {
    JwtError::Rejected(
        match kind {
            ErrorKind::ExpiredSignature => "the token has expired",
            ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)",
            ErrorKind::InvalidAudience => "the token is not for this audience (aud)",
            ErrorKind::InvalidIssuer => "the token's issuer (iss) is not the one configured",
            ErrorKind::InvalidSignature => "the token's signature is not valid",
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                "the token's algorithm is not accepted"
            }
            ErrorKind::MissingAlgorithm => "the token names no algorithm",
            ErrorKind::MissingRequiredClaim(claim) => {
                return JwtError::Rejected(format!("the token has no {claim} claim"))
            }
            ErrorKind::Json(_) => {
                "the token is malformed: its header or claims are not JSON of the right shape"
            }
            ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Utf8(_) => {
                "the token is malformed"
            }
            _ => "the token is not valid",
        }
        .to_owned(),
    )
}
