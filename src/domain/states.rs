//! The states a sale and an order can be in: one type each, named by one
//! word in Postgres, Redis and the API alike (`store` stores the word and
//! decodes it where it leaves Postgres, so that an unknown word is an error
//! there rather than a silent fallback anywhere above).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An enum named by one of a fixed set of words.
macro_rules! text_state {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $word:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every state, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)+];

            /// The word Postgres, Redis and the API use for it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $word,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownState;

            fn from_str(word: &str) -> Result<Self, UnknownState> {
                match word {
                    $($word => Ok(Self::$variant),)+
                    other => Err(UnknownState {
                        kind: stringify!($name),
                        word: other.chars().take(40).collect(),
                    }),
                }
            }
        }
    };
}

/// A word that names no state of its kind: data written by something else
/// than this version of the service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{word:?} is not a {kind}")]
pub struct UnknownState {
    kind: &'static str,
    word: String,
}

impl UnknownState {
    pub(super) fn new(kind: &'static str, word: &str) -> Self {
        Self {
            kind,
            word: word.chars().take(40).collect(),
        }
    }
}

text_state! {
    /// How a voucher is sold, chosen when it is created.
    #[derive(Default)]
    SaleMode {
        /// The order is committed to Postgres before the buyer hears 200.
        #[default]
        Sync => "sync",
        /// Redis accepts the order (202, `pending`); the stream writers
        /// commit it.
        Async => "async",
    }
}

text_state! {
    /// Where an order stands. Every stored order starts `unpaid`; exactly
    /// one of pay, cancel and expire moves it on, and only from `unpaid`.
    OrderStatus {
        /// An async sale's order that Redis accepted and Postgres does not
        /// hold yet (never stored as such).
        Pending => "pending",
        /// Stored, awaiting payment until its `pay_by`.
        Unpaid => "unpaid",
        /// Paid in time: final.
        Paid => "paid",
        /// Cancelled by its user or an admin; its unit went back on sale.
        Cancelled => "cancelled",
        /// Not paid by its `pay_by`; its unit went back on sale.
        Expired => "expired",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_reads_back_from_its_word_and_nothing_else_reads() {
        for mode in SaleMode::ALL {
            assert_eq!(mode.as_str().parse::<SaleMode>(), Ok(*mode));
        }
        for status in OrderStatus::ALL {
            assert_eq!(status.as_str().parse::<OrderStatus>(), Ok(*status));
        }
        for bad in ["", "Sync", "confirmed", "async ", "unpaid\0"] {
            assert!(bad.parse::<SaleMode>().is_err(), "{bad:?}");
            assert!(bad.parse::<OrderStatus>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn states_travel_as_lowercase_words_in_json() {
        assert_eq!(
            serde_json::to_string(&OrderStatus::Cancelled).unwrap(),
            "\"cancelled\""
        );
        assert_eq!(
            serde_json::from_str::<SaleMode>("\"async\"").unwrap(),
            SaleMode::Async
        );
        assert!(serde_json::from_str::<SaleMode>("\"ASYNC\"").is_err());
    }
}
