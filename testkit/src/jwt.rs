//! The shop's identity provider, as the tests and the load driver play it:
//! signing keys made for one run (RS256 from openssl, ES256 and EdDSA from
//! ring), each with its public JWK, and tokens signed under them.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

/// A key pair made for one run: how to sign with it, and its public JWK.
pub struct JwtKey {
    pub kid: &'static str,
    pub algorithm: Algorithm,
    pub signing: EncodingKey,
    pub jwk: Value,
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

impl JwtKey {
    /// A 2048-bit RSA key pair made by openssl in `dir` (RS256).
    pub fn rsa(kid: &'static str, dir: &Path) -> anyhow::Result<Self> {
        let (pem, n) = crate::rsa_key(dir)?;
        Ok(Self {
            kid,
            algorithm: Algorithm::RS256,
            signing: EncodingKey::from_rsa_pem(&pem)?,
            jwk: json!({ "kty": "RSA", "kid": kid, "use": "sig", "n": b64(&n), "e": "AQAB" }),
        })
    }

    /// A P-256 key pair (ES256).
    pub fn es256(kid: &'static str) -> anyhow::Result<Self> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)?;
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)?;
        let point = pair.public_key().as_ref();
        Ok(Self {
            kid,
            algorithm: Algorithm::ES256,
            signing: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({ "kty": "EC", "kid": kid, "crv": "P-256", "alg": "ES256",
                         "x": b64(&point[1..33]), "y": b64(&point[33..65]) }),
        })
    }

    /// An Ed25519 key pair (EdDSA).
    pub fn eddsa(kid: &'static str) -> anyhow::Result<Self> {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())?;
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())?;
        Ok(Self {
            kid,
            algorithm: Algorithm::EdDSA,
            signing: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({ "kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(pair.public_key().as_ref()) }),
        })
    }

    /// `claims` signed with this key, its `kid` in the header.
    pub fn token(&self, claims: &impl serde::Serialize) -> anyhow::Result<String> {
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.to_owned());
        Ok(encode(&header, claims, &self.signing)?)
    }
}

/// A JWK Set of these keys, as the provider publishes it.
pub fn jwk_set(keys: &[&JwtKey]) -> String {
    json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() }).to_string()
}
