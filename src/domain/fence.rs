//! The fencing token of a user's purchase lock: the number the sale
//! statement compares with the one it last stored for the user and
//! voucher, so that a holder whose lock was lost (and taken by another
//! since) cannot write.
//!
//! The lock library hands out a bare `i64` (it knows nothing of the
//! service); the service wraps it here as soon as the guard gives it up
//! (`seckill::UserGuard::fence`) and unwraps it only to bind it to SQL.

use std::fmt;

/// A lock hold's fencing token. It grows with every hold of one lock; the
/// comparison itself is SQL's (`store::sale`), so Rust only carries it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(i64);

impl FencingToken {
    /// The token a lock's guard gave.
    pub const fn new(token: i64) -> Self {
        Self(token)
    }

    /// The number, to bind to a query.
    pub const fn get(self) -> i64 {
        self.0
    }
}

/// The bare number, as logs showed the token before it had a type.
impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips() {
        for raw in [1, 41, i64::MAX] {
            let token = FencingToken::new(raw);
            assert_eq!(token.get(), raw);
            assert_eq!(token, FencingToken::new(raw));
            assert_eq!(format!("{token:?}"), raw.to_string());
            assert_eq!(format!("{:?}", Some(token)), format!("Some({raw})"));
        }
        assert_ne!(FencingToken::new(1), FencingToken::new(2));
    }
}
