//! Signed user tokens: who the caller is, until when, with an HMAC so that
//! nobody without the key can mint one.
//!
//! Format: `v1.<user_id>.<expires_unix>.<base64url(HMAC-SHA256)>`, the MAC
//! over everything before its dot. Stateless: verifying needs no database,
//! and rotating the key (or restarting without a fixed one) revokes all.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::{parse_positive, UserId};

type HmacSha256 = Hmac<Sha256>;

const VERSION: &str = "v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is malformed")]
    Malformed,
    #[error("the token's signature is not valid")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
}

/// Mints and checks user tokens with one secret key.
#[derive(Clone)]
pub struct TokenSigner {
    /// The HMAC with the key already taken in (its inner and outer pads
    /// hashed once, here): each token costs the hashing of its own bytes.
    keyed: HmacSha256,
}

impl TokenSigner {
    pub fn new(key: impl AsRef<[u8]>) -> Self {
        Self {
            keyed: HmacSha256::new_from_slice(key.as_ref()).expect("HMAC takes keys of any length"),
        }
    }

    fn mac(&self, payload: &str) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(payload.as_bytes());
        mac
    }

    /// A token for `user_id` valid until `expires_unix` (one for an id that
    /// is not positive never verifies: it is malformed).
    pub fn sign(&self, user_id: i64, expires_unix: i64) -> String {
        let payload = format!("{VERSION}.{user_id}.{expires_unix}");
        let signature = URL_SAFE_NO_PAD.encode(self.mac(&payload).finalize().into_bytes());
        format!("{payload}.{signature}")
    }

    /// The user id a token names, if the token is genuine and unexpired at
    /// `now_unix`.
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<UserId, TokenError> {
        let (payload, signature) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let mut parts = payload.split('.');
        let (Some(VERSION), Some(user), Some(expires), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let user_id = parse_positive(user)
            .and_then(UserId::new)
            .ok_or(TokenError::Malformed)?;
        let expires = parse_positive(expires).ok_or(TokenError::Malformed)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Malformed)?;
        // Constant-time comparison: no timing oracle for forging.
        self.mac(payload)
            .verify_slice(&signature)
            .map_err(|_| TokenError::BadSignature)?;
        if expires <= now_unix {
            return Err(TokenError::Expired);
        }
        Ok(user_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn a_signed_token_verifies_to_its_user() {
        let signer = TokenSigner::new(b"k");
        let token = signer.sign(42, NOW + 60);
        assert_eq!(signer.verify(&token, NOW), Ok(UserId::new(42).unwrap()));
    }

    #[test]
    fn expired_tokens_are_refused() {
        let signer = TokenSigner::new(b"k");
        assert_eq!(
            signer.verify(&signer.sign(42, NOW), NOW),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn another_key_or_an_edited_payload_breaks_the_signature() {
        let signer = TokenSigner::new(b"k");
        let other = TokenSigner::new(b"other");
        let token = other.sign(42, NOW + 60);
        assert_eq!(signer.verify(&token, NOW), Err(TokenError::BadSignature));

        let genuine = signer.sign(42, NOW + 60);
        let edited = genuine.replacen(".42.", ".43.", 1);
        assert_eq!(signer.verify(&edited, NOW), Err(TokenError::BadSignature));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let signer = TokenSigner::new(b"k");
        let good = signer.sign(42, NOW + 60);
        let sig = good.rsplit_once('.').unwrap().1;
        for bad in [
            String::new(),
            "v1".into(),
            "v1.42".into(),
            format!("v2.42.{}.{sig}", NOW + 60),
            format!("v1.042.{}.{sig}", NOW + 60),
            format!("v1.-42.{}.{sig}", NOW + 60),
            format!("v1.0.{}.{sig}", NOW + 60),
            format!("v1.42.{}.x.{sig}", NOW + 60),
            format!("v1.42.{}.!!!", NOW + 60),
            format!("v1.99999999999999999999.{}.{sig}", NOW + 60),
        ] {
            assert_eq!(
                signer.verify(&bad, NOW),
                Err(TokenError::Malformed),
                "{bad:?}"
            );
        }
    }
}
