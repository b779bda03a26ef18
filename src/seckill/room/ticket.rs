//! The waiting room's tickets and proof of work: what a client holds and
//! shows, signed by the service and checked locally (no Redis, no
//! Postgres), and the challenge a room that asks for work sets each user.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::Mac;
use secrecy::SecretBox;
use sha2::Sha256;

use super::{HmacSha256, Rooms};
use crate::domain::{parse_positive, UserId, VoucherId};
use crate::seckill::error::{Refusal, Result, SeckillError};

const TICKET_VERSION: &str = "t1";

/// A ticket as signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::seckill) struct Ticket {
    pub(super) voucher_id: VoucherId,
    pub(super) user_id: UserId,
    /// The holder's place; 0 until placed.
    pub(super) place: i64,
    /// Unix ms; 0 while waiting.
    pub(super) admitted_until_ms: i64,
    pub(super) expires_unix: i64,
}

/// The key that signs tickets, kept unprintable.
pub type TicketKey = Arc<SecretBox<[u8; 32]>>;

/// A ticket key derived from the key that signs user tokens: instances
/// that share that key accept each other's tickets.
pub fn ticket_key(token_secret: &[u8]) -> TicketKey {
    let mut mac = HmacSha256::new_from_slice(token_secret).expect("HMAC takes any key length");
    mac.update(b"seckill waiting-room tickets");
    Arc::new(SecretBox::new(Box::new(mac.finalize().into_bytes().into())))
}

impl Rooms {
    fn mac(&self, payload: &str) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(payload.as_bytes());
        mac
    }

    pub(super) fn sign(&self, t: &Ticket) -> String {
        let payload = format!(
            "{TICKET_VERSION}.{}.{}.{}.{}.{}",
            t.voucher_id, t.user_id, t.place, t.admitted_until_ms, t.expires_unix
        );
        let signature = URL_SAFE_NO_PAD.encode(self.mac(&payload).finalize().into_bytes());
        format!("{payload}.{signature}")
    }

    /// The ticket's contents, if this service signed it.
    fn verify(&self, ticket: &str) -> Option<Ticket> {
        let (payload, signature) = ticket.rsplit_once('.')?;
        let mut parts = payload.split('.');
        let (Some(TICKET_VERSION), Some(v), Some(u), Some(p), Some(a), Some(e), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let whole_or_zero = |text: &str| {
            if text == "0" {
                Some(0)
            } else {
                parse_positive(text)
            }
        };
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        self.mac(payload).verify_slice(&signature).ok()?;
        Some(Ticket {
            voucher_id: parse_positive(v).and_then(VoucherId::new)?,
            user_id: parse_positive(u).and_then(UserId::new)?,
            place: whole_or_zero(p)?,
            admitted_until_ms: whole_or_zero(a)?,
            expires_unix: parse_positive(e)?,
        })
    }

    /// The ticket, if it is this user's for this voucher (before a poll).
    pub(in crate::seckill) fn check_own(
        &self,
        voucher_id: VoucherId,
        user_id: UserId,
        ticket: &str,
    ) -> Result<Ticket> {
        match self.verify(ticket) {
            Some(t) if t.voucher_id == voucher_id && t.user_id == user_id => Ok(t),
            _ => Err(SeckillError::Invalid(
                "X-Queue-Ticket is not a ticket of this user for this voucher".into(),
            )),
        }
    }

    /// Whether `ticket` admits `user_id` to buy `voucher_id` at `now` (the
    /// sale's clock): signed here, theirs, admitted, within its window.
    pub(in crate::seckill) fn check_admitted(
        &self,
        voucher_id: VoucherId,
        user_id: UserId,
        ticket: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), Refusal> {
        let refuse = |why: &'static str| Err(Refusal::NotAdmitted(why));
        let Some(ticket) = ticket else {
            return refuse(
                "this sale has a waiting room: join it and buy with the X-Queue-Ticket it admits",
            );
        };
        let Some(t) = self.verify(ticket) else {
            return refuse("the X-Queue-Ticket is not one this service signed");
        };
        if t.voucher_id != voucher_id || t.user_id != user_id {
            return refuse("the X-Queue-Ticket is another user's or another voucher's");
        }
        if t.admitted_until_ms == 0 {
            return refuse("the X-Queue-Ticket is not admitted yet: poll the queue");
        }
        if now.timestamp_millis() >= t.admitted_until_ms {
            return refuse("the X-Queue-Ticket's admission has passed");
        }
        Ok(())
    }
}

/// The text a user's proof of work for a room hashes, before its nonce.
pub fn challenge(voucher_id: VoucherId, user_id: UserId) -> String {
    format!("seckill-queue:{voucher_id}:{user_id}:")
}

/// Whether SHA-256 of the user's challenge followed by `nonce` starts with
/// `bits` zero bits. A nonce is at most 64 characters.
pub fn proof_holds(voucher_id: VoucherId, user_id: UserId, nonce: &str, bits: u32) -> bool {
    use sha2::Digest;
    if nonce.is_empty() || nonce.len() > 64 {
        return false;
    }
    let mut hash = Sha256::new();
    hash.update(challenge(voucher_id, user_id).as_bytes());
    hash.update(nonce.as_bytes());
    leading_zero_bits(&hash.finalize()) >= bits
}

pub(super) fn leading_zero_bits(bytes: &[u8]) -> u32 {
    let mut zeros = 0;
    for byte in bytes {
        zeros += byte.leading_zeros();
        if *byte != 0 {
            break;
        }
    }
    zeros
}
