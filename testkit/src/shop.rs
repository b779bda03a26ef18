//! The shop's side, as the tests and the load driver play it: an RSA key
//! pair made by openssl (for RS256 JWTs), and a webhook receiver's check
//! of the `X-Seckill-Signature` header.

use anyhow::Context;
use std::path::Path;
use std::process::Command;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A 2048-bit RSA key made by openssl in `dir`: its PKCS#8 PEM and its
/// public modulus (the exponent is 65537).
pub fn rsa_key(dir: &Path) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let pem = dir.join("rsa.pem");
    let openssl = |args: &[&str]| -> anyhow::Result<Vec<u8>> {
        let out = Command::new("openssl")
            .args(args)
            .arg(&pem)
            .output()
            .context("openssl (scripts/deps.sh installs it)")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(out.status.success(), "openssl: {stderr}");
        Ok(out.stdout)
    };
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
    ])?;
    let modulus =
        String::from_utf8_lossy(&openssl(&["rsa", "-noout", "-modulus", "-in"])?).into_owned();
    let n = hex::decode(modulus.trim().trim_start_matches("Modulus="))
        .with_context(|| format!("openssl's modulus: {modulus}"))?;
    let pem = std::fs::read(&pem).with_context(|| pem.display().to_string())?;
    Ok((pem, n))
}

/// Whether `header` (`t=<unix>,v1=<hex>`) signs `body` under `secret`, as
/// a receiver checks it: HMAC-SHA256 of "<t>.<body>", compared in constant
/// time, and `t` within five minutes of `now_unix`.
pub fn webhook_signed(secret: &[u8], header: &str, body: &[u8], now_unix: i64) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = value.parse::<i64>().ok(),
            Some(("v1", value)) => v1 = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    (now_unix - t).abs() <= 300 && mac.verify_slice(&v1).is_ok()
}
