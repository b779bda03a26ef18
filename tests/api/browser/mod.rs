//! The storefront and the sale monitor in a real, headless Chromium,
//! driven over WebDriver: what a buyer and an operator see and do.

mod axe;
mod buyer;
mod driver;
mod monitor;
