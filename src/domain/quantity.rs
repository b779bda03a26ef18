//! How many units one purchase asks for: [`Quantity`], 1 to
//! [`Quantity::MAX`], within its voucher's `max_units_per_user`.

use std::fmt;

/// Units one purchase asks for (and its order holds), all or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(i32);

impl Quantity {
    /// One unit: a purchase that says nothing else.
    pub const ONE: Self = Self(1);
    /// Most units a voucher may allow one order (its `max_units_per_user`).
    pub const MAX: i32 = 100;

    /// `units`, if it is 1 to `allowed` (itself at most [`Quantity::MAX`]).
    pub fn within(units: i64, allowed: i32) -> Option<Self> {
        let allowed = allowed.clamp(1, Self::MAX);
        i32::try_from(units)
            .ok()
            .filter(|units| (1..=allowed).contains(units))
            .map(Self)
    }

    pub const fn get(self) -> i32 {
        self.0
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantity_is_one_to_what_the_voucher_allows_and_never_past_the_maximum() {
        assert_eq!(Quantity::within(1, 1), Some(Quantity::ONE));
        assert_eq!(Quantity::within(2, 3).map(Quantity::get), Some(2));
        assert_eq!(Quantity::within(3, 3).map(Quantity::get), Some(3));
        for (units, allowed) in [
            (0, 3),
            (-1, 3),
            (4, 3),
            (2, 1),
            (101, 1000),
            (i64::MAX, 100),
        ] {
            assert_eq!(
                Quantity::within(units, allowed),
                None,
                "{units} of {allowed}"
            );
        }
        assert_eq!(Quantity::within(100, 1000).map(Quantity::get), Some(100));
    }
}
